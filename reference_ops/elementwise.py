"""Elementwise Functions: the first patterns every seed teaches (save the input or the output)."""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


class Square(torch.autograd.Function):
    """y = x**2; saves the input (the SquareFunction of every seed)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


register(Square, name="square", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x, dtypes=ALL_FLOATS)


class Sigmoid(torch.autograd.Function):
    """y = 1 / (1 + exp(-x)); saves the output, since dy/dx = y (1 - y)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * y * (1 - y)


register(Sigmoid, name="sigmoid", inputs=[Tensor("x", "*batch n")], reference=torch.sigmoid, dtypes=ALL_FLOATS)


class Swish(torch.autograd.Function):
    """y = x * sigmoid(beta * x) with a learnable scalar beta (a 0-d tensor)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, beta, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, beta, s = ctx.saved_tensors
        ds = s * (1 - s)
        grad_x = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_output * (s + x * beta * ds)
        if ctx.needs_input_grad[1]:
            grad_beta = (grad_output * x * x * ds).sum().reshape(beta.shape)
        return grad_x, grad_beta


register(
    Swish,
    name="swish",
    inputs=[Tensor("x", "*batch n"), Tensor("beta", "", domain=(0.5, 2.0))],
    reference=lambda x, beta: x * torch.sigmoid(beta * x),
    dtypes=ALL_FLOATS,
)
