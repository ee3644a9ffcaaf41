"""Corner bugs (issue "Search power"): backward passes that are right almost everywhere and wrong in
one corner of the input space -- a size relation, a size past a block, a rank, a Scalar's value,
an ignored target. Written as kernel authors write them: fused backward, Python loops over blocks,
a fast path. Each buggy Function has a correct twin (name + "_ok") that differs in the one line.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from hypothesis import strategies as st

from conformance import Dim, Index, Mask, Offsets, Scalar, Tensor, register

FLOATS = (torch.float64, torch.float32)


# 1. causal attention, bottom-right aligned: the offset is lost when there are fewer queries than keys


def _causal_mask(m: int, n: int, device: torch.device, short_queries_ok: bool) -> torch.Tensor:
    offset = n - m
    if not short_queries_ok and offset > 0:
        offset = 0  # the bug: written for m >= n (training), so it never showed
    rows = torch.arange(m, device=device).unsqueeze(-1)
    cols = torch.arange(n, device=device)
    return cols > rows + offset


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, short_queries_ok: bool) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(_causal_mask(q.shape[-2], k.shape[-2], q.device, short_queries_ok), torch.finfo(s.dtype).min)
    return s


def _attention_forward(ok: bool):  # type: ignore[no-untyped-def]
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        p = torch.softmax(_scores(q, k, causal, ok), dim=-1)
        masked = _causal_mask(q.shape[-2], k.shape[-2], q.device, ok) if causal else torch.zeros_like(p, dtype=torch.bool)
        ctx.save_for_backward(q, k, v, p, masked)
        return p @ v

    return staticmethod(forward)


def _attention_backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    q, k, v, p, masked = ctx.saved_tensors
    dv = p.transpose(-1, -2) @ g
    dp = g @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
    ds = ds.masked_fill(masked, 0)  # a masked score is a constant: no gradient (a query with no key too)
    return ds @ k, ds.transpose(-1, -2) @ q, dv, None


class CausalAttentionShortQueries(torch.autograd.Function):
    forward = _attention_forward(False)
    backward = staticmethod(_attention_backward)


class CausalAttentionShortQueriesOk(torch.autograd.Function):
    forward = _attention_forward(True)
    backward = staticmethod(_attention_backward)


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return torch.softmax(_scores(q, k, causal, True), dim=-1) @ v


ATTENTION = [Tensor("q", "b m d"), Tensor("k", "b n d"), Tensor("v", "b n e"), Scalar("causal", st.booleans())]
for _function, _name in ((CausalAttentionShortQueries, "causal_offset_short_queries"), (CausalAttentionShortQueriesOk, "causal_offset_short_queries_ok")):
    register(_function, name=_name, inputs=ATTENTION, reference=_attention_reference, dtypes=FLOATS, double_backward=False)


# 2. a row sum in Python blocks of 64 that drops the tail once there is more than one block


def _blocked_sum(x: torch.Tensor, keep_tail: bool) -> torch.Tensor:
    n = x.shape[-1]
    stop = n if (keep_tail or n <= 64) else n - n % 64
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, stop, 64):
        total = total + x[..., start:start + 64].sum(-1)
    return total


class BlockedRowSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return _blocked_sum(x, keep_tail=False)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.unsqueeze(-1).expand(*g.shape, ctx.n).contiguous()


class BlockedRowSumOk(BlockedRowSum):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[-1]
        return _blocked_sum(x, keep_tail=True)


for _function, _name in ((BlockedRowSum, "tail_dropped_above_64"), (BlockedRowSumOk, "tail_dropped_above_64_ok")):
    register(_function, name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: x.sum(-1), dtypes=FLOATS)


# 3. a gradient computed on pairs of elements that forgets the odd one out


class PairScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 3 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        n = g.shape[-1]
        paired = n - n % 2 if n > 1 else n  # the bug: the odd element out gets no gradient
        out = torch.zeros_like(g)
        out[..., :paired] = 3 * g[..., :paired]
        return out


class PairScaleOk(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 3 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 3 * g


for _function, _name in ((PairScale, "odd_length_pairs"), (PairScaleOk, "odd_length_pairs_ok")):
    register(_function, name=_name, inputs=[Tensor("x", "m n")], reference=lambda x: 3 * x, dtypes=FLOATS)


# 4. a single-row fast path that forgets the scale


class RowScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if g.shape[0] == 1:
            return g  # "fast path" for a single row: the bug
        return 2 * g


class RowScaleOk(RowScale):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


for _function, _name in ((RowScale, "single_row_fast_path"), (RowScaleOk, "single_row_fast_path_ok")):
    register(_function, name=_name, inputs=[Tensor("x", "m n")], reference=lambda x: 2 * x, dtypes=FLOATS)


# 5. softmax over any dim whose backward reduces over the last one


def _dim_of(case: Any) -> st.SearchStrategy[int]:
    return st.integers(-case.ndim("x"), case.ndim("x") - 1)


class SoftmaxAnyDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        y = torch.softmax(x, dim=dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(-1, keepdim=True)), None  # the bug: dim=-1, not ctx.dim


class SoftmaxAnyDimOk(SoftmaxAnyDim):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(ctx.dim, keepdim=True)), None


SOFTMAX = [Tensor("x", "*batch n"), Scalar("dim", from_case=_dim_of)]
for _function, _name in ((SoftmaxAnyDim, "softmax_dim_not_last"), (SoftmaxAnyDimOk, "softmax_dim_not_last_ok")):
    register(_function, name=_name, inputs=SOFTMAX, reference=lambda x, dim: torch.softmax(x, dim=dim), dtypes=FLOATS)


# 6. a sum over a dim whose backward normalises a negative dim against the wrong rank


class SumOverDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim, ctx.shape = dim, x.shape
        return x.sum(dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        dim = ctx.dim if ctx.dim >= 0 else ctx.dim + g.dim()  # the bug: x has g.dim() + 1 dims
        return g.unsqueeze(dim).expand(ctx.shape).contiguous(), None


class SumOverDimOk(SumOverDim):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        dim = ctx.dim if ctx.dim >= 0 else ctx.dim + len(ctx.shape)
        return g.unsqueeze(dim).expand(ctx.shape).contiguous(), None


for _function, _name in ((SumOverDim, "negative_dim"), (SumOverDimOk, "negative_dim_ok")):
    register(_function, name=_name, inputs=SOFTMAX, reference=lambda x, dim: x.sum(dim), dtypes=FLOATS)


# 7. a batched norm whose backward divides by the batch size, which may be 0


class BatchMeanCenter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.rows = x.shape[0]
        return x - x.mean(-1, keepdim=True)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        scale = g.shape[0] / ctx.rows  # the bug: a batch of 0 rows divides 0 by 0
        return (g - g.mean(-1, keepdim=True)) * scale


class BatchMeanCenterOk(BatchMeanCenter):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g - g.mean(-1, keepdim=True)


for _function, _name in ((BatchMeanCenter, "zero_size_batch"), (BatchMeanCenterOk, "zero_size_batch_ok")):
    register(
        _function, name=_name, inputs=[Tensor("x", "b n")], dims=[Dim("b", min_size=0)],
        reference=lambda x: x - x.mean(-1, keepdim=True), dtypes=FLOATS,
    )


# 8. a per-token loss (reduction='none') whose backward treats grad_output as the scalar of a mean


class SquaredError(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, t)
        return (x - t) ** 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, t = ctx.saved_tensors
        return 2 * (x - t) * g.mean(), None  # the bug: written for reduction='mean'


class SquaredErrorOk(SquaredError):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, t = ctx.saved_tensors
        return 2 * (x - t) * g, None


TOKENS = [Tensor("x", "n"), Tensor("t", "n", requires_grad=False)]
for _function, _name in ((SquaredError, "per_token_grad_as_scalar"), (SquaredErrorOk, "per_token_grad_as_scalar_ok")):
    register(_function, name=_name, inputs=TOKENS, reference=lambda x, t: (x - t) ** 2, dtypes=FLOATS)


# 9. a projection over the head dim in chunks of 16 that drops a partial chunk


def _chunked_rows(x: torch.Tensor, w: torch.Tensor, keep_tail: bool) -> torch.Tensor:
    d = x.shape[-1]
    stop = d if (keep_tail or d <= 16) else d - d % 16
    out = torch.zeros(*x.shape[:-1], w.shape[-1], dtype=x.dtype, device=x.device)
    for start in range(0, stop, 16):
        out = out + x[..., start:start + 16] @ w[start:start + 16]
    return out


class HeadProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        grad_x = _chunked_rows(g, w.transpose(0, 1), keep_tail=True)
        grad_w = _chunked_rows(x.transpose(0, 1), g, keep_tail=False).contiguous()  # the bug
        return grad_x, grad_w


class HeadProjectionOk(HeadProjection):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return _chunked_rows(g, w.transpose(0, 1), keep_tail=True), _chunked_rows(x.transpose(0, 1), g, keep_tail=True)


PROJECTION = [Tensor("x", "t d"), Tensor("w", "d e")]
for _function, _name in ((HeadProjection, "head_dim_not_multiple_of_16"), (HeadProjectionOk, "head_dim_not_multiple_of_16_ok")):
    register(_function, name=_name, inputs=PROJECTION, reference=lambda x, w: x @ w, dtypes=FLOATS)


# 10. packed sequences (cu_seqlens): per-sequence sums whose backward stops at an empty sequence


def _segment_sums(x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    bounds = cu.tolist()
    return torch.stack([x[a:b].sum(0) for a, b in itertools.pairwise(bounds)])


class SegmentSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cu)
        ctx.t = x.shape[0]
        return _segment_sums(x, cu)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (cu,) = ctx.saved_tensors
        bounds = cu.tolist()
        grad = g.new_zeros(ctx.t, g.shape[-1])
        for i, (a, b) in enumerate(itertools.pairwise(bounds)):
            if a == b:
                break  # the bug: an empty sequence ends the loop ("no more tokens")
            grad[a:b] = g[i]
        return grad, None


class SegmentSumOk(SegmentSum):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (cu,) = ctx.saved_tensors
        bounds = cu.tolist()
        grad = g.new_zeros(ctx.t, g.shape[-1])
        for i, (a, b) in enumerate(itertools.pairwise(bounds)):
            grad[a:b] = g[i]
        return grad, None


VARLEN = [Tensor("x", "t d"), Offsets("cu_seqlens", sequences="s", total="t")]
for _function, _name in ((SegmentSum, "varlen_empty_sequence"), (SegmentSumOk, "varlen_empty_sequence_ok")):
    register(_function, name=_name, inputs=VARLEN, reference=_segment_sums, dtypes=FLOATS)


# 11. a pooling op whose rarely used mode ('max') sends the gradient to the first element


class Pool(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mode: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.mode = mode
        return x.amax(-1) if mode == "max" else x.sum(-1) if mode == "sum" else x.mean(-1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        n = x.shape[-1]
        if ctx.mode == "sum":
            return g.unsqueeze(-1).expand_as(x).contiguous(), None
        if ctx.mode == "mean":
            return (g / n).unsqueeze(-1).expand_as(x).contiguous(), None
        grad = torch.zeros_like(x)
        grad[..., 0] = g  # the bug: the first element, not the argmax
        return grad, None


class PoolOk(Pool):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        if ctx.mode != "max":
            n = 1 if ctx.mode == "sum" else x.shape[-1]
            return (g / n).unsqueeze(-1).expand_as(x).contiguous(), None
        return torch.zeros_like(x).scatter(-1, x.argmax(-1, keepdim=True), g.unsqueeze(-1)), None


def _pool_reference(x: torch.Tensor, mode: str) -> torch.Tensor:
    return x.amax(-1) if mode == "max" else x.sum(-1) if mode == "sum" else x.mean(-1)


POOL = [Tensor("x", "m n"), Scalar("mode", st.sampled_from(["sum", "mean", "max"]))]
for _function, _name in ((Pool, "rare_flag_branch"), (PoolOk, "rare_flag_branch_ok")):
    register(_function, name=_name, inputs=POOL, reference=_pool_reference, dtypes=FLOATS, double_backward=False)


# 12. mean cross-entropy whose backward divides by every row, ignored ones included


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    valid = target != ignore_index
    picked = torch.log_softmax(logits, -1).gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
    return -(picked * valid.to(picked.dtype)).sum() / max(int(valid.sum()), 1)


class CrossEntropyIgnore(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index
        return _cross_entropy(logits, target, ignore_index)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, target = ctx.saved_tensors
        valid = target != ctx.ignore_index
        count = logits.shape[0]  # the bug: every row, ignored ones too
        return _cross_entropy_grad(logits, target, valid, count, g), None, None


class CrossEntropyIgnoreOk(CrossEntropyIgnore):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, target = ctx.saved_tensors
        valid = target != ctx.ignore_index
        return _cross_entropy_grad(logits, target, valid, max(int(valid.sum()), 1), g), None, None


def _cross_entropy_grad(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, count: int, g: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, -1)
    onehot = torch.zeros_like(probs).scatter(-1, torch.where(valid, target, 0).unsqueeze(-1), 1.0)
    return (probs - onehot) * valid.to(probs.dtype).unsqueeze(-1) * (g / count)


LOSS = [Tensor("logits", "n c"), Index("target", "n", high="c", sentinels=(-100,)), Scalar("ignore_index", -100)]
for _function, _name in ((CrossEntropyIgnore, "ignore_index_present"), (CrossEntropyIgnoreOk, "ignore_index_present_ok")):
    register(_function, name=_name, inputs=LOSS, reference=_cross_entropy, dtypes=FLOATS, double_backward=False)


# 13. a row-tiled norm: dweight summed over blocks of 4 rows of the flattened batch; the bug keeps
# the last block's (seen by a new user's trial: the batch's rank corners never passed 4 rows)

ROW_BLOCK = 4


def _row_block_dweight(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """dweight = sum over rows of g * x, in float32 (float64 kept), blocks of ROW_BLOCK rows."""
    rows, gs = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = torch.zeros_like(w, dtype=torch.float32 if w.dtype != torch.float64 else w.dtype)
    for start in range(0, rows.shape[0], ROW_BLOCK):
        block = (gs[start:start + ROW_BLOCK] * rows[start:start + ROW_BLOCK]).sum(0).to(dw.dtype)
        dw = dw + block if accumulate else block  # the bug (accumulate=False): = where += was meant
    return dw.to(w.dtype)


class RowBlockScale(torch.autograd.Function):
    """y = x * w over the last dim, rows (the flattened ``*batch``) processed in blocks of 4."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return g * w, _row_block_dweight(x, g, w, accumulate=False)


class RowBlockScaleOk(RowBlockScale):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return g * w, _row_block_dweight(x, g, w, accumulate=True)


ROWS = [Tensor("x", "*batch d"), Tensor("w", "d")]
for _function, _name in ((RowBlockScale, "row_blocks_last_only"), (RowBlockScaleOk, "row_blocks_last_only_ok")):
    register(_function, name=_name, inputs=ROWS, reference=lambda x, w: x * w, dtypes=FLOATS)


# 14. a row-tiled scale whose backward writes dx block by block into torch.empty, with a one-block
# fast path; the loop runs over full blocks of 16 rows only, so the tail rows past a multiple of
# 16 keep whatever the allocation held (seen by a new user's trial: the many-rows corner drew a
# requires_grad subset without x, so unwritten_memory never judged dx at more than 16 rows)

TAIL_BLOCK = 16


def _row_block_dx(g: torch.Tensor, w: torch.Tensor, tail: bool) -> torch.Tensor:
    """dx = g * w, written into a fresh buffer a block of TAIL_BLOCK rows at a time."""
    rows = g.reshape(-1, g.shape[-1])
    dx = torch.empty_like(rows)
    if rows.shape[0] <= TAIL_BLOCK:  # one block: the fast path
        dx.copy_(rows * w)
        return dx.reshape(g.shape)
    end = rows.shape[0] if tail else rows.shape[0] // TAIL_BLOCK * TAIL_BLOCK  # the bug (tail=False)
    for start in range(0, end, TAIL_BLOCK):
        dx[start:start + TAIL_BLOCK] = rows[start:start + TAIL_BLOCK] * w
    return dx.reshape(g.shape)


class RowTailScale(torch.autograd.Function):
    """y = x * w over the last dim; dx written in blocks of 16 rows of the flattened ``*batch``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        dx = _row_block_dx(g, w, tail=False) if ctx.needs_input_grad[0] else None
        dw = (g * x).reshape(-1, x.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        return dx, dw


class RowTailScaleOk(RowTailScale):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        dx = _row_block_dx(g, w, tail=True) if ctx.needs_input_grad[0] else None
        dw = (g * x).reshape(-1, x.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        return dx, dw


for _function, _name in ((RowTailScale, "row_tail_unwritten"), (RowTailScaleOk, "row_tail_unwritten_ok")):
    register(_function, name=_name, inputs=ROWS, reference=lambda x, w: x * w, dtypes=FLOATS)


# 15. a row scale with a hand-written vmap rule that moves the batch dim to the front, computes, and
# then declares the output's batch dim to be where the input's came in (seen by a new user's trial:
# every coverage corner drew the batch dim first, in_dims=(0, None), where that is right)


def _row_scale_vmap(out_dims_from_input: bool):  # type: ignore[no-untyped-def]
    def vmap(info: Any, in_dims: tuple[int | None, int | None], x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, int]:
        x_dim, w_dim = in_dims
        x = x.movedim(x_dim, 0) if x_dim is not None else x.unsqueeze(0)
        if w_dim is not None:
            w = w.movedim(w_dim, 0)
            w = w.reshape(info.batch_size, *[1] * (x.dim() - 2), w.shape[-1])
        out = x * w  # the batch dim is first now
        return out, (x_dim if x_dim is not None else 0) if out_dims_from_input else 0  # the bug: where it came in

    return staticmethod(vmap)


class RowScaleVmapRule(torch.autograd.Function):
    """y = x * w over the last dim, setup_context style, with a hand-written vmap rule."""

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * w

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)

    vmap = _row_scale_vmap(True)


class RowScaleVmapRuleOk(RowScaleVmapRule):
    vmap = _row_scale_vmap(False)


for _function, _name in ((RowScaleVmapRule, "vmap_out_dims_where_it_came_in"), (RowScaleVmapRuleOk, "vmap_out_dims_where_it_came_in_ok")):
    register(_function, name=_name, inputs=ROWS, reference=lambda x, w: x * w, dtypes=FLOATS)


# an online log-sum-exp in blocks of 16 that forgets to rescale the running sum when the last,
# partial block raises the running max: wrong only where a row's maximum lies in that block (1 in
# 17 random rows at n = 17); ascending values put it there in every row


def _online_logsumexp(x: torch.Tensor, rescale_last: bool) -> torch.Tensor:
    n = x.shape[-1]
    peak = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, n, 16):
        block = x[..., start:start + 16]
        new_peak = torch.maximum(peak, block.amax(-1))
        partial_last = start + 16 > n and n % 16 != 0 and n > 16
        kept = total if partial_last and not rescale_last else total * torch.exp(peak - new_peak)
        total = kept + torch.exp(block - new_peak.unsqueeze(-1)).sum(-1)
        peak = new_peak
    return peak + torch.log(total)


class OnlineLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        lse = _online_logsumexp(x, rescale_last=False)
        ctx.save_for_backward(x, lse)
        return lse

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, lse = ctx.saved_tensors
        return g.unsqueeze(-1) * torch.exp(x - lse.unsqueeze(-1))


class OnlineLogSumExpOk(OnlineLogSumExp):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        lse = _online_logsumexp(x, rescale_last=True)
        ctx.save_for_backward(x, lse)
        return lse


for _function, _name in ((OnlineLogSumExp, "online_max_in_last_block"), (OnlineLogSumExpOk, "online_max_in_last_block_ok")):
    register(_function, name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.logsumexp(x, -1), dtypes=FLOATS)


# a filter of length L <= n whose backward drops the gradient of taps past the third: the corners
# drew L only at its smallest (n's smallest size capped it) until a bounded dim's big corner raised n too


def _head_filter(taps_kept: int | None) -> type[torch.autograd.Function]:
    """y = x[..., :L] * w; backward keeps the gradient of the first ``taps_kept`` taps of w only
    (None: all of them, right)."""

    class HeadFilter(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return x[..., : w.shape[-1]] * w

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors
            taps = w.shape[-1]
            gx = torch.zeros_like(x)
            gx[..., :taps] = g * w
            gw = (g * x[..., :taps]).reshape(-1, taps).sum(0)
            if taps_kept is not None:  # the bug: taps past the third get no gradient
                gw = gw.where(torch.arange(taps, device=gw.device) < taps_kept, 0)
            return gx, gw

    return HeadFilter


for _function, _name in ((_head_filter(3), "bounded_dim_past_three"), (_head_filter(None), "bounded_dim_past_three_ok")):
    register(
        _function, name=_name, inputs=[Tensor("x", "b n"), Tensor("w", "L")],
        reference=lambda x, w: x[..., : w.shape[-1]] * w, dims=[Dim("L", max_size="n")], dtypes=FLOATS,
    )



# an attention with a key-padding mask: masked scores are filled with the dtype's minimum and only the
# padded keys are zeroed after exp, so under causal a query whose visible keys are all padded (left
# padding: key 0 masked) spreads its weight over the future keys; right padding never shows it


def _padded_attention_weights(
    q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor, causal: bool, zero_every_masked_score: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = key_mask.unsqueeze(-2).expand(s.shape)
    if causal:
        allowed = allowed & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p * (allowed if zero_every_masked_score else key_mask.unsqueeze(-2))  # the bug: padded keys only
    return p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny), allowed


def _padded_attention(zero_every_masked_score: bool) -> type[torch.autograd.Function]:
    class PaddedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, causal: bool) -> torch.Tensor:
            p, allowed = _padded_attention_weights(q, k, key_mask, causal, zero_every_masked_score)
            ctx.save_for_backward(q, k, p, allowed, v)
            return p @ v

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
            q, k, p, allowed, v = ctx.saved_tensors
            dp = g @ v.transpose(-1, -2)
            ds = (p * (dp - (dp * p).sum(-1, keepdim=True))).masked_fill(~allowed, 0) / q.shape[-1] ** 0.5
            return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ g, None, None

    return PaddedAttention


def _padded_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """Softmax over the keys a query may see; a query that sees none gives 0."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = key_mask.unsqueeze(-2) & (torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril() | (not causal))
    seen = allowed.any(-1, keepdim=True)
    s = torch.where(seen, s.masked_fill(~allowed, float("-inf")), 0.0)
    return (torch.softmax(s, -1) * seen) @ v


PADDED_ATTENTION = [Tensor("q", "b n d"), Tensor("k", "b n d"), Tensor("v", "b n e"), Mask("key_mask", "b n"), Scalar("causal", st.booleans())]
for _function, _name in ((_padded_attention(False), "causal_left_padding_leak"), (_padded_attention(True), "causal_left_padding_leak_ok")):
    register(_function, name=_name, inputs=PADDED_ATTENTION, reference=_padded_attention_reference, dtypes=FLOATS, double_backward=False)


# a row share x / sum(x) whose backward drops the reduced dim with squeeze(), which drops every other
# size-1 dim too: wrong only where a batch dim next to the row is 1, shape (2, 1, n); batch sides of 2
# never showed it (entmax's budget bisection has the same bug)


def _row_share(squeeze_all: bool) -> type[torch.autograd.Function]:
    class RowShare(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            total = x.sum(-1, keepdim=True)
            y = x / total
            ctx.save_for_backward(y, total)
            return y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            y, total = ctx.saved_tensors
            dot = (g * y).sum(-1)
            dot = (dot.squeeze() if squeeze_all else dot).unsqueeze(-1)  # the bug: squeeze() drops every size-1 dim
            return (g - dot) / total

    return RowShare


for _function, _name in ((_row_share(True), "squeeze_drops_unit_batch_dim"), (_row_share(False), "squeeze_drops_unit_batch_dim_ok")):
    register(
        _function, name=_name, inputs=[Tensor("x", "*batch n", domain="positive")],
        reference=lambda x: x / x.sum(-1, keepdim=True), dtypes=FLOATS,
    )
