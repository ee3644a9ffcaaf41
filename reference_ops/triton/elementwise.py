"""A fused two-input elementwise op in Triton: ``y = x * sigmoid(gate)`` (a GLU-style gate).

Forward and backward are single flat kernels over ``numel`` elements in blocks of ``BLOCK``
with a tail mask. The spec is broadcast-free (both inputs have the same shape), which is what
the kernel supports.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Tensor, register
from reference_ops.triton._common import (
    check_device,
    device_guard,
    interpreted,
    kernel_devices,
    kernel_dtypes,
    launch_grid,
    stable_sigmoid,
)

__all__ = ["BLOCK", "TritonGated", "triton_gated"]

BLOCK = 128  # elements per program; the interpreter pays per program, so not too small


@triton.jit
def _gated_fwd(x_ptr, gate_ptr, y_ptr, numel, BLOCK: tl.constexpr, IS_F64: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        gate = gate.to(tl.float32)
    y = x * stable_sigmoid(gate)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_bwd(x_ptr, gate_ptr, g_ptr, dx_ptr, dgate_ptr, numel, BLOCK: tl.constexpr, IS_F64: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
    if not IS_F64:
        x = x.to(tl.float32)
        gate = gate.to(tl.float32)
        g = g.to(tl.float32)
    s = stable_sigmoid(gate)
    tl.store(dx_ptr + offsets, (g * s).to(dx_ptr.dtype.element_ty), mask=mask)
    # x * s * (1 - s) first: s (1 - s) <= 1/4 keeps it in range wherever x is.
    tl.store(dgate_ptr + offsets, (g * (x * s * (1.0 - s))).to(dgate_ptr.dtype.element_ty), mask=mask)


class TritonGated(torch.autograd.Function):
    """x * sigmoid(gate) for same-shape x and gate; saves both inputs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        check_device(x, gate)
        if x.shape != gate.shape:
            raise ValueError(f"triton_gated: x.shape={tuple(x.shape)} and gate.shape={tuple(gate.shape)} must match")
        x1, gate1 = x.detach().contiguous(), gate.detach().contiguous()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        with device_guard(x):
            launch_grid(
                _gated_fwd,
                (triton.cdiv(x1.numel(), BLOCK),),
                x1,
                gate1,
                y,
                x1.numel(),
                BLOCK=BLOCK,
                IS_F64=x.dtype == torch.float64,
            )
        ctx.save_for_backward(x, gate)
        return y

    @staticmethod
    @once_differentiable  # the backward is a kernel, not differentiable torch ops
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, gate = ctx.saved_tensors
        x1, gate1 = x.contiguous(), gate.contiguous()
        # grad_output may be transposed, sliced or a stride-0 expanded view: make it dense.
        g1 = grad_output.contiguous()
        dx, dgate = torch.empty_like(x1), torch.empty_like(gate1)
        with device_guard(x):
            launch_grid(
                _gated_bwd,
                (triton.cdiv(x1.numel(), BLOCK),),
                x1,
                gate1,
                g1,
                dx,
                dgate,
                x1.numel(),
                BLOCK=BLOCK,
                IS_F64=x.dtype == torch.float64,
            )
        # One fused kernel computes both; return only what autograd asked for.
        return (
            dx.view(x.shape) if ctx.needs_input_grad[0] else None,
            dgate.view(gate.shape) if ctx.needs_input_grad[1] else None,
        )


def triton_gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return TritonGated.apply(x, gate)  # type: ignore[no-any-return]


register(
    TritonGated,
    name="triton_gated",
    inputs=[Tensor("x", "*batch n"), Tensor("gate", "*batch n")],
    reference=lambda x, gate: x * torch.sigmoid(gate),
    dtypes=kernel_dtypes(_gated_fwd),
    devices=kernel_devices(_gated_fwd),
    double_backward=False,
    saves="inputs",
    fast_gradcheck=interpreted(_gated_fwd),  # interpreted, slow-mode gradcheck took 10.5 s of the default run
)
