"""Attention: masked scaled dot-product attention, and blockwise online-softmax FlashAttention.

Seed patterns shown:

* ``ScaledDotProductAttention`` -- seed 003 ``ScaledDotProductAttention``: softmax(q k^T / sqrt(d))
  v with an optional boolean mask (``True`` = keep). A fully masked query row is *defined* to
  give a zero output row and zero gradients; the reference defines the same (a plain
  ``softmax(masked_fill(-inf))`` would give nan there, in forward and in backward). Backward
  recomputes the probabilities from the saved q, k and mask, so it is twice differentiable.
* ``FlashAttention`` -- seed 000 section 7 (``flash_attention_naive``): the forward walks over
  blocks of keys with the online-softmax update (running max m, running sum l, rescaled
  accumulator), and saves q, k, v and the per-row log-sum-exp only -- never the (n_q, n_k)
  probability matrix. Backward recomputes each block's probabilities as ``exp(s - lse)``, in
  two passes: ``D = sum_j dP_ij P_ij`` first (see the comment there), then the gradients. Like the real kernels it is once
  differentiable (``@once_differentiable``, declared ``double_backward=False``). The block size
  is drawn (4 or 16) so partial and multiple blocks both occur; seqlen_q and seqlen_k are
  independent dims.

Computed on contiguous copies in a wider dtype (float32 for float16/bfloat16, float64 for
float32), rounded once at the end; see ``reference_ops._common.upcast``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st
from torch.autograd.function import once_differentiable

from conformance import Mask, Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["FlashAttention", "ScaledDotProductAttention"]


def _attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) over keys; rows with no kept key are all zeros."""
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is None:
        return torch.softmax(scores, dim=-1)
    any_kept = mask.any(dim=-1, keepdim=True)
    # In a fully masked row unmask everything (a finite, harmless softmax), then zero the row:
    # the gradient through the zeroing is exactly 0, never 0 * nan.
    keep = mask | ~any_kept
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return probs * any_kept.to(probs.dtype)


def _sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return _attention_probs(q, k, mask) @ v


class ScaledDotProductAttention(torch.autograd.Function):
    """out = softmax(q k^T / sqrt(d), masked) v; backward recomputes the probabilities."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if mask is None:
            ctx.save_for_backward(q, k, v)
        else:
            ctx.save_for_backward(q, k, v, mask)
        probs = _attention_probs(upcast(q), upcast(k), mask)
        return (probs @ upcast(v)).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, *rest = ctx.saved_tensors
        mask = rest[0] if rest else None
        qf, kf, vf, g = upcast(q), upcast(k), upcast(v), upcast(grad_output)
        probs = _attention_probs(qf, kf, mask)
        scale = 1.0 / math.sqrt(q.shape[-1])
        grad_q = grad_k = grad_v = None
        if ctx.needs_input_grad[2]:
            grad_v = (probs.transpose(-1, -2) @ g).to(v.dtype)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            dp = g @ vf.transpose(-1, -2)
            # Softmax backward; masked entries (probs == 0) get exactly zero.
            ds = probs * (dp - (dp * probs).sum(dim=-1, keepdim=True)) * scale
            if ctx.needs_input_grad[0]:
                grad_q = (ds @ kf).to(q.dtype)
            if ctx.needs_input_grad[1]:
                grad_k = (ds.transpose(-1, -2) @ qf).to(k.dtype)
        return grad_q, grad_k, grad_v, None


register(
    ScaledDotProductAttention,
    name="sdpa",
    inputs=[
        Tensor("q", "*batch n_q d"),
        Tensor("k", "*batch n_k d"),
        Tensor("v", "*batch n_k e"),
        Mask("mask", "*batch n_q n_k"),
    ],
    reference=_sdpa_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",  # backward recomputes the probabilities
)
register(
    ScaledDotProductAttention,
    name="sdpa_nomask",
    inputs=[Tensor("q", "*batch n_q d"), Tensor("k", "*batch n_k d"), Tensor("v", "*batch n_k e"), Scalar("mask", None)],
    reference=_sdpa_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",  # backward recomputes the probabilities
)


def _log_sum_exp_bytes(q: torch.Tensor) -> int:
    """Bytes of one log-sum-exp per query row, in the accumulation dtype."""
    return q[..., 0].numel() * upcast(q[..., :1]).element_size()


class FlashAttention(torch.autograd.Function):
    """Blockwise online-softmax attention (no mask); saves the log-sum-exp, not the probabilities."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_k: int) -> torch.Tensor:
        qf, kf, vf = upcast(q), upcast(k), upcast(v)
        scale = 1.0 / math.sqrt(q.shape[-1])
        rows = (*q.shape[:-1], 1)
        m = torch.full(rows, float("-inf"), dtype=qf.dtype, device=q.device)  # running max
        total = torch.zeros(rows, dtype=qf.dtype, device=q.device)  # running sum of exp(s - m)
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=qf.dtype, device=q.device)
        for start in range(0, k.shape[-2], block_k):
            k_j, v_j = kf[..., start : start + block_k, :], vf[..., start : start + block_k, :]
            s = (qf @ k_j.transpose(-1, -2)) * scale
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(m - m_new)  # rescales what was accumulated under the old max
            p = torch.exp(s - m_new)
            total = alpha * total + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v_j
            m = m_new
        out = (acc / total).to(q.dtype)
        lse = (m + torch.log(total)).squeeze(-1)  # kept in the accumulation dtype
        ctx.save_for_backward(q, k, v, lse)
        ctx.block_k = block_k
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, lse = ctx.saved_tensors
        qf, kf, vf, g = upcast(q), upcast(k), upcast(v), upcast(grad_output)
        scale = 1.0 / math.sqrt(q.shape[-1])
        blocks = [
            (kf[..., start : start + ctx.block_k, :], vf[..., start : start + ctx.block_k, :])
            for start in range(0, k.shape[-2], ctx.block_k)
        ]

        def probs(k_j: torch.Tensor) -> torch.Tensor:
            return torch.exp((qf @ k_j.transpose(-1, -2)) * scale - lse.unsqueeze(-1))

        # D_i = sum_j dP_ij P_ij, accumulated over blocks in a first pass. FlashAttention-2 uses
        # the equal rowsum(dO * O), but that differs from dP_ij by rounding, and the difference
        # is multiplied by |k|: with huge v and k it overflows where the exact gradient is 0.
        delta = torch.zeros((*q.shape[:-1], 1), dtype=qf.dtype, device=q.device)
        for k_j, v_j in blocks:
            delta = delta + ((g @ v_j.transpose(-1, -2)) * probs(k_j)).sum(dim=-1, keepdim=True)
        grad_q = torch.zeros_like(qf)
        grad_k_blocks, grad_v_blocks = [], []
        for k_j, v_j in blocks:
            p = probs(k_j)
            grad_v_blocks.append(p.transpose(-1, -2) @ g)
            ds = p * (g @ v_j.transpose(-1, -2) - delta) * scale
            grad_q = grad_q + ds @ k_j
            grad_k_blocks.append(ds.transpose(-1, -2) @ qf)
        grad_q_out = grad_q.to(q.dtype) if ctx.needs_input_grad[0] else None
        grad_k = torch.cat(grad_k_blocks, dim=-2).to(k.dtype) if ctx.needs_input_grad[1] else None
        grad_v = torch.cat(grad_v_blocks, dim=-2).to(v.dtype) if ctx.needs_input_grad[2] else None
        return grad_q_out, grad_k, grad_v, None


register(
    FlashAttention,
    name="flash_attention",
    inputs=[
        Tensor("q", "*batch n_q d"),
        Tensor("k", "*batch n_k d"),
        Tensor("v", "*batch n_k e"),
        Scalar("block_k", st.sampled_from([4, 16])),
    ],
    reference=lambda q, k, v, block_k: _sdpa_reference(q, k, v, None),
    dtypes=ALL_FLOATS,
    double_backward=False,
    saves=lambda t: _log_sum_exp_bytes(t["q"]),  # beyond q, k, v and the output: one number per query row
)
