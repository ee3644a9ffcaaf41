"""Linear algebra and broadcasting: transposed products, and gradients reduced to input shapes.

Seed patterns shown:

* ``Linear`` -- seed 004 ``MyLinearFunction`` / seed 002 ``CustomLinear`` (``x @ W.T + b`` over
  any batch dims, optional ``None`` bias; the bias gradient sums over every batch dim).
* ``LinearReLU`` -- seed 000 ``LinearWithReLUFunction`` (fused; saves a boolean mask instead of
  the pre-activation).
* ``MatMul`` -- seed 002 ``CustomMatmul`` (batched ``a @ b``).
* ``BiasAdd`` -- seed 002 ``CustomBiasAdd`` (per-channel bias on (B, C, H, W); sum over B, H, W).
* ``BroadcastMul`` -- seed 002 ``CustomBroadcastOp`` / ``GeneralBroadcast`` (each gradient summed
  back to its input's exact shape with ``sum_to_size``; the engine would silently do that for
  an unreduced gradient, which is why ``grad_meta`` checks the raw return).
* ``Conv1d`` -- seed 002 ``CustomConv1d`` (``torch.nn.grad.conv1d_input`` / ``conv1d_weight``).

Products accumulate in a wider dtype on contiguous copies (see ``reference_ops._common.upcast``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.grad

from conformance import Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["BiasAdd", "BroadcastMul", "Conv1d", "Linear", "LinearReLU", "MatMul"]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """Fold every leading dim: (*batch, n) -> (prod(batch), n); reshape copes with any strides."""
    return t.reshape(-1, t.shape[-1])


class Linear(torch.autograd.Function):
    """y = x @ W.T + b over any leading batch dims; b may be None (then it gets None back)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        y = upcast(x) @ upcast(weight).T
        if bias is not None:
            y = y + upcast(bias)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g = upcast(grad_output)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ upcast(weight)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (_flat(g).T @ _flat(upcast(x))).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = _flat(g).sum(0).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias


def _linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x @ weight.T + bias if bias is not None else x @ weight.T


register(
    Linear,
    name="linear",
    inputs=[Tensor("x", "*batch d_in"), Tensor("weight", "d_out d_in"), Tensor("bias", "d_out")],
    reference=_linear_reference,
    dtypes=ALL_FLOATS,
)
# The same Function without a bias: the None argument must get a None gradient back.
register(
    Linear,
    name="linear_nobias",
    inputs=[Tensor("x", "*batch d_in"), Tensor("weight", "d_out d_in"), Scalar("bias", None)],
    reference=_linear_reference,
    dtypes=ALL_FLOATS,
)


class LinearReLU(torch.autograd.Function):
    """y = relu(x @ W.T + b), fused: saves x, W and the boolean mask ``z > 0`` only.

    The mask is piecewise constant in x, so treating it as a constant in double backward is
    exact (away from the kink), unlike a saved float intermediate.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        z = upcast(x) @ upcast(weight).T + upcast(bias)
        mask = z > 0
        ctx.save_for_backward(x, weight, mask)
        ctx.bias_dtype = bias.dtype
        # where, not z * mask: an overflowed z = -inf times 0 would be nan where relu gives 0.
        return torch.where(mask, z, torch.zeros_like(z)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mask = ctx.saved_tensors
        grad_z = upcast(grad_output) * mask
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_z @ upcast(weight)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (_flat(grad_z).T @ _flat(upcast(x))).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = _flat(grad_z).sum(0).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias


register(
    LinearReLU,
    name="linear_relu",
    inputs=[Tensor("x", "*batch d_in"), Tensor("weight", "d_out d_in"), Tensor("bias", "d_out")],
    reference=lambda x, weight, bias: torch.relu(x @ weight.T + bias),
    dtypes=ALL_FLOATS,
)


class MatMul(torch.autograd.Function):
    """c = a @ b over matching batch dims; grad_a = g @ b^T, grad_b = a^T @ g."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return (upcast(a) @ upcast(b)).to(a.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        g = upcast(grad_output)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = (g @ upcast(b).transpose(-1, -2)).to(a.dtype)
        if ctx.needs_input_grad[1]:
            grad_b = (upcast(a).transpose(-1, -2) @ g).to(b.dtype)
        return grad_a, grad_b


register(
    MatMul,
    name="matmul",
    inputs=[Tensor("a", "*batch n k"), Tensor("b", "*batch k m")],
    reference=lambda a, b: a @ b,
    dtypes=ALL_FLOATS,
)


class BiasAdd(torch.autograd.Function):
    """y = x + b[None, :, None, None] on (B, C, H, W); grad_b sums over B, H and W."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x + bias.reshape(1, -1, 1, 1)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_output.clone()  # a copy: returning grad_output itself would alias it
        if ctx.needs_input_grad[1]:
            grad_bias = upcast(grad_output).sum(dim=(0, 2, 3)).to(grad_output.dtype)
        return grad_x, grad_bias


register(
    BiasAdd,
    name="bias_add",
    inputs=[Tensor("x", "b c h w"), Tensor("bias", "c")],
    reference=lambda x, bias: x + bias.reshape(1, -1, 1, 1),
    dtypes=ALL_FLOATS,
)


class BroadcastMul(torch.autograd.Function):
    """y = a * b with numpy broadcasting; each gradient is summed back to its input's shape."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        # sum_to_size drops broadcast leading dims and sums size-1 dims (keepdim), giving the
        # exact input shape; it is differentiable, so double backward still works.
        if ctx.needs_input_grad[0]:
            grad_a = (grad_output * b).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = (grad_output * a).sum_to_size(b.shape)
        return grad_a, grad_b


register(
    BroadcastMul,
    name="broadcast_mul",
    inputs=[Tensor("a", "*batch n", broadcastable=True), Tensor("b", "*batch n", broadcastable=True)],
    reference=lambda a, b: a * b,
    dtypes=ALL_FLOATS,
)


class Conv1d(torch.autograd.Function):
    """y = conv1d(x, w, padding) with gradients from torch.nn.grad.conv1d_input / conv1d_weight.

    Those two are built on ``aten.convolution_backward``, which is itself differentiable, so
    the op is twice differentiable.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, padding: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        return torch.nn.functional.conv1d(x, weight, padding=padding)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        # Under autocast forward ran in bfloat16/float16 while x and weight may be float32:
        # backward computes in their common dtype and returns each gradient in its input's.
        dtype = torch.promote_types(x.dtype, weight.dtype)
        g = grad_output.to(dtype)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.nn.grad.conv1d_input(x.shape, weight.to(dtype), g, padding=ctx.padding).to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.nn.grad.conv1d_weight(x.to(dtype), weight.shape, g, padding=ctx.padding).to(weight.dtype)
        return grad_x, grad_weight, None


register(
    Conv1d,
    name="conv1d",
    # Kernel size 3 with padding 1 keeps the length, so every drawn length l >= 1 is valid.
    inputs=[Tensor("x", "b c_in l"), Tensor("weight", "c_out c_in 3"), Scalar("padding", 1)],
    reference=lambda x, weight, padding: torch.nn.functional.conv1d(x, weight, padding=padding),
    dtypes=ALL_FLOATS,
)
