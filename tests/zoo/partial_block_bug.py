"""A row-sum kernel that forgets the last partial block of columns, and its fixed twin.

Both process each row in blocks of ``BLOCK = 8`` columns, the way a Triton kernel with
``BLOCK_N = 8`` would. Rows of at most one block take a single masked load (correct in both);
longer rows loop over blocks. ``TailDroppingRowSum`` stops the loop at the last *full* block,
so whenever ``n > 8`` and ``n % 8 != 0`` the tail columns are missing from the sum. Its backward
is the textbook one (every column gets grad_output), so forward and backward disagree exactly
there -- gradcheck sees it, but only on sizes that hand-written tests rarely pick.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

BLOCK = 8


def _blocked_row_sum(x: torch.Tensor, *, include_tail: bool) -> torch.Tensor:
    n = x.shape[-1]
    if n <= BLOCK:
        return x.sum(-1)  # the single-block path: one masked load covers the whole row
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    stop = n if include_tail else n - n % BLOCK
    for start in range(0, stop, BLOCK):
        total = total + x[..., start : start + BLOCK].sum(-1)
    return total


class TailDroppingRowSum(torch.autograd.Function):
    """Row sum over the last dim whose multi-block loop drops the final partial block."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return _blocked_row_sum(x, include_tail=False)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return grad_output.unsqueeze(-1).expand(*grad_output.shape, ctx.n).clone()


class BlockedRowSum(torch.autograd.Function):
    """The same blocked row sum with the tail block included: correct."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return _blocked_row_sum(x, include_tail=True)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return grad_output.unsqueeze(-1).expand(*grad_output.shape, ctx.n).clone()


def row_sum_reference(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)


for fn, name in ((TailDroppingRowSum, "tail_dropping_row_sum"), (BlockedRowSum, "blocked_row_sum")):
    register(
        fn,
        name=name,
        inputs=[Tensor("x", "m n")],
        reference=row_sum_reference,
        dtypes=(torch.float64, torch.float32),
    )
