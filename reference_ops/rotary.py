"""Rotary position embedding (RoPE), Hugging Face ``rotate_half`` convention.

Pattern shown: a Function whose non-differentiable inputs are *tables with a precondition*
(``cos``/``sin`` of the same positions) and may be *partially broadcast*.

* ``RotaryEmbedding`` -- ``out = x * cos + rotate_half(x) * sin`` over ``x`` of shape
  ``(b, s, h, d)``, ``rotate_half(x) = cat(-x2, x1)`` over the halves of the last dim. The
  tables come as ``(b, s, 1, d)`` (one position offset per batch row, as with left padding or a
  KV cache), ``(1, s, 1, d)`` or ``(s, 1, d)`` (shared by the batch); forward and backward use
  plain broadcasting, so every form works. Backward is the adjoint:
  ``g * cos + rotate_half^T(g * sin)`` with ``rotate_half^T(y) = cat(y2, -y1)``. It saves
  ``cos`` and ``sin`` only (the op is linear in ``x``), and is written with differentiable ops
  on ``grad_output``, so it is twice differentiable.

``rope_cos`` / ``rope_sin`` build the tables for the spec (``Derived`` inputs) from one helper,
so the same generator seed gives the same positions in both. Computed on contiguous copies in
a wider dtype, rounded once (``reference_ops._common.upcast``).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Derived, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["RotaryEmbedding", "rope_cos", "rope_sin"]

ROPE_BASE = 10000.0
MAX_START = 64  # per batch row, positions start at a random offset in [0, MAX_START)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotate_half_transposed(y: torch.Tensor) -> torch.Tensor:
    """The adjoint of ``_rotate_half``: (y1, y2) -> (y2, -y1)."""
    half = y.shape[-1] // 2
    return torch.cat([y[..., half:], -y[..., :half]], dim=-1)


def _rope_angles(ctx: Any) -> torch.Tensor:
    """Angles (positions x inverse frequencies, duplicated into both halves) of ``ctx.shape``.

    ``ctx.shape`` is ``(b, s, 1, d)``, ``(1, s, 1, d)`` or ``(s, 1, d)``. One start offset is
    drawn per batch row of the *full* batch (``ctx.sizes["b"]``) whatever the drawn form, so a
    broadcast table holds row 0's positions and cos and sin agree row by row even when they
    were broadcast differently.
    """
    shape = tuple(ctx.shape)
    seqlen, dim = shape[-3], shape[-1]
    rows = shape[0] if len(shape) == 4 else 1
    batch = max(int(ctx.sizes.get("b", rows)), rows)
    starts = torch.randint(0, MAX_START, (batch, 1), generator=ctx.generator, dtype=torch.int64)[:rows]
    positions = (starts + torch.arange(seqlen, dtype=torch.int64)).to(torch.float64)  # (rows, s)
    inv_freq = ROPE_BASE ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (d/2,)
    angles = positions.unsqueeze(-1) * inv_freq  # (rows, s, d/2)
    return torch.cat([angles, angles], dim=-1).reshape(shape)


def rope_cos(ctx: Any) -> torch.Tensor:
    """The cos table for a ``Derived`` input (float64 on the CPU; the suite casts it)."""
    return torch.cos(_rope_angles(ctx))


def rope_sin(ctx: Any) -> torch.Tensor:
    """The sin table; give it ``seed_from`` the cos input so the positions are the same."""
    return torch.sin(_rope_angles(ctx))


def _rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class RotaryEmbedding(torch.autograd.Function):
    """out = x * cos + rotate_half(x) * sin; cos/sin broadcast over the batch (and heads)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)  # linear in x: the tables are all backward needs
        ctx.x_dtype = x.dtype
        xf, cf, sf = upcast(x), upcast(cos), upcast(sin)
        return (xf * cf + _rotate_half(xf) * sf).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        cos, sin = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        g = upcast(grad_output)
        # Broadcasting g (b, s, h, d) against any table form gives x's full shape: no reduction
        # is needed, since x itself is never broadcast.
        grad_x = g * upcast(cos) + _rotate_half_transposed(g * upcast(sin))
        return grad_x.to(ctx.x_dtype), None, None  # None: the tables never require grad


register(
    RotaryEmbedding,
    name="rotary",
    inputs=[
        Tensor("x", "b s h d:even"),
        Derived("cos", rope_cos, "b s 1 d", broadcast="b"),
        Derived("sin", rope_sin, "b s 1 d", broadcast="b", seed_from="cos"),
    ],
    reference=_rotary_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",  # cos and sin only
)
