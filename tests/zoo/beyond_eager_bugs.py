"""Buggy Functions and custom ops whose defect only shows beyond eager autograd: one bug each.

Twins of beyond_eager_correct.py (registered there with the suffix ``_ok``), each differing from
the correct code by one realistic mistake. Every one of them computes the right outputs in eager
mode, and every one except ``custom_op_backward_wrong`` passes a plain float64
``torch.autograd.gradcheck``; what finds each is a contract that leaves eager autograd (fake
tensors, torch.compile, forward-mode AD, torch.func transforms, autocast).

* ``custom_op_fake_wrong_shape`` (``conformance_zoo::sq_norm_fake_bug``): y = sum(x**2, -1) as a
  ``torch.library.custom_op``; the real kernel and the registered autograd are right, but the
  ``register_fake`` kernel keeps the reduced dim (``(*x.shape[:-1], 1)``, as if keepdim=True).
  Eager never runs the fake kernel, so reference and gradcheck pass; ``opcheck``'s
  test_faketensor fails (shape mismatch), and so does anything that traces the op
  (torch.compile sees a wrong output shape).
* ``custom_op_fake_dtype`` (``conformance_zoo::lse_fake_dtype_bug``): a row-wise logsumexp whose
  real kernel returns its float32 accumulator for float16 inputs, while the fake kernel and the
  reference give float16. opcheck's test_faketensor fails; reference meets the same dtype and is
  blocked by it.
* ``custom_op_fake_swapped_dims`` (``conformance_zoo::outer_fake_bug``): y = outer(x, w); the fake
  kernel returns ``(n, m)``, right only where the two sizes are equal (compile's later calls give
  different dims different sizes, so it is blocked by opcheck, not passed).
* ``custom_op_backward_wrong`` (``conformance_zoo::scaled_tanh_bug``): y = tanh(scale * x); the
  registered backward returns grad * (1 - y**2) and forgets the chain-rule factor ``scale``. The
  fake kernel and the schema are right, and ``opcheck`` passes every sub-check (it checks that an
  autograd formula is registered and that compiled and eager gradients agree -- both run the same
  wrong formula -- not its numbers); gradcheck and the float64 reference see it.
* ``custom_op_bias_grad_wrong_dim`` (``conformance_zoo::bias_add_bug``): y = x + b for x
  ``(rows, d)`` and b ``(d,)``; the registered backward sums the bias gradient over the wrong dim
  (``grad.sum(-1, keepdim=True)``, copied from a norm's backward), a gradient of the wrong shape
  wherever ``d > 1`` (the engine raises; at ``d == 1`` it repairs the shape). That is grad_meta's
  defect; opcheck's test_aot_dispatch_dynamic and compile meet it too, and are blocked by it.
* ``compile_only_bug`` (SiLUCompileFallbackBug): y = x * sigmoid(x). Eager backward runs the
  "fused kernel" (out= calls into a fresh buffer, standing in for an opaque CUDA/Triton kernel);
  under ``torch.compiler.is_compiling()`` it takes the pure-torch fallback that authors add so
  Dynamo can trace the op -- and the fallback writes ``s + x * (1 - s)`` where the derivative is
  ``s + y * (1 - s)`` (x where y = x * s was meant). Eager (reference, gradcheck, every ordering
  of calls) never runs that branch; compiled gradients are silently wrong.
* ``wrong_jvp`` (SwiGLUJvpForgetsUp): y = silu(gate) * up in setup_context style; backward is
  right, but jvp returns only the gate's term ``gate_t * up * silu'(gate)`` and forgets
  ``silu(gate) * up_t`` (the up projection treated as a constant, as if it were a weight).
  Backward-mode checks (gradcheck, reference) never call jvp; forward-mode AD is wrong whenever
  ``up`` has a tangent.
* ``wrong_vmap_rule`` (SoftmaxVmapIgnoresInDims): softmax over the last dim with a hand-written
  ``vmap`` staticmethod that ignores ``in_dims``: it runs the op on the batched tensor as it is
  and declares ``out_dims=0``. Right when the batch dim is 0 (the common case, and what a quick
  test tries); for in_dims=1 the output's batch dim is read from the wrong axis (a wrong shape, or
  silently transposed values when the two sizes are equal), and for a batch dim that is last the
  softmax runs over the batch. Eager checks never call the rule.
* ``autocast_dtype_grads`` (AutocastScaleGradDtype): y = x * w (w over the last dim) with
  ``@torch.amp.custom_fwd(device_type="cpu")`` / ``custom_bwd``; backward returns grad x in "the
  autocast dtype" it noted in forward. The multiplication is not one autocast narrows, so forward
  and the gradient are float32 natively; the bfloat16 return loses 8 bits that the engine's
  silent cast back to float32 cannot restore. Outside autocast (gradcheck, the reference
  contract) it is exact. (Returning bfloat16 where native autocast computes in bfloat16 anyway,
  as torch's own custom_fwd example does, is only advice: tests/zoo/tiers_correct.py.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

# --------------------------------------------------------------------------- custom op: fake kernel


@torch.library.custom_op("conformance_zoo::sq_norm_fake_bug", mutates_args=())
def sq_norm_fake_bug(x: torch.Tensor) -> torch.Tensor:
    """Row-wise squared L2 norm: y = sum(x**2, dim=-1)."""
    return (x * x).sum(dim=-1)


@sq_norm_fake_bug.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], 1))  # BUG: keeps the reduced dim (should be x.shape[:-1])


def _sq_norm_fake_bug_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    (x,) = inputs
    ctx.save_for_backward(x)


def _sq_norm_fake_bug_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return 2 * x * grad.unsqueeze(-1)


sq_norm_fake_bug.register_autograd(_sq_norm_fake_bug_backward, setup_context=_sq_norm_fake_bug_setup_context)

register(
    sq_norm_fake_bug,
    name="custom_op_fake_wrong_shape",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x.pow(2).sum(dim=-1),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- custom op: backward


@torch.library.custom_op("conformance_zoo::scaled_tanh_bug", mutates_args=())
def scaled_tanh_bug(x: torch.Tensor, scale: float) -> torch.Tensor:
    """y = tanh(scale * x) (a soft-capping activation)."""
    return torch.tanh(x * scale)


@scaled_tanh_bug.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _scaled_tanh_bug_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _x, scale = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale


def _scaled_tanh_bug_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (y,) = ctx.saved_tensors
    return grad * (1 - y * y), None  # BUG: chain rule through scale * x forgotten (* ctx.scale)


scaled_tanh_bug.register_autograd(_scaled_tanh_bug_backward, setup_context=_scaled_tanh_bug_setup_context)

register(
    scaled_tanh_bug,
    name="custom_op_backward_wrong",
    inputs=[Tensor("x", "*batch n"), Scalar("scale", 0.5)],
    reference=lambda x, scale: torch.tanh(x * scale),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- compile-only fallback


class SiLUCompileFallbackBug(torch.autograd.Function):
    """y = x * sigmoid(x); eager backward is the fused kernel, compiled backward a buggy fallback."""

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
            return grad_out * (s + x * (1 - s))  # BUG: should be s + y * (1 - s)
        # "Fused kernel": writes dx = g * (s + y * (1 - s)) into a fresh buffer with out= calls.
        gx = torch.empty_like(x)
        torch.mul(s, y, out=gx)
        torch.sub(y, gx, out=gx)
        torch.add(gx, s, out=gx)
        torch.mul(gx, grad_out, out=gx)
        return gx


register(
    SiLUCompileFallbackBug,
    name="compile_only_bug",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: F.silu(x),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- forward AD


class SwiGLUJvpForgetsUp(torch.autograd.Function):
    """y = silu(gate) * up, setup_context style, with a jvp that drops up's tangent."""

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
        # BUG: the up tangent is never added (missing: out_t + gate * s * up_t)
        return out_t


register(
    SwiGLUJvpForgetsUp,
    name="wrong_jvp",
    inputs=[Tensor("gate", "*batch f"), Tensor("up", "*batch f")],
    reference=lambda gate, up: F.silu(gate) * up,
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- vmap rule


class SoftmaxVmapIgnoresInDims(torch.autograd.Function):
    """softmax over the last dim with a hand-written vmap rule that assumes the batch dim is 0."""

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
        # The op is row-wise over the last dim, so the batched tensor can be passed straight in.
        # BUG: ignores in_dims -- the batch dim is not moved to 0 (x.movedim(in_dims[0], 0))
        # before declaring out_dims=0.
        return SoftmaxVmapIgnoresInDims.apply(x), 0


register(
    SoftmaxVmapIgnoresInDims,
    name="wrong_vmap_rule",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.softmax(x, dim=-1),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- autocast


class AutocastScaleGradDtype(torch.autograd.Function):
    """y = x * w under custom_fwd/custom_bwd; backward returns grad x in the autocast dtype."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.low = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        return x * w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        gx = (g * w).to(ctx.low) if ctx.needs_input_grad[0] else None  # BUG: "the autocast dtype"; mul ran in float32
        gw = (g * x).reshape(-1, x.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        return gx, gw


register(
    AutocastScaleGradDtype,
    name="autocast_dtype_grads",
    inputs=[Tensor("x", "*batch d"), Tensor("w", "d")],
    reference=lambda x, w: x * w,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- compile: graph break, recompile storm


_SCALE_CACHE: dict[tuple[int, int], torch.Tensor] = {}


class CachedRowScale(torch.autograd.Function):
    """y = x * rsqrt(mean(x**2) + 1) per row, with the row scales cached by the input's storage."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), x._version)  # BUG under compile: fake tensors have no data pointer
        scale = _SCALE_CACHE.get(key)
        if scale is None:
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
    CachedRowScale,
    name="compile_graph_break",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
    compile="fullgraph",  # the promise it breaks: without it, a graph break is advice
)


# Padded block width per row length, precomputed for the sizes a kernel supports.
_BLOCK = {n: 1 << max(0, (n - 1).bit_length()) for n in range(1, 1025)}


class PaddedBlockScale(torch.autograd.Function):
    """y = x / block(n), with block(n) the padded (power-of-two) width a kernel would launch."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        block = _BLOCK[x.shape[-1]]  # BUG under compile: a lookup keyed by a size guards on that exact size
        ctx.block = block
        return x * (1.0 / block)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out * (1.0 / ctx.block)


def _padded_block_reference(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 / (1 << max(0, (x.shape[-1] - 1).bit_length())))


register(
    PaddedBlockScale,
    name="compile_recompile_storm",
    inputs=[Tensor("x", "*batch n")],
    reference=_padded_block_reference,
    dtypes=(torch.float64, torch.float32),
    compile="dynamic",  # the promise it breaks: without it, a recompile is advice
)


# --------------------------------------------------------------------------- custom op: fake kernel, two dims


@torch.library.custom_op("conformance_zoo::outer_fake_bug", mutates_args=())
def outer_fake_bug(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[i, j] = x[i] * w[j]."""
    return x[:, None] * w[None, :]


@outer_fake_bug.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((w.shape[0], x.shape[0]))  # BUG: (n, m), right only where m == n


def _outer_fake_bug_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _outer_fake_bug_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return grad @ w, x @ grad


outer_fake_bug.register_autograd(_outer_fake_bug_backward, setup_context=_outer_fake_bug_setup_context)

register(
    outer_fake_bug,
    name="custom_op_fake_swapped_dims",
    inputs=[Tensor("x", "m"), Tensor("w", "n")],
    reference=lambda x, w: torch.outer(x, w),
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- custom op: backward, gradient shape


@torch.library.custom_op("conformance_zoo::bias_add_bug", mutates_args=())
def bias_add_bug(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = x + b, b broadcast over the rows."""
    return x + b


@bias_add_bug.register_fake
def _(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _bias_add_bug_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    pass


def _bias_add_bug_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad, grad.sum(-1, keepdim=True)  # BUG: summed over the features (should be dim 0)


bias_add_bug.register_autograd(_bias_add_bug_backward, setup_context=_bias_add_bug_setup_context)

register(
    bias_add_bug,
    name="custom_op_bias_grad_wrong_dim",
    inputs=[Tensor("x", "rows d"), Tensor("b", "d")],
    reference=lambda x, b: x + b,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- custom op: output dtype


@torch.library.custom_op("conformance_zoo::lse_fake_dtype_bug", mutates_args=())
def lse_fake_dtype_bug(x: torch.Tensor) -> torch.Tensor:
    """Row-wise logsumexp, accumulated in float32 at least."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    peak = wide.amax(dim=-1, keepdim=True)
    lse = (peak + (wide - peak).exp().sum(dim=-1, keepdim=True).log()).squeeze(-1)
    return lse  # BUG: float32 for float16 inputs; the fake kernel (and the reference) say x.dtype


@lse_fake_dtype_bug.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


def _lse_bug_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    (x,) = inputs
    ctx.save_for_backward(x, output)


def _lse_bug_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    x, lse = ctx.saved_tensors
    wide = lse.dtype if lse.dtype.itemsize >= 4 else torch.float32
    return (grad.to(wide).unsqueeze(-1) * (x.to(wide) - lse.to(wide).unsqueeze(-1)).exp()).to(x.dtype)


lse_fake_dtype_bug.register_autograd(_lse_bug_backward, setup_context=_lse_bug_setup_context)

register(
    lse_fake_dtype_bug,
    name="custom_op_fake_dtype",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.logsumexp(x, dim=-1),
    dtypes=(torch.float64, torch.float32, torch.float16),
)
