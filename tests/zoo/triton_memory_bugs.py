"""Triton kernels with memory defects, each beside its correct twin.

* ``triton_store_past_end``: the forward kernel's store mask is ``offsets <= numel`` (one too
  many), so the last program writes one element past the end of the output buffer, into
  whatever lives next to it. The values returned are right. ``triton_scale`` masks with ``<``.
* ``triton_unwritten_tail``: the backward allocates grad_x with ``torch.empty_like`` and launches
  ``numel // BLOCK`` programs without a tail mask, so the last partial block is never written.
* ``triton_strided_grad_read``: the backward hands grad_output to the kernel as it comes (no
  ``.contiguous()``), so a strided or stride-0 one is read as if it were contiguous, past its end:
  its values change with whatever lies there. layouts' defect alone; the contracts that meet the
  garbage as values differing between calls, or as a poisoned NaN, are blocked by it.

* ``triton_row_sum_load_past_end``: a row sum whose load has no mask, so each row reads up to the
  next power of two: past the row into the next one, and past the last row into whatever lies
  beyond the tensor. out_of_bounds' defect (the results change with the memory around the input);
  the contracts that meet its garbage as wrong values, values differing between calls, or a
  poisoned neighbour's NaN are blocked by it. ``triton_row_sum`` masks the load.

Run with ``--impl=tests/zoo/triton_memory_bugs.py``; without CUDA the plugin selects the
interpreter before this file is imported (it writes out of bounds into torch memory, like a GPU).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Tensor, register

BLOCK = 8  # small: interpreted programs cost milliseconds each


def kernel_devices(kernel: Any) -> tuple[str, ...]:
    """The interpreter runs CPU tensors; a natively compiled kernel needs CUDA ones."""
    return ("cpu", "cuda") if type(kernel).__name__ == "InterpretedFunction" else ("cuda",)


def launch_grid(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    if all(g > 0 for g in grid):
        kernel[grid](*args, **meta)


@triton.jit
def _scale(x_ptr, y_ptr, numel, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < numel, other=0.0)
    tl.store(y_ptr + offsets, x * FACTOR, mask=offsets < numel)


@triton.jit
def _scale_store_past_end(x_ptr, y_ptr, numel, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < numel, other=0.0)
    tl.store(y_ptr + offsets, x * FACTOR, mask=offsets <= numel)  # BUG: one element too many


@triton.jit
def _scale_no_tail(x_ptr, y_ptr, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # BUG: no mask; grid drops the tail
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets) * FACTOR)


def _launch(kernel: Any, x: torch.Tensor, *, full_grid: bool = True) -> torch.Tensor:
    x1 = x.detach().contiguous()
    y = torch.empty_like(x1)
    if full_grid:
        launch_grid(kernel, (triton.cdiv(x1.numel(), BLOCK),), x1, y, x1.numel(), FACTOR=2.0, BLOCK=BLOCK)
    else:
        launch_grid(kernel, (x1.numel() // BLOCK,), x1, y, FACTOR=2.0, BLOCK=BLOCK)
    return y.view(x.shape)


class TritonScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _launch(_scale, x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _launch(_scale, grad_output)


class StorePastEnd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _launch(_scale_store_past_end, x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _launch(_scale, grad_output)


class UnwrittenTail(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _launch(_scale, x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _launch(_scale_no_tail, grad_output, full_grid=False)


class StridedGradRead(TritonScale):  # forward as its twin's
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        grad_x = torch.empty(grad_output.shape, dtype=grad_output.dtype, device=grad_output.device)
        numel = grad_output.numel()  # BUG: grad_output is read as if contiguous, whatever its strides
        launch_grid(_scale, (triton.cdiv(numel, BLOCK),), grad_output, grad_x, numel, FACTOR=2.0, BLOCK=BLOCK)
        return grad_x


@triton.jit
def _row_sum(x_ptr, y_ptr, n, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    start = tl.program_id(0).to(tl.int64) * n
    if MASKED:
        row = tl.load(x_ptr + start + cols, mask=cols < n, other=0.0)
    else:
        row = tl.load(x_ptr + start + cols)  # BUG: no mask: reads BLOCK_N elements of a row of n
    tl.store(y_ptr + tl.program_id(0), tl.sum(row, axis=0))


def _row_sums(ctx: Any, x: torch.Tensor, *, masked: bool) -> torch.Tensor:
    n = x.shape[-1] if x.dim() else 1
    rows = x.detach().contiguous().reshape(-1, n)
    y = torch.empty(rows.shape[0], dtype=x.dtype, device=x.device)
    launch_grid(_row_sum, (rows.shape[0],), rows, y, n, BLOCK_N=triton.next_power_of_2(n), MASKED=masked)
    ctx.shape = x.shape
    return y.reshape(x.shape[:-1])


class TritonRowSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _row_sums(ctx, x, masked=True)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output.unsqueeze(-1).expand(ctx.shape).contiguous()


class RowSumLoadPastEnd(TritonRowSum):  # backward as its twin's
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _row_sums(ctx, x, masked=False)


for fn, name in (
    (TritonRowSum, "triton_row_sum"), (RowSumLoadPastEnd, "triton_row_sum_load_past_end"),
    (TritonScale, "triton_scale"), (StorePastEnd, "triton_store_past_end"), (UnwrittenTail, "triton_unwritten_tail"),
    (StridedGradRead, "triton_strided_grad_read"),
):
    register(
        fn,
        name=name,
        inputs=[Tensor("x", "*batch n")],
        reference=(lambda x: x.sum(-1)) if "row_sum" in name else (lambda x: x * 2.0),
        dtypes=(torch.float64, torch.float32),
        devices=kernel_devices(_scale),
        double_backward=False,
    )
