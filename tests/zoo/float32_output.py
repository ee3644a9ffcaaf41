"""Functions whose output is float32 whatever their input's dtype (an upcasting kernel, a loss that
always returns float32): finite differences in float64 cannot check them, the reference contract can.

``float32_output`` is correct; ``float32_output_doubled_grad`` returns twice the gradient."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

FLOATS = (torch.float64, torch.float32)


class Float32Output(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.input_dtype = x.dtype
        return x.float() * 3

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return (grad_output * 3).to(ctx.input_dtype)


class Float32OutputDoubledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.input_dtype = x.dtype
        return x.float() * 3

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return (grad_output * 6).to(ctx.input_dtype)


register(Float32Output, name="float32_output", inputs=[Tensor("x", "*batch n")], reference=lambda x: x.float() * 3, dtypes=FLOATS)
register(
    Float32OutputDoubledGrad, name="float32_output_doubled_grad", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x.float() * 3, dtypes=FLOATS,
)
