"""A backward 5% off on a tensor big enough for gradcheck's fast mode; a backward that changes
its own state between calls (not reentrant) and its twin, whose calls differ by rounding only."""

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


class CountingScale(torch.autograd.Function):
    """Scales by a factor it keeps on ctx and bumps on every backward call (a "running" buffer
    updated in place): a second backward through the same graph gives another gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.calls = 0
        return 3 * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        ctx.calls += 1
        return grad_output * (3 + 1e-3 * (ctx.calls - 1))


register(CountingScale, name="counting_scale", inputs=[Tensor("x", "n")], reference=lambda x: 3 * x)


class ShuffledRowSum(torch.autograd.Function):
    """y = (x @ w).sum(0); backward sums x's rows in a fresh random order on each call, as atomic
    adds do: two calls agree to rounding, which is determinism's finding, not gradcheck's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return (x @ w).sum(0)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        column_sums = torch.zeros_like(x[0])
        for row in torch.randperm(x.shape[0], device=x.device).tolist():
            column_sums = column_sums + x[row]
        return (w @ grad_output).expand_as(x), torch.outer(column_sums, grad_output)


register(
    ShuffledRowSum, name="shuffled_row_sum", inputs=[Tensor("x", "m k"), Tensor("w", "k n")],
    reference=lambda x, w: (x @ w).sum(0),
)
