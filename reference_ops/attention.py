"""Attention: masked sdpa (boolean or additive mask), blockwise FlashAttention, packed varlen attention.

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
* ``VarlenAttention`` -- flash-attention's varlen form: sequences packed along one dim ``t``,
  delimited by int32 ``cu_seqlens`` (an ``Offsets`` input, zero-length sequences included);
  each attends only within itself. The loops follow a kernel's launch grid (sequence x query
  block, the block axis sized by ``max_seqlen``, which never changes a result); forward saves
  one log-sum-exp per (row, head), backward recomputes the probabilities per sequence. Once
  differentiable. The reference runs the sdpa reference on each non-empty slice.
* ``AdditiveMaskAttention`` -- sdpa with an additive float mask (0 = keep, ``-inf`` = masked,
  in the case dtype) added to the scores, as ``attn_mask`` of
  ``torch.nn.functional.scaled_dot_product_attention``. A row that is ``-inf`` everywhere gives
  a zero output row and zero gradients, the same convention as the boolean ``sdpa``.

Computed on contiguous copies in a wider dtype (float32 for float16/bfloat16, float64 for
float32), rounded once at the end; see ``reference_ops._common.upcast``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from hypothesis import strategies as st
from torch.autograd.function import once_differentiable

from conformance import AdditiveMask, Mask, Offsets, Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["AdditiveMaskAttention", "FlashAttention", "ScaledDotProductAttention", "VarlenAttention"]


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
    waivers={
        "compile": "loops over key blocks in Python (range(0, n_k, block_k)), so torch.compile specialises on the "
        "key length and recompiles for every one (measured: 3 graphs for 3 calls with different n_k)"
    },
)


# --------------------------------------------------------------------------- packed varlen


def _varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Each sequence's rows attend within the sequence: sdpa per slice, concatenated."""
    bounds = cu_seqlens.tolist()
    pieces = [
        _sdpa_reference(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), None).transpose(0, 1)
        for s, e in itertools.pairwise(bounds)
        if e > s  # a zero-length sequence contributes no rows
    ]
    if not pieces:  # t == 0: an empty (0, h, e) result, still connected to q, k and v
        return _sdpa_reference(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), None).transpose(0, 1)
    return torch.cat(pieces, dim=0)


VARLEN_BLOCK_M = 4  # query rows per program of the launch grid


class VarlenAttention(torch.autograd.Function):
    """Packed variable-length attention over cu_seqlens (non-causal); saves one lse per (row, head).

    q, k: (t, h, d), v: (t, h, e), the sequences packed along t; sequence i is rows
    ``cu_seqlens[i]:cu_seqlens[i+1]`` and attends only to itself. The loops mirror a varlen
    kernel's launch grid (sequence, query block of ``VARLEN_BLOCK_M`` rows): ``max_seqlen`` sizes
    the grid's block axis, and a program whose block starts past its sequence's end does
    nothing -- which is all a zero-length sequence ever gets.
    """

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
    ) -> torch.Tensor:
        qf, kf, vf = upcast(q), upcast(k), upcast(v)
        scale = 1.0 / math.sqrt(q.shape[-1])
        bounds = cu_seqlens.tolist()
        out = torch.zeros((q.shape[0], q.shape[1], v.shape[-1]), dtype=qf.dtype, device=q.device)
        lse = torch.zeros(q.shape[:2], dtype=qf.dtype, device=q.device)  # (t, h), accumulation dtype
        for start, end in itertools.pairwise(bounds):
            k_i, v_i = kf[start:end].transpose(0, 1), vf[start:end].transpose(0, 1)  # (h, n, *)
            for block in range(0, max_seqlen, VARLEN_BLOCK_M):
                if start + block >= end:
                    break  # this program's rows lie past the sequence's end
                rows = slice(start + block, min(start + block + VARLEN_BLOCK_M, end))
                s = (qf[rows].transpose(0, 1) @ k_i.transpose(-1, -2)) * scale  # (h, m, n)
                m = s.amax(dim=-1, keepdim=True)
                p = torch.exp(s - m)
                total = p.sum(dim=-1, keepdim=True)
                out[rows] = ((p @ v_i) / total).transpose(0, 1)
                lse[rows] = (m + torch.log(total)).squeeze(-1).transpose(0, 1)
        ctx.save_for_backward(q, k, v, cu_seqlens, lse)
        ctx.max_seqlen = max_seqlen
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, cu_seqlens, lse = ctx.saved_tensors
        qf, kf, vf, g = upcast(q), upcast(k), upcast(v), upcast(grad_output)
        scale = 1.0 / math.sqrt(q.shape[-1])
        bounds = cu_seqlens.tolist()
        # Every packed row belongs to exactly one sequence, so each is written once; zeros for t == 0.
        grad_q, grad_k, grad_v = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        for start, end in itertools.pairwise(bounds):
            k_i, v_i = kf[start:end].transpose(0, 1), vf[start:end].transpose(0, 1)  # (h, n, *)
            # The forward's query blocks again: scores recomputed with the same operands and shapes
            # are bitwise the forward's, so exp(s - lse) <= 1 even where the scores are ~1e30.
            for block in range(0, ctx.max_seqlen, VARLEN_BLOCK_M):
                if start + block >= end:
                    break
                rows = slice(start + block, min(start + block + VARLEN_BLOCK_M, end))
                s = (qf[rows].transpose(0, 1) @ k_i.transpose(-1, -2)) * scale  # (h, m, n)
                p = torch.exp(s - lse[rows].transpose(0, 1).unsqueeze(-1))
                g_rows = g[rows].transpose(0, 1)  # (h, m, e)
                dp = g_rows @ v_i.transpose(-1, -2)
                # D = sum_j dP_ij P_ij, not rowsum(dO * O): see FlashAttention.backward.
                ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True)) * scale
                grad_q[rows] = (ds @ k_i).transpose(0, 1)
                grad_k[start:end] += (ds.transpose(-1, -2) @ qf[rows].transpose(0, 1)).transpose(0, 1)
                grad_v[start:end] += (p.transpose(-1, -2) @ g_rows).transpose(0, 1)
        return (
            grad_q.to(q.dtype) if ctx.needs_input_grad[0] else None,
            grad_k.to(k.dtype) if ctx.needs_input_grad[1] else None,
            grad_v.to(v.dtype) if ctx.needs_input_grad[2] else None,
            None,  # cu_seqlens: int32 offsets
            None,  # max_seqlen
        )


register(
    VarlenAttention,
    name="varlen_attention",
    inputs=[
        Tensor("q", "t h d"),
        Tensor("k", "t h d"),
        Tensor("v", "t h e"),
        Offsets("cu_seqlens", sequences="b", total="t"),
        Scalar("max_seqlen", from_case=lambda case: case.max_length("cu_seqlens")),
    ],
    reference=_varlen_reference,
    dtypes=ALL_FLOATS,
    double_backward=False,
    saves=lambda t: _log_sum_exp_bytes(t["q"]),  # beyond the inputs: one lse per (row, head)
    waivers={
        "compile": "loops in Python over sequence lengths read from cu_seqlens (data-dependent control flow, "
        "which fullgraph=True cannot trace); a compiled varlen kernel is one custom op"
    },
)


# --------------------------------------------------------------------------- additive mask


def _additive_mask_probs(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) over keys; rows whose bias is -inf everywhere are all zeros."""
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    any_kept = (~torch.isneginf(bias)).any(dim=-1, keepdim=True)
    # A fully masked row gets no bias (a finite softmax) and is then zeroed: its gradient is
    # exactly 0, never 0 * nan.
    probs = torch.softmax(scores + torch.where(any_kept, bias, torch.zeros_like(bias)), dim=-1)
    return probs * any_kept.to(probs.dtype)


def _additive_mask_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # An AdditiveMask holds only 0 and -inf: it is the boolean mask "not -inf" of sdpa, whose
    # reference defines the same zero rows.
    return _sdpa_reference(q, k, v, ~torch.isneginf(bias))


class AdditiveMaskAttention(torch.autograd.Function):
    """out = softmax(q k^T / sqrt(d) + bias) v with an additive 0 / -inf mask; recomputes in backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, k, v, bias)
        probs = _additive_mask_probs(upcast(q), upcast(k), upcast(bias))
        return (probs @ upcast(v)).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, bias = ctx.saved_tensors
        qf, kf, vf, g = upcast(q), upcast(k), upcast(v), upcast(grad_output)
        probs = _additive_mask_probs(qf, kf, upcast(bias))
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
        return grad_q, grad_k, grad_v, None  # None: the mask never requires grad


register(
    AdditiveMaskAttention,
    name="sdpa_additive_mask",
    inputs=[
        Tensor("q", "*batch n_q d"),
        Tensor("k", "*batch n_k d"),
        Tensor("v", "*batch n_k e"),
        AdditiveMask("bias", "*batch n_q n_k"),
    ],
    reference=_additive_mask_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",  # backward recomputes the probabilities
)
