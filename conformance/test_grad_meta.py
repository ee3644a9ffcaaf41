"""Contract grad_meta: each raw gradient has exactly its input's shape, dtype and device.

Checked on what backward returned, before the engine sums an expandable shape (an unreduced
broadcast gradient) or casts a dtype -- both of which gradcheck lets through.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from conformance.harness import execute
from conformance.report import fail
from conformance.runner import Target


def check_grad_meta(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data, broadcast=True)  # broadcastable inputs get size-1 and missing dims
    execution = execute(case)
    if not execution.recorder.calls:
        if execution.backward_error is not None:
            raise execution.backward_error
        return
    call = execution.recorder.last
    if call.raw is None:
        raise call.error or AssertionError("backward neither returned nor raised")
    if len(call.raw) < len(case.recipes) or any(g is not None for g in call.raw[len(case.recipes):]):
        return  # a wrong count is return_count's finding; the engine refused the gradients anyway
    fn_name = target.spec.fn.__qualname__
    for recipe, arg, grad in zip(case.recipes, execution.args, call.raw):
        if not isinstance(grad, torch.Tensor) or not isinstance(arg, torch.Tensor):
            continue
        where = f"{fn_name}.backward, input {recipe.name!r}"
        if tuple(grad.shape) != tuple(arg.shape):
            hint = ""
            try:
                torch.broadcast_shapes(tuple(grad.shape), tuple(arg.shape))
                if len(grad.shape) >= len(arg.shape):
                    hint = (
                        "The gradient looks unreduced over broadcast dims: sum it over the dims that "
                        "were broadcast (e.g. grad.sum_to_size(input.shape)). The autograd engine "
                        "silently does this for you, which hides the bug from gradcheck."
                    )
            except RuntimeError:
                pass
            fail(f"grad[{recipe.name!r}].shape={tuple(grad.shape)}, but should be {tuple(arg.shape)} [{where}]", hint)
        if grad.dtype != arg.dtype:
            fail(
                f"grad[{recipe.name!r}].dtype={grad.dtype}, but should be {arg.dtype} [{where}]",
                "The autograd engine silently casts it, losing precision or wasting memory; a buffer made "
                "with torch.zeros(shape) instead of torch.zeros_like(input) is the usual cause.",
            )
        if grad.device != arg.device:
            fail(f"grad[{recipe.name!r}].device={grad.device}, but should be {arg.device} [{where}]")
    if execution.backward_error is not None:
        raise execution.backward_error


def test_grad_meta(conformance_target: Target) -> None:
    conformance_target.run(check_grad_meta)
