"""Correct Functions written the way third-party libraries write them, each of which the suite
must pass -- with advice where a by-design choice costs performance, or an upstream finding where
torch itself is wrong -- and never fail (issue "Decisive verdicts"):

* ``log_scan`` (LogStepScan): an inclusive prefix sum as a Hillis-Steele scan, ceil(log2(n))
  Python-level steps, backward the reverse scan. Its structure depends on the size, so
  torch.compile recompiles for new step counts: advice.
* ``pow2_pad_norm`` (Pow2PadNorm): y = x / 2**ceil(log2(n)), the padded FFT length computed by a
  numpy ufunc (``np.frexp``, a C call Dynamo cannot trace): a graph break, advice.
* ``classmethod_swish`` (ClassmethodSwish): y = x * sigmoid(x) with a ``@classmethod`` forward,
  which Dynamo cannot bind: a graph break caused by the definition itself, advice.
* ``inplace_affine`` (InplaceAffine): x.mul_(scale).add_(shift) in place with ``mark_dirty``.
  torch.compile's AOTAutograd gives a wrong gradient for it while eager and Dynamo alone are
  right: upstream (torch's bug), with a torch-only repro.
* ``undeclared_softplus`` (UndeclaredSoftplus): softplus whose backward is plain differentiable
  torch, registered with ``double_backward=False``: the double backward runs and is right, advice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance import Scalar, Tensor, register


class LogStepScan(torch.autograd.Function):
    """Inclusive prefix sum along the last dim, in ceil(log2(n)) shifted adds."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        shift = 1
        while shift < y.shape[-1]:
            y = y + F.pad(y[..., :-shift], (shift, 0))
            shift *= 2
        return y

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        g = grad_out.flip(-1)
        shift = 1
        while shift < g.shape[-1]:
            g = g + F.pad(g[..., :-shift], (shift, 0))
            shift *= 2
        return g.flip(-1)


register(
    LogStepScan, name="log_scan", inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.cumsum(x, dim=-1),
)


class Pow2PadNorm(torch.autograd.Function):
    """y = x / P with P the power of two an FFT of length n is padded to."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _, exponent = np.frexp(float(x.shape[-1] - 1))  # (n - 1) = m * 2**e, 0.5 <= m < 1
        ctx.scale = float(np.ldexp(1.0, -int(exponent)))
        return x * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out * ctx.scale


def _pow2_pad_norm_reference(x: torch.Tensor) -> torch.Tensor:
    return x / (1 << (x.shape[-1] - 1).bit_length())


register(Pow2PadNorm, name="pow2_pad_norm", inputs=[Tensor("x", "*batch n")], reference=_pow2_pad_norm_reference)


class ClassmethodSwish(torch.autograd.Function):
    """y = x * sigmoid(x), forward written as a classmethod."""

    @classmethod
    def forward(cls, ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_out * (s + x * s * (1 - s))


register(ClassmethodSwish, name="classmethod_swish", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * torch.sigmoid(x))


class InplaceAffine(torch.autograd.Function):
    """x <- x * scale + shift, in place (mark_dirty)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
        ctx.scale = scale
        x.mul_(scale).add_(shift)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad_out * ctx.scale, None, None


register(
    InplaceAffine,
    name="inplace_affine",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 3.0), Scalar("shift", 0.5)],
    reference=lambda x, scale, shift: x * scale + shift,
    mutates=("x",),
)


class UndeclaredSoftplus(torch.autograd.Function):
    """y = log(1 + exp(x)); backward is differentiable torch (no @once_differentiable)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(x)


register(
    UndeclaredSoftplus,
    name="undeclared_softplus",
    inputs=[Tensor("x", "*batch n")],
    reference=F.softplus,
    double_backward=False,
)
