"""Contract return_count: backward returns one entry per forward input, None for non-tensors.

Trailing extra Nones are tolerated (the engine tolerates them too); anything else is a defect
the engine would report as an opaque "incorrect number of gradients" or let through.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from conformance.harness import execute
from conformance.report import describe_value, fail
from conformance.runner import Target


def check_return_count(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    execution = execute(case)
    if not execution.recorder.calls:
        if execution.backward_error is not None:
            raise execution.backward_error
        return  # nothing required grad through a differentiable output: nothing to check
    call = execution.recorder.last
    if call.raw is None:
        raise call.error or AssertionError("backward neither returned nor raised")
    raw = call.raw
    names = [r.name for r in case.recipes]
    returned = ", ".join(describe_value(v) for v in raw)
    where = f"{target.spec.fn.__qualname__}.backward, forward inputs {names}"
    if len(raw) < len(names):
        fail(
            f"len(backward return)={len(raw)}, but should be {len(names)} [{where}]",
            f"backward returned ({returned}); the gradient for {names[len(raw):]} is missing.",
            "Return one entry per forward input (None where there is no gradient).",
        )
    extra = [(i, v) for i, v in enumerate(raw[len(names):], start=len(names)) if v is not None]
    if extra:
        fail(
            f"len(backward return)={len(raw)}, but should be {len(names)} [{where}]",
            f"backward returned ({returned}); entries {[i for i, _ in extra]} go beyond the "
            f"{len(names)} forward inputs and are not None.",
        )
    for recipe, value in zip(case.recipes, raw):
        if recipe.kind != "tensor" and value is not None:
            fail(
                f"grad[{recipe.name!r}]={describe_value(value)}, but should be None [{where}]",
                f"{recipe.name!r} is a {recipe.kind} input (not differentiable); backward must return None for it.",
                f"backward returned ({returned}).",
            )
        if recipe.kind == "tensor" and value is not None and not isinstance(value, torch.Tensor):
            fail(
                f"grad[{recipe.name!r}]={describe_value(value)}, but should be a Tensor or None [{where}]",
                f"backward returned ({returned}).",
            )
    if execution.backward_error is not None:
        raise execution.backward_error


def test_return_count(conformance_target: Target) -> None:
    conformance_target.run(check_return_count)
