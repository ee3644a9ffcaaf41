"""Known-buggy Functions that only the richer input kinds reach: zero-length sequences (``Offsets``),
sentinel targets (``Index(sentinels=)``) and partially broadcast tables (``Derived(broadcast=)``).

Each is registered with the spec and reference of its correct twin in ``reference_ops``
(``varlen_attention``, ``cross_entropy_ignore_index``, ``rotary``), under a name saying what is
wrong. Each is right on the inputs an older generation drew (no zero-length sequences, no
sentinels, tables only at their full shape, offsets written by hand):

* ``varlen_empty_sequence_bug`` -- a zero-length sequence still gets one row: it adds v of the
  next sequence's first row into that row's output.
* ``varlen_last_sequence_bug`` -- a launch grid of ``t // 4`` row blocks (floor, not ceil): the
  last ``t % 4`` packed rows (normally the tail of the last sequence) are never computed, stay 0.
* ``cross_entropy_counts_ignored`` -- the mean divides by n, not by the count of valid targets.
* ``rotary_unbroadcast_backward`` -- backward reshapes cos/sin to (b, s, 1, d): raises when the
  table is shared by a batch of more than one.

In the first three forward and backward agree (gradcheck passes): only the reference
comparison finds them. The last raises in backward, so any contract that runs backward on a
broadcast table with b > 1 finds it.

Self-contained on purpose: importing ``reference_ops`` here would register (and test) all of
it, so the references and table builders are repeated from there, unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Derived, Index, Offsets, Scalar, Tensor, register

ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _upcast(tensor: torch.Tensor) -> torch.Tensor:
    """As reference_ops._common.upcast: a contiguous float64 copy (one compute dtype for mixed inputs)."""
    tensor = tensor.contiguous()
    return tensor.double() if tensor.is_floating_point() else tensor


# --------------------------------------------------------------------------- varlen attention


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1) @ v


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """As reference_ops.attention._varlen_reference: sdpa per non-empty slice, concatenated."""
    bounds = cu_seqlens.tolist()
    pieces = [
        _sdpa(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)).transpose(0, 1)
        for s, e in itertools.pairwise(bounds)
        if e > s
    ]
    if not pieces:
        return _sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    return torch.cat(pieces, dim=0)


def _attend(qf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, rows: slice, keys: slice) -> torch.Tensor:
    """Output rows ``rows`` attending to keys ``keys`` of packed (t, h, *) tensors: (m, h, e)."""
    q_i, k_j, v_j = (x.transpose(0, 1) for x in (qf[rows], kf[keys], vf[keys]))
    return _sdpa(q_i, k_j, v_j).transpose(0, 1)


def _attend_backward(
    tensors: tuple[torch.Tensor, ...], g: torch.Tensor, grads: tuple[torch.Tensor, ...], rows: slice, keys: slice
) -> None:
    """Accumulates the gradients of ``_attend(rows, keys)`` into ``grads`` (probabilities recomputed)."""
    qf, kf, vf = tensors
    q_i, k_j, v_j, g_i = (x.transpose(0, 1) for x in (qf[rows], kf[keys], vf[keys], g[rows]))
    scale = 1.0 / math.sqrt(qf.shape[-1])
    p = torch.softmax((q_i @ k_j.transpose(-1, -2)) * scale, dim=-1)
    dp = g_i @ v_j.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True)) * scale
    grads[0][rows] += (ds @ k_j).transpose(0, 1)
    grads[1][keys] += (ds.transpose(-1, -2) @ q_i).transpose(0, 1)
    grads[2][keys] += (p.transpose(-1, -2) @ g_i).transpose(0, 1)


Ranges = list[tuple[slice, slice]]  # (query rows, key rows) per program


def _ranges_forward(ctx: Any, ranges: Ranges, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Varlen attention over the given (rows, keys) ranges, accumulated; saves the inputs."""
    qf, kf, vf = _upcast(q), _upcast(k), _upcast(v)
    out = torch.zeros((q.shape[0], q.shape[1], v.shape[-1]), dtype=qf.dtype, device=q.device)
    for rows, keys in ranges:
        out[rows] += _attend(qf, kf, vf, rows, keys)
    ctx.save_for_backward(q, k, v, cu_seqlens)
    return out.to(q.dtype)


def _ranges_backward(ctx: Any, ranges_of: Callable[[list[int], int], Ranges], grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The exact gradient of ``_ranges_forward`` over the same ranges: forward and backward agree."""
    q, k, v, cu_seqlens = ctx.saved_tensors
    tensors = (_upcast(q), _upcast(k), _upcast(v))
    grads = tuple(torch.zeros_like(x) for x in tensors)
    for rows, keys in ranges_of(cu_seqlens.tolist(), q.shape[0]):
        _attend_backward(tensors, _upcast(grad_output), grads, rows, keys)
    needed = tuple(gr.to(x.dtype) if need else None for gr, x, need in zip(grads, (q, k, v), ctx.needs_input_grad))
    return (*needed, None, None)


def _empty_sequence_ranges(bounds: list[int], total: int) -> Ranges:
    spans = [(s, min(s + max(e - s, 1), total)) for s, e in itertools.pairwise(bounds)]  # BUG: max(len, 1)
    return [(slice(s, e), slice(s, e)) for s, e in spans if e > s]


def _last_sequence_ranges(bounds: list[int], total: int) -> Ranges:
    computed = total // 4 * 4  # BUG: rows past the last full block of 4 get no program
    return [(slice(s, min(e, computed)), slice(s, e)) for s, e in itertools.pairwise(bounds) if min(e, computed) > s]


class VarlenEmptySequenceBug(torch.autograd.Function):
    """Gives every sequence max(len, 1) rows: a zero-length one attends over the next sequence's first row.

    Its single-key softmax is 1, so it adds that row's v into that row's output (accumulated, as
    atomics would). Wrong only when a zero-length sequence precedes packed rows; the older
    generation had no Offsets input and never drew a zero-length sequence.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        return _ranges_forward(ctx, _empty_sequence_ranges(cu_seqlens.tolist(), q.shape[0]), q, k, v, cu_seqlens)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _ranges_backward(ctx, _empty_sequence_ranges, grad_output)


class VarlenLastSequenceBug(torch.autograd.Function):
    """Launches t // 4 blocks of 4 packed rows (floor, not ceil): the last t % 4 rows stay 0.

    Those rows are normally the tail of the last sequence; its keys are still all read. Wrong only when
    the packed total is not a multiple of 4: the older generation had no Offsets input, so a
    varlen spec carried hand-written offsets whose total never moved with the drawn sizes.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        return _ranges_forward(ctx, _last_sequence_ranges(cu_seqlens.tolist(), q.shape[0]), q, k, v, cu_seqlens)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _ranges_backward(ctx, _last_sequence_ranges, grad_output)


_VARLEN_INPUTS = [
    Tensor("q", "t h d"),
    Tensor("k", "t h d"),
    Tensor("v", "t h e"),
    Offsets("cu_seqlens", sequences="b", total="t"),
    Scalar("max_seqlen", from_case=lambda case: case.max_length("cu_seqlens")),
]

for _fn, _name in ((VarlenEmptySequenceBug, "varlen_empty_sequence_bug"), (VarlenLastSequenceBug, "varlen_last_sequence_bug")):
    register(
        _fn,
        name=_name,
        inputs=_VARLEN_INPUTS,
        reference=varlen_reference,
        dtypes=ALL_FLOATS,
        double_backward=False,
        saves=lambda t: t["q"][..., 0].numel() * _upcast(t["q"][:1, :1, :1]).element_size(),  # the twin's promise
        waivers={"compile": "loops in Python over sequence lengths read from cu_seqlens (data-dependent control flow)"},
    )


# --------------------------------------------------------------------------- cross-entropy


def cross_entropy_reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """As reference_ops.losses._cross_entropy_reference: mean over valid rows, 0 when none is."""
    valid = target != ignore_index
    picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
    return -(picked * valid.to(picked.dtype)).sum() / max(int(valid.sum()), 1)


class CrossEntropyCountsIgnored(torch.autograd.Function):
    """Divides the summed loss of the valid rows by n, every row, instead of by their count.

    Forward and backward divide alike, so gradcheck passes. Wrong only when some but not all
    targets are ignore_index: the older generation drew no sentinels, so the count was always n.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        lf = _upcast(logits)
        valid = target != ignore_index
        lse = torch.logsumexp(lf, dim=-1)
        picked = lf.gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
        count = max(logits.shape[0], 1)  # BUG: n, not valid.sum()
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index, ctx.count = ignore_index, count
        return (torch.where(valid, lse - picked, torch.zeros_like(lse)).sum() / count).to(logits.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        logits, target, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        lf = _upcast(logits)
        valid = target != ctx.ignore_index
        onehot = torch.zeros_like(lf).scatter(-1, torch.where(valid, target, 0).unsqueeze(-1), 1.0)
        weight = valid.to(lf.dtype).unsqueeze(-1) * (_upcast(grad_output) / ctx.count)
        return ((torch.exp(lf - lse.unsqueeze(-1)) - onehot) * weight).to(logits.dtype), None, None


register(
    CrossEntropyCountsIgnored,
    name="cross_entropy_counts_ignored",
    inputs=[Tensor("logits", "n c"), Index("target", "n", high="c", sentinels=(-100,)), Scalar("ignore_index", -100)],
    reference=cross_entropy_reference,
    dtypes=ALL_FLOATS,
    double_backward=False,
    saves=lambda t: t["logits"].shape[0] * _upcast(t["logits"][:1, :1]).element_size(),  # the twin's promise
)


# --------------------------------------------------------------------------- rotary


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotate_half_transposed(y: torch.Tensor) -> torch.Tensor:
    half = y.shape[-1] // 2
    return torch.cat([y[..., half:], -y[..., :half]], dim=-1)


def _rope_angles(ctx: Any) -> torch.Tensor:
    """As reference_ops.rotary._rope_angles: one random start per batch row, + arange(s)."""
    shape = tuple(ctx.shape)
    seqlen, dim = shape[-3], shape[-1]
    rows = shape[0] if len(shape) == 4 else 1
    batch = max(int(ctx.sizes.get("b", rows)), rows)
    starts = torch.randint(0, 64, (batch, 1), generator=ctx.generator, dtype=torch.int64)[:rows]
    positions = (starts + torch.arange(seqlen, dtype=torch.int64)).to(torch.float64)
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.unsqueeze(-1) * inv_freq
    return torch.cat([angles, angles], dim=-1).reshape(shape)


def rope_cos(ctx: Any) -> torch.Tensor:
    return torch.cos(_rope_angles(ctx))


def rope_sin(ctx: Any) -> torch.Tensor:
    return torch.sin(_rope_angles(ctx))


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class RotaryUnbroadcastBackward(torch.autograd.Function):
    """Forward broadcasts cos/sin; backward reads them the way a kernel written for full tables
    does: table row ``batch * s + position`` of a flat (rows, d) view, with loads past the last
    row masked to 0 (``tl.load(..., mask=row < n_rows, other=0)``).

    Right for the full (b, s, 1, d) table and for b = 1; for a (1, s, 1, d) or (s, 1, d) table
    and b > 1, every batch element after the first gets a zero gradient, silently. The older
    generation drew cos/sin only at their full shape (broadcasting was all dims or none, and
    dropping the position dim is not a rotary table), so it never handed backward a broadcast table.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        xf = _upcast(x)
        return (xf * _upcast(cos) + _rotate_half(xf) * _upcast(sin)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        cos, sin = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        b, s, _, d = grad_output.shape
        g = _upcast(grad_output)

        def rows(table: torch.Tensor) -> torch.Tensor:
            flat = _upcast(table).reshape(-1, d)  # BUG: assumes one table row per (batch, position)
            row = torch.arange(b * s, device=flat.device)
            loaded = flat[row.clamp(max=flat.shape[0] - 1)]
            return torch.where((row < flat.shape[0]).unsqueeze(-1), loaded, 0.0).reshape(b, s, 1, d)

        cos_rows, sin_rows = rows(cos), rows(sin)
        return (g * cos_rows + _rotate_half_transposed(g * sin_rows)).to(grad_output.dtype), None, None


register(
    RotaryUnbroadcastBackward,
    name="rotary_unbroadcast_backward",
    inputs=[
        Tensor("x", "b s h d:even"),
        Derived("cos", rope_cos, "b s 1 d", broadcast="b"),
        Derived("sin", rope_sin, "b s 1 d", broadcast="b", seed_from="cos"),
    ],
    reference=rotary_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",
)
