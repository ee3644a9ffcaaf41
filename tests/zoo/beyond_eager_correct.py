"""Correct Functions and custom ops checked beyond eager autograd: twins of beyond_eager_bugs.py.

Each differs from its buggy twin only by the fix; registered names carry the suffix ``_ok``.

* ``custom_op_fake_wrong_shape_ok`` (``conformance_zoo::sq_norm_fake_ok``): y = sum(x**2, -1) as a
  ``torch.library.custom_op`` whose ``register_fake`` returns ``x.shape[:-1]``.
* ``custom_op_fake_dtype_ok`` (``conformance_zoo::lse_fake_dtype_ok``): a row-wise logsumexp that
  accumulates in float32 and returns the input's dtype, as its fake kernel says.
* ``custom_op_fake_swapped_dims_ok`` (``conformance_zoo::outer_fake_ok``): y = outer(x, w) whose
  fake kernel returns ``(m, n)``.
* ``custom_op_backward_wrong_ok`` (``conformance_zoo::scaled_tanh_ok``): y = tanh(scale * x) whose
  registered backward is grad * (1 - y**2) * scale.
* ``custom_op_bias_grad_wrong_dim_ok`` (``conformance_zoo::bias_add_ok``): y = x + b whose
  registered backward sums the bias gradient over the rows.
* ``compile_only_bug_ok`` (SiLUCompileFallback): y = x * sigmoid(x) with an eager "fused kernel"
  backward and a ``torch.compiler.is_compiling()`` fallback computing s + y * (1 - s).
* ``wrong_jvp_ok`` (SwiGLU): y = silu(gate) * up, setup_context style, whose jvp adds both the
  gate and the up tangent terms.
* ``wrong_vmap_rule_ok`` (SoftmaxVmap): last-dim softmax whose ``vmap`` staticmethod moves the
  batch dim to 0 before running the op and declaring ``out_dims=0``.
* ``autocast_dtype_grads_ok`` (AutocastScale): y = x * w with ``custom_fwd``/``custom_bwd`` whose
  backward returns each gradient in its input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

# --------------------------------------------------------------------------- custom op: fake kernel


@torch.library.custom_op("conformance_zoo::sq_norm_fake_ok", mutates_args=())
def sq_norm_fake_ok(x: torch.Tensor) -> torch.Tensor:
    """Row-wise squared L2 norm: y = sum(x**2, dim=-1)."""
    return (x * x).sum(dim=-1)


@sq_norm_fake_ok.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


def _sq_norm_fake_ok_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    (x,) = inputs
    ctx.save_for_backward(x)


def _sq_norm_fake_ok_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return 2 * x * grad.unsqueeze(-1)


sq_norm_fake_ok.register_autograd(_sq_norm_fake_ok_backward, setup_context=_sq_norm_fake_ok_setup_context)

register(
    sq_norm_fake_ok,
    name="custom_op_fake_wrong_shape_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x.pow(2).sum(dim=-1),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- custom op: backward


@torch.library.custom_op("conformance_zoo::scaled_tanh_ok", mutates_args=())
def scaled_tanh_ok(x: torch.Tensor, scale: float) -> torch.Tensor:
    """y = tanh(scale * x) (a soft-capping activation)."""
    return torch.tanh(x * scale)


@scaled_tanh_ok.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _scaled_tanh_ok_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _x, scale = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale


def _scaled_tanh_ok_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (y,) = ctx.saved_tensors
    return grad * (1 - y * y) * ctx.scale, None


scaled_tanh_ok.register_autograd(_scaled_tanh_ok_backward, setup_context=_scaled_tanh_ok_setup_context)

register(
    scaled_tanh_ok,
    name="custom_op_backward_wrong_ok",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 0.5)],
    reference=lambda x, scale: torch.tanh(x * scale),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- compile-only fallback


class SiLUCompileFallback(torch.autograd.Function):
    """y = x * sigmoid(x); eager backward is the fused kernel, compiled backward a fallback."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.sigmoid(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        x, y = ctx.saved_tensors
        s = torch.sigmoid(x)
        if torch.compiler.is_compiling():
            # Traceable fallback for torch.compile (the fused kernel below is opaque to Dynamo).
            return grad_out * (s + y * (1 - s))
        # "Fused kernel": writes dx = g * (s + y * (1 - s)) into a fresh buffer with out= calls.
        gx = torch.empty_like(x)
        torch.mul(s, y, out=gx)
        torch.sub(y, gx, out=gx)
        torch.add(gx, s, out=gx)
        torch.mul(gx, grad_out, out=gx)
        return gx


register(
    SiLUCompileFallback,
    name="compile_only_bug_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: F.silu(x),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- forward AD


class SwiGLU(torch.autograd.Function):
    """y = silu(gate) * up, setup_context style, with a jvp."""

    @staticmethod
    def forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        gate, up = inputs
        ctx.save_for_backward(gate, up)
        ctx.save_for_forward(gate, up)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        s = torch.sigmoid(gate)
        dsilu = s * (1 + gate * (1 - s))
        grad_gate = grad_out * up * dsilu if ctx.needs_input_grad[0] else None
        grad_up = grad_out * gate * s if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up

    @staticmethod
    def jvp(ctx: Any, gate_t: torch.Tensor | None, up_t: torch.Tensor | None) -> torch.Tensor:
        gate, up = ctx.saved_tensors
        s = torch.sigmoid(gate)
        dsilu = s * (1 + gate * (1 - s))
        out_t = torch.zeros_like(gate * up)
        if gate_t is not None:
            out_t = out_t + gate_t * up * dsilu
        if up_t is not None:
            out_t = out_t + gate * s * up_t
        return out_t


register(
    SwiGLU,
    name="wrong_jvp_ok",
    inputs=[Tensor("gate", "*batch f"), Tensor("up", "*batch f")],
    reference=lambda gate, up: F.silu(gate) * up,
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- vmap rule


class SoftmaxVmap(torch.autograd.Function):
    """softmax over the last dim with a hand-written vmap rule."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        z = x - x.amax(dim=-1, keepdim=True)
        e = torch.exp(z)
        return e / e.sum(dim=-1, keepdim=True)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y * (grad_out - (grad_out * y).sum(dim=-1, keepdim=True))

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], x: torch.Tensor) -> tuple[torch.Tensor, int]:
        # The op is row-wise over the last dim: move the batch dim to the front and run it.
        x = x.movedim(in_dims[0], 0)
        return SoftmaxVmap.apply(x), 0


register(
    SoftmaxVmap,
    name="wrong_vmap_rule_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.softmax(x, dim=-1),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- autocast


class AutocastScale(torch.autograd.Function):
    """y = x * w under custom_fwd/custom_bwd; each gradient in its input's dtype."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        gx = (g * w).to(x.dtype) if ctx.needs_input_grad[0] else None
        gw = (g * x).reshape(-1, x.shape[-1]).sum(0).to(w.dtype) if ctx.needs_input_grad[1] else None
        return gx, gw


register(
    AutocastScale,
    name="autocast_dtype_grads_ok",
    inputs=[Tensor("x", "*batch d"), Tensor("w", "d")],
    reference=lambda x, w: x * w,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- compile: graph break, recompile storm


class RowScale(torch.autograd.Function):
    """y = x * rsqrt(mean(x**2) + 1) per row; the scale is saved on ctx, never cached globally."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1)
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        x, scale = ctx.saved_tensors
        n = x.shape[-1]
        return scale * grad_out - x * scale.pow(3) * (grad_out * x).sum(-1, keepdim=True) / n


register(
    RowScale,
    name="compile_graph_break_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
    compile="fullgraph",
)


class PaddedBlockScaleComputed(torch.autograd.Function):
    """y = x / block(n), with block(n) the padded width computed as a tensor from the size (no
    Python lookup keyed by it, so one compiled graph serves every size)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        n = torch.tensor(x.shape[-1], dtype=torch.float64)
        block = torch.exp2(torch.ceil(torch.log2(n))).to(x.dtype)
        ctx.save_for_backward(block)
        return x / block

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (block,) = ctx.saved_tensors
        return grad_out / block


def _padded_block_reference(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 / (1 << max(0, (x.shape[-1] - 1).bit_length())))


register(
    PaddedBlockScaleComputed,
    name="compile_recompile_storm_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=_padded_block_reference,
    dtypes=(torch.float64, torch.float32),
    compile="dynamic",
)


# --------------------------------------------------------------------------- custom op: fake kernel, two dims


@torch.library.custom_op("conformance_zoo::outer_fake_ok", mutates_args=())
def outer_fake_ok(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[i, j] = x[i] * w[j]."""
    return x[:, None] * w[None, :]


@outer_fake_ok.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


def _outer_fake_ok_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _outer_fake_ok_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return grad @ w, x @ grad


outer_fake_ok.register_autograd(_outer_fake_ok_backward, setup_context=_outer_fake_ok_setup_context)

register(
    outer_fake_ok,
    name="custom_op_fake_swapped_dims_ok",
    inputs=[Tensor("x", "m"), Tensor("w", "n")],
    reference=lambda x, w: torch.outer(x, w),
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- custom op: backward, gradient shape


@torch.library.custom_op("conformance_zoo::bias_add_ok", mutates_args=())
def bias_add_ok(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = x + b, b broadcast over the rows."""
    return x + b


@bias_add_ok.register_fake
def _(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _bias_add_ok_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    pass


def _bias_add_ok_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad, grad.sum(0)


bias_add_ok.register_autograd(_bias_add_ok_backward, setup_context=_bias_add_ok_setup_context)

register(
    bias_add_ok,
    name="custom_op_bias_grad_wrong_dim_ok",
    inputs=[Tensor("x", "rows d"), Tensor("b", "d")],
    reference=lambda x, b: x + b,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- custom op: output dtype


@torch.library.custom_op("conformance_zoo::lse_fake_dtype_ok", mutates_args=())
def lse_fake_dtype_ok(x: torch.Tensor) -> torch.Tensor:
    """Row-wise logsumexp, accumulated in float32 at least."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    peak = wide.amax(dim=-1, keepdim=True)
    lse = (peak + (wide - peak).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)
    return lse.to(x.dtype)


@lse_fake_dtype_ok.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


def _lse_ok_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    (x,) = inputs
    ctx.save_for_backward(x, output)


def _lse_ok_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    x, lse = ctx.saved_tensors
    wide = lse.dtype if lse.dtype.itemsize >= 4 else torch.float32
    return (grad.to(wide).unsqueeze(-1) * (x.to(wide) - lse.to(wide).unsqueeze(-1)).exp()).to(x.dtype)


lse_fake_dtype_ok.register_autograd(_lse_ok_backward, setup_context=_lse_ok_setup_context)

register(
    lse_fake_dtype_ok,
    name="custom_op_fake_dtype_ok",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.logsumexp(x, dim=-1),
    dtypes=(torch.float64, torch.float32, torch.float16),
)
