"""Backward passes that write into grad_output only when it has one particular layout.

Sizes are literal (every dim > 1), so ``.contiguous()`` on a transposed view is a copy unless
grad_output already has the transposed layout: the write reaches the caller's grad_output only
for the grad_output layout that makes the call a no-op. The inplace contract tries every
grad_output layout, so both are caught whatever the output's own layout is.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register


class TransposedOutputInPlaceGrad(torch.autograd.Function):
    """y = (2x).transpose(1, 2), a transposed view; backward doubles grad.transpose(1, 2).contiguous() in place."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        g = grad.transpose(1, 2).contiguous()
        return g.mul_(2)  # BUG: a no-op .contiguous() makes this the caller's grad_output


class ContiguousOutputInPlaceGrad(torch.autograd.Function):
    """y = 2x (contiguous); backward works on grad.transpose(1, 2).contiguous() in place."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        g = grad.transpose(1, 2).contiguous()
        g.mul_(2)  # BUG: in place, and the caller's grad_output when it is stored dims-1-2-swapped
        return g.transpose(1, 2)


register(
    TransposedOutputInPlaceGrad,
    name="transposed_output_in_place_grad",
    inputs=[Tensor("x", "2 3 2 4")],
    reference=lambda x: (x * 2).transpose(1, 2),
)
register(
    ContiguousOutputInPlaceGrad,
    name="contiguous_output_in_place_grad",
    inputs=[Tensor("x", "2 3 2 4")],
    reference=lambda x: x * 2,
)
