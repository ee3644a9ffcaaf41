"""A kernel the Triton interpreter cannot run: it calls ``libdevice.j0`` (a Bessel function),
which has no interpreter fallback. Every contract must say "not run here" and name the
function, never fail the Function for it."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable
from triton.language.extra import libdevice

from conformance import Tensor, register


@triton.jit
def _bessel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, libdevice.j0(x), mask=mask)


class BesselJ0(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        xc = x.contiguous()
        y = torch.empty_like(xc)
        if xc.numel():
            _bessel[(triton.cdiv(xc.numel(), 64),)](xc, y, xc.numel(), BLOCK=64)
        ctx.save_for_backward(xc)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (xc,) = ctx.saved_tensors
        return -grad_output * torch.special.bessel_j1(xc)


register(
    BesselJ0,
    name="triton_bessel_j0",
    inputs=[Tensor("x", "n")],
    reference=torch.special.bessel_j0,
    dtypes=(torch.float64, torch.float32),
    devices=("cpu", "cuda") if "Interpreted" in type(_bessel).__name__ else ("cuda",),
    double_backward=False,
    max_examples=3,
)
