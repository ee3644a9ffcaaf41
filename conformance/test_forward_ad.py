"""Contract forward_ad: forward-mode AD through the target gives the reference's directional derivatives.

A Function that defines ``jvp`` is checked with dual tensors (``torch.autograd.forward_ad``): in
float64 by ``torch.autograd.gradcheck(check_forward_ad=True)`` (the forward-mode Jacobian against
finite differences, elements spaced as in the gradcheck contract), in lower precision against
``torch.func.jvp`` of the reference in float64 under the reference policy (the reference's own
forward-mode error in the tested dtype sets the budget). A spec with a ``surrogate`` (a
straight-through estimator) is held to the surrogate's jvp in every dtype, float64 included: its
forward's finite differences are not the declared derivative. Integer outputs (indices) have no
tangent to check, as ``torch.sort``'s own have none. Tangents are drawn for every
differentiable input at once, so a jvp that forgets one input's term is seen.

A Function without ``jvp`` must refuse forward-mode AD with an error (torch's "You must
implement the jvp function"), never hand back tangents; one that returns tangents anyway is
checked like a jvp. n/a for a torch.library custom op: torch.library has no forward-mode
registration, and (measured, torch 2.13) forward AD through one returns no tangent without an
error -- do not use forward AD through a custom op.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

from conformance.engine.contract import Requirement, contract
from conformance.engine.evaluate import forward_mode, function_of_tensors, reference_jvp
from conformance.engine.finite_differences import (
    FAST_ATOL,
    FAST_RTOL,
    FD_EPS,
    FD_SPACING,
    GRADCHECK_FAST_MODE_ELEMENTS,
    SLOW_ATOL,
    SLOW_RTOL,
)
from conformance.engine.numerics import Judged, judge_against_truth, truth_and_baseline
from conformance.engine.report import fail
from conformance.engine.runner import Target
from conformance.engine.torch_text import JIT_SCRIPT_DEPRECATION, gradcheck_input
from strategies.cases import Case, CaseOptions
from strategies.values import distinct_seed, grad_output_from_seed

TANGENT_SEED = 7919  # tangents differ from grad_outputs drawn from the same seed


def tangents_for(case: Case, args: list[Any]) -> dict[int, torch.Tensor]:
    """A seeded random tangent for every differentiable floating input, by position."""
    differentiable = {i.name for i in case.spec.differentiable_inputs}
    return {
        position: grad_output_from_seed(
            tuple(arg.shape), arg.dtype, seed=distinct_seed(case.grad_seed + TANGENT_SEED, recipe.name), device=str(arg.device)
        )
        for position, (recipe, arg) in enumerate(zip(case.recipes, args))
        if recipe.name in differentiable and isinstance(arg, torch.Tensor) and arg.is_floating_point()
    }


def _check_in_float64(target: Target, case: Case) -> None:
    args = case.args(dtype=torch.float64)
    wrt_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not wrt_positions:
        target.not_checked("no input requires grad: no direction to differentiate along")
        return
    call = function_of_tensors(case, args, wrt_positions)
    numel = sum(args[i].numel() for i in wrt_positions)
    fast = target.spec.fast_gradcheck or numel > GRADCHECK_FAST_MODE_ELEMENTS
    atol, rtol = (FAST_ATOL, FAST_RTOL) if fast else (SLOW_ATOL, SLOW_RTOL)
    names = [case.recipes[i].name for i in wrt_positions]
    try:
        torch.autograd.gradcheck(
            call, tuple(args[i] for i in wrt_positions), eps=FD_EPS, atol=atol, rtol=rtol, fast_mode=fast,
            check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False, check_batched_grad=False,
        )
    except GradcheckError as error:
        named = gradcheck_input(str(error))  # torch names the first input whose Jacobian differs
        if named is not None and named < len(names):
            names = [names[named]]
        fail(
            f"forward-mode (jvp) Jacobian != numerical, with respect to {', '.join(repr(n) for n in names)} "
            f"[{target.spec.display_name}.jvp, torch.autograd.gradcheck(check_forward_ad=True), float64, "
            f"{'fast' if fast else 'slow'} mode, atol={atol}, rtol={rtol}]",
            str(error).strip(),
        )
    target.checked()


def _check_against_reference(target: Target, case: Case) -> None:
    spec = target.spec
    args = case.args(requires_grad=set())
    tangents = tangents_for(case, args)
    if not tangents:
        target.not_checked("no differentiable floating input: no direction to differentiate along")
        return
    _, found = forward_mode(spec.op.call, case, args, tangents)
    try:
        truth, baseline = truth_and_baseline(
            spec, case, lambda cast, _: reference_jvp(case, [cast(a) for a in args], {p: cast(t) for p, t in tangents.items()})
        )
    except Exception as error:
        target.not_checked(f"the spec's reference has no forward-mode AD ({type(error).__name__}: {str(error)[:120]})")
        return
    where = f"{spec.display_name}.jvp, {str(case.dtype).removeprefix('torch.')}"
    values = []
    for position, (got, want, base) in enumerate(zip(found, truth, baseline)):
        if want is None:
            continue
        if got is None:
            fail(f"tangent[{position}]=None, but should be the reference's directional derivative [{where}]", compares_values=False)
        values.append(Judged(f"tangent[{position}]", "grad", got, want, base if base is not None else torch.zeros_like(got), where))
    verdict = judge_against_truth(spec, case.dtype, values)
    if verdict is not None:
        fail(verdict.summary, verdict.details, f"tangents along: {', '.join(case.recipes[p].name for p in sorted(tangents))}")
    target.checked()


def _check_refuses(target: Target, case: Case) -> None:
    """No jvp: forward AD must raise; tangents that come back anyway must be right."""
    args = case.args(requires_grad=set())
    tangents = tangents_for(case, args)
    if not tangents:
        target.not_checked("no differentiable floating input: no direction to differentiate along")
        return
    try:
        _, found = forward_mode(target.spec.op.call, case, args, tangents)
    except Exception:
        target.checked()
        return
    if all(t is None for t in found):
        fail(
            f"forward-mode AD through {target.spec.display_name} returned outputs without tangents and no error, "
            "but should raise (it defines no jvp): callers get zero directional derivatives silently",
            compares_values=False,
        )
    _check_against_reference(target, case)


def check_forward_ad(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    target.preflight(case)  # a defect eager already shows is its owner's (blocked by it)
    with warnings.catch_warnings():
        # torch's forward-AD machinery scripts a helper on first use and warns that
        # torch.jit.script is deprecated: torch's own business, not the user's.
        warnings.filterwarnings("ignore", message=JIT_SCRIPT_DEPRECATION, category=DeprecationWarning)
        if not target.spec.op.declares("jvp"):
            _check_refuses(target, case)
        elif case.dtype == torch.float64 and target.spec.surrogate is None:
            _check_in_float64(target, case)
        else:
            _check_against_reference(target, case)


def _not_custom_op(target: Target) -> None:
    if target.spec.op.kind == "custom op":
        target.not_applicable(
            "torch.library has no forward-mode AD registration; forward AD through a custom op returns no "
            f"tangent and no error (measured, torch {torch.__version__}): do not use forward AD through it"
        )


# Elements spaced for the float64 gradcheck (as the gradcheck contract draws them).
@contract("forward_ad", case=CaseOptions(spacing=FD_SPACING), requires=[Requirement("a Function", _not_custom_op)], compares_values=True)
def test_forward_ad(conformance_target: Target) -> None:
    conformance_target.run(check_forward_ad)
