"""Correct Functions that use the unusual corners of the autograd.Function API.

Every contract must pass these: a contract that fails one of them has a false positive.
Trailing None returns, set_materialize_grads(False) with None handling, a non-differentiable
index output, an in-place op declared with mark_dirty, saving the output instead of the input,
grad_output itself and an expanded view of it returned as gradients, and new-style
setup_context.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Scalar, Tensor, register


class ScaleTrailingNones(torch.autograd.Function):
    """y = x * scale; backward returns two extra trailing Nones (the engine tolerates them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return grad_output * ctx.scale, None, None, None


class NoneAwareTwoOutputs(torch.autograd.Function):
    """(a, b) = (2x, x**2) with set_materialize_grads(False) and None checks in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * x

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor | None, grad_b: torch.Tensor | None) -> torch.Tensor | None:
        (x,) = ctx.saved_tensors
        grad = None
        if grad_a is not None:
            grad = grad_a * 2
        if grad_b is not None:
            grad = grad_b * 2 * x if grad is None else grad + grad_b * 2 * x
        return grad


class MaxWithIndex(torch.autograd.Function):
    """(values, indices) of the max over the last dim; indices marked non-differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = x.max(dim=-1)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.input_shape = x.shape  # a torch.Size, not a tensor
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: torch.Tensor, grad_indices: Any) -> torch.Tensor:
        (indices,) = ctx.saved_tensors
        grad = grad_values.new_zeros(ctx.input_shape)
        return grad.scatter(-1, indices.unsqueeze(-1), grad_values.unsqueeze(-1))


class KeepPositiveWithMask(torch.autograd.Function):
    """(x where positive else 0, the bool mask); the mask marked non-differentiable (seen in a new
    user's trial: gradcheck's finite differences once subtracted the two bool masks and raised)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = x > 0
        ctx.mark_non_differentiable(mask)
        ctx.save_for_backward(mask)
        return x * mask, mask

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, grad_mask: Any) -> torch.Tensor:
        (mask,) = ctx.saved_tensors
        return grad_y * mask


class DoubleInPlace(torch.autograd.Function):
    """x.mul_(2) in place, declared with ctx.mark_dirty (and mutates=["x"] in the spec)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class ExpSavesOutput(torch.autograd.Function):
    """y = exp(x); saves y, not x, since dy/dx = y."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * y


class CopyReturnsGradOutput(torch.autograd.Function):
    """y = x.clone(); backward returns grad_output itself, unmodified."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


class SumExpandsGradOutput(torch.autograd.Function):
    """y = x.sum(-1); backward returns a stride-0 expanded view of grad_output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.input_shape = x.shape
        return x.sum(dim=-1)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output.unsqueeze(-1).expand(ctx.input_shape)


class MulSetupContext(torch.autograd.Function):
    """x * w elementwise, new style: forward without ctx, setup_context saves the inputs."""

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * w

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, w = inputs
        ctx.save_for_backward(x, w)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        grad_x = grad_output * w if ctx.needs_input_grad[0] else None
        grad_w = grad_output * x if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


register(
    ScaleTrailingNones,
    name="scale_trailing_nones",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 1.5)],
    reference=lambda x, scale: x * scale,
)
register(
    NoneAwareTwoOutputs,
    name="none_aware_two_outputs",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: (x * 2, x * x),
)
register(
    MaxWithIndex,
    name="max_with_index",
    inputs=[Tensor("x", "b n")],
    reference=lambda x: tuple(torch.max(x, dim=-1)),
)
register(
    KeepPositiveWithMask,
    name="keep_positive_with_mask",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: (x * (x > 0), x > 0),
)
register(
    DoubleInPlace, name="double_in_place", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 2, mutates=["x"],
    # Correct in eager; torch 2.13's aot_eager gets the gradient of a Function that saves its
    # dirtied input wrong (the compile contract reports it; reference_ops' relu_ waives it too).
    waivers={"compile": "torch.compile bug: a Function saving its mark_dirty input gets wrong compiled gradients"},
)
register(ExpSavesOutput, name="exp_saves_output", inputs=[Tensor("x", "*batch n")], reference=torch.exp)
register(CopyReturnsGradOutput, name="copy_returns_grad_output", inputs=[Tensor("x", "*batch n")], reference=lambda x: x.clone())
register(
    SumExpandsGradOutput,
    name="sum_expands_grad_output",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x.sum(dim=-1),
)
register(
    MulSetupContext,
    name="mul_setup_context",
    inputs=[Tensor("x", "*batch n"), Tensor("w", "*batch n")],
    reference=lambda x, w: x * w,
)
