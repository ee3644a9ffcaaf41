"""Functions no spec registers: the ghostwriter (``python -m conformance write``) writes theirs.

* ``RMSNormRowsOnly`` -- a hurried RMSNorm whose weight gradient sums over the first dim only:
  right for 2-D inputs, the wrong shape (and values) with more than one batch dim.
"""

from __future__ import annotations

from typing import Any

import torch


class RMSNormRowsOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        xf, gf = x.float(), g.float()
        xhat = xf * rstd
        gw = gf * weight.float()
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (gf * xhat).sum(0)  # BUG: the batch dims beyond the first are not summed
        return dx.to(x.dtype), dweight.to(weight.dtype), None
