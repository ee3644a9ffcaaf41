"""Known-buggy Triton kernels: mistakes that are easy to make in a hand-written kernel.

* ``triton_grad_into_input``: the backward kernel stores grad_x into the input's own buffer
  (``tl.store(x_ptr, ...)``) to save an allocation and returns that buffer. The gradient values
  are right, but the caller's ``x`` is overwritten behind autograd's back: a raw-pointer write
  does not bump the version counter. The ``inplace`` contract must catch it.
* ``triton_dropped_tail``: the backward kernel uses a fixed ``BLOCK = 8``, no tail mask and
  ``grid = numel // 8``, so the last partial block is never written (its gradient stays 0).
  ``gradcheck`` and ``reference`` must catch it whenever ``numel % 8 != 0``.

Run with ``--impl=tests/zoo/triton_bugs.py``; the plugin selects the interpreter when CUDA is
absent before this file is imported.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Tensor, register

# Self-contained on purpose: importing reference_ops here would register (and test) all of it.
BLOCK = 128


def kernel_devices(kernel: Any) -> tuple[str, ...]:
    """The interpreter runs CPU tensors; a natively compiled kernel needs CUDA ones."""
    return ("cpu", "cuda") if type(kernel).__name__ == "InterpretedFunction" else ("cuda",)


def launch_grid(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    if all(g > 0 for g in grid):
        kernel[grid](*args, **meta)


@triton.jit
def _gated_fwd(x_ptr, gate_ptr, y_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, x / (1.0 + tl.exp(-gate)), mask=mask)


# ----------------------------------------------------------------- gradient stored into x


@triton.jit
def _gated_bwd_into_x(x_ptr, gate_ptr, g_ptr, dgate_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
    s = 1.0 / (1.0 + tl.exp(-gate))
    tl.store(dgate_ptr + offsets, g * x * s * (1.0 - s), mask=mask)
    tl.store(x_ptr + offsets, g * s, mask=mask)  # BUG: "reuse" x's buffer for grad_x


class GradIntoInput(torch.autograd.Function):
    """x * sigmoid(gate) whose backward overwrites x with grad_x and returns x's buffer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x1, gate1 = x.detach().contiguous(), gate.detach().contiguous()
        y = torch.empty_like(x1)
        launch_grid(_gated_fwd, (triton.cdiv(x1.numel(), BLOCK),), x1, gate1, y, x1.numel(), BLOCK=BLOCK)
        ctx.save_for_backward(x, gate)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, gate = ctx.saved_tensors
        x1, gate1, g1 = x.contiguous(), gate.contiguous(), grad_output.contiguous()
        dgate = torch.empty_like(gate1)
        launch_grid(_gated_bwd_into_x, (triton.cdiv(x1.numel(), BLOCK),), x1, gate1, g1, dgate, x1.numel(), BLOCK=BLOCK)
        return x1.view(x.shape), dgate.view(gate.shape)


register(
    GradIntoInput,
    name="triton_grad_into_input",
    inputs=[Tensor("x", "*batch n"), Tensor("gate", "*batch n")],
    reference=lambda x, gate: x * torch.sigmoid(gate),
    dtypes=(torch.float64, torch.float32),
    devices=kernel_devices(_gated_bwd_into_x),
    double_backward=False,
)

# ----------------------------------------------------------------- last partial block dropped


@triton.jit
def _relu2_fwd(x_ptr, y_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    r = tl.maximum(x, 0.0)
    tl.store(y_ptr + offsets, r * r, mask=mask)


@triton.jit
def _relu2_bwd_no_tail(x_ptr, g_ptr, dx_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # BUG: no mask; grid drops the tail
    x = tl.load(x_ptr + offsets)
    g = tl.load(g_ptr + offsets)
    tl.store(dx_ptr + offsets, 2.0 * tl.maximum(x, 0.0) * g)


class DroppedTail(torch.autograd.Function):
    """Squared ReLU whose backward launches ``numel // 8`` programs of 8: the tail is never written."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x1 = x.detach().contiguous()
        y = torch.empty_like(x1)
        launch_grid(_relu2_fwd, (triton.cdiv(x1.numel(), 128),), x1, y, x1.numel(), BLOCK=128)
        ctx.save_for_backward(x)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        x1, g1 = x.contiguous(), grad_output.contiguous()
        dx = torch.zeros_like(x1)  # zeros, so the unwritten tail is a deterministic 0
        launch_grid(_relu2_bwd_no_tail, (x1.numel() // 8,), x1, g1, dx, BLOCK=8)
        return dx.view(x.shape)


register(
    DroppedTail,
    name="triton_dropped_tail",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.relu(x) ** 2,
    dtypes=(torch.float64, torch.float32),
    devices=kernel_devices(_relu2_bwd_no_tail),
    double_backward=False,
)
