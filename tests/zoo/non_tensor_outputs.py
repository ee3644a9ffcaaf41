"""Functions that return Python numbers beside their tensors (the reference contract).

A kernel that also reports a statistic -- how many units fired, what fraction -- returns it as a
Python int or float next to the activation. The reference returns the same numbers, and the
reference contract compares them: a count equal to the reference's (or to the reference's own
result in the tested dtype), a float within the reference's own error. ``relu_firing_per_row``
reports the largest per-row count instead of the total, a value no tensor comparison sees.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

ALL = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


class ReluFiring(torch.autograd.Function):
    """relu(x), how many elements are positive, and which fraction (Python int and float)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, int, float]:
        ctx.save_for_backward(x)
        firing = x > 0
        return x.clamp(min=0), int(firing.sum()), float(firing.float().mean()) if x.numel() else 0.0

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, _count: Any, _fraction: Any) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * (x > 0).to(grad_output.dtype)


class ReluFiringPerRow(ReluFiring):
    """The count is the largest per-row count, not the total: the tensors are all right."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, int, float]:
        ctx.save_for_backward(x)
        firing = x > 0
        per_row = int(firing.sum(-1).max()) if x.numel() else 0
        return x.clamp(min=0), per_row, float(firing.float().mean()) if x.numel() else 0.0


def relu_firing(x: torch.Tensor) -> tuple[torch.Tensor, int, float]:
    firing = x > 0
    return torch.relu(x), int(firing.sum()), float(firing.double().mean()) if x.numel() else 0.0


for _fn, _name in ((ReluFiring, "relu_firing"), (ReluFiringPerRow, "relu_firing_per_row")):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n", domain="nonzero")], reference=relu_firing, dtypes=ALL)
