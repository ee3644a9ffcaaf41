"""Correct Functions written the way third-party kernel libraries write them.

None of these was tuned to the suite: they are the fused, buffer-writing, view-returning code
found in kernel repositories, written correctly. Each has a buggy twin in real_world_bugs.py.

* ``mutating_double`` (ScaleInPlaceGradKernel): y = 2x; backward allocates a fresh gradient
  buffer and fills it with an ``out=`` kernel call, never touching grad_output.
* ``layer_norm_f32`` (LayerNormF32): a fused LayerNorm in the input dtype (no upcast) that saves
  mean and rstd and computes dx, dweight, dbias with the standard fused formula.
* ``blockwise_attention_f32`` (BlockwiseAttention): FlashAttention-2-style single-head attention in
  pure PyTorch: online softmax over key blocks of 4, float32 accumulation for half inputs, and a
  backward that recomputes the probabilities from the saved log-sum-exp. As in FlashAttention-2,
  D = rowsum(dO * O) and dP = dO V^T are two differently ordered dot products of equal value when
  there is one key (n == 1), so there dQ and dK -- exactly 0 in math -- are rounding noise of
  order eps * |dO| |V| |Q| (measured in float32: exact 0 for d = 1..4 and 8, up to a few hundred ulp
  of max |output, grad| for d = 5, 16, 32, 64 with |q| ~ 100).
* ``rotary_transposed_output`` (RotaryEmbedding): Hugging Face-style rotary embedding whose output
  is a non-contiguous transposed view (b, h, s, d) of a fresh buffer; backward is linear and
  differentiable, so double backward works.
* ``center_upcast`` (CenterUpcast): y = (x - mean(x)) * w, upcast for half inputs, centred
  out of place.
* ``relu_masks_grad_output`` (ReluMasksGradCopy): ReLU whose backward zeroes its own copy of
  grad_output with ``masked_fill_``.
* ``square_own_scratch`` (SquareOwnScratch): y = x * x whose backward computes 2x out of place.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

# --------------------------------------------------------------------------- y = 2x


class ScaleInPlaceGradKernel(torch.autograd.Function):
    """y = 2 * x; backward writes 2 * grad into a freshly allocated buffer (out= kernel)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        gx = torch.empty_like(grad_out)
        torch.mul(grad_out, 2, out=gx)
        return gx


register(
    ScaleInPlaceGradKernel,
    name="mutating_double",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: 2 * x,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- fused LayerNorm


class LayerNormF32(torch.autograd.Function):
    """LayerNorm over the last dim, fused forward/backward, statistics in the input dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)  # biased
        rstd = torch.rsqrt(var + eps)
        y = xc * rstd * weight + bias
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x, weight, mean, rstd = ctx.saved_tensors
        n = x.shape[-1]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        xhat = (x - mean) * rstd
        if need_x:
            wdy = weight * dy
            c1 = (xhat * wdy).mean(dim=-1, keepdim=True)
            c2 = wdy.mean(dim=-1, keepdim=True)
            dx = (wdy - xhat * c1 - c2) * rstd
        if need_w:
            dw = (dy * xhat).reshape(-1, n).sum(dim=0)
        if need_b:
            db = dy.reshape(-1, n).sum(dim=0)
        return dx, dw, db, None


register(
    LayerNormF32,
    name="layer_norm_f32",
    inputs=[Tensor("x", "*batch n"), Tensor("weight", "n"), Tensor("bias", "n"), Scalar("eps", 1e-5)],
    reference=lambda x, weight, bias, eps: F.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- blockwise attention

BLOCK = 4


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class BlockwiseAttention(torch.autograd.Function):
    """softmax(q k^T * d**-0.5) v, FlashAttention-2 style: online softmax over key blocks."""

    @staticmethod
    # Without it, autocast runs the score matmuls in bfloat16: lse would come from rounded scores
    # that backward recomputes in float32, and exp(s - lse) is off by exp(|s| * 2**-9) (9% of dq).
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        acc_dtype = _compute_dtype(q.dtype)
        qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
        b, m, d = q.shape
        n = k.shape[1]
        scale = d**-0.5

        acc = torch.zeros(b, m, v.shape[-1], dtype=acc_dtype, device=q.device)
        row_max = torch.full((b, m, 1), float("-inf"), dtype=acc_dtype, device=q.device)
        row_sum = torch.zeros(b, m, 1, dtype=acc_dtype, device=q.device)
        for start in range(0, n, BLOCK):
            kb = kf[:, start : start + BLOCK]
            vb = vf[:, start : start + BLOCK]
            s = torch.bmm(qf, kb.transpose(1, 2)) * scale
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(row_max - new_max)  # 0 on the first block
            p = torch.exp(s - new_max)
            row_sum = row_sum * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + torch.bmm(p, vb)
            row_max = new_max

        out = (acc / row_sum).to(q.dtype)
        lse = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        scale = ctx.scale
        acc_dtype = _compute_dtype(q.dtype)
        qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
        do = grad_out.to(acc_dtype)
        n = k.shape[1]

        D = (do * out.to(acc_dtype)).sum(dim=-1, keepdim=True)  # (b, m, 1)
        dq = torch.zeros_like(qf)
        dk = torch.empty_like(kf)
        dv = torch.empty_like(vf)
        for start in range(0, n, BLOCK):
            end = min(start + BLOCK, n)
            kb = kf[:, start:end]
            vb = vf[:, start:end]
            s = torch.bmm(qf, kb.transpose(1, 2)) * scale
            p = torch.exp(s - lse)
            dv[:, start:end] = torch.bmm(p.transpose(1, 2), do)
            dp = torch.bmm(do, vb.transpose(1, 2))
            ds = p * (dp - D)
            dq += torch.bmm(ds, kb) * scale
            dk[:, start:end] = torch.bmm(ds.transpose(1, 2), qf) * scale

        # Like FlashAttention's wrappers: one kernel computes dq, dk and dv together, and all
        # three are returned whatever needs_input_grad says (the spec waives unneeded_grads).
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


register(
    BlockwiseAttention,
    name="blockwise_attention_f32",
    inputs=[Tensor("q", "b m d"), Tensor("k", "b n d"), Tensor("v", "b n d")],
    reference=_attention_reference,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
    waivers={
        "unneeded_grads": "dq, dk and dv come from one fused backward kernel",
        # A Python loop over key blocks: each sequence length unrolls into its own graph.
        "compile": "loops over key blocks in Python, so torch.compile recompiles for every sequence length",
    },
)

# --------------------------------------------------------------------------- rotary embedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_transpose(g: torch.Tensor) -> torch.Tensor:
    """Adjoint of rotate_half: (g1, g2) -> (g2, -g1)."""
    g1, g2 = g.chunk(2, dim=-1)
    return torch.cat((g2, -g1), dim=-1)


class RotaryEmbedding(torch.autograd.Function):
    """y = x * cos + rotate_half(x) * sin over (b, s, h, d), returned as a (b, h, s, d) view."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos_ = cos[:, None, :]  # (s, 1, d): broadcast over b and h
        sin_ = sin[:, None, :]
        y = x * cos_ + rotate_half(x) * sin_
        ctx.save_for_backward(cos, sin)
        return y.transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        cos, sin = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        g = grad.transpose(1, 2)  # back to (b, s, h, d)
        gx = g * cos[:, None, :] + rotate_half_transpose(g * sin[:, None, :])
        return gx, None, None


def _rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    y = x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
    return y.transpose(1, 2)


register(
    RotaryEmbedding,
    name="rotary_transposed_output",
    inputs=[
        Tensor("x", "b s h 4"),
        Tensor("cos", "s 4", requires_grad=False),
        Tensor("sin", "s 4", requires_grad=False),
    ],
    reference=_rotary_reference,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- centring through a no-op upcast


class CenterUpcast(torch.autograd.Function):
    """y = (x - mean(x)) * w, upcast for half inputs (float32 compute)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        xf = xf - xf.mean(-1, keepdim=True)
        ctx.save_for_backward(xf, weight)
        return (xf * weight.to(xf.dtype)).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        centred, weight = ctx.saved_tensors
        g = grad.to(centred.dtype)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            gy = g * weight.to(g.dtype)
            grad_x = (gy - gy.mean(-1, keepdim=True)).to(grad.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (g * centred).reshape(-1, centred.shape[-1]).sum(0).to(weight.dtype)
        return grad_x, grad_w


register(
    CenterUpcast,
    name="center_upcast",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d")],
    reference=lambda x, weight: (x - x.mean(-1, keepdim=True)) * weight,
    dtypes=(torch.float64, torch.float32, torch.float16),
    double_backward=False,
)


# --------------------------------------------------------------------------- ReLU, mask written into a copy


class ReluMasksGradCopy(torch.autograd.Function):
    """ReLU whose backward zeroes its own copy of grad_output where x <= 0 (``masked_fill_``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clamp_min(0)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad.clone().masked_fill_(x <= 0, 0)


register(
    ReluMasksGradCopy,
    name="relu_masks_grad_output",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.relu,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)


# --------------------------------------------------------------------------- y = x * x, scratch of its own


class SquareOwnScratch(torch.autograd.Function):
    """y = x * x; backward computes 2x into a buffer of its own (``x.mul(2)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.mul(2)


register(
    SquareOwnScratch,
    name="square_own_scratch",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * x,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)
