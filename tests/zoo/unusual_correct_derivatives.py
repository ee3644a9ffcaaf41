"""Correct but unusual Functions: each must pass every behavioural contract.

Once-differentiable ops (one by ``@once_differentiable``, one whose backward refuses create_graph
itself, as revtorch's does), a straight-through estimator with a declared surrogate, a random op
declared nondeterministic, and an op whose backward is itself a Function with its own backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

FLOATS = (torch.float64, torch.float32)


class OnceDifferentiableSoftplus(torch.autograd.Function):
    """softplus(x) = log1p(exp(x)); backward is declared once differentiable and says so."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)


register(
    OnceDifferentiableSoftplus,
    name="once_differentiable_softplus",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.nn.functional.softplus,
    dtypes=FLOATS,
    double_backward=False,
)


class SignSTE(torch.autograd.Function):
    """sign(x) forward; straight-through gradient of hardtanh (grad passes where |x| <= 1).

    gradcheck compares the gradient with the declared surrogate; gradgradcheck checks that the
    surrogate gradient is itself differentiated correctly (its second derivative is 0 a.e.).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * (x.abs() <= 1).to(grad_output.dtype)


register(
    SignSTE,
    name="sign_ste_hardtanh",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.sign,
    surrogate=lambda x: x.clamp(-1, 1),
    dtypes=FLOATS,
)


class ScaledRoundSTE(torch.autograd.Function):
    """round(x * s) / s forward; straight-through gradient for x, and an explicit zero gradient for
    the scale s, which the surrogate (x itself) ignores: None there and zeros here are one gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(s)
        return torch.round(x * s) / s

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (s,) = ctx.saved_tensors
        dx = grad_output.clone() if ctx.needs_input_grad[0] else None
        return dx, torch.zeros_like(s) if ctx.needs_input_grad[1] else None


register(
    ScaledRoundSTE,
    name="scaled_round_ste_zero_scale_grad",
    inputs=[Tensor("x", "n"), Tensor("s", "n", domain="positive")],
    reference=lambda x, s: torch.round(x * s) / s,
    surrogate=lambda x, s: x,
    double_backward=False,
)


def _gumbel(logits: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from torch's global RNG (uniform kept away from 0 and 1)."""
    u = torch.rand_like(logits).clamp(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(u))


class GumbelSoftmax(torch.autograd.Function):
    """softmax((logits + Gumbel noise) / tau): random by design, declared nondeterministic."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, tau: float) -> torch.Tensor:
        y = torch.softmax((logits + _gumbel(logits)) / tau, dim=-1)
        ctx.save_for_backward(y)
        ctx.tau = tau
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return (grad_output - (grad_output * y).sum(-1, keepdim=True)) * y / ctx.tau, None


register(
    GumbelSoftmax,
    name="gumbel_softmax_b",
    inputs=[Tensor("logits", "*batch n"), Scalar("tau", 0.5)],
    # Draws its noise the same way, so under the same RNG state it gives the same sample.
    reference=lambda logits, tau: torch.softmax((logits + _gumbel(logits)) / tau, dim=-1),
    dtypes=FLOATS,
    nondeterministic=True,
)


def _keep_mask(x: torch.Tensor) -> torch.Tensor:
    """Dropout's keep mask (p = 0.5) from float64 uniforms: the same sample in every dtype."""
    return (torch.rand(x.shape, dtype=torch.float64, device=x.device) > 0.5).to(x.dtype)


class DropoutSavedMask(torch.autograd.Function):
    """Declared-random dropout that saves forward's mask for backward (the twin of
    dropout_fresh_mask_in_backward, which draws a new one)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        keep = _keep_mask(x)
        ctx.save_for_backward(keep)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (keep,) = ctx.saved_tensors
        return grad_output * keep * 2


register(
    DropoutSavedMask, name="dropout_saved_mask", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * _keep_mask(x) * 2, dtypes=FLOATS, nondeterministic=True,
)


class _CubeBackward(torch.autograd.Function):
    """The backward of Cube as a Function of its own: (x, g) -> 3 x^2 g, with its own backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, grad_output)
        return 3 * x * x * grad_output

    @staticmethod
    def backward(ctx: Any, grad_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, grad_output = ctx.saved_tensors
        return 6 * x * grad_output * grad_grad, 3 * x * x * grad_grad


class Cube(torch.autograd.Function):
    """y = x^3 whose backward is the Function _CubeBackward: proper double backward, explicitly."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _CubeBackward.apply(x, grad_output)


register(Cube, name="cube", inputs=[Tensor("x", "*batch n")], reference=lambda x: x**3, dtypes=FLOATS)


class RefusesGraphInBackward(torch.autograd.Function):
    """x**2 whose backward refuses to be differentiated by asserting, the way revtorch's reversible
    blocks do: under create_graph=True it raises before any double backward. A refusal, as declared."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        assert not grad_output.requires_grad, "double backward is not supported"
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


register(
    RefusesGraphInBackward, name="refuses_graph_in_backward", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x,
    dtypes=FLOATS, double_backward=False,
)



class CentralDifferenceSin(torch.autograd.Function):
    """sin(x) exact; backward by a central difference with step 3e-3 (a stand-in for a derivative that is
    approximate by design: an adjoint ODE solve, an iterative solver's tolerance), ~1.5e-6 relative off.
    Declared with tolerances[float64]; without it the reference contract fails it (tests/test_check.py)."""

    STEP = 3e-3

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        h = CentralDifferenceSin.STEP
        return grad_output * (torch.sin(x + h) - torch.sin(x - h)) / (2 * h)


register(
    CentralDifferenceSin,
    name="approximate_derivative_declared",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.sin,
    dtypes=(torch.float64,),
    double_backward=False,
    tolerances={torch.float64: {"rtol": 1e-5, "atol": 1e-6}},
)
