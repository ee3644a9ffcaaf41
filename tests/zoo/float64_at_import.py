"""A spec module that sets torch's default dtype to float64 at import ("for accuracy").

Loaded before another --impl target, it must change nothing about that target's examples
(masks, values) or verdicts (tests/test_global_state.py).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Mask, Tensor, register

torch.set_default_dtype(torch.float64)


class MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(keep)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad_output * keep * 2, None


register(
    MaskedScale,
    name="masked_scale_float64_module",
    inputs=[Tensor("x", "*batch n"), Mask("keep", "*batch n")],
    reference=lambda x, keep: x * keep * 2,
)
