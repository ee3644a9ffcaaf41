"""A Triton kernel behind a ``torch.library`` custom op: ``conformance_ref::triton_swiglu``.

``out = silu(a) * b = a * sigmoid(a) * b`` for same-shape ``a`` (gate) and ``b`` (up). Forward
and backward are each one flat kernel over ``numel`` elements in blocks of ``BLOCK`` with a
tail mask (as ``reference_ops.triton.elementwise``); the backward kernel is a second custom op,
``conformance_ref::triton_swiglu_backward``, that writes both gradients in one pass. It has no
autograd formula, so the op is once differentiable: double backward raises.

Why ``custom_op`` and not ``torch.library.triton_op`` + ``wrap_triton``: under the Triton
interpreter (``TRITON_INTERPRET=1``, CPU tensors) a ``triton_op`` runs in eager mode, but its
fake implementation is the Python body itself, and the interpreted kernel is then launched on
FakeTensors: ``opcheck``'s fake-tensor test and ``torch.compile`` fail with "Cannot access data
pointer of Tensor (e.g. FakeTensor ...)" (torch 2.13, triton 3.7; measured). ``custom_op`` is
opaque to tracing and takes an explicit ``register_fake``, so it works both natively and
interpreted.

As for every custom op with ``register_autograd`` (see ``reference_ops.custom_ops``),
``torch.func.grad`` does not work on it (torch 2.13); ``vmap`` of the forward does.

Like the other modules of this package it imports Triton unguarded: the package ``__init__``
imports it only when Triton is installed.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

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

__all__ = ["BLOCK", "triton_swiglu", "triton_swiglu_backward"]

BLOCK = 128  # elements per program; the interpreter pays per program, so not too small


@triton.jit
def _swiglu_fwd(a_ptr, b_ptr, y_ptr, numel, BLOCK: tl.constexpr, IS_F64: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0)
    if not IS_F64:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    y = a * stable_sigmoid(a) * b
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(a_ptr, b_ptr, g_ptr, da_ptr, db_ptr, numel, BLOCK: tl.constexpr, IS_F64: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
    if not IS_F64:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        g = g.to(tl.float32)
    s = stable_sigmoid(a)
    # silu'(a) = s * (1 + a * (1 - s)); a * (1 - s) -> 0 (not nan) as a -> +inf.
    tl.store(da_ptr + offsets, (g * b * (s * (1.0 + a * (1.0 - s)))).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offsets, (g * (a * s)).to(db_ptr.dtype.element_ty), mask=mask)


def _check_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"triton_swiglu: a.shape={tuple(a.shape)} and b.shape={tuple(b.shape)} must match")


@torch.library.custom_op("conformance_ref::triton_swiglu", mutates_args=())
def triton_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for same-shape a and b, one Triton kernel."""
    check_device(a, b)
    _check_shapes(a, b)
    # The kernel indexes flat memory: transposed, sliced or expanded inputs are made dense.
    a1, b1 = a.contiguous(), b.contiguous()
    y = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    with device_guard(a):
        launch_grid(
            _swiglu_fwd, (triton.cdiv(a1.numel(), BLOCK),), a1, b1, y, a1.numel(),
            BLOCK=BLOCK, IS_F64=a.dtype == torch.float64,
        )
    return y


@triton_swiglu.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_shapes(a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.custom_op("conformance_ref::triton_swiglu_backward", mutates_args=())
def triton_swiglu_backward(
    grad_output: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_a, grad_b), both from one Triton kernel."""
    check_device(grad_output, a, b)
    # grad_output may be transposed, sliced or a stride-0 expanded view: make it dense.
    a1, b1, g1 = a.contiguous(), b.contiguous(), grad_output.contiguous()
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    db = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    with device_guard(a):
        launch_grid(
            _swiglu_bwd, (triton.cdiv(a1.numel(), BLOCK),), a1, b1, g1, da, db, a1.numel(),
            BLOCK=BLOCK, IS_F64=a.dtype == torch.float64,
        )
    return da, db


@triton_swiglu_backward.register_fake
def _(grad_output: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(b.shape, dtype=b.dtype, device=b.device)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    # Not differentiable: triton_swiglu_backward is a kernel with no autograd formula of its own.
    a, b = ctx.saved_tensors
    da, db = triton_swiglu_backward(grad_output, a, b)
    # One fused kernel computes both; return only what autograd asked for.
    return (da if ctx.needs_input_grad[0] else None, db if ctx.needs_input_grad[1] else None)


triton_swiglu.register_autograd(_backward, setup_context=_setup_context)

register(
    triton_swiglu,
    name="triton_custom_swiglu",
    inputs=[Tensor("a", "*batch f"), Tensor("b", "*batch f")],
    reference=lambda a, b: torch.nn.functional.silu(a) * b,
    dtypes=kernel_dtypes(_swiglu_fwd),
    devices=kernel_devices(_swiglu_fwd),
    double_backward=False,
    saves="inputs",
    fast_gradcheck=interpreted(_swiglu_fwd),  # each interpreted evaluation is costly
)
