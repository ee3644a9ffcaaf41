"""Losses: cross-entropy with ``ignore_index``, the way fused loss kernels write it.

Pattern shown: an integer input with a *sentinel* value the op must treat apart, and a
reduction whose divisor depends on the data.

* ``CrossEntropy`` -- mean over rows of ``logsumexp(logits) - logits[target]`` for logits
  ``(n, c)`` and int64 targets ``(n,)``, skipping rows whose target is ``ignore_index``
  (-100, as ``torch.nn.functional.cross_entropy``): the mean is over the *valid* rows, so the
  divisor is their count, not ``n``. When every target is ignored the loss is *defined* as 0
  with a zero gradient (``F.cross_entropy`` gives 0/0 = nan there); the reference defines the
  same. Forward saves the logits and one log-sum-exp per row (not the (n, c) softmax);
  backward is ``(exp(logits - lse) - onehot) * valid / count * grad_output``. A saved
  log-sum-exp is a constant to double backward, so, like the real kernels, it is once
  differentiable (``@once_differentiable``, declared ``double_backward=False``).

Computed on a contiguous copy in a wider dtype, rounded once (``reference_ops._common.upcast``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Index, Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["CrossEntropy"]


def _valid_rows(target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid mask, target with ignored rows pointed at class 0 so gather stays in range, count >= 1)."""
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    count = valid.sum().clamp(min=1)  # all ignored: 0 / 1 = 0, never 0 / 0
    return valid, safe, count


def _cross_entropy_reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    valid = target != ignore_index
    picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1)
    total = -(picked * valid.to(picked.dtype)).sum()
    # Every target ignored: 0 (total is 0, divided by 1), where F.cross_entropy gives 0/0 = nan.
    return total / max(int(valid.sum()), 1)


def _lse_bytes(logits: torch.Tensor) -> int:
    """Bytes of one log-sum-exp per row, in the accumulation dtype."""
    return logits.shape[0] * upcast(logits[:1, :1]).element_size()


class CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the rows whose target is not ignore_index; saves the row lse."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        lf = upcast(logits)
        valid, safe, count = _valid_rows(target, ignore_index)
        lse = torch.logsumexp(lf, dim=-1)  # (n,), kept in the accumulation dtype
        picked = lf.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        loss = torch.where(valid, lse - picked, torch.zeros_like(lse)).sum() / count
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index = ignore_index
        return loss.to(logits.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        logits, target, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        lf = upcast(logits)
        valid, safe, count = _valid_rows(target, ctx.ignore_index)
        probs = torch.exp(lf - lse.unsqueeze(-1))
        onehot = torch.zeros_like(lf).scatter(-1, safe.unsqueeze(-1), 1.0)
        weight = valid.to(lf.dtype).unsqueeze(-1) * (upcast(grad_output) / count)  # ignored rows: 0
        return ((probs - onehot) * weight).to(logits.dtype), None, None  # None: target, ignore_index


register(
    CrossEntropy,
    name="cross_entropy_ignore_index",  # "cross_entropy" is reductions.CrossEntropy (no ignore_index)
    inputs=[
        Tensor("logits", "n c"),
        Index("target", "n", high="c", sentinels=(-100,)),
        Scalar("ignore_index", -100),
    ],
    reference=_cross_entropy_reference,
    dtypes=ALL_FLOATS,
    double_backward=False,
    saves=lambda t: _lse_bytes(t["logits"]),  # beyond the inputs: one log-sum-exp per row
)
