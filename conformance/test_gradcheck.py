"""Contract gradcheck: the analytical gradient matches finite differences, in float64.

Runs ``torch.autograd.gradcheck`` on generated shapes, with every tensor's elements kept
``FD_SPACING`` (100 finite-difference steps) apart and away from the kinks the spec declares, so
that no central difference straddles a tie or a kink. Above ``GRADCHECK_FAST_MODE_ELEMENTS`` it uses fast
mode (random projections u^T J v) with ``FAST_ATOL``: gradcheck scales atol by sum(u) * sum(v),
so the default atol=1e-5 lets a backward that is 5% off pass on a few thousand elements
(measured: tests/test_gradcheck_tolerance.py). Specs with a ``surrogate`` (straight-through
estimators) are instead compared with the surrogate's autograd gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract, float64
from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import (
    blocked_by_undeclared_writes,
    function_of_tensors,
    run_reference,
)
from conformance.engine.finite_differences import (
    FD_SPACING,
    check_first_derivatives,
    jacobian_mismatch,
    surrogate_mismatch,
    unresolvable_outputs,
)
from conformance.engine.harness import Execution
from conformance.engine.numerics import blocked_by_wrong_values
from conformance.engine.report import fail
from conformance.engine.runner import Target
from conformance.engine.torch_text import (
    gradcheck_input,
    gradcheck_not_reentrant,
    jacobian_pair,
)
from strategies.cases import Case, CaseOptions

# Elements kept FD_SPACING apart and from declared kinks: a central difference across a
# near-tie or a kink has no right answer (see strategies.values.spread).
GRADCHECK_CASES = CaseOptions(dtypes=(torch.float64,), broadcast=True, spacing=FD_SPACING)


def gradcheck_inputs(target: Target, data: st.DataObject, *, spaced: bool = True):  # type: ignore[no-untyped-def]
    case = target.draw_case(data, None if spaced else target.case_options.replace(spacing=0.0))
    args = case.args(dtype=torch.float64)
    wrt_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    return case, args, wrt_positions


def check_gradcheck(target: Target, data: st.DataObject) -> None:
    if target.spec.surrogate is not None:
        check_surrogate(target, data)
        return
    case, args, wrt_positions = gradcheck_inputs(target, data)
    execution = target.preflight(case, dtype=torch.float64)
    if not target.backward_ran(execution):
        return
    unresolvable = unresolvable_outputs(execution.outputs)
    if unresolvable is not None:
        target.not_checked(unresolvable)
        return
    # A case drawn again is not checked again: the pool served these very results (its tensors
    # intact), and the Function is deterministic and draws from no generator, or it would not be kept.
    target.judged_once(execution, "jacobians", lambda: _check_jacobians(target, case, args, wrt_positions, execution))
    target.checked()


def _check_jacobians(target: Target, case: Case, args: list[Any], wrt_positions: list[int], execution: Execution) -> None:
    """Fail unless torch.autograd.gradcheck passes on ``case`` (``execution``: its float64 evaluation)."""
    names = [case.recipes[i].name for i in wrt_positions]
    call = function_of_tensors(case, args, wrt_positions)

    wrt_tensors = tuple(args[i] for i in wrt_positions)
    # A fast-mode mismatch makes torch recompute both Jacobians in slow mode for its message
    # alone: only for the reported example (a 40 x 50 input: 3.7 s -> 0.4 s to the first failure).
    checked = check_first_derivatives(
        call, wrt_tensors, execution.outputs, fast=target.spec.fast_gradcheck, nondeterministic=target.spec.nondeterministic,
        brief=not target.reporting(),
    )
    error, fast, atol, rtol, nondet_tol = checked.error, checked.fast, checked.atol, checked.rtol, checked.nondet_tol
    if error is not None:
        blocked_by_undeclared_writes(case)  # finite differences of a Function that writes into its input
        # Finite differences of a Function that differs from itself judge nothing: determinism's defect.
        target.blocked_by_undeclared_randomness(case)
        blocked_by_wrong_values(execution)  # a NaN Jacobian entry (stability's), a wrong forward (reference's)
        message = str(error)
        reentrancy = (
            "backward is not reentrant: two backward calls on the same graph gave different gradients "
            f"[torch.autograd.gradcheck, float64, nondet_tol={nondet_tol}]"
        )
        if gradcheck_not_reentrant(message):
            # A second backward through one graph that differs: inplace's check (retain_graph=True).
            raise Blocked(Defect("inplace", reentrancy, (message.strip(),)), case)
        # The reported example names the worst Jacobian entry instead of printing both Jacobians.
        located = jacobian_mismatch(call, wrt_tensors, atol=atol, rtol=rtol, pair=jacobian_pair(message)) if target.reporting() else None
        index = located.input if located is not None else gradcheck_input(message)
        argument = names[index] if index is not None else ", ".join(names)
        where = f"[torch.autograd.gradcheck, float64, {'fast' if fast else 'slow'} mode, atol={atol}, rtol={rtol}]"
        returned_none = (
            (f"backward returned None for {argument!r}, which requires grad: the output depends on it, so its "
             "gradient is not zero",) if argument in execution.grads and execution.grads[argument] is None else ()
        )
        if located is None:
            fail(f"analytical grad[{argument!r}] != numerical {where}", *returned_none, message.strip())
        fail(
            f"analytical grad[{argument!r}] != numerical: {located.entry(f'output[{located.output}]', argument)} {where}",
            *returned_none, *located.details(f"output[{located.output}]", repr(argument), "torch.autograd.gradcheck"),
        )


def check_surrogate(target: Target, data: st.DataObject) -> None:
    case, _, _ = gradcheck_inputs(target, data, spaced=False)
    execution = target.preflight(case, dtype=torch.float64)
    if not target.backward_ran(execution):
        return
    assert target.spec.surrogate is not None
    _, expected = run_reference(
        target.spec.surrogate, case, dtype=torch.float64, device=case.device, grad_outputs_from=execution.grad_outputs_before
    )
    mismatch = surrogate_mismatch(execution.grads, expected)
    if mismatch is not None:
        fail(*(part for part in mismatch if part))
    target.checked()


@contract(
    "gradcheck", case=GRADCHECK_CASES, requires=[float64("gradcheck needs float64; the reference contract covers the others")],
    compares_values=True,
)
def test_gradcheck(conformance_target: Target) -> None:
    conformance_target.run(check_gradcheck)
