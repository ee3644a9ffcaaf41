"""Elementwise Functions: save the input, or save the output, and multiply by the local slope.

Seed patterns shown:

* ``Square`` -- seed 000 ``SquareFunction`` (save the input).
* ``ReLU`` -- seed 001 ``MyReLU`` / seed 002 ``CustomReLU`` (a mask from the saved input).
* ``Sigmoid`` -- seed 004 ``MySigmoid`` / seed 002 ``CustomSigmoid`` (save the *output*).
* ``Tanh`` -- seed 002 ``CustomTanh`` (save the output, ``1 - y**2``).
* ``GELU`` -- seed 002 ``UnnecessaryGELU`` (the exact erf form, written out).
* ``Swish`` -- seed 002 ``SwishFunction`` (a learnable 0-d ``beta``; its gradient is a full sum).
* ``ClippedReLU`` / ``SoftThreshold`` -- seed 003 ``ClippedReLU`` / ``SoftThreshold``.

Kinks: finite differences straddling a kink make ``gradcheck`` fail on a correct op, so the
piecewise ops draw inputs from the ``"nonzero"`` domain (``|x| >= 0.25 * scale``). The kinks at
``clip``/``threshold`` cannot be excluded by a domain; there ``gradcheck`` would only misfire for
an input within 1e-6 of the kink (about 1e-6 per element). In low precision an input can round
*exactly* onto a kink, so each backward uses the same tie convention as its reference's autograd
(``torch.clamp``: inclusive bounds; ``torch.relu``: strict), which makes the verdict independent
of such rounding.

Simple ops compute in the input dtype with exactly the reference's expression (their rounding
error then equals the reference's); GELU computes in a wider dtype (``reference_ops._common.upcast``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from conformance import Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["GELU", "ClippedReLU", "ReLU", "Sigmoid", "SoftThreshold", "Square", "Swish", "Tanh"]


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


class ReLU(torch.autograd.Function):
    """y = max(x, 0); backward multiplies by the mask ``x > 0`` (torch.relu's convention at 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        # A new tensor: never write into grad_output (the seed's ``grad_in[x < 0] = 0`` does so on a clone).
        return grad_output * (x > 0).to(grad_output.dtype)


register(ReLU, name="relu", inputs=[Tensor("x", "*batch n", domain="nonzero")], reference=torch.relu, dtypes=ALL_FLOATS)


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


class Tanh(torch.autograd.Function):
    """y = tanh(x); saves the output, since dy/dx = 1 - y**2."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * (1 - y * y)


register(Tanh, name="tanh", inputs=[Tensor("x", "*batch n")], reference=torch.tanh, dtypes=ALL_FLOATS)

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_reference(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5 * (1 + torch.erf(x * _INV_SQRT2))


class GELU(torch.autograd.Function):
    """y = x * Phi(x) (exact erf form); dy/dx = Phi(x) + x * phi(x), recomputed from the saved x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _gelu_reference(upcast(x)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        xf = upcast(x)
        cdf = 0.5 * (1 + torch.erf(xf * _INV_SQRT2))
        # x * pdf: for |x| huge, exp(-x*x/2) underflows to 0 first, so the product stays 0, not nan.
        slope = cdf + xf * (torch.exp(-0.5 * xf * xf) * _INV_SQRT_2PI)
        return (upcast(grad_output) * slope).to(x.dtype)


register(GELU, name="gelu", inputs=[Tensor("x", "*batch n")], reference=_gelu_reference, dtypes=ALL_FLOATS)


class Swish(torch.autograd.Function):
    """y = x * sigmoid(beta * x) (SiLU at beta = 1) with a learnable scalar beta (a 0-d tensor)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, beta)
        return x * s

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, beta = ctx.saved_tensors
        # Recomputed from the saved inputs (not a saved intermediate), so double backward sees
        # its dependence on x and beta.
        s = torch.sigmoid(beta * x)
        ds = s * (1 - s)
        grad_x = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_output * (s + x * beta * ds)
        if ctx.needs_input_grad[1]:
            # Left to right: (g * x * ds) reaches 0 before the second x, as autograd's chain does;
            # x * x first would overflow to inf and inf * 0 = nan at extreme |x|.
            grad_beta = (grad_output * x * ds * x).sum().reshape(beta.shape)
        return grad_x, grad_beta


register(
    Swish,
    name="swish",
    inputs=[Tensor("x", "*batch n"), Tensor("beta", "", domain=(0.5, 2.0))],
    reference=lambda x, beta: x * torch.sigmoid(beta * x),
    dtypes=ALL_FLOATS,
)


class ClippedReLU(torch.autograd.Function):
    """y = min(max(x, 0), clip) (ReLU6 at clip = 6); the gradient passes where 0 <= x <= clip."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clip: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.clip = clip  # a Python float: non-tensor state may live on ctx
        return x.clamp(min=0.0, max=clip)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        # Inclusive bounds, as torch.clamp's own backward: matters when x rounds onto the clip.
        inside = (x >= 0) & (x <= ctx.clip)
        return grad_output * inside.to(grad_output.dtype), None


register(
    ClippedReLU,
    name="clipped_relu",
    # Kinks at 0 (kept away by the nonzero domain) and at the clip value.
    inputs=[Tensor("x", "*batch n", domain="nonzero", kinks=("clip",)), Scalar("clip", 1.0)],
    reference=lambda x, clip: torch.clamp(x, min=0.0, max=clip),
    dtypes=ALL_FLOATS,
)


class SoftThreshold(torch.autograd.Function):
    """y = sign(x) * max(|x| - t, 0), the proximal operator of t*|x|; gradient 1 where |x| > t."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, threshold: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.threshold = threshold
        return torch.sign(x) * torch.relu(x.abs() - threshold)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        # Strict, as the reference's relu: zero gradient at |x| == threshold exactly.
        active = x.abs() > ctx.threshold
        return grad_output * active.to(grad_output.dtype), None


register(
    SoftThreshold,
    name="soft_threshold",
    inputs=[Tensor("x", "*batch n", domain="nonzero", kinks=("threshold", "-threshold")), Scalar("threshold", 0.5)],
    reference=lambda x, threshold: torch.sign(x) * torch.relu(x.abs() - threshold),
    dtypes=ALL_FLOATS,
)
