"""Correct Functions with code no drawn example can reach: --author-coverage must name it.

* ``chunked_sum`` -- backward takes a chunked path only for inputs over a million elements, far
  beyond any element budget: the branch and its helper never run.
* ``scaled_rows`` -- every line and branch runs on ordinary examples (nothing to report).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from conformance import Tensor, register

CHUNK = 4096


def _chunked_expand(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    out = g.new_empty(shape)
    for start in range(0, shape[-1], CHUNK):
        out[..., start : start + CHUNK] = g.unsqueeze(-1)
    return out


class ChunkedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return x.sum(-1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if math.prod(ctx.shape) > 1 << 20:  # only inputs over a million elements
            return _chunked_expand(g, ctx.shape)
        return g.unsqueeze(-1).expand(ctx.shape).clone()


register(ChunkedSum, name="chunked_sum", inputs=[Tensor("x", "*batch n")], reference=lambda x: x.sum(-1))


class ScaledRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


register(ScaledRows, name="scaled_rows", inputs=[Tensor("x", "*batch n")], reference=lambda x: 2 * x)
