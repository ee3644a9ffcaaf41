"""Correct Functions whose results cancel to rounding noise far below their terms.

A plain BatchNorm (no affine, batch statistics) computed directly in the input dtype: on
constant rows its input gradient is exactly 0 in theory, so any two summation orders return
different rounding noise of the size of g / sqrt(eps). A layouts budget scaled only by the
inputs and outputs flags it; the suite must not.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Scalar, Tensor, register


def batch_norm_reference(x: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(0, keepdim=True)
    var = x.var(0, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


class PlainBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        mean = x.mean(0, keepdim=True)
        var = x.var(0, unbiased=False, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x)
        ctx.eps = eps
        return (x - mean) * rstd

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        # Written with differentiable ops on the saved input so it stays twice differentiable.
        mean = x.mean(0, keepdim=True)
        rstd = torch.rsqrt(x.var(0, unbiased=False, keepdim=True) + ctx.eps)
        xhat = (x - mean) * rstd
        n = x.shape[0]
        g = grad_output
        grad = rstd / n * (n * g - g.sum(0, keepdim=True) - xhat * (g * xhat).sum(0, keepdim=True))
        return grad, None


register(
    PlainBatchNorm,
    name="plain_batch_norm",
    inputs=[Tensor("x", "n c"), Scalar("eps", 1e-5)],
    reference=batch_norm_reference,
    dtypes=(torch.float64, torch.float32),
)
