"""Third-party-style Triton norms (Liger/unsloth style): one program per row, the row's statistics
computed with ``libdevice`` on a *scalar* and stored through a scalar pointer
(``tl.store(Rstd + row, rstd)``). Under the interpreter these ran only once libdevice fallbacks
kept a scalar a scalar (issue 28): before, ``libdevice.rsqrt(scalar)`` gave a one-element block
and the store raised, which the suite blamed on the kernel.

Correct (must pass every contract that applies):

* ``triton_scalar_rmsnorm``: ``rstd = libdevice.rsqrt(mean(x*x) + eps)``; backward computes dX
  and per-row dW partials (summed in torch), each only when needed.
* ``triton_scalar_rmsnorm_``: an in-place RMSNorm without weight (``mark_dirty``, declared
  ``mutates=("x",)``); backward needs only the output and rstd.
* ``triton_scalar_layer_norm``: ``rstd = 1 / libdevice.sqrt(var + eps)``, mean and rstd stored
  per row; dW and dB per-row partials summed in torch.

Buggy twins of the RMSNorm:

* ``triton_scalar_rmsnorm_dx_into_dy``: backward writes dX into grad_output's buffer to save
  memory (Liger's ``in_place=True``). grad_output may be shared with other consumers of the
  output; the ``inplace`` contract must catch it.
* ``triton_scalar_rmsnorm_always_dx``: backward computes dX even when only the weight needs a
  gradient: wasted work that ``unneeded_grads`` reports as advice, not a failure.

Run with ``--impl=tests/zoo/triton_scalar_norms.py``; the plugin selects the interpreter when CUDA
is absent before this file is imported.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable
from triton.language.extra import libdevice

from conformance import Dim, Scalar, Tensor, register


def interpreted(kernel: Any) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def kernel_dtypes(kernel: Any) -> tuple[torch.dtype, ...]:
    """bfloat16 only natively: the interpreter truncates float32 -> bfloat16."""
    dtypes = (torch.float64, torch.float32, torch.float16)
    return dtypes if interpreted(kernel) else (*dtypes, torch.bfloat16)


def kernel_devices(kernel: Any) -> tuple[str, ...]:
    return ("cpu", "cuda") if interpreted(kernel) else ("cuda",)


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    """Row statistics and dW partials: float32, float64 for float64 inputs (so gradcheck runs)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def launch(kernel: Any, n_rows: int, *args: Any, **meta: Any) -> None:
    if n_rows > 0:
        kernel[(n_rows,)](*args, **meta)


# --------------------------------------------------------------------------- RMSNorm


@triton.jit
def _rms_norm_fwd(X, W, Y, Rstd, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    if X.dtype.element_ty != tl.float64:
        x = x.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    rstd = libdevice.rsqrt(mean_square + eps)  # a scalar
    tl.store(Rstd + row, rstd)  # through a scalar pointer
    y = x * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * n_cols + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(
    dY, X, W, Rstd, dX, dW_partial, n_cols,
    HAS_WEIGHT: tl.constexpr, X_IS_NORMED: tl.constexpr, COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """One row per program. X_IS_NORMED: X holds x * rstd already (the in-place variant's output)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(dY + row * n_cols + cols, mask=mask, other=0.0)
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    if X.dtype.element_ty != tl.float64:
        dy = dy.to(tl.float32)
        x = x.to(tl.float32)
    rstd = tl.load(Rstd + row)  # a scalar
    xhat = x if X_IS_NORMED else x * rstd
    m = dy
    if HAS_WEIGHT:
        m = dy * tl.load(W + cols, mask=mask, other=0.0).to(dy.dtype)
    if COMPUTE_DX:
        dx = rstd * (m - xhat * (tl.sum(m * xhat, axis=0) / n_cols))
        tl.store(dX + row * n_cols + cols, dx.to(dX.dtype.element_ty), mask=mask)
    if COMPUTE_DW:
        tl.store(dW_partial + row * n_cols + cols, dy * xhat, mask=mask)


def _rms_norm_forward(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1]
    x2 = x.detach().reshape(-1, d).contiguous()
    y2 = torch.empty_like(x2)
    rstd = torch.empty(x2.shape[0], dtype=stats_dtype(x), device=x.device)
    w = weight.detach().contiguous() if weight is not None else x2
    launch(_rms_norm_fwd, x2.shape[0], x2, w, y2, rstd, d, eps, HAS_WEIGHT=weight is not None,
           BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
    return y2.view(x.shape), rstd


def _rms_norm_backward(
    grad_output: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    need_dx: bool, need_dw: bool, dx_into_dy: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    n_rows, d = math.prod(x.shape[:-1]), x.shape[-1]
    x2 = x.reshape(n_rows, d).contiguous()
    dy = grad_output.reshape(n_rows, d).contiguous()  # a view of grad_output when it is contiguous
    dx = dy if dx_into_dy else (torch.empty_like(x2) if need_dx else x2)
    partial = torch.empty((n_rows, d), dtype=rstd.dtype, device=x.device) if need_dw else rstd
    launch(_rms_norm_bwd, n_rows, dy, x2, weight.contiguous(), rstd, dx, partial, d, HAS_WEIGHT=True,
           X_IS_NORMED=False, COMPUTE_DX=need_dx, COMPUTE_DW=need_dw, BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
    dw = partial.sum(0).to(weight.dtype) if need_dw else None
    return (dx.view(x.shape) if need_dx else None), dw


class ScalarRstdRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = _rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        return (*_rms_norm_backward(grad_output, x, weight, rstd, *ctx.needs_input_grad[:2]), None)


class DxIntoDyRMSNorm(ScalarRstdRMSNorm):
    """BUG: backward writes dX into grad_output's buffer (and returns it) to save an allocation."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        return (*_rms_norm_backward(grad_output, x, weight, rstd, need_dx, need_dw, dx_into_dy=need_dx), None)


class AlwaysDxRMSNorm(ScalarRstdRMSNorm):
    """Wasteful: backward computes (and returns) dX even when only the weight needs a gradient."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        return (*_rms_norm_backward(grad_output, x, weight, rstd, True, ctx.needs_input_grad[1]), None)


class InplaceRMSNorm(torch.autograd.Function):
    """x <- x * rsqrt(mean(x*x) + eps) in place; backward from the output (x-hat) and rstd."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        d = x.shape[-1]
        x2 = x.view(-1, d) if x.is_contiguous() else x.reshape(-1, d).contiguous()
        rstd = torch.empty(x2.shape[0], dtype=stats_dtype(x), device=x.device)
        # Y is X: each program loads its row before it stores it.
        launch(_rms_norm_fwd, x2.shape[0], x2, x2, x2, rstd, d, eps, HAS_WEIGHT=False,
               BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
        if not x.is_contiguous():  # the kernel wrote a contiguous copy
            x.copy_(x2.view(x.shape))
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, rstd)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, rstd = ctx.saved_tensors
        n_rows, d = math.prod(y.shape[:-1]), y.shape[-1]
        y2 = y.reshape(n_rows, d).contiguous()
        dy = grad_output.reshape(n_rows, d).contiguous()
        dx = torch.empty_like(y2)
        launch(_rms_norm_bwd, n_rows, dy, y2, y2, rstd, dx, rstd, d, HAS_WEIGHT=False, X_IS_NORMED=True,
               COMPUTE_DX=True, COMPUTE_DW=False, BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
        return dx.view(y.shape), None


def _rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _stats_bytes(x: torch.Tensor, per_row: int) -> int:
    return x[..., 0].numel() * per_row * (8 if x.dtype == torch.float64 else 4)


RMS_NORM_SPEC: dict[str, Any] = dict(
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)],
    reference=_rms_norm_reference,
    dtypes=kernel_dtypes(_rms_norm_fwd),
    devices=kernel_devices(_rms_norm_fwd),
    double_backward=False,
    saves=lambda t: _stats_bytes(t["x"], 1),  # beyond x and weight: rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,  # interpreted: each evaluation launches kernels
)
register(ScalarRstdRMSNorm, name="triton_scalar_rmsnorm", **RMS_NORM_SPEC)
register(DxIntoDyRMSNorm, name="triton_scalar_rmsnorm_dx_into_dy", **RMS_NORM_SPEC)
register(AlwaysDxRMSNorm, name="triton_scalar_rmsnorm_always_dx", **RMS_NORM_SPEC)
register(
    InplaceRMSNorm,
    name="triton_scalar_rmsnorm_",
    inputs=[Tensor("x", "*batch d"), Scalar("eps", 1e-6)],
    reference=lambda x, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps),
    dtypes=kernel_dtypes(_rms_norm_fwd),
    devices=kernel_devices(_rms_norm_fwd),
    double_backward=False,
    mutates=("x",),
    saves=lambda t: _stats_bytes(t["x"], 1),  # beyond the output: rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,
)


# --------------------------------------------------------------------------- LayerNorm


@triton.jit
def _layer_norm_fwd(X, W, B, Y, Mean, Rstd, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    if X.dtype.element_ty != tl.float64:
        x = x.to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / libdevice.sqrt(var + eps)  # a scalar
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0)
    b = tl.load(B + cols, mask=mask, other=0.0)
    y = xc * rstd * w + b
    tl.store(Y + row * n_cols + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_bwd(
    dY, X, W, Mean, Rstd, dX, dW_partial, dB_partial, n_cols,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(dY + row * n_cols + cols, mask=mask, other=0.0)
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    if X.dtype.element_ty != tl.float64:
        dy = dy.to(tl.float32)
        x = x.to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    if COMPUTE_DX:
        wdy = dy * tl.load(W + cols, mask=mask, other=0.0).to(dy.dtype)
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dX + row * n_cols + cols, dx.to(dX.dtype.element_ty), mask=mask)
    if COMPUTE_DW:
        tl.store(dW_partial + row * n_cols + cols, dy * xhat, mask=mask)
    if COMPUTE_DB:
        tl.store(dB_partial + row * n_cols + cols, dy, mask=mask)


class ScalarRstdLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        d = x.shape[-1]
        x2 = x.detach().reshape(-1, d).contiguous()
        y2 = torch.empty_like(x2)
        mean = torch.empty(x2.shape[0], dtype=stats_dtype(x), device=x.device)
        rstd = torch.empty_like(mean)
        launch(_layer_norm_fwd, x2.shape[0], x2, weight.detach().contiguous(), bias.detach().contiguous(), y2,
               mean, rstd, d, eps, BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
        ctx.save_for_backward(x, weight, mean, rstd)
        return y2.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        n_rows, d = math.prod(x.shape[:-1]), x.shape[-1]
        x2 = x.reshape(n_rows, d).contiguous()
        dy = grad_output.reshape(n_rows, d).contiguous()
        dx = torch.empty_like(x2) if need_dx else x2
        dw_partial = torch.empty((n_rows, d), dtype=rstd.dtype, device=x.device) if need_dw else rstd
        db_partial = torch.empty((n_rows, d), dtype=rstd.dtype, device=x.device) if need_db else rstd
        launch(_layer_norm_bwd, n_rows, dy, x2, weight.contiguous(), mean, rstd, dx, dw_partial, db_partial, d,
               COMPUTE_DX=need_dx, COMPUTE_DW=need_dw, COMPUTE_DB=need_db, BLOCK_SIZE=triton.next_power_of_2(d))  # fmt: skip
        return (
            dx.view(x.shape) if need_dx else None,
            dw_partial.sum(0).to(weight.dtype) if need_dw else None,
            db_partial.sum(0).to(weight.dtype) if need_db else None,
            None,
        )


register(
    ScalarRstdLayerNorm,
    name="triton_scalar_layer_norm",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Tensor("bias", "d"), Scalar("eps", 1e-5)],
    reference=lambda x, weight, bias, eps: torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    dtypes=kernel_dtypes(_layer_norm_fwd),
    devices=kernel_devices(_layer_norm_fwd),
    double_backward=False,
    saves=lambda t: _stats_bytes(t["x"], 2),  # beyond x and weight: mean and rstd per row
    dims=[Dim("d", block_sizes=(16,))],
    max_elements=128,
    max_examples=5,
    fast_gradcheck=True,
)
