"""RMSNorm and LayerNorm over the last dim: Triton forward and backward kernels.

Forward: one program per block of ``ROWS_PER_BLOCK`` rows, a ``(ROWS_PER_BLOCK, BLOCK_D)`` tile
with ``BLOCK_D = next_power_of_2(d)`` lanes masked to ``d`` and the rows past the last masked
out (the last row block is partial unless ``n_rows % ROWS_PER_BLOCK == 0``); it writes the normalised rows
and each row's statistics (rstd; mean and rstd for LayerNorm), which are all forward keeps
besides its inputs.

Backward follows the Triton layer-norm tutorial's two-stage weight-gradient reduction, without
its locks: kernel 1 runs one program per group of ``ROWS_PER_GROUP`` rows, writes dx for each of
its rows and that group's partial sums of dweight (and dbias) into one row of an
``(n_groups, d)`` buffer; kernel 2 sums that buffer over the groups, a block of columns per
program. ``n_groups = cdiv(n_rows, ROWS_PER_GROUP)``: the last group is partial whenever
``n_rows % ROWS_PER_GROUP != 0``, and its missing rows are masked out. Deterministic (a fixed
summation order, no atomics). A tile of rows per program rather than a row also keeps the
interpreter (which runs each program's ops in numpy, program after program) about 4x cheaper.

float16 rows are computed in float32 (as fused GPU kernels do) and stored back in the input
dtype; the statistics and partial sums are float32, or float64 for float64 inputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Dim, Scalar, Tensor, register
from reference_ops.triton._common import (
    check_device,
    device_guard,
    kernel_devices,
    kernel_dtypes,
    launch_grid,
    next_power_of_2,
)

__all__ = ["TritonLayerNorm", "TritonRMSNorm", "triton_layer_norm", "triton_rmsnorm"]

ROWS_PER_BLOCK = 4  # rows per forward program
ROWS_PER_GROUP = 4  # rows per backward program, i.e. per partial weight-gradient row
SUM_BLOCK_G = 16  # groups per step of the partial-sum kernel
SUM_BLOCK_D = 64  # columns per program of the partial-sum kernel


def _split_eps(eps: float) -> tuple[float, float]:
    """``eps`` as hi + lo with hi exactly a float32: a compiled kernel receives a Python float as
    a float32 argument, which would round eps for float64 rows; hi + lo restores it there."""
    hi = torch.tensor(eps, dtype=torch.float32).item()
    return hi, float(eps) - hi


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor) -> tuple[int, int]:
    """(rows, d) of x viewed as (-1, d)."""
    return math.prod(x.shape[:-1]), x.shape[-1]


# --------------------------------------------------------------------------- shared kernel


@triton.jit
def _sum_partials(p_ptr, out_ptr, n_groups, d, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[c] = sum over the groups g of p[g, c], BLOCK_D columns per program."""
    cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=p_ptr.dtype.element_ty)
    for start in range(0, n_groups, BLOCK_G):
        groups = (start + tl.arange(0, BLOCK_G)).to(tl.int64)
        mask = (groups[:, None] < n_groups) & col_mask[None, :]
        acc += tl.load(p_ptr + groups[:, None] * d + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)


def _reduce_partials(partial: torch.Tensor, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    """Stage 2: sum the (n_groups, d) partial buffer over groups into a (d,) tensor of ``dtype``."""
    d = partial.shape[1]
    out = torch.empty(d, dtype=dtype, device=partial.device)
    launch_grid(
        _sum_partials,
        (triton.cdiv(d, SUM_BLOCK_D),),
        partial,
        out,
        partial.shape[0],
        d,
        BLOCK_G=SUM_BLOCK_G,
        BLOCK_D=SUM_BLOCK_D,
    )
    return out.view(shape)


# --------------------------------------------------------------------------- RMSNorm


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


class TritonRMSNorm(torch.autograd.Function):
    """y = x * rsqrt(mean(x**2, -1) + eps) * weight; saves x, weight and rstd per row."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        check_device(x, weight)
        n_rows, d = _rows(x)
        x2 = x.detach().contiguous().view(n_rows, d)  # the kernel indexes rows densely
        w = weight.detach().contiguous()
        y2 = torch.empty_like(x2)
        rstd = torch.empty(n_rows, dtype=_acc_dtype(x), device=x.device)
        eps_hi, eps_lo = _split_eps(eps)
        with device_guard(x):
            launch_grid(
                _rmsnorm_fwd,
                (triton.cdiv(n_rows, ROWS_PER_BLOCK),),
                x2,
                w,
                y2,
                rstd,
                n_rows,
                d,
                eps_hi,
                eps_lo,
                BLOCK_ROWS=ROWS_PER_BLOCK,
                BLOCK_D=next_power_of_2(d),
                IS_F64=x.dtype == torch.float64,
            )
        ctx.save_for_backward(x, weight, rstd)  # x as given: a contiguous copy would be extra memory
        return y2.view(x.shape)

    @staticmethod
    @once_differentiable  # the backward is a kernel, not differentiable torch ops
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_rows, d = _rows(x)
        x2 = x.contiguous().view(n_rows, d)
        # grad_output may be transposed, sliced or a stride-0 expanded view: make it dense.
        g2 = grad_output.contiguous().view(n_rows, d)
        w = weight.contiguous()
        n_groups = triton.cdiv(n_rows, ROWS_PER_GROUP)
        dx2 = torch.empty_like(x2) if need_dx else x2  # x2 is a placeholder the kernel never touches
        partial = torch.empty((n_groups, d), dtype=rstd.dtype, device=x.device) if need_dw else rstd
        with device_guard(x):
            launch_grid(
                _rmsnorm_bwd,
                (n_groups,),
                x2,
                w,
                g2,
                rstd,
                dx2,
                partial,
                n_rows,
                d,
                ROWS_PER_GROUP=ROWS_PER_GROUP,
                BLOCK_D=next_power_of_2(d),
                IS_F64=x.dtype == torch.float64,
                COMPUTE_DX=need_dx,
                COMPUTE_DW=need_dw,
            )
            dw = _reduce_partials(partial, weight.dtype, weight.shape) if need_dw else None
        return (dx2.view(x.shape) if need_dx else None), dw, None


def triton_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return TritonRMSNorm.apply(x, weight, eps)  # type: ignore[no-any-return]


def _row_stats_bytes(x: torch.Tensor, per_row: int) -> int:
    """Bytes of ``per_row`` statistics per row of x, in the accumulation dtype."""
    return x[..., 0].numel() * per_row * (8 if x.dtype == torch.float64 else 4)


register(
    TritonRMSNorm,
    name="triton_rmsnorm",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)],
    reference=lambda x, weight, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight,
    dtypes=kernel_dtypes(_rmsnorm_fwd),
    devices=kernel_devices(_rmsnorm_fwd),
    double_backward=False,
    saves=lambda t: _row_stats_bytes(t["x"], 1),  # beyond x and weight: rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,  # interpreted: each evaluation launches kernels (~20 ms)
)


# --------------------------------------------------------------------------- LayerNorm


@triton.jit
def _layer_norm_fwd(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, d, eps_hi, eps_lo,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, IS_F64: tl.constexpr,
):  # fmt: skip
    """A (BLOCK_ROWS, BLOCK_D) tile of rows per program; the last row block may be partial."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < d
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None] * d + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        w = w.to(tl.float32)
        b = b.to(tl.float32)
    # Two passes over the rows held in registers: robust to a large mean.
    mean = tl.sum(x, axis=1) / d
    centered = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / d
    rstd = 1.0 / tl.sqrt((var + eps_hi) + eps_lo)
    y = centered * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _layer_norm_bwd(
    x_ptr, w_ptr, g_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, d,
    ROWS_PER_GROUP: tl.constexpr, BLOCK_D: tl.constexpr, IS_F64: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
):  # fmt: skip
    """One program per group of rows: dx of each row, and the group's partial dw and db rows."""
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
    mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        g = g.to(tl.float32)
        w = w.to(tl.float32)
    xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    if COMPUTE_DX:
        # rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); masked lanes have g = 0
        gw = g * w[None, :]
        c1 = tl.sum(gw * xhat, axis=1) / d
        c2 = tl.sum(gw, axis=1) / d
        dx = rstd[:, None] * (gw - c2[:, None] - xhat * c1[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + group * d + cols, tl.sum(g * xhat, axis=0), mask=col_ok)
    if COMPUTE_DB:
        tl.store(db_partial_ptr + group * d + cols, tl.sum(g, axis=0), mask=col_ok)


class TritonLayerNorm(torch.autograd.Function):
    """y = (x - mean) * rstd * weight + bias over the last dim; saves x, weight, mean and rstd."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        check_device(x, weight, bias)
        n_rows, d = _rows(x)
        x2 = x.detach().contiguous().view(n_rows, d)
        w, b = weight.detach().contiguous(), bias.detach().contiguous()
        y2 = torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=_acc_dtype(x), device=x.device)
        rstd = torch.empty(n_rows, dtype=_acc_dtype(x), device=x.device)
        eps_hi, eps_lo = _split_eps(eps)
        with device_guard(x):
            launch_grid(
                _layer_norm_fwd,
                (triton.cdiv(n_rows, ROWS_PER_BLOCK),),
                x2,
                w,
                b,
                y2,
                mean,
                rstd,
                n_rows,
                d,
                eps_hi,
                eps_lo,
                BLOCK_ROWS=ROWS_PER_BLOCK,
                BLOCK_D=next_power_of_2(d),
                IS_F64=x.dtype == torch.float64,
            )
        ctx.save_for_backward(x, weight, mean, rstd)  # bias is not needed by backward, only its dtype
        ctx.bias_dtype = bias.dtype
        return y2.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        n_rows, d = _rows(x)
        x2 = x.contiguous().view(n_rows, d)
        g2 = grad_output.contiguous().view(n_rows, d)
        w = weight.contiguous()
        n_groups = triton.cdiv(n_rows, ROWS_PER_GROUP)

        def partial_buffer(needed: bool) -> torch.Tensor:  # rstd: a placeholder never touched
            return torch.empty((n_groups, d), dtype=rstd.dtype, device=x.device) if needed else rstd

        dx2 = torch.empty_like(x2) if need_dx else x2
        dw_partial, db_partial = partial_buffer(need_dw), partial_buffer(need_db)
        with device_guard(x):
            launch_grid(
                _layer_norm_bwd,
                (n_groups,),
                x2,
                w,
                g2,
                mean,
                rstd,
                dx2,
                dw_partial,
                db_partial,
                n_rows,
                d,
                ROWS_PER_GROUP=ROWS_PER_GROUP,
                BLOCK_D=next_power_of_2(d),
                IS_F64=x.dtype == torch.float64,
                COMPUTE_DX=need_dx,
                COMPUTE_DW=need_dw,
                COMPUTE_DB=need_db,
            )
            dw = _reduce_partials(dw_partial, weight.dtype, weight.shape) if need_dw else None
            db = _reduce_partials(db_partial, ctx.bias_dtype, weight.shape) if need_db else None
        return (dx2.view(x.shape) if need_dx else None), dw, db, None


def triton_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return TritonLayerNorm.apply(x, weight, bias, eps)  # type: ignore[no-any-return]


register(
    TritonLayerNorm,
    name="triton_layer_norm",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Tensor("bias", "d"), Scalar("eps", 1e-5)],
    reference=lambda x, weight, bias, eps: torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    dtypes=kernel_dtypes(_layer_norm_fwd),
    devices=kernel_devices(_layer_norm_fwd),
    double_backward=False,
    saves=lambda t: _row_stats_bytes(t["x"], 2),  # beyond x and weight: mean and rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,  # interpreted: each evaluation launches kernels (~20 ms)
)
