"""Flash attention with a Triton forward and a FlashAttention-2 style Triton backward.

q: (b, h, n_q, d), k and v: (b, h, n_k, d); out = softmax(q k^T / sqrt(d), masked) v.

* Forward: one program per (query block, batch * head); it walks over the key blocks with the
  online-softmax update (running max, running sum, rescaled accumulator) and saves the
  log-sum-exp of each query row -- never the (n_q, n_k) probabilities. It is saved in two parts,
  the row max ``m`` and ``log(l)`` (as FlashAttention-1 kept m and l): backward's
  ``P = exp((S - m) - log l)`` is then as accurate as softmax's ``exp(S - max) / sum``, whereas
  ``exp(S - lse)`` with ``lse`` rounded to one float32 loses ``|lse| * eps`` in every P -- at
  scores ~200 that is 1e-5 relative, and dQ, a difference of such terms, came out 1.2x past the
  reference contract's bound (float32, q and k at scale 10).
* Backward, three kernels: ``_fa_bwd_delta`` (one program per query block) computes
  ``D_i = sum_j dP_ij P_ij`` in a first pass over the key blocks, as the pure-PyTorch
  ``FlashAttention`` does: FlashAttention-2's equal ``rowsum(dO * O)`` differs from it by
  rounding, and the difference is multiplied by ``|k|``. ``_fa_bwd_dkdv`` (one program per key
  block) accumulates dK and dV over the query blocks; ``_fa_bwd_dq`` (one program per query
  block) accumulates dQ over the key blocks. Each recomputes P from scores computed exactly as
  the forward's (the same ``tl.dot`` of the same aligned blocks), so even at scores ~1e30 the
  exponent is <= 0; it is clamped to 0 all the same.
* ``causal=True`` is bottom-right aligned, as flash-attention >= 2.1: query ``i`` attends to key
  ``j`` iff ``j <= i + (n_k - n_q)``. A query row with no key to attend to (``n_q > n_k``) is
  defined to give a zero output row and zero gradients (its saved max is ``+inf``, so P = 0);
  the reference (``_sdpa_reference`` with the same boolean mask) defines the same.

Blocks are 16 x 16 (so sequence lengths 15, 16, 17 give partial and multiple blocks); the head
dim is padded to ``BLOCK_D = max(16, next_power_of_2(d))`` with masks (16: ``tl.dot``'s smallest
operand on GPUs). float16 is computed in float32 and rounded once on store; float32 in float32
(``input_precision="ieee"``: no TF32 on GPUs); float64 in float64 (``tl.dot`` on float64 works
natively and under the interpreter). The row statistics are float32, float64 for float64
inputs. Once differentiable (``@once_differentiable``, ``double_backward=False``).

Interpreted, the cost grows with the programs launched (b * h * blocks): so the specs keep b
and h at most 2 and 256 elements per input. Measured at the largest such shape, q, k and v of
(2, 2, 17, 17, 3): forward 0.2 s, backward 0.5-0.6 s, every dtype, causal or not (2-core CPU).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from conformance import Dim, Scalar, Tensor, register
from reference_ops.attention import _sdpa_reference
from reference_ops.triton._common import (
    check_device,
    device_guard,
    kernel_devices,
    kernel_dtypes,
    launch_grid,
    next_power_of_2,
)

__all__ = ["TritonFlashAttention", "triton_flash_attention"]

BLOCK_M = 16  # query rows per block
BLOCK_N = 16  # key rows per block


@triton.jit
def _scale(d, IS_F64: tl.constexpr):
    """1 / sqrt(d) in the compute dtype, correctly rounded (as the reference's 1.0 / math.sqrt(d))."""
    # tl.full, not d.to(...): natively an int argument equal to 1 is specialised to a constexpr.
    if IS_F64:
        return 1.0 / tl.sqrt(tl.full([], d, tl.float64))  # float64 sqrt is IEEE; sqrt_rn is float32 only
    else:
        return 1.0 / tl.sqrt_rn(tl.full([], d, tl.float32))  # tl.sqrt of float32 may be approximate on GPUs


@triton.jit
def _load_rows(ptr, rows, n, offs_d, d, IS_F64: tl.constexpr):
    """A (rows, BLOCK_D) tile of a dense (n, d) matrix, zero outside it, in the compute dtype."""
    mask = (rows[:, None] < n) & (offs_d[None, :] < d)
    x = tl.load(ptr + rows[:, None] * d + offs_d[None, :], mask=mask, other=0.0)
    if IS_F64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _allowed(rows, cols, n_q, n_k, CAUSAL: tl.constexpr):
    """Which (query, key) pairs exist and may attend: in range, and causal bottom-right aligned."""
    keep = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + (n_k - n_q))
    return keep


@triton.jit
def _scores(q, k, scale):
    """S = q k^T * scale for one (query block, key block): the same op on the same operands in
    every kernel, so the backward's scores are bitwise the forward's."""
    return tl.dot(q, tl.trans(k), input_precision="ieee") * scale


@triton.jit
def _key_end(start_m, n_q, n_k, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key a query block may attend to."""
    if CAUSAL:
        return tl.maximum(tl.minimum(n_k, start_m + BLOCK_M + (n_k - n_q)), 0)
    else:
        return n_k


@triton.jit
def _fa_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, ll_ptr, n_q, n_k, d,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_F64: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # int64: b * h * n * d may exceed 2**31
    q_ptr += bh * n_q * d
    k_ptr += bh * n_k * d
    v_ptr += bh * n_k * d
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    scale = _scale(d, IS_F64)
    q = _load_rows(q_ptr, rows, n_q, offs_d, d, IS_F64)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=q.dtype)  # running max
    l_i = tl.zeros([BLOCK_M], dtype=q.dtype)  # running sum of exp(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=q.dtype)
    for start_n in range(0, _key_end(start_m, n_q, n_k, BLOCK_M, CAUSAL), BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_ptr, cols, n_k, offs_d, d, IS_F64)
        v = _load_rows(v_ptr, cols, n_k, offs_d, d, IS_F64)
        s = tl.where(_allowed(rows, cols, n_q, n_k, CAUSAL), _scores(q, k, scale), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with no allowed key so far has max -inf: subtract 0 instead (exp(-inf) = 0, not nan).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)  # rescales what was accumulated under the old max
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    has_key = l_i > 0.0
    l_safe = tl.where(has_key, l_i, 1.0)
    # A row with no allowed key: acc is 0, so the output row is 0; its max is saved as +inf, so
    # that P = exp(-inf) = 0 in backward.
    out = acc / l_safe[:, None]
    row_ok = rows < n_q
    o_mask = row_ok[:, None] & (offs_d[None, :] < d)
    tl.store(o_ptr + bh * n_q * d + rows[:, None] * d + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=o_mask)
    # The log-sum-exp in two parts, m + log(l): the row max is exact, so backward's S - m is too.
    tl.store(m_ptr + bh * n_q + rows, tl.where(has_key, m_i, float("inf")), mask=row_ok)
    tl.store(ll_ptr + bh * n_q + rows, tl.log(l_safe), mask=row_ok)


@triton.jit
def _load_stats(m_ptr, ll_ptr, rows, row_ok):
    """The forward's row max m and log(l) for a block of rows (+inf and 0 past n_q: P = 0)."""
    m = tl.load(m_ptr + rows, mask=row_ok, other=float("inf"))
    ll = tl.load(ll_ptr + rows, mask=row_ok, other=0.0)
    return m, ll


@triton.jit
def _probs(q, k, scale, m, ll, rows, cols, n_q, n_k, CAUSAL: tl.constexpr):
    """P = exp((S - m) - log l) for one block, 0 where not allowed.

    S - m is exact near the max (the forward's bitwise scores and max), so P keeps the accuracy
    of softmax's exp(S - max) / sum even at large scores, where S - lse with lse = m + log(l)
    rounded to one float32 would lose |lse| * eps (at |S| ~ 200, 1e-5 relative in every P).
    The exponent is <= 0; it is clamped to 0 all the same.
    """
    s = _scores(q, k, scale)
    p = tl.exp(tl.minimum((s - m[:, None]) - ll[:, None], 0.0))
    return tl.where(_allowed(rows, cols, n_q, n_k, CAUSAL), p, 0.0)


@triton.jit
def _fa_bwd_delta(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, ll_ptr, delta_ptr, n_q, n_k, d,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_F64: tl.constexpr,
):
    """D_i = sum_j dP_ij P_ij, a first pass over the key blocks (not rowsum(dO * O): see the module doc)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    k_ptr += bh * n_k * d
    v_ptr += bh * n_k * d
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < n_q
    scale = _scale(d, IS_F64)
    q = _load_rows(q_ptr + bh * n_q * d, rows, n_q, offs_d, d, IS_F64)
    do = _load_rows(do_ptr + bh * n_q * d, rows, n_q, offs_d, d, IS_F64)
    m, ll = _load_stats(m_ptr + bh * n_q, ll_ptr + bh * n_q, rows, row_ok)
    delta = tl.zeros([BLOCK_M], dtype=q.dtype)
    for start_n in range(0, _key_end(start_m, n_q, n_k, BLOCK_M, CAUSAL), BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_ptr, cols, n_k, offs_d, d, IS_F64)
        v = _load_rows(v_ptr, cols, n_k, offs_d, d, IS_F64)
        p = _probs(q, k, scale, m, ll, rows, cols, n_q, n_k, CAUSAL)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        delta += tl.sum(dp * p, axis=1)
    tl.store(delta_ptr + bh * n_q + rows, delta, mask=row_ok)


@triton.jit
def _fa_bwd_dkdv(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, ll_ptr, delta_ptr, dk_ptr, dv_ptr, n_q, n_k, d,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_F64: tl.constexpr,
):
    """dV = P^T dO and dK = dS^T Q * scale for one key block, over the query blocks."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    q_ptr += bh * n_q * d
    do_ptr += bh * n_q * d
    m_ptr += bh * n_q
    ll_ptr += bh * n_q
    delta_ptr += bh * n_q
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    scale = _scale(d, IS_F64)
    k = _load_rows(k_ptr + bh * n_k * d, cols, n_k, offs_d, d, IS_F64)
    v = _load_rows(v_ptr + bh * n_k * d, cols, n_k, offs_d, d, IS_F64)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=k.dtype)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=k.dtype)
    lo = 0
    if CAUSAL:
        # The first query block with a row that may see this key block; a multiple of BLOCK_M, so
        # the blocks are the forward's (bitwise the same scores).
        lo = (tl.maximum(start_n - (n_k - n_q), 0) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, n_q, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < n_q
        q = _load_rows(q_ptr, rows, n_q, offs_d, d, IS_F64)
        do = _load_rows(do_ptr, rows, n_q, offs_d, d, IS_F64)
        m, ll = _load_stats(m_ptr, ll_ptr, rows, row_ok)
        delta = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)
        p = _probs(q, k, scale, m, ll, rows, cols, n_q, n_k, CAUSAL)
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
    dk = dk * scale
    mask = (cols[:, None] < n_k) & (offs_d[None, :] < d)
    offsets = bh * n_k * d + cols[:, None] * d + offs_d[None, :]
    tl.store(dk_ptr + offsets, dk.to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + offsets, dv.to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fa_bwd_dq(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, ll_ptr, delta_ptr, dq_ptr, n_q, n_k, d,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_F64: tl.constexpr,
):
    """dQ = dS K * scale for one query block, over the key blocks."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    k_ptr += bh * n_k * d
    v_ptr += bh * n_k * d
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < n_q
    scale = _scale(d, IS_F64)
    q = _load_rows(q_ptr + bh * n_q * d, rows, n_q, offs_d, d, IS_F64)
    do = _load_rows(do_ptr + bh * n_q * d, rows, n_q, offs_d, d, IS_F64)
    m, ll = _load_stats(m_ptr + bh * n_q, ll_ptr + bh * n_q, rows, row_ok)
    delta = tl.load(delta_ptr + bh * n_q + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=q.dtype)
    for start_n in range(0, _key_end(start_m, n_q, n_k, BLOCK_M, CAUSAL), BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_ptr, cols, n_k, offs_d, d, IS_F64)
        v = _load_rows(v_ptr, cols, n_k, offs_d, d, IS_F64)
        p = _probs(q, k, scale, m, ll, rows, cols, n_q, n_k, CAUSAL)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds, k, input_precision="ieee")
    dq = dq * scale
    mask = row_ok[:, None] & (offs_d[None, :] < d)
    tl.store(dq_ptr + bh * n_q * d + rows[:, None] * d + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty), mask=mask)


def _meta(q: torch.Tensor, causal: bool) -> dict[str, Any]:
    return {
        "CAUSAL": bool(causal),
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_D": max(16, next_power_of_2(q.shape[-1])),
        "IS_F64": q.dtype == torch.float64,
    }


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The compute dtype, which the row statistics are kept in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class TritonFlashAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d), optionally causal) v; saves q, k, v and a (m, log l) pair per query row."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        check_device(q, k, v)
        b, h, n_q, d = q.shape
        n_k = k.shape[-2]
        # The kernels index dense (b * h, n, d) matrices.
        q1, k1, v1 = (t.detach().contiguous() for t in (q, k, v))
        out = torch.empty_like(q1)
        # Per query row: stats[0] the row max m, stats[1] log(l); the log-sum-exp is their sum.
        stats = torch.empty((2, b, h, n_q), dtype=_stats_dtype(q.dtype), device=q.device)
        with device_guard(q):
            launch_grid(
                _fa_fwd, (triton.cdiv(n_q, BLOCK_M), b * h),
                q1, k1, v1, out, stats[0], stats[1], n_q, n_k, d, **_meta(q, causal),
            )
        ctx.save_for_backward(q1, k1, v1, stats)
        ctx.causal = bool(causal)
        return out

    @staticmethod
    @once_differentiable  # the backward is kernels, not differentiable torch ops
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, stats = ctx.saved_tensors
        m, ll = stats[0], stats[1]
        b, h, n_q, d = q.shape
        n_k = k.shape[-2]
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        # grad_output may be transposed, sliced or a stride-0 expanded view: make it dense.
        do = grad_output.contiguous()
        meta = _meta(q, ctx.causal)
        grad_q = grad_k = grad_v = None
        with device_guard(q):
            delta = torch.empty_like(m)
            if need_q or need_k:
                launch_grid(
                    _fa_bwd_delta, (triton.cdiv(n_q, BLOCK_M), b * h), q, k, v, do, m, ll, delta, n_q, n_k, d, **meta
                )
            if need_k or need_v:
                # One kernel computes dK and dV together; a gradient not needed is dropped.
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                launch_grid(
                    _fa_bwd_dkdv, (triton.cdiv(n_k, BLOCK_N), b * h),
                    q, k, v, do, m, ll, delta, dk, dv, n_q, n_k, d, **meta,
                )
                grad_k = dk if need_k else None
                grad_v = dv if need_v else None
            if need_q:
                grad_q = torch.empty_like(q)
                launch_grid(
                    _fa_bwd_dq, (triton.cdiv(n_q, BLOCK_M), b * h), q, k, v, do, m, ll, delta, grad_q, n_q, n_k, d, **meta
                )
        return grad_q, grad_k, grad_v, None


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    return TritonFlashAttention.apply(q, k, v, causal)  # type: ignore[no-any-return]


def causal_mask(n_q: int, n_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n_q, n_k) bool, True = keep: query i sees key j iff j <= i + (n_k - n_q) (bottom-right)."""
    rows = torch.arange(n_q, device=device).unsqueeze(-1)
    cols = torch.arange(n_k, device=device)
    return cols <= rows + (n_k - n_q)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return _sdpa_reference(q, k, v, mask)


def _stats_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Two numbers per query row (m and log l): float32, float64 for float64 inputs."""
    q = tensors["q"]
    return 2 * q[..., 0].numel() * torch.empty((), dtype=_stats_dtype(q.dtype)).element_size()


def _inputs(causal: bool) -> list[Any]:
    return [Tensor("q", "b h n_q d"), Tensor("k", "b h n_k d"), Tensor("v", "b h n_k d"), Scalar("causal", causal)]


_SPEC: dict[str, Any] = {
    "reference": _reference,
    "dtypes": kernel_dtypes(_fa_fwd),
    "devices": kernel_devices(_fa_fwd),
    "double_backward": False,
    "saves": _stats_bytes,  # beyond q, k, v and the output: the log-sum-exp, as m and log l, per query row
    # Block boundaries 15, 16, 17 are drawn for both sequence lengths. b and h only multiply the
    # launch grid's second axis: at most 2 each, so an interpreted call runs few programs.
    "dims": [
        Dim("n_q", block_sizes=(BLOCK_M,)),
        Dim("n_k", block_sizes=(BLOCK_N,)),
        Dim("b", max_size=2),
        Dim("h", max_size=2),
    ],
    "max_elements": 64,  # q, k, v each: n up to 17 (past one 16-wide block) at b = h = 1, d <= 3
    "max_examples": 3,
    "fast_gradcheck": True,  # interpreted: each evaluation launches kernels (0.2 s forward at most)
}
register(TritonFlashAttention, name="triton_flash_attention", inputs=_inputs(False), **_SPEC)
register(TritonFlashAttention, name="triton_flash_attention_causal", inputs=_inputs(True), **_SPEC)
