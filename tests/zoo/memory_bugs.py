"""Memory defects written the way kernel code is, each beside its correct twin.

* ``tail_unwritten_grad``: a blocked elementwise kernel (blocks of ``BLOCK`` elements, like a
  Triton program per block) whose backward allocates its gradient with ``torch.empty_like`` and
  launches ``numel // BLOCK`` blocks, so the last partial block is never written. Whatever the
  fresh buffer held (often zeros) is returned as the gradient. ``blocked_scale`` is the same code
  launching ``cdiv(numel, BLOCK)`` blocks. ``tail_unwritten_grad_aliased`` is the same bug through
  a module-level ``from torch import empty_like as ...``: the suite must see that allocation too.
  ``tail_unwritten_grad_by_argument`` gets that launcher as an argument: its own code names no
  allocation, the function it is handed does.
* ``attention_saves_probs``: an attention that declares the flash-attention promise (keep the
  inputs, the output and one log-sum-exp per row) but saves the full probability matrix for
  backward. ``attention_lse`` keeps the promise and recomputes the probabilities in backward.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import empty_like as allocate_like
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

BLOCK = 8


def _blocks(numel: int, *, drop_tail: bool) -> range:
    stop = numel - numel % BLOCK if drop_tail else numel
    return range(0, stop, BLOCK)


def _blocked_scale(x: torch.Tensor, factor: float, *, drop_tail: bool) -> torch.Tensor:
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    for start in _blocks(flat.numel(), drop_tail=drop_tail):
        out[start : start + BLOCK] = flat[start : start + BLOCK] * factor
    return out.view(x.shape)


class BlockedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _blocked_scale(x, 3.0, drop_tail=False)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _blocked_scale(grad_output, 3.0, drop_tail=False)


class TailUnwrittenGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _blocked_scale(x, 3.0, drop_tail=False)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _blocked_scale(grad_output, 3.0, drop_tail=True)  # BUG: numel // BLOCK blocks


def _blocked_scale_aliased(x: torch.Tensor, factor: float) -> torch.Tensor:
    flat = x.contiguous().view(-1)
    out = allocate_like(flat)
    for start in _blocks(flat.numel(), drop_tail=True):  # BUG: numel // BLOCK blocks
        out[start : start + BLOCK] = flat[start : start + BLOCK] * factor
    return out.view(x.shape)


class TailUnwrittenGradAliased(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _blocked_scale_aliased(grad_output, 3.0)


class TailUnwrittenGradByArgument(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, launcher: Any) -> torch.Tensor:
        ctx.launcher = launcher
        return x * 3.0

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.launcher(grad_output, 3.0), None


register(
    TailUnwrittenGradByArgument,
    name="tail_unwritten_grad_by_argument",
    inputs=[Tensor("x", "*batch n"), Scalar("launcher", _blocked_scale_aliased)],
    reference=lambda x, launcher: x * 3.0,
    double_backward=False,
    waivers={"compile": "loops over blocks in Python, so torch.compile recompiles for every numel"},
)

for fn, name in (
    (BlockedScale, "blocked_scale"),
    (TailUnwrittenGrad, "tail_unwritten_grad"),
    (TailUnwrittenGradAliased, "tail_unwritten_grad_aliased"),
):
    register(
        fn,
        name=name,
        inputs=[Tensor("x", "*batch n")],
        reference=lambda x: x * 3.0,
        double_backward=False,
        waivers={"compile": "loops over blocks in Python, so torch.compile recompiles for every numel"},
    )


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])


def _attention_backward(
    ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, probs: torch.Tensor, grad_out: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    scale = 1.0 / math.sqrt(q.shape[-1])
    need_q, need_k, need_v = ctx.needs_input_grad
    # Under autocast forward's products are bfloat16 while q, k, v may be float32: one dtype here.
    dtypes = (q.dtype, k.dtype, v.dtype)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v, grad_out, out, probs = (t.to(dtype) for t in (q, k, v, grad_out, out, probs))
    grad_v = probs.transpose(-1, -2) @ grad_out if need_v else None
    grad_probs = grad_out @ v.transpose(-1, -2)
    delta = (grad_out * out).sum(-1, keepdim=True)
    grad_scores = probs * (grad_probs - delta)
    grad_q = (grad_scores @ k * scale).to(dtypes[0]) if need_q else None
    grad_k = (grad_scores.transpose(-1, -2) @ q * scale).to(dtypes[1]) if need_k else None
    return grad_q, grad_k, grad_v.to(dtypes[2]) if grad_v is not None else None


class AttentionLse(torch.autograd.Function):
    """Keeps q, k, v, the output and the log-sum-exp per row; recomputes probabilities."""

    @staticmethod
    # Without it, autocast rounds the scores to bfloat16 before lse, which backward pairs with
    # scores recomputed in float32: exp(s - lse) off by exp(|s| * 2**-9) (6% of dv, measured).
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = _scores(q, k)
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.exp(scores - lse.unsqueeze(-1)) @ v
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dtype = torch.promote_types(q.dtype, k.dtype)  # q may be bfloat16 under autocast
        probs = torch.exp(_scores(q.to(dtype), k.to(dtype)) - lse.unsqueeze(-1).to(dtype))
        return _attention_backward(ctx, q, k, v, out, probs, grad_out)


class AttentionSavesProbs(torch.autograd.Function):
    """Same maths, but keeps the full probability matrix: what flash attention exists to avoid."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(_scores(q, k), dim=-1)
        out = probs @ v
        ctx.save_for_backward(q, k, v, out, probs)  # BUG: batch x rows x keys kept until backward
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, probs = ctx.saved_tensors
        return _attention_backward(ctx, q, k, v, out, probs, grad_out)


def _lse_bytes(inputs: dict[str, torch.Tensor]) -> int:
    """One log-sum-exp per query row, in the inputs' dtype."""
    q = inputs["q"]
    return q[..., 0].numel() * q.element_size()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(_scores(q, k), dim=-1) @ v


for fn, name in ((AttentionLse, "attention_lse"), (AttentionSavesProbs, "attention_saves_probs")):
    register(
        fn,
        name=name,
        inputs=[Tensor("q", "b n d"), Tensor("k", "b m d"), Tensor("v", "b m d")],
        reference=_attention,
        double_backward=False,
        saves=_lse_bytes,
    )
