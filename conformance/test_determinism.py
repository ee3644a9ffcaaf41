"""Contract determinism: the same inputs twice give bitwise identical outputs and gradients.

Two calls on fresh copies of the same inputs and grad_outputs, one after the other, with torch's
global RNG left alone: if the Function draws random numbers without declaring it, the second call
sees a different RNG state and the difference shows. (Seeding the RNG identically before each
call would hide exactly that.) Undeclared randomness, reads of uninitialised memory
(``torch.empty`` not fully written), and order-dependent atomics all fail here.

Functions declared ``nondeterministic=True`` (dropout, Gumbel noise, sampling) cannot promise
equal values; for them this contract checks what they can promise: both calls give outputs and
gradients of the same structure, shapes, dtypes and devices.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import execute
from conformance.engine.numerics import blocked_by_reads_outside, same_bits
from conformance.engine.report import describe_value, fail
from conformance.engine.runner import Target
from strategies.cases import Case

ADVICE = (
    "If the Function is random by design (dropout, noise, sampling), declare nondeterministic=True "
    "in register(); otherwise look for torch.rand*/randn* calls, torch.empty buffers that are not "
    "fully written, and atomic accumulation whose order varies."
)


def check_determinism(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    # Both calls are new, never the evaluation pool's: each example starts from the same RNG
    # state, so only two calls made now draw different numbers when the Function draws any.
    first = execute(case)
    require_sound(target.contract, first)
    second = execute(case)
    require_sound(target.contract, second)
    fn_name = target.spec.display_name
    if len(first.outputs) != len(second.outputs):
        fail(f"len(outputs)={len(second.outputs)} on the second call, but {len(first.outputs)} on the first [{fn_name}.forward]")
    exact = not target.spec.nondeterministic
    for position, (a, b) in enumerate(zip(first.outputs, second.outputs)):
        _compare(case, a, b, f"outputs[{position}]", f"{fn_name}.forward", exact)
    if set(first.grads) != set(second.grads):
        fail(f"gradients for {sorted(second.grads)} on the second call, but for {sorted(first.grads)} on the first")
    for name in first.grads:
        _compare(case, first.grads[name], second.grads[name], f"grad[{name!r}]", f"{fn_name}.backward", exact)
    target.checked()  # every output (and gradient) of both calls compared


def _compare(case: Case, a: Any, b: Any, what: str, where: str, exact: bool) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            fail(f"{what}={describe_value(b)} on the second call, but {describe_value(a)} on the first [{where}]")
        return
    for attribute in ("shape", "dtype", "device"):
        if getattr(a, attribute) != getattr(b, attribute):
            fail(f"{what}.{attribute}={getattr(b, attribute)} on the second call, but {getattr(a, attribute)} on the first [{where}]")
    if not exact or same_bits(b, a):
        return
    blocked_by_reads_outside(case)  # garbage read past a tensor's end differs from call to call: out_of_bounds'
    try:
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)  # for its report of the elements
    except AssertionError as error:
        fail(
            f"{what} differs between two calls with identical inputs [{where}]",
            str(error).strip(),
            ADVICE,
        )


@contract("determinism")
def test_determinism(conformance_target: Target) -> None:
    conformance_target.run(check_determinism)
