"""Estimators and custom gradients: backward passes that are *not* the forward's derivative.

Seed patterns shown:

* ``SignSTE`` -- seed 001 ``STE`` / seed 003 ``SignSTE``: forward sign(x), backward identity.
* ``ClippedSTE`` -- seed 003 ``SignClippedSTE``: forward sign(x), backward passes where |x| < 1.
* ``FakeQuant`` -- seed 000 ``FakeQuant``: round-to-grid in forward, straight-through backward.
* ``GradientReversal`` / ``GradientScale``: identity forward, backward multiplies by -alpha / s.
* ``GumbelSoftmax`` -- seed 003 ``GumbelSoftmax`` (soft sample) with its noise as an input.
* ``GumbelSoftmaxSample`` -- seed 003 ``GumbelSoftmax`` as written, noise drawn in forward,
  declared ``nondeterministic=True``.
* ``Embedding`` -- a declared-nondeterministic backward (accumulation order varies per call).

How these are checked: each declares ``surrogate=``, a plain differentiable function whose
autograd gradient backward must reproduce (``identity`` for the STE, ``hardtanh`` for the
clipped STE, ``-alpha * x`` for gradient reversal); the ``reference`` gives the forward. So
gradcheck (which would see the true derivative, zero almost everywhere) is replaced by a
comparison with the surrogate. Returned gradients are always new tensors, never grad_output.

Gumbel-softmax and nondeterminism. Seed 003 draws its Gumbel noise inside forward with
``torch.rand_like``. Every property here runs a Function several times on the same inputs and
compares (finite differences, reference, layouts); fresh noise per call would make each of
those comparisons fail on a correct op, and a reference "meaningful only for shapes" would
leave the forward untested. So the noise source is an explicit input: ``u`` (uniform, domain
"unit", never requiring grad), turned into Gumbel noise ``-log(-log(u))`` inside. The op is
then deterministic and fully checked against ``softmax((logits + g) / tau)``; the sampling
wrapper a model calls is ``GumbelSoftmax.apply(logits, torch.rand_like(logits), tau)``
(``gumbel_softmax`` below). It is *not* declared nondeterministic, because it is not.

The declared-nondeterministic op is ``Embedding``: its backward scatters rows of grad_output
into the weight gradient in an order that changes from call to call, as CUDA atomics do. The
order is drawn in forward from torch's global RNG and saved, so (like dropout) the op is
reproducible under a fixed seed -- the contracts that compare repeated calls (gradcheck,
gradgradcheck, layouts) seed it -- and one graph's backward is reentrant. It accumulates in
float64, so in float32/float16/bfloat16 the result is practically always bitwise the same,
and in float64 two runs differ only by rounding (~1e-16 relative), within every
tolerance-based comparison; only bitwise repeatability, which the ``determinism`` contract
checks, is given up, and that is what ``nondeterministic=True`` says.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Index, Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = [
    "ClippedSTE",
    "Embedding",
    "FakeQuant",
    "GradientReversal",
    "GradientScale",
    "GumbelSoftmax",
    "GumbelSoftmaxSample",
    "SignSTE",
    "gumbel_softmax",
]


class SignSTE(torch.autograd.Function):
    """Forward sign(x); backward passes grad_output straight through (surrogate: identity)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output.clone()  # a copy, so the gradient does not alias grad_output


register(
    SignSTE,
    name="sign_ste",
    inputs=[Tensor("x", "*batch n", domain="nonzero")],
    reference=torch.sign,
    surrogate=lambda x: x.clone(),
    dtypes=ALL_FLOATS,
)


class ClippedSTE(torch.autograd.Function):
    """Forward sign(x); backward passes where -1 < x < 1 (surrogate: hardtanh, same strict bounds)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * ((x > -1) & (x < 1)).to(grad_output.dtype)


register(
    ClippedSTE,
    name="clipped_ste",
    inputs=[Tensor("x", "*batch n", domain="nonzero")],
    reference=torch.sign,
    surrogate=torch.nn.functional.hardtanh,
    dtypes=ALL_FLOATS,
)


def _fake_quant(x: torch.Tensor, scale: float, n_bits: int) -> torch.Tensor:
    low, high = -(2 ** (n_bits - 1)), 2 ** (n_bits - 1) - 1
    return torch.round(x / scale).clamp(low, high) * scale


class FakeQuant(torch.autograd.Function):
    """Symmetric n-bit fake quantisation; straight-through (identity) gradient, as the seed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float, n_bits: int) -> torch.Tensor:
        # Exactly the reference's expression in the input dtype: a value that rounds to the
        # other side of a .5 boundary in float16 does so in the reference too.
        return _fake_quant(x, scale, n_bits)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad_output.clone(), None, None


register(
    FakeQuant,
    name="fake_quant",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 0.05), Scalar("n_bits", 8)],
    reference=_fake_quant,
    surrogate=lambda x, scale, n_bits: x.clone(),
    dtypes=ALL_FLOATS,
)


class GradientReversal(torch.autograd.Function):
    """Identity forward; backward returns -alpha * grad_output (domain-adversarial training)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.alpha = alpha
        return x.clone()  # a new tensor: returning x (or a view of it) would alias the input

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output * (-ctx.alpha), None


register(
    GradientReversal,
    name="gradient_reversal",
    inputs=[Tensor("x", "*batch n"), Scalar("alpha", 1.0)],
    reference=lambda x, alpha: x.clone(),
    surrogate=lambda x, alpha: -alpha * x,
    dtypes=ALL_FLOATS,
)


class GradientScale(torch.autograd.Function):
    """Identity forward; backward returns s * grad_output (per-branch learning-rate scaling)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, s: float) -> torch.Tensor:
        ctx.s = s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output * ctx.s, None


register(
    GradientScale,
    name="gradient_scale",
    inputs=[Tensor("x", "*batch n"), Scalar("s", 0.25)],
    reference=lambda x, s: x.clone(),
    surrogate=lambda x, s: s * x,
    dtypes=ALL_FLOATS,
)


def _gumbel_softmax_reference(logits: torch.Tensor, u: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.softmax((logits - torch.log(-torch.log(u))) / tau, dim=-1)


class GumbelSoftmax(torch.autograd.Function):
    """y = softmax((logits + g) / tau), g = -log(-log(u)) from explicit uniforms u."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, u: torch.Tensor, tau: float) -> torch.Tensor:
        ctx.save_for_backward(logits, u)
        ctx.tau = tau
        return _gumbel_softmax_reference(upcast(logits), upcast(u), tau).to(logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        logits, u = ctx.saved_tensors
        # y recomputed in the accumulation dtype rather than saved rounded: the log(-log(u))
        # noise is ill-conditioned, and the rounded output would carry that error into the gradient.
        yf = _gumbel_softmax_reference(upcast(logits), upcast(u), ctx.tau)
        g = upcast(grad_output)
        grad = yf * (g - (g * yf).sum(dim=-1, keepdim=True)) / ctx.tau
        return grad.to(logits.dtype), None, None  # u is a noise source: no gradient


register(
    GumbelSoftmax,
    name="gumbel_softmax",
    inputs=[Tensor("logits", "*batch n"), Tensor("u", "*batch n", requires_grad=False, domain="unit"), Scalar("tau", 0.5)],
    reference=_gumbel_softmax_reference,
    dtypes=ALL_FLOATS,
)


def gumbel_softmax(logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """The sampling wrapper a model calls: fresh uniforms from torch's RNG each call."""
    u = torch.rand_like(logits).clamp_(torch.finfo(logits.dtype).tiny, 1.0 - torch.finfo(logits.dtype).eps)
    return GumbelSoftmax.apply(logits, u, tau)


def _uniform_noise(logits: torch.Tensor) -> torch.Tensor:
    """Uniforms for Gumbel noise from torch's global RNG, drawn in float64 so every dtype of a
    call sees the same numbers under the same seed, and kept off 0 and 1."""
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device)
    return u.clamp_(1e-12, 1.0 - 1e-12)


class GumbelSoftmaxSample(torch.autograd.Function):
    """Seed 003's GumbelSoftmax as written: the noise is drawn inside forward (declared
    nondeterministic). The drawn uniforms are saved, so backward differentiates the sample
    forward actually returned."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, tau: float) -> torch.Tensor:
        u = _uniform_noise(logits)
        ctx.save_for_backward(logits, u)
        ctx.tau = tau
        return _gumbel_softmax_reference(upcast(logits), u, tau).to(logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        logits, u = ctx.saved_tensors
        yf = _gumbel_softmax_reference(upcast(logits), u, ctx.tau)
        g = upcast(grad_output)
        return (yf * (g - (g * yf).sum(dim=-1, keepdim=True)) / ctx.tau).to(logits.dtype), None


register(
    GumbelSoftmaxSample,
    name="gumbel_softmax_sample",
    inputs=[Tensor("logits", "*batch n"), Scalar("tau", 0.5)],
    # Draws its uniforms the same way, so under the same RNG state it is the same sample.
    reference=lambda logits, tau: _gumbel_softmax_reference(logits, _uniform_noise(logits).to(logits.dtype), tau),
    dtypes=ALL_FLOATS,
    nondeterministic=True,
)


class Embedding(torch.autograd.Function):
    """out = weight[idx]; backward index_adds grad rows into grad_weight in a random order."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # The accumulation order of backward's scatter is drawn here, from torch's global RNG,
        # the way a kernel launch fixes its schedule: it differs from call to call (declared
        # nondeterminism) but is reproducible under a fixed seed, and one graph's backward is
        # reentrant (gradcheck calls it twice and compares bitwise).
        order = torch.randperm(idx.numel(), device=idx.device)
        ctx.save_for_backward(idx, order)
        ctx.num_embeddings = weight.shape[0]
        return weight[idx]  # advanced indexing: a new tensor, not a view of weight

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        idx, order = ctx.saved_tensors
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        flat_idx = idx.reshape(-1)
        acc = torch.zeros(
            (ctx.num_embeddings, rows.shape[-1]), dtype=torch.float64, device=grad_output.device
        )
        grad = acc.index_add(0, flat_idx[order], rows[order].to(torch.float64))
        return grad.to(grad_output.dtype), None


register(
    Embedding,
    name="embedding",
    inputs=[Tensor("weight", "v d"), Index("idx", "*batch n", high="v")],
    reference=lambda weight, idx: torch.nn.functional.embedding(idx, weight),
    dtypes=ALL_FLOATS,
    nondeterministic=True,
)
