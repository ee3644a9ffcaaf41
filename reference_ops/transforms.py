"""Functions that compose with forward-mode AD and ``torch.func`` transforms.

Pattern shown: the ``setup_context`` style (``forward`` without ctx), which ``torch.func``
requires, plus the staticmethods that the transforms call:

* ``SiLU`` -- ``y = x * sigmoid(x)`` with a ``jvp`` staticmethod: ``setup_context`` keeps x for
  both modes (``ctx.save_for_backward`` and ``ctx.save_for_forward``), ``jvp`` multiplies the
  tangent by the same slope as backward. ``generate_vmap_rule = True``: an elementwise op is
  its own batching rule.
* ``Softcap`` -- ``y = cap * tanh(x / cap)`` (logit soft-capping) with a learnable 0-d ``cap``
  and ``generate_vmap_rule = True``: under ``vmap(grad(...))`` the cap's gradient (a full sum)
  becomes a per-sample sum with no extra code, because forward, backward and jvp are all
  written in torch ops that vmap can batch.
* ``BiasSoftmax`` -- ``y = softmax(x + bias, -1)`` with a hand-written ``vmap(info, in_dims, x,
  bias)`` returning ``(output, out_dims)``. The op is row-wise over the last dim, so the batch
  dim can go in front: a batched input is moved there, an unbatched ``x`` gets a size-1 front
  dim that broadcasts, and a batched ``bias`` of logical shape ``(n,)`` is viewed as
  ``(B, 1, ..., 1, n)`` so it lines up with x's rows. Backward reduces each gradient to its
  input's shape (``sum_to_size``), which is what makes the broadcast inside the rule correct.

Every backward and jvp is written in differentiable torch ops on saved inputs (or, for
``BiasSoftmax``, the saved output, whose own grad_fn is this Function), so all three are twice
differentiable. Computation is in a wider dtype, rounded once (``reference_ops._common.upcast``).

``torch.compile(fullgraph=True)`` refuses all three ("Dynamo does not support tracing
``torch.autograd.Function`` subclasses that define a custom ``jvp`` method", torch 2.13); without
``fullgraph`` Dynamo graph-breaks at the Function and runs it eagerly, with identical results.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["BiasSoftmax", "SiLU", "Softcap"]


def _silu_slope(xf: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(xf)
    # d/dx x*s = s * (1 + x * (1 - s)); x * (1 - s) -> 0 (not nan) as x -> +inf.
    return s * (1 + xf * (1 - s))


class SiLU(torch.autograd.Function):
    """y = x * sigmoid(x); backward and jvp both use the slope recomputed from the saved x."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        return (xf * torch.sigmoid(xf)).to(x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)  # jvp reads ctx.saved_tensors too: it must be saved for it

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (upcast(grad_output) * _silu_slope(upcast(x))).to(x.dtype)

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (upcast(x_t) * _silu_slope(upcast(x))).to(x.dtype)


register(SiLU, name="silu_jvp", inputs=[Tensor("x", "*batch n")], reference=torch.nn.functional.silu, dtypes=ALL_FLOATS)


def _softcap_partials(xf: torch.Tensor, capf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dy/dx, dy/dcap) elementwise, for y = cap * tanh(x / cap)."""
    u = xf / capf
    t = torch.tanh(u)
    dt = 1 - t * t  # exactly 0 once tanh saturates, so u * dt stays 0 at any |x|
    return dt, t - u * dt


class Softcap(torch.autograd.Function):
    """y = cap * tanh(x / cap) with a learnable 0-d cap; vmap rule generated from the torch ops."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
        capf = upcast(cap)
        return (capf * torch.tanh(upcast(x) / capf)).to(x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, cap = inputs
        ctx.save_for_backward(x, cap)
        ctx.save_for_forward(x, cap)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, cap = ctx.saved_tensors
        d_x, d_cap = _softcap_partials(upcast(x), upcast(cap))
        g = upcast(grad_output)
        grad_x = grad_cap = None
        if ctx.needs_input_grad[0]:
            grad_x = (g * d_x).to(x.dtype)
        if ctx.needs_input_grad[1]:
            # A full sum to the 0-d cap; under vmap it is a per-sample sum (the rule is generated).
            grad_cap = (g * d_cap).sum().reshape(cap.shape).to(cap.dtype)
        return grad_x, grad_cap

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor | None, cap_t: torch.Tensor | None) -> torch.Tensor:
        x, cap = ctx.saved_tensors
        d_x, d_cap = _softcap_partials(upcast(x), upcast(cap))
        out_t = torch.zeros_like(d_x)
        # An input without a tangent contributes nothing (None when it has none).
        if x_t is not None:
            out_t = out_t + upcast(x_t) * d_x
        if cap_t is not None:
            out_t = out_t + upcast(cap_t) * d_cap
        return out_t.to(x.dtype)


register(
    Softcap,
    name="softcap",
    inputs=[Tensor("x", "*batch n"), Tensor("cap", "", domain=(0.5, 2.0))],
    reference=lambda x, cap: cap * torch.tanh(x / cap),
    dtypes=ALL_FLOATS,
    saves="inputs",
)


def _softmax_jvp(y: torch.Tensor, z_t: torch.Tensor) -> torch.Tensor:
    """The softmax Jacobian applied to z_t (it is symmetric, so also the vjp): y * (z_t - <y, z_t>)."""
    return y * (z_t - (y * z_t).sum(dim=-1, keepdim=True))


class BiasSoftmax(torch.autograd.Function):
    """y = softmax(x + bias, -1) with bias (n,); an explicit vmap staticmethod."""

    @staticmethod
    def forward(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # Shapes only need to broadcast: the vmap rule calls apply with (1 or B, ..., n) x and
        # (B, 1, ..., 1, n) bias.
        return torch.softmax(upcast(x) + upcast(bias), dim=-1).to(x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, bias = inputs
        ctx.save_for_backward(output)
        ctx.shapes = (x.shape, bias.shape)
        ctx.dtypes = (x.dtype, bias.dtype)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (y,) = ctx.saved_tensors
        grad_z = _softmax_jvp(upcast(y), upcast(grad_output))
        (x_shape, bias_shape), (x_dtype, bias_dtype) = ctx.shapes, ctx.dtypes
        grad_x = grad_bias = None
        # z = x + bias broadcasts: each gradient sums over the dims its input was broadcast along.
        if ctx.needs_input_grad[0]:
            grad_x = grad_z.sum_to_size(x_shape).to(x_dtype)
        if ctx.needs_input_grad[1]:
            grad_bias = grad_z.sum_to_size(bias_shape).to(bias_dtype)
        return grad_x, grad_bias

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor | None, bias_t: torch.Tensor | None) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        yf = upcast(y)
        z_t = torch.zeros_like(yf)
        if x_t is not None:
            z_t = z_t + upcast(x_t)
        if bias_t is not None:
            z_t = z_t + upcast(bias_t)
        return _softmax_jvp(yf, z_t).to(y.dtype)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, int | None], x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, int]:
        x_bdim, bias_bdim = in_dims
        # Batch dim in front; an unbatched x gets a size-1 one that broadcasts against bias's.
        x = x.movedim(x_bdim, 0) if x_bdim is not None else x.unsqueeze(0)
        if bias_bdim is not None:
            bias = bias.movedim(bias_bdim, 0)
            # (B, n) -> (B, 1, ..., 1, n): one size-1 dim per logical batch dim of x, so the
            # per-sample bias meets its own sample's rows, not the rows' leading dim.
            bias = bias.reshape(bias.shape[0], *([1] * (x.dim() - 2)), bias.shape[-1])
        return BiasSoftmax.apply(x, bias), 0


register(
    BiasSoftmax,
    name="bias_softmax",
    inputs=[Tensor("x", "*batch n"), Tensor("bias", "n")],
    reference=lambda x, bias: torch.softmax(x + bias, dim=-1),
    dtypes=ALL_FLOATS,
)
