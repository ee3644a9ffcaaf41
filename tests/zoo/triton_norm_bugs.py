"""A known-buggy Triton RMSNorm: the two-stage weight-gradient reduction drops a partial group.

* ``triton_rmsnorm_partial_group_bug``: backward's kernel 1 writes one partial dweight row per
  group of ``ROWS_PER_GROUP = 4`` rows (``cdiv(n_rows, 4)`` of them, the last one partial), but
  the second stage is told ``n_rows // 4`` groups, so it sums the full groups only. dweight
  misses the last ``n_rows % 4`` rows' contributions (all of them when ``n_rows < 4``); dx and
  the forward are right. ``reference`` and ``gradcheck`` must catch it on ``weight`` whenever
  ``n_rows % 4 != 0``.

Run with ``--impl=tests/zoo/triton_norm_bugs.py``; the plugin selects the interpreter when CUDA
is absent before this file is imported.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Dim, Scalar, Tensor, register

# Self-contained on purpose: importing reference_ops here would register (and test) all of it.
ROWS_PER_GROUP = 4
SUM_BLOCK_G = 16
SUM_BLOCK_D = 64


def interpreted(kernel: Any) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def kernel_dtypes(kernel: Any) -> tuple[torch.dtype, ...]:
    """bfloat16 only natively: the interpreter truncates float32 -> bfloat16."""
    dtypes = (torch.float64, torch.float32, torch.float16)
    return dtypes if interpreted(kernel) else (*dtypes, torch.bfloat16)


def kernel_devices(kernel: Any) -> tuple[str, ...]:
    """The interpreter runs CPU tensors; a natively compiled kernel needs CUDA ones."""
    return ("cpu", "cuda") if interpreted(kernel) else ("cuda",)


def launch_grid(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    if all(g > 0 for g in grid):
        kernel[grid](*args, **meta)


def next_power_of_2(n: int) -> int:
    return int(triton.next_power_of_2(max(int(n), 1)))


def _split_eps(eps: float) -> tuple[float, float]:
    hi = torch.tensor(eps, dtype=torch.float32).item()
    return hi, float(eps) - hi


@triton.jit
def _rmsnorm_fwd(
    x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, d, eps_hi, eps_lo,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, IS_F64: tl.constexpr,
):  # fmt: skip
    """A (BLOCK_ROWS, BLOCK_D) tile of rows per program; the last row block may be partial."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # int64: rows * d may exceed 2**31
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < d
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None] * d + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        w = w.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=1) / d  # masked lanes are 0
    rstd = 1.0 / tl.sqrt((mean_sq + eps_hi) + eps_lo)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _rmsnorm_bwd(
    x_ptr, w_ptr, g_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, d,
    ROWS_PER_GROUP: tl.constexpr, BLOCK_D: tl.constexpr, IS_F64: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr,
):  # fmt: skip
    """One program per group of rows: dx of each row, and the group's partial dw row."""
    group = tl.program_id(0).to(tl.int64)
    rows = group * ROWS_PER_GROUP + tl.arange(0, ROWS_PER_GROUP)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows  # the last group is partial unless n_rows % ROWS_PER_GROUP == 0
    col_ok = cols < d
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None] * d + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        g = g.to(tl.float32)
        w = w.to(tl.float32)
    xhat = x * rstd[:, None]  # 0 on masked rows and lanes
    if COMPUTE_DX:
        # d/dx [x * rstd * w] = rstd * (g*w - xhat * mean(g*w * xhat))
        gw = g * w[None, :]
        c = tl.sum(gw * xhat, axis=1) / d
        dx = rstd[:, None] * (gw - xhat * c[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + group * d + cols, tl.sum(g * xhat, axis=0), mask=col_ok)


@triton.jit
def _sum_partials(p_ptr, out_ptr, n_groups, d, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=p_ptr.dtype.element_ty)
    for start in range(0, n_groups, BLOCK_G):
        groups = (start + tl.arange(0, BLOCK_G)).to(tl.int64)
        mask = (groups[:, None] < n_groups) & col_mask[None, :]
        acc += tl.load(p_ptr + groups[:, None] * d + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)


class PartialGroupRMSNorm(torch.autograd.Function):
    """RMSNorm whose dweight reduction sums ``n_rows // 4`` groups: the last partial group is lost."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n_rows, d = math.prod(x.shape[:-1]), x.shape[-1]
        x2 = x.detach().contiguous().view(n_rows, d)
        y2 = torch.empty_like(x2)
        rstd = torch.empty(n_rows, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
        eps_hi, eps_lo = _split_eps(eps)
        launch_grid(
            _rmsnorm_fwd, (triton.cdiv(n_rows, ROWS_PER_GROUP),), x2, weight.detach().contiguous(), y2, rstd,
            n_rows, d, eps_hi, eps_lo, BLOCK_ROWS=ROWS_PER_GROUP, BLOCK_D=next_power_of_2(d),
            IS_F64=x.dtype == torch.float64,
        )  # fmt: skip
        ctx.save_for_backward(x, weight, rstd)
        return y2.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_rows, d = math.prod(x.shape[:-1]), x.shape[-1]
        x2 = x.contiguous().view(n_rows, d)
        g2 = grad_output.contiguous().view(n_rows, d)
        n_groups = triton.cdiv(n_rows, ROWS_PER_GROUP)
        dx2 = torch.empty_like(x2) if need_dx else x2
        partial = torch.empty((n_groups, d), dtype=rstd.dtype, device=x.device) if need_dw else rstd
        launch_grid(
            _rmsnorm_bwd, (n_groups,), x2, weight.contiguous(), g2, rstd, dx2, partial, n_rows, d,
            ROWS_PER_GROUP=ROWS_PER_GROUP, BLOCK_D=next_power_of_2(d), IS_F64=x.dtype == torch.float64,
            COMPUTE_DX=need_dx, COMPUTE_DW=need_dw,
        )  # fmt: skip
        dw = None
        if need_dw:
            dw = torch.empty(d, dtype=weight.dtype, device=x.device)
            full_groups = n_rows // ROWS_PER_GROUP  # BUG: should be n_groups (cdiv): drops the partial group
            launch_grid(
                _sum_partials, (triton.cdiv(d, SUM_BLOCK_D),), partial, dw, full_groups, d,
                BLOCK_G=SUM_BLOCK_G, BLOCK_D=SUM_BLOCK_D,
            )  # fmt: skip
            dw = dw.view(weight.shape)
        return (dx2.view(x.shape) if need_dx else None), dw, None


def triton_rmsnorm_partial_group_bug(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return PartialGroupRMSNorm.apply(x, weight, eps)  # type: ignore[no-any-return]


register(
    PartialGroupRMSNorm,
    name="triton_rmsnorm_partial_group_bug",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)],
    reference=lambda x, weight, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight,
    dtypes=kernel_dtypes(_rmsnorm_fwd),
    devices=kernel_devices(_rmsnorm_fwd),
    double_backward=False,
    saves=lambda t: t["x"][..., 0].numel() * (8 if t["x"].dtype == torch.float64 else 4),  # rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,  # interpreted: each evaluation launches kernels (~20 ms)
)
