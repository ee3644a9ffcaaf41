"""Numerically buggy Functions (and their correct counterparts) for the reference and
stability contracts.

Each bug is the kind users report as NaN/Inf in backward or as low-precision drift: a
log-sum-exp and a softmax without the max shift, a softmax whose backward reduction runs in
float16, a LayerNorm whose backward forgets eps, masked attention that returns NaN for fully
masked rows, a product whose backward divides by the input (NaN at a zero). ``double_minus_x`` is exact-reference bait: its reference (2x) is exact in float16,
so the baseline error is 0 and only the rounding-step floor lets a correct op pass.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Mask, Scalar, Tensor, register

LOW = (torch.float32, torch.float16, torch.bfloat16)
ALL = (torch.float64, *LOW)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 compute for half types, as a kernel would; float64 stays float64."""
    return x if x.dtype == torch.float64 else x.float()


# --------------------------------------------------------------------------- log-sum-exp


class NaiveLogSumExp(torch.autograd.Function):
    """log(sum(exp(x))) without the max shift: exp overflows at large logits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x)
        ctx.save_for_backward(e)
        return torch.log(e.sum(-1))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (e,) = ctx.saved_tensors
        return grad_output.unsqueeze(-1) * e / e.sum(-1, keepdim=True)


class StableLogSumExp(torch.autograd.Function):
    """m + log(sum(exp(x - m))); backward softmax * g, computed in float32 for half types."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        xf = _upcast(x)
        m = xf.amax(-1, keepdim=True)
        out = m.squeeze(-1) + torch.log(torch.exp(xf - m).sum(-1))
        ctx.save_for_backward(x, out)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        x, out = ctx.saved_tensors
        return (_upcast(grad_output).unsqueeze(-1) * torch.exp(_upcast(x) - out.unsqueeze(-1))).to(x.dtype)


for _fn, _name in ((NaiveLogSumExp, "naive_logsumexp"), (StableLogSumExp, "stable_logsumexp")):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.logsumexp(x, -1), dtypes=ALL)


# --------------------------------------------------------------------------- softmax


def _softmax_backward(y: torch.Tensor, g: torch.Tensor, reduce_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y * (g - sum(g * y)); the row reduction in ``reduce_dtype`` when given."""
    prod = g * y
    if reduce_dtype is not None:
        dot = prod.to(reduce_dtype).sum(-1, keepdim=True).to(y.dtype)
    else:
        dot = prod.sum(-1, keepdim=True)
    return y * (g - dot)


class NaiveSoftmax(torch.autograd.Function):
    """exp(x) / sum(exp(x)) without the max shift: inf / inf = NaN at large logits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x)
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _softmax_backward(y, grad_output)


class StableSoftmax(torch.autograd.Function):
    """exp(x - max) / sum; float32 compute for half types."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        xf = _upcast(x)
        e = torch.exp(xf - xf.amax(-1, keepdim=True))
        y = (e / e.sum(-1, keepdim=True)).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _softmax_backward(_upcast(y), _upcast(grad_output)).to(y.dtype)


class SoftmaxHalfReduction(StableSoftmax):
    """A stable softmax whose backward row reduction sum(g * y) runs in float16."""

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _softmax_backward(_upcast(y), _upcast(grad_output), reduce_dtype=torch.float16).to(y.dtype)


for _fn, _name, _dtypes in (
    (NaiveSoftmax, "naive_softmax", ALL),
    (StableSoftmax, "stable_softmax", ALL),
    (SoftmaxHalfReduction, "softmax_half_reduction", (torch.float32,)),
):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.softmax(x, -1), dtypes=_dtypes)


# --------------------------------------------------------------------------- LayerNorm


class LayerNorm(torch.autograd.Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim, float32 compute."""

    forget_eps_in_backward = False

    @classmethod
    def forward(cls, ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        xf = _upcast(x)
        mean = xf.mean(-1, keepdim=True)
        var = (xf - mean).pow(2).mean(-1, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        xhat = (xf - mean) * rstd
        ctx.save_for_backward(x, weight, mean, var)
        ctx.eps = eps
        ctx.bias_dtype = bias.dtype
        return (xhat * _upcast(weight) + _upcast(bias)).to(x.dtype)

    @classmethod
    @once_differentiable
    def backward(cls, ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, var = ctx.saved_tensors
        # The bug: rsqrt(var) instead of rsqrt(var + eps) -- inf on a constant row.
        rstd = torch.rsqrt(var) if cls.forget_eps_in_backward else torch.rsqrt(var + ctx.eps)
        xf, g, w = _upcast(x), _upcast(grad_output), _upcast(weight)
        xhat = (xf - mean) * torch.rsqrt(var + ctx.eps)
        dxhat = g * w
        grad_x = rstd * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        reduce_dims = tuple(range(x.ndim - 1))
        grad_w = (g * xhat).sum(reduce_dims) if reduce_dims else g * xhat
        grad_b = g.sum(reduce_dims) if reduce_dims else g
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), grad_b.to(ctx.bias_dtype), None


class LayerNormNoEpsBackward(LayerNorm):
    """Forward uses eps; backward forgets it (rstd = 1/sqrt(var))."""

    forget_eps_in_backward = True


def _layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


for _fn, _name in ((LayerNorm, "layer_norm_ok"), (LayerNormNoEpsBackward, "layer_norm_no_eps_backward")):
    register(
        _fn,
        name=_name,
        inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Tensor("bias", "d"), Scalar("eps", 1e-5)],
        reference=_layer_norm_reference,
        dtypes=ALL,
        double_backward=False,  # backward reuses forward's mean and var as constants: once differentiable
    )


# --------------------------------------------------------------------------- masked attention


def _masked_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over kept keys; a fully masked query row gives zeros.

    The -inf fill is replaced by 0 on fully masked rows *before* the softmax, so no NaN is
    produced there -- not even in the reference's own backward.
    """
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    any_kept = mask.any(-1, keepdim=True)
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~any_kept, 0.0)
    return (torch.softmax(scores, -1) * any_kept) @ v


class MaskedAttention(torch.autograd.Function):
    """Masked attention with explicit backward, float32 compute; fully masked rows give zeros."""

    zero_masked_rows = True

    @classmethod
    def _probs(cls, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~mask, float("-inf"))
        if cls.zero_masked_rows:
            any_kept = mask.any(-1, keepdim=True)
            return torch.softmax(scores.masked_fill(~any_kept, 0.0), -1) * any_kept
        return torch.softmax(scores, -1)  # the bug: a fully masked row is softmax(all -inf) = NaN

    @classmethod
    def forward(cls, ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        qf, kf, vf = _upcast(q), _upcast(k), _upcast(v)
        p = cls._probs(qf, kf, mask)
        ctx.save_for_backward(q, k, v, p)
        return (p @ vf).to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, p = ctx.saved_tensors
        qf, kf, vf, g = _upcast(q), _upcast(k), _upcast(v), _upcast(grad_output)
        p = p.to(g.dtype)  # bfloat16 when forward ran under autocast
        dp = g @ vf.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
        return (ds @ kf).to(q.dtype), (ds.transpose(-1, -2) @ qf).to(k.dtype), (p.transpose(-1, -2) @ g).to(v.dtype), None


class MaskedAttentionNaNRows(MaskedAttention):
    """Returns NaN (softmax over all -inf) for a fully masked query row."""

    zero_masked_rows = False


for _fn, _name in ((MaskedAttention, "masked_attention_ok"), (MaskedAttentionNaNRows, "masked_attention_nan_rows")):
    register(
        _fn,
        name=_name,
        inputs=[
            Tensor("q", "*batch n d"),
            Tensor("k", "*batch m d"),
            Tensor("v", "*batch m e"),
            Mask("mask", "*batch n m"),
        ],
        reference=_masked_attention_reference,
        dtypes=ALL,
        double_backward=False,  # backward reuses forward's probabilities as constants: once differentiable
    )


# --------------------------------------------------------------------------- exact reference


class DoubleMinusX(torch.autograd.Function):
    """2x computed as 3x - x (and its gradient as 3g - g): up to ~1.5 rounding steps off,
    while the reference 2x is exact in every dtype (baseline error 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 3 - x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 3 - grad_output


register(DoubleMinusX, name="double_minus_x", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 2, dtypes=ALL)


# --------------------------------------------------------------------------- zeros


class ProdDividingByInput(torch.autograd.Function):
    """prod over the last dim, backward as ``g * prod / x``: right wherever no element is 0, 0/0
    = NaN at a zero, where the truth (the product of the others) is finite. Random values are
    never exactly 0: only stability's rows of zeros meet it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.prod(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, out = ctx.saved_tensors
        return (g * out).unsqueeze(-1) / x


class ProdOfOthers(ProdDividingByInput):
    """The same backward as the product of the other elements (exclusive cumulative products from
    both ends): finite at zeros. The partial products are kept in float64: in the input's dtype a
    long row's prefix overflows where its suffix underflows (float16: inf * 0 = NaN at 129 values
    up to 2.3; float32: a subnormal product of the others 2.7x off)."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, _ = ctx.saved_tensors
        wide = x.double()
        ones = torch.ones_like(wide[..., :1])
        before = torch.cat([ones, wide[..., :-1]], -1).cumprod(-1)
        after = torch.cat([wide[..., 1:], ones], -1).flip(-1).cumprod(-1).flip(-1)
        return (g.double().unsqueeze(-1) * before * after).to(x.dtype)


for _fn, _name in ((ProdDividingByInput, "prod_dividing_by_input"), (ProdOfOthers, "prod_of_others")):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: x.prod(-1), dtypes=ALL)


class GuardedUnitNormalize(torch.autograd.Function):
    """x / max(|x|, eps) over the last dim against the formula x / |x|, which is 0/0 at a row of
    zeros: the guarded kernel's finite values there are no defect (stability's zero rows judge
    only non-finite values where the truth is finite)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        ctx.save_for_backward(x, norm)
        return x / norm

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, norm = ctx.saved_tensors
        y = x / norm
        return (g - y * (g * y).sum(-1, keepdim=True)) / norm


register(
    GuardedUnitNormalize, name="guarded_unit_normalize", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x / x.norm(dim=-1, keepdim=True), dtypes=ALL,
)


class DistanceToShift(torch.autograd.Function):
    """|x - t|, backward (x - t) / |x - t|: NaN at x == t, its declared kink (named by the Scalar
    t), where no gradient is right or wrong. Stability's zero rows stay off it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: float) -> torch.Tensor:
        y = (x - t).abs()
        ctx.save_for_backward(x, y)
        ctx.t = t
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, y = ctx.saved_tensors
        return g * (x - ctx.t) / y, None


register(
    DistanceToShift, name="distance_to_shift", inputs=[Tensor("x", "*batch n", kinks=("t",)), Scalar("t", 0.0)],
    reference=lambda x, t: (x - t).abs(), dtypes=ALL,
)



def _row_norm(scaled: bool):  # type: ignore[no-untyped-def]
    """|x| over the last dim: sqrt(sum(x * x)), whose squares overflow float32 from |x| ~ 2e19 while
    |x| itself is finite (a hurried kernel), or scaled by the row's largest |x| first (right)."""

    def norm(x: torch.Tensor) -> torch.Tensor:
        if not scaled:
            return (x * x).sum(-1).sqrt()
        top = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        return top.squeeze(-1) * ((x / top) ** 2).sum(-1).sqrt()

    class RowNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            y = norm(x)
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            x, y = ctx.saved_tensors
            return g.unsqueeze(-1) * x / y.unsqueeze(-1).clamp_min(torch.finfo(x.dtype).tiny)

    return RowNorm


# Found at the dtype's largest extreme magnitude (1e30 in float32), not at 1e2: the coverage phase's third scale.
for _fn, _name in ((_row_norm(False), "naive_row_norm"), (_row_norm(True), "scaled_row_norm")):
    register(
        _fn, name=_name, inputs=[Tensor("x", "*batch n", kinks=(0.0,))],
        reference=lambda x: torch.linalg.vector_norm(x, dim=-1), dtypes=(torch.float64, torch.float32),
    )
