"""Reductions: the numerically stable log-sum-exp (max shift) of seed 000."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register


class LogSumExp(torch.autograd.Function):
    """log(sum(exp(x), -1)) computed as m + log(sum(exp(x - m))); backward is softmax * g."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        m = x.amax(dim=-1, keepdim=True)
        # An all -inf row would give (-inf) - (-inf) = nan; shift by 0 there instead.
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = m.squeeze(-1) + torch.log(torch.exp(x - m).sum(dim=-1))
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        x, out = ctx.saved_tensors
        return grad_output.unsqueeze(-1) * torch.exp(x - out.unsqueeze(-1))


register(
    LogSumExp,
    name="logsumexp",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.logsumexp(x, dim=-1),
    dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)
