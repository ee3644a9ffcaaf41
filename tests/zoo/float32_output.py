"""Functions whose output is float32 whatever their input's dtype (an upcasting kernel, a loss that
always returns float32), or float64 holding float32 values (a kernel that computes in float32 and
casts back): finite differences in float64 cannot check them, the reference contract can.

``float32_output`` and ``float32_inside`` are correct; their ``_doubled_grad`` twins return twice
the gradient."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

FLOATS = (torch.float64, torch.float32)


def _float32_times_three(grad_factor: float) -> type[torch.autograd.Function]:
    """y = 3 * x.float(); backward returns ``grad_factor * grad_output`` in x's dtype (3 is right)."""

    class Float32Output(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.input_dtype = x.dtype
            return x.float() * 3

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
            return (grad_output * grad_factor).to(ctx.input_dtype)

    return Float32Output


def _computed_in_float32(grad_factor: float) -> type[torch.autograd.Function]:
    """y = exp(x) computed in float32 and returned in x's dtype (a hurried kernel's float32 path);
    backward returns ``grad_factor * y * grad_output`` (1 is right), also in float32."""

    class Float32Inside(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            y = x.float().exp()
            ctx.save_for_backward(y)
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
            (y,) = ctx.saved_tensors
            return (grad_factor * y * grad_output.float()).to(grad_output.dtype)

    return Float32Inside


def _exp_in_float32(x: torch.Tensor) -> torch.Tensor:
    # What the author declares: exp at float32 precision. Against torch.exp in float64 it would
    # fail float64's rule (assert_close's 1e-7) wherever exp(x) is above ~1, by its precision alone.
    return x.float().exp().to(x.dtype)


for _factor, _name in ((1, "float32_inside"), (2, "float32_inside_doubled_grad")):
    register(_computed_in_float32(_factor), name=_name, inputs=[Tensor("x", "*batch n")], reference=_exp_in_float32, dtypes=FLOATS)


def _reference(x: torch.Tensor) -> torch.Tensor:
    return x.float() * 3


register(_float32_times_three(3), name="float32_output", inputs=[Tensor("x", "*batch n")], reference=_reference, dtypes=FLOATS)
register(
    _float32_times_three(6), name="float32_output_doubled_grad", inputs=[Tensor("x", "*batch n")], reference=_reference,
    dtypes=FLOATS,
)
