"""Correct Functions written the way third-party code writes them, each of which a past version of
the suite failed for the wrong reason (issue "Right on everyone's code"); every one must pass
every contract. Their buggy twins are in everyones_code_bugs.py.

* ``inplace_square`` (InplaceSquare, class 3): x *= x in place with ``mark_dirty``, a copy of x
  kept for backward. In float16 the square overflows to inf where the true value is past
  float16's max: correct. stability once computed its truth from the clobbered x (inf), so the
  finite grad 2 g x looked wrong against 2 g inf.
* ``narrow_rows`` (NarrowRows, class 4): returns ``x[1:]``, a view of its input, as torch's own
  select and slice ops do; autograd tracks the view. inplace once failed every view output.
* ``sort_rows`` (SortRows, class 5): values and indices of an (unstable) ``torch.argsort`` along
  the last dim, backward a scatter. On a constant row, stored with stride 0 or not, ties come out
  in another order; layouts once compared the indices exactly.
* ``row_norms_numpy`` (RowNormsNumpy, class 6): y = 2x, and the row count as a numpy array (a
  Python-side statistic). compile once crashed comparing numpy outputs with ``==``.
* ``straight_through_sign`` (StraightThroughSign, class 7): sign(x) with the hardtanh
  straight-through gradient, declared as ``surrogate=``, and a jvp that matches it. forward_ad
  once held the jvp to sign's own derivative (zero).
* ``sort_values_jvp`` (SortValuesJvp, class 7): values and indices of a sort, with a jvp for the
  values and none for the indices, as ``torch.sort`` itself gives. forward_ad once demanded a
  tangent for the indices.
* ``permute_columns`` (PermuteColumns, class 12): y = x[..., perm] for a permutation ``perm``,
  backward through its inverse (argsort). The permutation is an integer ``Derived`` input (a
  precondition ``Index`` cannot state: ``Index`` draws repeats, where "the inverse" is wrong).
* ``scale_optional_bias`` (ScaleOptionalBias, class 12): y = 2x + bias with ``bias=None`` allowed,
  passed as None through ``Scalar("bias", None)``, and ``ctx.save_for_backward(bias)`` saving that
  None. inplace once crashed comparing the saved None with its copy.
* ``add_into_inplace`` (AddIntoInplace, class 3): y += x in place with ``mark_dirty``, backward
  passing grad_output through to both. Under autocast y comes in bfloat16 and x in float32, and
  the gradient for x is grad_output itself, in bfloat16, as torch's own ``y.add_(x)`` returns it;
  it loses nothing (the engine's cast to float32 is exact). autocast once failed it for the
  narrower dtype alone.
* ``kl_div_log_target`` (KLDivLogTarget, class 8): KL divergence with a log-space target,
  sum(exp(t) * (t - x)) / n, whose target values reach 20: the loss is ~1e8 while the derivative
  of an entry with a small t is ~1. Central differences at 1e-6 are then mostly rounding (u |f| /
  h ~ 0.01), and gradcheck once blamed the exact backward "by a constant factor".
* ``sparsemax`` (Sparsemax, class 8): sparsemax over the last dim, float32 compute for half
  types as a kernel accumulates; backward from the support of the output. In bfloat16 an element within
  one rounding step of the threshold may leave the support, where the gradient jumps by O(1): the
  budget allows how far the truth moves when the inputs move one rounding step.
* ``linear_no_custom_fwd`` (LinearNoCustomFwd, class 10): y = x @ w written with no thought of
  autocast; backward casts grad_output to the saved tensors' dtype and returns each gradient in
  its input's dtype, so it works under ``torch.autocast`` without ``custom_fwd``.
* ``gelu_tanh_under_autocast`` (GeluTanhUnderAutocast, class 10): exact GELU, and under autocast
  (no ``custom_fwd``) the tanh approximation, within the budget of GELU run in bfloat16.
* ``rms_scale_float32_eps`` (RmsScaleFloat32Eps): y = x / sqrt(mean(x**2) + eps) with ``eps``
  rounded to float32, as a Triton kernel receives a Python float, and a vmap rule and a jvp. In
  float64 it is a few rounding steps from the reference (eps in float64): within the reference
  contract's float64 rule (``assert_close``); func, forward_ad and compile once held float64 to
  a 2-step floor and failed it (a new user's trial: "a forward defect", while reference passed).
* ``max_pool_last_tie`` (MaxPoolLastTie, class 8): max pooling over windows of 2 along the last
  dim whose backward gives a tied window's gradient to its last element, where torch's max_pool1d
  (the reference) picks the first: at a tie both are right. reference compares the sum over each
  tie (drawn on purpose), never which element gets it.
* ``masked_logcumsumexp`` (MaskedLogCumSumExp, class 8): log-cumsum-exp of x plus an additive
  mask, a loop with ``logaddexp``, whose backward gives 0 where an output is -inf (no input moves
  it). torch's own backward gives NaN there (-inf - -inf), and gradcheck's differences of a -inf
  output are NaN: gradcheck and stability once failed it (a new user's trial).
* ``quant_codes`` (QuantCodes, class 12): int8 codes ``round(x / scale)`` beside the dequantised
  value, straight-through gradient declared as ``surrogate=``. In bfloat16 ``x / scale`` may round
  onto a half where float64's is not, so a code differs from the float64 truth's by one while
  it equals plain PyTorch's in bfloat16: reference once compared integer outputs with the float64
  truth alone (a new user's trial).
* ``clip_grad`` (ClipGrad): identity forward, backward clamps grad_output to [-c, c]:
  a gradient no function of x has (it is not linear in grad_output). Its ``surrogate=`` clips
  with a tensor hook, the recipe docs/specs.md shows (a new user's trial).
* ``stop_grad_target`` (StopGradTarget): (x - t)**2 with no gradient for the target t
  by design (distillation); ``surrogate=`` detaches t, the recipe docs/specs.md shows.
* ``index_add_rows`` (IndexAddRows): ``base.index_add(0, idx, src)``, which raises on a bfloat16
  base and a float32 src, as torch's index_add does: autocast once failed it on the mixed inputs
  it hands a Function that lists bfloat16, though its reference raises there too (a new user's trial).
* ``inverse`` (Inverse): ``torch.linalg.inv`` on a plain square Tensor. An expanded layout's
  constant rows make a singular matrix, on which it raises as its reference does: layouts once
  failed it (a new user's trial; a case both raise on is outside the op's domain).
* ``spd_logdet`` (SPDLogdet): log det(a a^T + n I) by Cholesky. At magnitude 1e100 the n I is
  below float64's rounding, the matrix is singular and torch.linalg.cholesky raises, where the
  float64 reference gives -inf (finite at ordinary magnitudes): stability once failed it as a
  crash (a new user's trial).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import AdditiveMask, Derived, Index, Scalar, Tensor, register


class InplaceSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.clone())
        ctx.mark_dirty(x)
        return x.mul_(x)

    @staticmethod
    @once_differentiable  # the copy of x is made in forward: a constant to double backward
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * grad * x


register(
    InplaceSquare, name="inplace_square", inputs=[Tensor("x", "*batch n")], reference=torch.square,
    mutates=["x"], dtypes=(torch.float64, torch.float32, torch.float16), double_backward=False,
)


class NarrowRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.rows = x.shape[0]
        return x[1:]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return F.pad(grad, (0, 0, 1, 0))


register(
    NarrowRows, name="narrow_rows", inputs=[Tensor("x", "rows n")], reference=lambda x: x[1:].clone(),
    dims=[],
)


class SortRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(x, dim=-1)
        ctx.save_for_backward(order)
        ctx.mark_non_differentiable(order)
        return x.gather(-1, order), order

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> torch.Tensor:
        (order,) = ctx.saved_tensors
        return torch.zeros_like(grad).scatter(-1, order, grad)


register(
    SortRows, name="sort_rows", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.sort(x, dim=-1),
)


class RowNormsNumpy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        return x * 2, np.asarray([x.shape[0]])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> torch.Tensor:
        return grad * 2


register(
    RowNormsNumpy, name="row_norms_numpy", inputs=[Tensor("x", "rows n")],
    reference=lambda x: (x * 2, np.asarray([x.shape[0]])),
)


class StraightThroughSign(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1)

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return tangent * (x.abs() <= 1)


register(
    StraightThroughSign, name="straight_through_sign", inputs=[Tensor("x", "*batch n", kinks=(-1.0, 0.0, 1.0))],
    reference=torch.sign, surrogate=F.hardtanh, double_backward=False,
)


class SortValuesJvp(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sort(x, dim=-1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: tuple[torch.Tensor, torch.Tensor]) -> None:
        order = output[1]
        ctx.save_for_backward(order)
        ctx.save_for_forward(order)
        ctx.mark_non_differentiable(order)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> torch.Tensor:
        (order,) = ctx.saved_tensors
        return torch.zeros_like(grad).scatter(-1, order, grad)

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> tuple[torch.Tensor, None]:
        (order,) = ctx.saved_tensors
        return tangent.gather(-1, order), None


register(
    SortValuesJvp, name="sort_values_jvp", inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.sort(x, dim=-1), double_backward=False,
)


class LinearNoCustomFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        dtype = torch.promote_types(x.dtype, w.dtype)
        grad = grad.to(dtype)
        return (grad @ w.to(dtype).mT).to(x.dtype), (x.to(dtype).mT @ grad).to(w.dtype)


register(
    LinearNoCustomFwd, name="linear_no_custom_fwd", inputs=[Tensor("x", "m k"), Tensor("w", "k n")],
    reference=lambda x, w: x @ w,
)


class PermuteColumns(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(perm)
        return x[..., perm]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (perm,) = ctx.saved_tensors
        return grad[..., torch.argsort(perm)], None


def random_permutation(ctx: Any) -> torch.Tensor:
    return torch.randperm(ctx.shape[0], generator=ctx.generator)


register(
    PermuteColumns, name="permute_columns",
    inputs=[Tensor("x", "*batch n"), Derived("perm", random_permutation, "n")],
    reference=lambda x, perm: x[..., perm],
)


class ScaleOptionalBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(bias)  # None when there is no bias: legal, and saved as None
        return 2 * x + bias if bias is not None else 2 * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        (bias,) = ctx.saved_tensors
        return 2 * grad, (grad if bias is not None else None)


register(
    ScaleOptionalBias, name="scale_optional_bias", inputs=[Tensor("x", "*batch n"), Scalar("bias", None)],
    reference=lambda x, bias: 2 * x,
)


def sparsemax_forward(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax over the last dim (Martins & Astudillo): the Euclidean projection onto the simplex."""
    ordered = torch.sort(z, dim=-1, descending=True).values
    rank = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cumulative = ordered.cumsum(-1)
    support = 1 + rank * ordered > cumulative
    size = support.sum(-1, keepdim=True).clamp(min=1)  # the largest element is always in it
    tau = (cumulative.gather(-1, size - 1) - 1) / size.to(z.dtype)
    return torch.clamp(z - tau, min=0)


class Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor) -> torch.Tensor:
        out = sparsemax_forward(z.float() if z.dtype in (torch.float16, torch.bfloat16) else z).to(z.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        support = (out > 0).to(grad.dtype)
        mean = (grad * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True).clamp(min=1)
        return support * (grad - mean)


register(
    Sparsemax, name="sparsemax", inputs=[Tensor("z", "*batch n")], reference=sparsemax_forward,
    dtypes=(torch.float64, torch.float32, torch.bfloat16), double_backward=False,
)


class GeluTanhUnderAutocast(torch.autograd.Function):
    """Exact GELU; under autocast, the cheaper tanh approximation (within 3e-4 of it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        if torch.is_autocast_enabled(x.device.type):
            return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))
        return F.gelu(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1 + torch.erf(x * 0.7071067811865476))
        pdf = torch.exp(-0.5 * x * x) * 0.3989422804014327
        return (grad * (cdf + x * pdf)).to(x.dtype)


register(GeluTanhUnderAutocast, name="gelu_tanh_under_autocast", inputs=[Tensor("x", "*batch n")], reference=F.gelu)


# --------------------------------------------------------------------------- float32 eps in float64


def _eps32(eps: float) -> float:
    return float(torch.tensor(eps, dtype=torch.float32))


class RmsScaleFloat32Eps(torch.autograd.Function):
    """y = x * rsqrt(mean(x**2, -1) + eps), eps rounded to float32 (a kernel's float32 scalar)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps32(eps))
        return x * rstd

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, float], output: torch.Tensor) -> None:
        x, eps = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)  # jvp reads it too
        ctx.eps = eps

    @staticmethod
    def _along(ctx: Any, x: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps32(ctx.eps))
        return rstd * (direction - x * rstd.pow(2) * (direction * x).mean(-1, keepdim=True))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return RmsScaleFloat32Eps._along(ctx, x, grad), None

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor, _: Any) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return RmsScaleFloat32Eps._along(ctx, x, x_t)


register(
    RmsScaleFloat32Eps,
    name="rms_scale_float32_eps",
    inputs=[Tensor("x", "*batch d"), Scalar("eps", 1e-6)],
    reference=lambda x, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps),
    dtypes=(torch.float64, torch.float32),
)


class AddIntoInplace(torch.autograd.Function):
    """y += x in place (``mark_dirty``), backward passing grad_output through to both inputs."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y.add_(x)
        ctx.mark_dirty(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad


register(
    AddIntoInplace, name="add_into_inplace", inputs=[Tensor("y", "*batch n"), Tensor("x", "*batch n")],
    reference=lambda y, x: y + x, mutates=("y",), dtypes=(torch.float64, torch.float32, torch.bfloat16),
)


class KLDivLogTarget(torch.autograd.Function):
    """KL(target || input) with both in log space, mean over elements: sum(exp(t) * (t - x)) / n."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, t)
        return (torch.exp(t) * (t - x)).sum() / x.numel()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, t = ctx.saved_tensors
        scale = g / x.numel()
        dx = -torch.exp(t) * scale if ctx.needs_input_grad[0] else None
        dt = torch.exp(t) * (t - x + 1) * scale if ctx.needs_input_grad[1] else None
        return dx, dt


register(
    KLDivLogTarget, name="kl_div_log_target",
    inputs=[Tensor("x", "*batch n"), Tensor("t", "*batch n", domain=(0.0, 20.0))],
    reference=lambda x, t: (t.exp() * (t - x)).mean(), dtypes=(torch.float64, torch.float32),
)


class MaxPoolLastTie(torch.autograd.Function):
    """max over windows of 2 along the last dim; the gradient goes to the window's last maximum."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        windows = x.unflatten(-1, (-1, 2))
        last = (windows[..., 1] >= windows[..., 0]).long()  # the last of a tie
        ctx.save_for_backward(last)
        ctx.shape = x.shape
        return windows.gather(-1, last.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (last,) = ctx.saved_tensors
        windows = grad.new_zeros(ctx.shape).unflatten(-1, (-1, 2))
        return windows.scatter(-1, last.unsqueeze(-1), grad.unsqueeze(-1)).flatten(-2)


def max_pool_pairs(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool1d(x.reshape(-1, 1, x.shape[-1]), 2).reshape(*x.shape[:-1], x.shape[-1] // 2)


register(
    MaxPoolLastTie, name="max_pool_last_tie", inputs=[Tensor("x", "*batch 2*w")], reference=max_pool_pairs,
    dtypes=(torch.float64, torch.float32, torch.bfloat16),
)


class MaskedLogCumSumExp(torch.autograd.Function):
    """log(cumsum(exp(x + bias))) along the last dim, a loop over positions; 0 gradient where y = -inf."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        z = x + bias
        running = z[..., 0]
        ys = [running]
        for j in range(1, z.shape[-1]):
            running = torch.logaddexp(running, z[..., j])
            ys.append(running)
        y = torch.stack(ys, -1)
        ctx.save_for_backward(z, y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        z, y = ctx.saved_tensors
        # d y_j / d z_i = exp(z_i - y_j) for i <= j, summed right to left: s_i = g_i + exp(y_i - y_(i+1)) s_(i+1)
        # (y never decreases, so every exponent is <= 0); 0 where an exponent is -inf - -inf (a masked prefix).
        def weight(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.where(torch.isfinite(b), torch.exp(a - torch.where(torch.isfinite(b), b, 0)), 0)

        running = grad[..., -1]
        grads = [weight(z[..., -1], y[..., -1]) * running]
        for i in range(z.shape[-1] - 2, -1, -1):
            running = grad[..., i] + weight(y[..., i], y[..., i + 1]) * running
            grads.append(weight(z[..., i], y[..., i]) * running)
        return torch.stack(grads[::-1], -1), None


register(
    MaskedLogCumSumExp, name="masked_logcumsumexp", inputs=[Tensor("x", "*batch n"), AdditiveMask("bias", "*batch n")],
    reference=lambda x, bias: torch.logcumsumexp(x + bias, -1), dtypes=(torch.float64, torch.float32), double_backward=False,
)


class QuantCodes(torch.autograd.Function):
    """int8 codes round(x / scale) and the dequantised codes * scale; straight-through gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.round(x / scale).clamp(-128, 127)
        packed = codes.to(torch.int8)
        ctx.mark_non_differentiable(packed)
        return packed, codes * scale

    @staticmethod
    def backward(ctx: Any, grad_codes: torch.Tensor | None, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.clone(), None


def _quantised(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.round(x / scale).clamp(-128, 127)
    return codes.to(torch.int8), codes * scale


register(
    QuantCodes, name="quant_codes", inputs=[Tensor("x", "*batch n"), Scalar("scale", 0.1)], reference=_quantised,
    surrogate=lambda x, scale: (torch.round(x / scale).clamp(-128, 127).to(torch.int8), x.clone()),
    dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)


# Gradient-only Functions: the surrogate is what backward differentiates.
class ClipGrad(torch.autograd.Function):
    """Identity forward; backward clips each gradient element to [-c, c]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, c: float) -> torch.Tensor:
        ctx.c = c
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.clamp(-ctx.c, ctx.c), None


def clipped_identity(x: torch.Tensor, c: float) -> torch.Tensor:
    """x, whose gradient is clipped on its way back (a hook: no function of x has this gradient)."""
    y = x.clone()
    if y.requires_grad:
        y.register_hook(lambda grad: grad.clamp(-c, c))
    return y


register(
    ClipGrad, name="clip_grad", inputs=[Tensor("x", "*batch n"), Scalar("c", 0.5)], reference=lambda x, c: x.clone(),
    surrogate=clipped_identity, dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)


class StopGradTarget(torch.autograd.Function):
    """(x - t)**2 with no gradient for the target t (distillation, BYOL)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, t)
        return (x - t) ** 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        x, t = ctx.saved_tensors
        return (2 * (x - t) * grad if ctx.needs_input_grad[0] else None), None


register(
    StopGradTarget, name="stop_grad_target", inputs=[Tensor("x", "*batch n"), Tensor("t", "*batch n")],
    reference=lambda x, t: (x - t) ** 2, surrogate=lambda x, t: (x - t.detach()) ** 2,
    dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)


class IndexAddRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, base: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        return base.index_add(0, idx, src)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        (idx,) = ctx.saved_tensors
        needs_base, _, needs_src = ctx.needs_input_grad
        return (grad if needs_base else None), None, (grad.index_select(0, idx) if needs_src else None)


register(
    IndexAddRows, name="index_add_rows", inputs=[Tensor("base", "n d"), Index("idx", "k", high="n"), Tensor("src", "k d")],
    reference=lambda base, idx, src: base.index_add(0, idx, src),
    dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
)


class Inverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        inverse = torch.linalg.inv(a)
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (inverse,) = ctx.saved_tensors
        return -inverse.mT @ grad @ inverse.mT


register(Inverse, name="inverse", inputs=[Tensor("a", "*batch n n")], reference=torch.linalg.inv)


class SPDLogdet(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        n = a.shape[-2]
        factor = torch.linalg.cholesky(a @ a.mT + n * torch.eye(n, dtype=a.dtype, device=a.device))
        ctx.save_for_backward(a, factor)
        return 2 * torch.log(torch.diagonal(factor, dim1=-2, dim2=-1)).sum(-1)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        a, factor = ctx.saved_tensors
        return 2 * grad[..., None, None] * (torch.cholesky_inverse(factor) @ a)


def spd_logdet(a: torch.Tensor) -> torch.Tensor:
    n = a.shape[-2]
    return torch.logdet(a @ a.mT + n * torch.eye(n, dtype=a.dtype, device=a.device))


register(SPDLogdet, name="spd_logdet", inputs=[Tensor("a", "*batch n k")], reference=spd_logdet, double_backward=False)
