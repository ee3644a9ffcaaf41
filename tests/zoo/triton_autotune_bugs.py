"""An autotuned Triton kernel wrong for one config only, and its correct twin.

``scale_columns`` computes ``out[m, n] = x[m, n] * w[n]`` in (BLOCK_M, BLOCK_N) tiles; backward
reuses it for ``grad_x = g * w``. Three configs: 16x16, 16x32 and 32x16.

* ``triton_autotune_grid_bug``: the launch grid is written ``(cdiv(M, BLOCK_N), cdiv(N, BLOCK_N))``
  -- BLOCK_N typed for both axes. Where BLOCK_N <= BLOCK_M that launches enough row programs
  (masked, so correct); with BLOCK_N > BLOCK_M (the 16x32 config) the rows past
  ``cdiv(M, 32) * 16`` get no program and the ``torch.empty_like`` output keeps them unwritten.
  Autotuning would pick whichever config is fastest on the machine, so the bug shows up on some
  GPUs only; ``register(..., autotune=kernel)`` checks each config as its own test id.
* ``triton_autotune_scale``: the same with the grid written right; every config passes.

Self-contained (importing reference_ops would register the whole catalogue).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Dim, Tensor, register

CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}),
]


def _devices(kernel: Any) -> tuple[str, ...]:
    return ("cpu", "cuda") if "Interpreted" in type(getattr(kernel, "fn", kernel)).__name__ else ("cuda",)


def _scale_columns_kernel() -> Any:
    # One autotuner per Function, so pinning one Function's config never touches the other's.
    @triton.autotune(configs=CONFIGS, key=["M", "N"])
    @triton.jit
    def scale_columns(x_ptr, w_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], x * w[None, :], mask=mask)

    return scale_columns


def _function(kernel: Any, grid: Any, name: str) -> type[torch.autograd.Function]:
    def launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x, w = x.contiguous(), w.contiguous()
        out = torch.empty_like(x)
        if x.numel():
            kernel[grid(x.shape[0], x.shape[1])](x, w, out, x.shape[0], x.shape[1])
        return out

    class ScaleColumns(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return launch(x, w)

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
            x, w = ctx.saved_tensors
            grad_x = launch(grad_output, w) if ctx.needs_input_grad[0] else None
            grad_w = (grad_output * x).sum(0) if ctx.needs_input_grad[1] else None
            return grad_x, grad_w

    ScaleColumns.__name__ = ScaleColumns.__qualname__ = name
    register(
        ScaleColumns,
        name="triton_autotune_grid_bug" if "Bug" in name else "triton_autotune_scale",
        inputs=[Tensor("x", "m n"), Tensor("w", "n")],
        reference=lambda x, w: x * w,
        dtypes=(torch.float64, torch.float32, torch.float16),
        devices=_devices(kernel),
        double_backward=False,
        autotune=kernel,
        dims=[Dim("m", block_sizes=(32,))],  # rows around 32: past one 16-row tile, within a 32-row one
        max_elements=256,
        max_examples=8,
    )
    return ScaleColumns


_buggy = _scale_columns_kernel()
_correct = _scale_columns_kernel()
# BUG: BLOCK_N for the row axis too.
ScaleColumnsGridBug = _function(
    _buggy, lambda m, n: lambda meta: (triton.cdiv(m, meta["BLOCK_N"]), triton.cdiv(n, meta["BLOCK_N"])), "ScaleColumnsGridBug"
)
ScaleColumns = _function(
    _correct, lambda m, n: lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"])), "ScaleColumns"
)
