"""Correct Functions whose specs use case-dependent scalars, dim relations and per-spec budgets
(quoted in docs/specs.md): they must pass every contract."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance import Dim, Scalar, Tensor, register


class SoftmaxOverDim(torch.autograd.Function):
    """softmax along a drawn ``dim`` (negative dims included); backward from the saved output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        wide = x.double() if x.dtype != torch.float64 else x
        out = torch.softmax(wide, dim=dim).to(x.dtype)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (out,) = ctx.saved_tensors
        y, g = out.double(), grad_output.double()
        return (y * (g - (g * y).sum(ctx.dim, keepdim=True))).to(grad_output.dtype), None


register(
    SoftmaxOverDim,
    name="softmax_over_dim",
    inputs=[
        Tensor("x", "*batch n"),
        Scalar("dim", from_case=lambda case: st.integers(-case.ndim("x"), case.ndim("x") - 1)),
    ],
    reference=lambda x, dim: torch.softmax(x, dim=dim),
    dims=[Dim("n", block_sizes=(64,))],
    max_elements=256,
    max_examples=5,
    dtypes=(torch.float64, torch.float32, torch.float16),
    saves="inputs_and_outputs",
)


class PrefixDot(torch.autograd.Function):
    """out = sum over the first k elements of x times w (w has k <= n entries)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        k = w.shape[-1]
        return (x[..., :k].double() * w.double()).sum(-1).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        k = w.shape[-1]
        g = grad_output.double().unsqueeze(-1)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
            grad_x[..., :k] = g * w.double()
            grad_x = grad_x.to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (g * x[..., :k].double()).reshape(-1, k).sum(0).to(w.dtype)
        return grad_x, grad_w


register(
    PrefixDot,
    name="prefix_dot",
    inputs=[Tensor("x", "*batch n"), Tensor("w", "k")],
    reference=lambda x, w: (x[..., : w.shape[-1]] * w).sum(-1),
    dims=[Dim("k", max_size="n")],
    dtypes=(torch.float64, torch.float32),
)
