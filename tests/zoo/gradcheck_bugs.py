"""A backward 5% off on a tensor big enough for gradcheck's fast mode."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register


class FivePercentOffSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2.1 * x * grad_output


register(FivePercentOffSquare, name="five_percent_off", inputs=[Tensor("x", "40 50")], reference=lambda x: x * x)
