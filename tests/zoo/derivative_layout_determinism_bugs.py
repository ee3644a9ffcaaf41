"""Known-buggy Functions for the behavioural contracts gradgradcheck, layouts and determinism.

Each passes gradcheck (most also the other contracts) and is registered under a name saying
what is wrong; the meta-tests check that the intended contract fails with a message that says why.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Tensor, register

FLOATS = (torch.float64, torch.float32)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


# ----------------------------------------------------------------------------- gradgradcheck


class SavedIntermediateSiLU(torch.autograd.Function):
    """x * sigmoid(x) saving sigmoid(x) from forward: a constant to double backward.

    First derivatives are right (gradcheck passes); the second derivative misses every term
    through sigmoid(x), silently.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        x, s = ctx.saved_tensors
        return grad_output * (s + x * s * (1 - s))


class DetachInBackward(torch.autograd.Function):
    """x^2 whose backward uses x.detach(): d(grad)/dx is silently None (treated as zero)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x.detach() * grad_output


class NoGradBackward(torch.autograd.Function):
    """x^2 whose backward runs under torch.no_grad(), declared twice differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.no_grad():
            return 2 * x * grad_output


class SilentOnceDifferentiable(torch.autograd.Function):
    """Declared double_backward=False, but without @once_differentiable: double backward runs
    and silently returns a wrong second derivative (x is detached)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x.detach() * grad_output


class SilentNoGradOnceDifferentiable(torch.autograd.Function):
    """Declared double_backward=False, backward under no_grad: the gradient silently carries no
    graph, so a gradient penalty built on it contributes nothing, without an error."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.no_grad():
            return 2 * x * grad_output


register(SavedIntermediateSiLU, name="saved_intermediate_silu", inputs=[Tensor("x", "*batch n")], reference=_silu, dtypes=FLOATS)
register(DetachInBackward, name="detach_in_backward", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x, dtypes=FLOATS)
register(NoGradBackward, name="no_grad_backward", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x, dtypes=FLOATS)
register(
    SilentOnceDifferentiable,
    name="silent_once_differentiable",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * x,
    dtypes=FLOATS,
    double_backward=False,
)
register(
    SilentNoGradOnceDifferentiable,
    name="silent_no_grad_once_differentiable",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * x,
    dtypes=FLOATS,
    double_backward=False,
)



class InplaceInBackward(torch.autograd.Function):
    """exp(x), whose backward scales a fresh exp(x) by grad_output in place: right once, but under
    create_graph=True autograd saved that exp(x) for its own derivative, so double backward raises
    (the tensor was modified by an inplace operation), and the spec declares it twice differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.exp(x).mul_(grad_output)


class InplaceInBackwardOnce(InplaceInBackward):
    """The same backward, declared: double_backward=False and @once_differentiable (correct)."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.exp(x).mul_(grad_output)


register(InplaceInBackward, name="inplace_in_backward", inputs=[Tensor("x", "*batch n")], reference=torch.exp, dtypes=FLOATS)
register(
    InplaceInBackwardOnce, name="inplace_in_backward_once", inputs=[Tensor("x", "*batch n")], reference=torch.exp,
    dtypes=FLOATS, double_backward=False,
)

# ----------------------------------------------------------------------------- layouts


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """What a kernel indexing data_ptr as ``i * n + j`` sees: storage read with contiguous strides."""
    return torch.as_strided(t, t.shape, _contiguous_strides(t.shape), t.storage_offset())


class StorageReadScale(torch.autograd.Function):
    """y = x * w (w per column), with forward reading x's memory as if it were contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        flat_x = _as_if_contiguous(x)
        ctx.save_for_backward(flat_x, w)
        return flat_x * w

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad_output * w, (grad_output * x).sum(0)


class ContiguousGradOutputAssumed(torch.autograd.Function):
    """y = x^2 whose backward reads grad_output's memory as if it were contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * _as_if_contiguous(grad_output)


register(
    StorageReadScale,
    name="storage_read_scale",
    inputs=[Tensor("x", "m n"), Tensor("w", "n")],
    reference=lambda x, w: x * w,
    dtypes=FLOATS,
)
register(
    ContiguousGradOutputAssumed,
    name="contiguous_grad_output_assumed",
    inputs=[Tensor("x", "m n")],
    reference=lambda x: x * x,
    dtypes=FLOATS,
)


# ----------------------------------------------------------------------------- determinism


class UndeclaredNoise(torch.autograd.Function):
    """y = 2x plus a little Gaussian noise from torch's global RNG, not declared nondeterministic."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1e-3 * torch.randn_like(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * grad_output


class NoisyBackward(torch.autograd.Function):
    """y = 2x with a gradient perturbed by noise (e.g. stochastic rounding), undeclared."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * grad_output * (1 + 1e-6 * torch.randn_like(grad_output))


register(UndeclaredNoise, name="undeclared_noise", inputs=[Tensor("x", "*batch n")], reference=lambda x: 2 * x, dtypes=FLOATS)
register(NoisyBackward, name="noisy_backward", inputs=[Tensor("x", "*batch n")], reference=lambda x: 2 * x, dtypes=FLOATS)


def _keep_mask(x: torch.Tensor) -> torch.Tensor:
    """Dropout's keep mask (p = 0.5) from float64 uniforms: the same sample in every dtype."""
    return (torch.rand(x.shape, dtype=torch.float64, device=x.device) > 0.5).to(x.dtype)


class DropoutFreshMaskInBackward(torch.autograd.Function):
    """Declared-random dropout whose backward draws a new mask instead of reusing forward's: its
    gradient belongs to another sample (the correct twin, dropout_saved_mask, saves the mask)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * _keep_mask(x) * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * _keep_mask(grad_output) * 2


register(
    DropoutFreshMaskInBackward, name="dropout_fresh_mask_in_backward", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * _keep_mask(x) * 2, dtypes=FLOATS, nondeterministic=True,
)
