"""Running a Function with every requires_grad subset of its differentiable inputs: the shared
body of the needs_input_grad contract (correctness: every needed gradient returned, and equal to
the one with every input requiring grad) and the unneeded_grads contract (efficiency: None for
an input whose gradient is not needed). Checked on what backward returned (the probe's raw
record), not on what the engine passes on.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.defects import Blocked, Defect, require_sound
from conformance.engine.evaluate import execute
from conformance.engine.harness import Execution, fixed_rng, why_no_backward
from conformance.engine.numerics import exactly_equal, float64_tolerance, reordering_tolerance
from conformance.engine.provenance import BackwardOps, extra_ops
from conformance.engine.report import ContractFailure, advise, describe_value, fail
from conformance.engine.runner import Target
from strategies.cases import Case
from strategies.recipes import FloatingRecipe

# Subsets are enumerated exhaustively up to this many differentiable inputs (2**4 runs).
EXHAUSTIVE_INPUTS = 4


def _run(target: Target, case: Case, subset: frozenset[str]) -> Execution:
    """Forward and backward with ``subset`` requiring grad, under a fixed RNG seed (shared by
    needs_input_grad and unneeded_grads, which run the same subsets of the same cases).

    The seed makes Functions that draw random numbers (dropout masks) draw the same ones in
    every run, so their gradients are comparable across subsets.
    """
    with fixed_rng(case.grad_seed, case.device):
        return target.execution(case, requires_grad=subset, rng=f"fixed_rng({case.grad_seed})")


def _subsets(case: Case) -> list[frozenset[str]]:
    names = [i.name for i in case.spec.differentiable_inputs]
    ordered = [case.requires_grad]
    if len(names) <= EXHAUSTIVE_INPUTS:
        for size in range(len(names) + 1):
            ordered.extend(frozenset(c) for c in itertools.combinations(names, size))
    else:  # too many to enumerate: the empty set and each input alone, where index bugs show
        ordered.append(frozenset())
        ordered.extend(frozenset([n]) for n in names)
    unique: list[frozenset[str]] = []
    for subset in ordered:
        if subset not in unique:
            unique.append(subset)
    return unique


def _check_no_grad_forward(target: Target, case: Case, execution: Execution) -> None:
    fn_name = target.spec.display_name
    for position, out in enumerate(execution.outputs):
        if isinstance(out, torch.Tensor) and (out.requires_grad or out.grad_fn is not None):
            fail(
                f"output[{position}].requires_grad=True, but should be False [{fn_name}.forward, no input requires grad]",
                "With no input requiring grad, apply() must return plain tensors; an output attached to a "
                "graph here means forward built one itself (e.g. it called a differentiable op under "
                "torch.enable_grad(), or returned a global tensor that requires grad).",
                compares_values=False,
            )


def run_subsets(target: Target, data: st.DataObject, *, efficiency: bool) -> None:
    """Run the drawn case with every input requiring grad, then each subset, checking either the
    correctness half (needs_input_grad) or the efficiency half (unneeded_grads)."""
    drawn = target.draw_case(data)
    everything = frozenset(i.name for i in target.spec.differentiable_inputs)
    full = _run(target, replace(drawn, requires_grad=everything), everything)
    require_sound(target.contract, full)
    if everything and not target.backward_ran(full):
        return  # no differentiable output reached backward: nothing to compare with
    full_raw = (full.recorder.last.raw or ()) if full.recorder.calls else ()
    # Clone: a later run must not be able to change the baseline.
    expected: dict[str, Any] = {
        r.name: g.detach().clone() if isinstance(g, torch.Tensor) else g for r, g in zip(drawn.recipes, full_raw)
    }
    checked = False
    for subset in _subsets(drawn):
        case = replace(drawn, requires_grad=subset)
        if target.context is not None:
            target.context.case = case  # the report and repro show the subset that failed
        execution = _run(target, case, subset)
        if efficiency:
            # A wrong needs_input_grad index also computes an unneeded gradient: one defect,
            # reported once, by needs_input_grad.
            try:
                _check_subset(target, case, expected, execution, efficiency=False)
            except ContractFailure as failure:
                raise Blocked(Defect("needs_input_grad", failure.summary), case) from None
        checked = _check_subset(target, case, expected, execution, efficiency=efficiency) or checked
    if target.context is not None:
        target.context.case = drawn
    if checked:
        target.checked()
    elif efficiency:
        target.not_checked(
            "no requires_grad subset left a differentiable input without a gradient while backward ran "
            f"({_differentiable_text(target)}), so no gradient can be unneeded"
        )
    else:
        target.not_checked(why_no_backward(full))


def _advise_on_unneeded(
    target: Target, case: Case, needs: Sequence[bool], wasted: list[int], returned: str, requiring: list[str]
) -> None:
    """Gradients returned for inputs that need none: advice naming the ops only they needed; none
    when they are by-products of the needed gradients (traced again with :class:`BackwardOps`)."""
    traced = BackwardOps()
    with fixed_rng(case.grad_seed, case.device), traced:
        execution = execute(case, requires_grad=case.requires_grad, after_forward=lambda _: setattr(traced, "recording", True))
    raw = (execution.recorder.last.raw or ()) if execution.recorder.calls else ()
    tensors = [g if isinstance(g, torch.Tensor) else None for g in raw]
    needed = [g for i, g in enumerate(tensors) if g is not None and i < len(needs) and needs[i]]
    unneeded = [g for i, g in enumerate(tensors) if g is not None and i in wasted]
    if not unneeded:
        return
    extra = extra_ops(traced, needed, unneeded)
    if extra is None:
        return  # by-products of the needed gradients (or views of them): no extra work
    names = [case.recipes[i].name for i in wasted]
    where = f"{target.spec.display_name}.backward, requires_grad: {requiring}"
    advise(
        f"{', '.join(f'grad[{n!r}]' for n in names)} computed, but not needed: extra work {extra.describe()} [{where}]",
        f"ctx.needs_input_grad={tuple(needs)}: {', '.join(repr(n) for n in names)} need no gradient, but backward "
        f"returned ({returned}). The engine silently discards it.",
        f"Guard it with `if ctx.needs_input_grad[{wasted[0]}]:` and return None otherwise; or, when one fused kernel "
        "computes every gradient at once, waive this contract in the spec: register(..., waivers={'unneeded_grads': 'why'}).",
    )


def _differentiable_text(target: Target) -> str:
    names = [i.name for i in target.spec.differentiable_inputs]
    if not names:
        return f"{target.spec.name!r} declares no differentiable input"
    if len(names) == 1:
        return f"{names[0]!r} is the only differentiable input: backward runs only when it needs its gradient"
    return f"differentiable inputs: {names}"


def _check_subset(
    target: Target, case: Case, expected: dict[str, Any], execution: Execution, *, efficiency: bool
) -> bool:
    """Check one subset's run; False when it had nothing to check."""
    if not case.requires_grad:
        if efficiency:
            return False  # backward does not run: no gradient at all
        _check_no_grad_forward(target, case, execution)
        return True
    require_sound(target.contract, execution)
    if not execution.recorder.calls:
        return False  # no differentiable output reached: nothing to check
    call = execution.recorder.last
    assert call.raw is not None  # require_sound: backward returned
    fn_name = target.spec.display_name
    declared = {i.name for i in target.spec.differentiable_inputs}
    needs = call.needs_input_grad
    returned = ", ".join(describe_value(v) for v in call.raw)
    requiring = sorted(case.requires_grad)
    unneeded = False  # efficiency: a differentiable input whose gradient this call did not need
    wasted: list[int] = []  # positions of gradients returned although not needed
    for position, (recipe, grad) in enumerate(zip(case.recipes, call.raw)):
        if not isinstance(recipe, FloatingRecipe):
            continue  # gradients for non-tensor inputs are return_count's finding
        needed = position < len(needs) and needs[position]
        where = f"{fn_name}.backward, input {recipe.name!r}, requires_grad: {requiring}"
        if efficiency:
            if not needed and grad is not None and recipe.name not in declared:
                # The engine drops a gradient for an input that requires none: unchecked work, not wrong numbers.
                advise(
                    f"grad[{recipe.name!r}]={describe_value(grad)} returned for an input the spec declares "
                    f"requires_grad=False; it could be None [{where}]",
                    f"backward returned ({returned}); the engine discards grad[{recipe.name!r}] unchecked.",
                    f"Return None at position {position}, or, if {recipe.name!r} is differentiable, declare "
                    f"Tensor({recipe.name!r}, ..., requires_grad=True) so that its gradient is checked.",
                )
            unneeded = unneeded or (not needed and recipe.name in declared)
            if not needed and grad is not None and recipe.name in declared:
                wasted.append(position)
            continue
        if needed and grad is None and isinstance(expected.get(recipe.name), torch.Tensor):
            fail(
                f"grad[{recipe.name!r}]=None, but should be a Tensor [{where}]",
                f"ctx.needs_input_grad={needs} says {recipe.name!r} (position {position}) needs a gradient, "
                f"but backward returned ({returned}); with every input requiring grad it returns one.",
                "A gradient that exists only in some requires_grad combinations usually means "
                "needs_input_grad is read at the wrong index.",
                compares_values=False,
            )
    if efficiency:
        if wasted:
            _advise_on_unneeded(target, case, needs, wasted, returned, requiring)
        return unneeded
    for recipe, grad in zip(case.recipes, call.raw):
        want = expected.get(recipe.name)
        if not isinstance(recipe, FloatingRecipe) or not isinstance(grad, torch.Tensor) or not isinstance(want, torch.Tensor):
            continue
        if tuple(grad.shape) != tuple(want.shape):
            fail(
                f"grad[{recipe.name!r}].shape={tuple(grad.shape)}, but should be {tuple(want.shape)} as with "
                f"every input requiring grad [{fn_name}.backward, input {recipe.name!r}, requires_grad: {requiring}]",
                compares_values=False,
            )
        # Same inputs, dtype and grad_outputs: a correct backward gives identical gradients unless it
        # takes another code path (a fused kernel computing several gradients at once, another
        # summation order), i.e. the same kernels reordered.
        if exactly_equal(grad, want):
            continue
        rtol, atol = reordering_tolerance(case.dtype, want)
        approximate = float64_tolerance(case.spec) if case.dtype == torch.float64 else None
        if approximate is not None:  # approximate by design: another subset may take another solver path
            rtol, atol = max(rtol, approximate[0]), max(atol, approximate[1])
        try:
            torch.testing.assert_close(grad.detach(), want, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False, check_device=False)
        except AssertionError as error:
            fail(
                f"grad[{recipe.name!r}] with requires_grad {requiring} != grad[{recipe.name!r}] with every input "
                f"requiring grad [{fn_name}.backward, {case.dtype}]",
                "The same inputs and grad_outputs must give the same gradient whatever else requires grad.",
                str(error),
            )
    return True
