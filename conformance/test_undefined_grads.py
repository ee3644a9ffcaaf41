"""Contract undefined_grads: backward copes with outputs the caller did not use.

When only some outputs of a Function reach the loss, backward receives None for the others if
forward called ``ctx.set_materialize_grads(False)``, and zeros otherwise; non-differentiable
outputs (``ctx.mark_non_differentiable``) never get a real gradient either. For every Function
with more than one tensor output, backward is run with each single differentiable output used
and with each one left out; it must not raise, and its gradients must equal those of a backward
through every output with zero grad_outputs for the unused ones (what "unused" means).

Single-output Functions cannot receive an undefined grad_output (an unused sole output means
backward is never called). Their examples still run forward and count the outputs, and the test
is then skipped with that reason rather than reported as a pass it did not earn.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import execute, gradients_through_outputs
from conformance.engine.harness import differentiable_positions, random_state, why_no_backward
from conformance.engine.numerics import exactly_equal, reordering_tolerance
from conformance.engine.report import describe_value, fail
from conformance.engine.runner import Target


def _used_subsets(positions: list[int], n_tensor_outputs: int) -> list[tuple[int, ...]]:
    """Which differentiable outputs to use: each alone, and each left out (deduplicated)."""
    if len(positions) >= 2:
        singles = [(p,) for p in positions]
        leave_one_out = list(itertools.combinations(positions, len(positions) - 1))
        return list(dict.fromkeys(singles + leave_one_out))
    if len(positions) == 1 and n_tensor_outputs >= 2:
        return [tuple(positions)]  # the others are non-differentiable: always "unused"
    return []


def check_undefined_grads(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    fn_name = target.spec.display_name
    with random_state(target.spec, case):
        execution = execute(case, backward=False)
    require_sound(target.contract, execution)  # forward's return value; see defects.py
    outputs = execution.outputs
    n_tensor_outputs = sum(isinstance(o, torch.Tensor) for o in outputs)
    subsets = _used_subsets(differentiable_positions(outputs), n_tensor_outputs)
    if not subsets:
        if n_tensor_outputs <= 1:
            others = " (its other outputs are not tensors)" if len(outputs) > 1 else ""
            target.not_checked(
                f"{target.spec.name!r} has a single tensor output{others}: an unused sole output means backward is "
                "never called, so no grad_output can be undefined"
            )
        else:
            target.not_checked(why_no_backward(execution))
        return
    target.preflight(case)  # a structural defect blocks this contract; see defects.py
    wrt_names = execution.wrt_names
    del execution
    for used in subsets:
        unused = [p for p in range(len(outputs)) if isinstance(outputs[p], torch.Tensor) and p not in used]
        where = f"{fn_name}.backward, outputs used: {list(used)}, unused: {unused}"
        unused_text = ", ".join(f"output[{p}]" for p in unused)
        grads, call, error = gradients_through_outputs(case, used, zeros_for_unused=False)
        if error is not None:
            received = ", ".join(describe_value(g) for g in call.grad_outputs) if call is not None else "?"
            cause = call.error if call is not None and call.error is not None else error
            fail(
                f"backward raised {type(cause).__name__} when {unused_text} {'was' if len(unused) == 1 else 'were'} "
                f"unused, but should handle {'it' if len(unused) == 1 else 'them'} [{where}]",
                f"{type(cause).__name__}: {cause}",
                f"backward received grad_outputs ({received}).",
                "An output nobody uses gets grad_output None when forward called "
                "ctx.set_materialize_grads(False) (zeros otherwise); non-differentiable outputs never get a "
                "real one. Check `if grad is not None` before using each grad_output, or keep grads "
                "materialized.",
                compares_values=False,
            )
        expected, _, expected_error = gradients_through_outputs(case, used, zeros_for_unused=True)
        if expected_error is not None:
            fail(
                f"backward raised {type(expected_error).__name__} with zero grad_outputs for "
                f"{unused_text}, but should return gradients [{where}]",
                f"{type(expected_error).__name__}: {expected_error}",
                compares_values=False,
            )
        for name, got, want in zip(wrt_names, grads, expected):
            if want is None:
                continue
            actual = got if got is not None else torch.zeros_like(want)
            # Both runs compute the same quantity with the same kernels, except that one may skip
            # adding a zero term: reordering-level differences, nothing more.
            if exactly_equal(actual, want):
                continue
            rtol, atol = reordering_tolerance(case.dtype, want)
            # Compare where the zero-filled run is finite: 0 * inf there is NaN by construction.
            mask = torch.isfinite(want)
            try:
                torch.testing.assert_close(
                    actual.detach()[mask], want.detach()[mask], rtol=rtol, atol=atol,
                    check_dtype=False,
                )
            except AssertionError as mismatch:
                fail(
                    f"grad[{name!r}] with {unused_text} unused != grad with zero grad_outputs for them [{where}]",
                    "An unused output contributes nothing: the gradient must equal the one computed with "
                    "zeros as its grad_output.",
                    str(mismatch),
                )
    target.checked()


@contract("undefined_grads", compares_values=True)
def test_undefined_grads(conformance_target: Target) -> None:
    conformance_target.run(check_undefined_grads)
