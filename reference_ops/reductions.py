"""Reductions over the last dim, and the numerically stable softmax family.

Seed patterns shown:

* ``Sum`` / ``Mean`` / ``Max`` -- seed 002 ``CustomSum`` / ``CustomMean`` / ``CustomMax``
  (expand the gradient back over the reduced dim; Max routes it to the saved index).
* ``LogSumExp`` -- seed 000 ``LogSumExp`` (max shift; backward is softmax * g).
* ``Softmax`` -- seed 000 section 8 (stable softmax; saves the output).
* ``CrossEntropy`` -- integer class targets (an ``Index`` input gets a ``None`` gradient).

Ties in ``Max``: like the seed, the gradient goes to the one index ``torch.max(x, dim)``
returns, and the reference is ``torch.max(x, dim).values`` whose autograd uses that same index;
``torch.amax`` would instead split the gradient evenly among ties. Random floats almost never
tie, but constant rows (and values rounded to float16/bfloat16) do, so the convention matters.

Twice differentiable: a tensor computed in forward and saved is a constant to double backward,
so backward recomputes what depends on the inputs (softmax from the saved logits), or uses a
saved *output*, which stays connected to the graph.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Index, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["CrossEntropy", "LogSumExp", "Max", "Mean", "Softmax", "Sum"]


class Sum(torch.autograd.Function):
    """y = x.sum(-1); the gradient is g broadcast back over the last dim."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return upcast(x).sum(-1).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        # expand() would be a stride-0 view of grad_output; materialise it so the gradient owns
        # its memory (no aliasing of grad_output).
        return grad_output.unsqueeze(-1).expand(*grad_output.shape, ctx.n).clone()


register(Sum, name="sum", inputs=[Tensor("x", "*batch n")], reference=lambda x: x.sum(-1), dtypes=ALL_FLOATS)


class Mean(torch.autograd.Function):
    """y = x.mean(-1); the gradient is g / n broadcast back over the last dim."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return upcast(x).mean(-1).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output.unsqueeze(-1).expand(*grad_output.shape, ctx.n) / ctx.n


register(Mean, name="mean", inputs=[Tensor("x", "*batch n")], reference=lambda x: x.mean(-1), dtypes=ALL_FLOATS)


class Max(torch.autograd.Function):
    """y = x.max(-1).values; the gradient goes to the saved argmax (one index per row, ties included)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        values, indices = x.max(dim=-1)
        ctx.save_for_backward(indices)
        ctx.n = x.shape[-1]
        return values

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (indices,) = ctx.saved_tensors
        shape = (*grad_output.shape, ctx.n)
        zeros = torch.zeros(shape, dtype=grad_output.dtype, device=grad_output.device)
        # Out-of-place scatter: differentiable in grad_output, so double backward works.
        return zeros.scatter(-1, indices.unsqueeze(-1), grad_output.unsqueeze(-1))


register(
    Max,
    name="max",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.max(x, dim=-1).values,
    dtypes=ALL_FLOATS,
)


class LogSumExp(torch.autograd.Function):
    """log(sum(exp(x), -1)) computed as m + log(sum(exp(x - m))); backward is softmax * g."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        m = xf.amax(dim=-1, keepdim=True)
        # An all -inf row would give (-inf) - (-inf) = nan; shift by 0 there instead.
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = (m.squeeze(-1) + torch.log(torch.exp(xf - m).sum(dim=-1))).to(x.dtype)
        ctx.save_for_backward(x, out)  # the output stays connected for double backward
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        x, out = ctx.saved_tensors
        # exp(x - lse) is the softmax. Recompute lse in float32 for half inputs: the saved,
        # rounded output would put its rounding error into every probability.
        xf = upcast(x)
        lse = out if out.dtype == xf.dtype else torch.logsumexp(xf, dim=-1)
        return (upcast(grad_output).unsqueeze(-1) * torch.exp(xf - lse.unsqueeze(-1))).to(x.dtype)


register(
    LogSumExp,
    name="logsumexp",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.logsumexp(x, dim=-1),
    dtypes=ALL_FLOATS,
)


def _stable_softmax(x: torch.Tensor) -> torch.Tensor:
    m = x.amax(dim=-1, keepdim=True).detach()  # the shift cancels; no gradient through it
    e = torch.exp(x - m)
    return e / e.sum(dim=-1, keepdim=True)


class Softmax(torch.autograd.Function):
    """y = softmax(x, -1), max-shifted; saves the output: dx = y * (g - sum(g * y))."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = _stable_softmax(upcast(x)).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        yf, g = upcast(y), upcast(grad_output)
        return (yf * (g - (g * yf).sum(dim=-1, keepdim=True))).to(y.dtype)


register(
    Softmax,
    name="softmax",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.softmax(x, dim=-1),
    dtypes=ALL_FLOATS,
)


class CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits (n, c) against int64 targets (n,); d/dlogits = (p - onehot) / n."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(logits, target)
        lf = upcast(logits)
        lse = torch.logsumexp(lf, dim=-1)
        picked = lf.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return (lse - picked).mean().to(logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        logits, target = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        lf = upcast(logits)
        p = _stable_softmax(lf)  # recomputed from the saved logits: exact double backward
        onehot = torch.zeros_like(lf).scatter(-1, target.unsqueeze(-1), 1.0)
        grad = (p - onehot) * (upcast(grad_output) / logits.shape[0])
        return grad.to(logits.dtype), None  # None: the integer target has no gradient


register(
    CrossEntropy,
    name="cross_entropy",
    inputs=[Tensor("logits", "n c"), Index("target", "n", high="c")],
    reference=lambda logits, target: torch.nn.functional.cross_entropy(logits, target),
    dtypes=ALL_FLOATS,
)
