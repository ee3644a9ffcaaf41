"""Known-buggy Functions for the core contracts (return_count, grad_meta, gradcheck).

Each is registered under a name saying what is wrong; the meta-tests run the plugin on this
file and check that exactly the intended contract fails, with a message that says why.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Scalar, Tensor, register


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x @ weight.T + bias


class TooFewGrads(torch.autograd.Function):
    """Returns a gradient for x only, forgetting the scale argument's None."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return (grad_output * ctx.scale,)


class ExtraGrad(torch.autograd.Function):
    """Returns one more non-None gradient than forward has inputs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return grad_output * 3, grad_output


class UnreducedBiasGrad(torch.autograd.Function):
    """Returns grad_output (B, D) as the gradient of a (D,) bias: the engine sums it silently."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        x, weight = ctx.saved_tensors
        return grad_output @ weight, grad_output.T @ x, grad_output


class WrongDtypeGrad(torch.autograd.Function):
    """Accumulates the gradient in torch.zeros(shape): float32 whatever the input's dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        grad = torch.zeros(x.shape)
        grad += 2 * x * grad_output
        return grad


class MissingTranspose(torch.autograd.Function):
    """Linear whose weight gradient forgets a transpose (square weight, so shapes still fit)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        x, weight = ctx.saved_tensors
        return grad_output @ weight, x.T @ grad_output, grad_output.sum(0)


register(TooFewGrads, name="too_few_grads", inputs=[Tensor("x", "n"), Scalar("scale", 2.0)], reference=lambda x, scale: x * scale)
register(ExtraGrad, name="extra_grad", inputs=[Tensor("x", "n")], reference=lambda x: x * 3)
register(
    UnreducedBiasGrad,
    name="unreduced_bias_grad",
    inputs=[Tensor("x", "b d_in"), Tensor("weight", "d_out d_in"), Tensor("bias", "d_out")],
    reference=linear_reference,
)
register(WrongDtypeGrad, name="wrong_dtype_grad", inputs=[Tensor("x", "n")], reference=lambda x: x * x)
register(
    MissingTranspose,
    name="missing_transpose",
    inputs=[Tensor("x", "b d"), Tensor("weight", "d d"), Tensor("bias", "d")],
    reference=linear_reference,
)


class UnreducedBroadcastMul(torch.autograd.Function):
    """a * b with numpy broadcasting whose gradients are not summed back to the inputs' shapes."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        a, b = ctx.saved_tensors
        return grad_output * b, grad_output * a


register(
    UnreducedBroadcastMul,
    name="unreduced_broadcast_mul",
    inputs=[Tensor("a", "*batch n", broadcastable=True), Tensor("b", "*batch n", broadcastable=True)],
    reference=lambda a, b: a * b,
)
