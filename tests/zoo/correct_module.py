"""A correct external Function registered from an importable module (used as --impl=correct_module)."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Scalar, Tensor, register


class ScaledTanh(torch.autograd.Function):
    """y = tanh(x) * scale; saves the input, so backward stays differentiable (twice)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.tanh(x) * scale

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        y = torch.tanh(x)
        return grad_output * ctx.scale * (1 - y * y), None


register(
    ScaledTanh,
    name="scaled_tanh",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 1.5)],
    reference=lambda x, scale: torch.tanh(x) * scale,
    dtypes=(torch.float64, torch.float32),
)
