"""Linear algebra Functions: gradients with transposes and reductions over batch dims."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register


class Linear(torch.autograd.Function):
    """y = x @ W.T + b over any leading batch dims; b's gradient is reduced over all of them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = x @ weight.T
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        return grad_x, grad_weight, grad_bias


register(
    Linear,
    name="linear",
    inputs=[Tensor("x", "*batch d_in"), Tensor("weight", "d_out d_in"), Tensor("bias", "d_out")],
    reference=lambda x, weight, bias: x @ weight.T + bias,
    dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)
