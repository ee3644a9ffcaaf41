"""Buggy Functions written the way third-party kernel libraries write them: one bug each.

Twins of real_world_correct.py (plus two small kernels), each differing from correct code by one
realistic mistake. None of them was tuned to the suite.

* ``mutating_double_bug`` (MutatingDoubleBug): backward scales grad_output in place and returns
  it -- the numbers are exact, but the caller's grad_output is overwritten.
* ``layer_norm_f32_bug`` (LayerNormF32NoEpsBackward): backward recomputes var from x and uses
  1/sqrt(var) without eps -- NaN on constant rows, wrong values on near-constant rows; on
  ordinary rows (var >> eps) it is within gradcheck's tolerance.
* ``blockwise_attention_f32_bug`` (BlockwiseAttentionMissingD): backward forgets to subtract
  D = rowsum(dO * O) in dS = P * (dP - D) -- wrong dQ and dK.
* ``rotary_transposed_output_bug`` (RotaryInPlaceGrad): backward computes the gradient in place
  into ``grad.transpose(1, 2).contiguous()``; when grad_output is the transpose of a contiguous
  buffer, .contiguous() is a no-op and the caller's grad_output is overwritten. Values are right.
* ``bias_grad_wrong_shape`` (BiasGradWrongShape): y = x * w + b with a 0-d bias; backward returns
  grad_out (shape (n,)) for b instead of grad_out.sum(). The engine does not refuse it: () is
  expandable to (n,), so it silently sums the raw gradient, and gradcheck passes.
* ``wrong_dtype_grad_kernel`` (WrongDtypeGradKernel): y = x * x; the gradient buffer is
  ``torch.zeros(x.shape, device=x.device)`` -- default float32 even for float64 inputs. The
  engine casts it back to float64, so only ~1e-7 relative error shows and gradcheck passes.
* ``bias_grad_summed_to_scalar`` (BiasGradSummedToScalar): y = x + b with b of shape (d,);
  backward reduces grad_out over every dim (a 0-d tensor) for b. The engine refuses it
  ("returned an invalid gradient at index 1"), which stops every contract that runs backward:
  grad_meta owns the defect, the others are blocked by it.
* ``clobbers_input_in_forward`` (ClobbersInputInForward): y = 2x whose forward reuses x's memory
  as scratch afterwards (``x.data.zero_()``) -- the values it returns are right, but the caller's
  x is gone (and gradcheck, which perturbs x in place, would see nonsense).
* ``center_in_place_upcast`` (CenterInPlaceUpcast): y = (x - mean(x)) * w whose forward upcasts
  half inputs and centres the upcast copy in place -- a copy for float16, x itself for float32
  and float64, so the caller's x is centred too. inplace owns it; on an expanded (stride-0) x the
  same write raises in torch, and layouts and out_of_bounds are blocked by inplace.
* ``relu_masks_grad_output_bug`` (ReluMasksGradOutput): ReLU whose backward zeroes grad_output
  itself with ``masked_fill_`` and returns it. On a stride-0 grad_output torch only warns, so the
  write goes through and the gradient is wrong on that layout alone: inplace owns it, layouts is
  blocked by inplace.
* ``square_scratches_saved_input_bug`` (SquareScratchesSavedInput): y = x * x whose backward
  reuses the saved x as scratch (``x.mul_(2)``). inplace owns it; gradcheck, which runs the graph
  backward more than once, meets autograd's "modified by an inplace operation" and is blocked by
  inplace.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

# --------------------------------------------------------------------------- y = 2x


class MutatingDoubleBug(torch.autograd.Function):
    """y = 2 * x; backward doubles grad_output in place and returns it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out.mul_(2)  # BUG: writes into the caller's grad_output


register(
    MutatingDoubleBug,
    name="mutating_double_bug",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: 2 * x,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- fused LayerNorm


class LayerNormF32NoEpsBackward(torch.autograd.Function):
    """Fused LayerNorm whose backward recomputes rstd from x without eps."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        y = xc * rstd * weight + bias
        ctx.save_for_backward(x, weight, mean)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x, weight, mean = ctx.saved_tensors
        n = x.shape[-1]
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)
        rstd = 1 / torch.sqrt(var)  # BUG: eps dropped (saves memory by not storing rstd)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        xhat = xc * rstd
        if need_x:
            wdy = weight * dy
            c1 = (xhat * wdy).mean(dim=-1, keepdim=True)
            c2 = wdy.mean(dim=-1, keepdim=True)
            dx = (wdy - xhat * c1 - c2) * rstd
        if need_w:
            dw = (dy * xhat).reshape(-1, n).sum(dim=0)
        if need_b:
            db = dy.reshape(-1, n).sum(dim=0)
        return dx, dw, db, None


register(
    LayerNormF32NoEpsBackward,
    name="layer_norm_f32_bug",
    inputs=[Tensor("x", "*batch n"), Tensor("weight", "n"), Tensor("bias", "n"), Scalar("eps", 1e-5)],
    reference=lambda x, weight, bias, eps: F.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)

# --------------------------------------------------------------------------- blockwise attention

BLOCK = 4


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class BlockwiseAttentionMissingD(torch.autograd.Function):
    """FlashAttention-2-style attention whose backward computes dS = P * dP (no - D)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        acc_dtype = _compute_dtype(q.dtype)
        qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
        b, m, d = q.shape
        n = k.shape[1]
        scale = d**-0.5

        acc = torch.zeros(b, m, v.shape[-1], dtype=acc_dtype, device=q.device)
        row_max = torch.full((b, m, 1), float("-inf"), dtype=acc_dtype, device=q.device)
        row_sum = torch.zeros(b, m, 1, dtype=acc_dtype, device=q.device)
        for start in range(0, n, BLOCK):
            kb = kf[:, start : start + BLOCK]
            vb = vf[:, start : start + BLOCK]
            s = torch.bmm(qf, kb.transpose(1, 2)) * scale
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(row_max - new_max)
            p = torch.exp(s - new_max)
            row_sum = row_sum * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + torch.bmm(p, vb)
            row_max = new_max

        out = (acc / row_sum).to(q.dtype)
        lse = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k, v, _out, lse = ctx.saved_tensors
        scale = ctx.scale
        acc_dtype = _compute_dtype(q.dtype)
        qf, kf, vf = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
        do = grad_out.to(acc_dtype)
        n = k.shape[1]

        dq = torch.zeros_like(qf)
        dk = torch.empty_like(kf)
        dv = torch.empty_like(vf)
        for start in range(0, n, BLOCK):
            end = min(start + BLOCK, n)
            kb = kf[:, start:end]
            vb = vf[:, start:end]
            s = torch.bmm(qf, kb.transpose(1, 2)) * scale
            p = torch.exp(s - lse)
            dv[:, start:end] = torch.bmm(p.transpose(1, 2), do)
            dp = torch.bmm(do, vb.transpose(1, 2))
            ds = p * dp  # BUG: should be p * (dp - D), D = rowsum(dO * O)
            dq += torch.bmm(ds, kb) * scale
            dk[:, start:end] = torch.bmm(ds.transpose(1, 2), qf) * scale

        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        return (
            dq.to(q.dtype) if need_q else None,
            dk.to(k.dtype) if need_k else None,
            dv.to(v.dtype) if need_v else None,
        )


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


register(
    BlockwiseAttentionMissingD,
    name="blockwise_attention_f32_bug",
    inputs=[Tensor("q", "b m d"), Tensor("k", "b n d"), Tensor("v", "b n d")],
    reference=_attention_reference,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
    waivers={"compile": "loops over key blocks in Python, so torch.compile recompiles for every sequence length"},
)

# --------------------------------------------------------------------------- rotary embedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_transpose(g: torch.Tensor) -> torch.Tensor:
    g1, g2 = g.chunk(2, dim=-1)
    return torch.cat((g2, -g1), dim=-1)


class RotaryInPlaceGrad(torch.autograd.Function):
    """Rotary embedding returning a (b, h, s, d) view; backward works in place on grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        y = x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
        ctx.save_for_backward(cos, sin)
        return y.transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        cos, sin = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        # BUG: .contiguous() is a no-op when grad is the transpose of a contiguous buffer,
        # and the in-place ops below then write into the caller's grad_output.
        g = grad.transpose(1, 2).contiguous()
        rot = rotate_half_transpose(g * sin[:, None, :])
        g.mul_(cos[:, None, :]).add_(rot)
        return g, None, None


register(
    RotaryInPlaceGrad,
    name="rotary_transposed_output_bug",
    inputs=[
        Tensor("x", "b s h 4"),
        Tensor("cos", "s 4", requires_grad=False),
        Tensor("sin", "s 4", requires_grad=False),
    ],
    reference=lambda x, cos, sin: (x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]).transpose(1, 2),
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- 0-d bias


class BiasGradWrongShape(torch.autograd.Function):
    """y = x * w + b with a 0-d bias b; backward returns grad_out unreduced for b."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w + b

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        gx = grad_out * w if ctx.needs_input_grad[0] else None
        gw = grad_out * x if ctx.needs_input_grad[1] else None
        gb = grad_out if ctx.needs_input_grad[2] else None  # BUG: should be grad_out.sum()
        return gx, gw, gb


register(
    BiasGradWrongShape,
    name="bias_grad_wrong_shape",
    inputs=[Tensor("x", "n"), Tensor("w", "n"), Tensor("b", "")],
    reference=lambda x, w, b: x * w + b,
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- y = x * x


class WrongDtypeGradKernel(torch.autograd.Function):
    """y = x * x; backward fills a gradient buffer allocated without a dtype (float32)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        gx = torch.zeros(x.shape, device=x.device)  # BUG: dtype defaults to float32
        gx.copy_(grad_out * 2 * x)
        return gx


register(
    WrongDtypeGradKernel,
    name="wrong_dtype_grad_kernel",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * x,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)


# --------------------------------------------------------------------------- y = x + b


class BiasGradSummedToScalar(torch.autograd.Function):
    """y = x + b (b broadcast over rows); backward sums the bias gradient over every dim."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x + b

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        return grad_out, grad_out.sum()  # BUG: should be grad_out.sum(0), shape (d,)


register(
    BiasGradSummedToScalar,
    name="bias_grad_summed_to_scalar",
    inputs=[Tensor("x", "m d"), Tensor("b", "d")],
    reference=lambda x, b: x + b,
    dtypes=(torch.float64, torch.float32),
)

# --------------------------------------------------------------------------- y = 2x, scratch input


class ClobbersInputInForward(torch.autograd.Function):
    """y = 2x; forward then reuses x's buffer as scratch space behind autograd's back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x * 2
        x.data.zero_()  # BUG: the caller's tensor is overwritten
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out * 2


register(
    ClobbersInputInForward,
    name="clobbers_input_in_forward",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: 2 * x,
    dtypes=(torch.float64, torch.float32),
)


# --------------------------------------------------------------------------- centring through a no-op upcast


class CenterInPlaceUpcast(torch.autograd.Function):
    """y = (x - mean(x)) * w, upcast for half inputs; the centring is
    written in place on the upcast copy, which is x itself when there is nothing to upcast."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        xf -= xf.mean(-1, keepdim=True)  # BUG: xf is x itself in float32/float64: the caller's x is centred
        ctx.save_for_backward(xf, weight)
        return (xf * weight.to(xf.dtype)).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        centred, weight = ctx.saved_tensors
        g = grad.to(centred.dtype)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            gy = g * weight.to(g.dtype)
            grad_x = (gy - gy.mean(-1, keepdim=True)).to(grad.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (g * centred).reshape(-1, centred.shape[-1]).sum(0).to(weight.dtype)
        return grad_x, grad_w


register(
    CenterInPlaceUpcast,
    name="center_in_place_upcast",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d")],
    reference=lambda x, weight: (x - x.mean(-1, keepdim=True)) * weight,
    dtypes=(torch.float64, torch.float32, torch.float16),
    double_backward=False,
)


# --------------------------------------------------------------------------- ReLU, mask written into grad_output


class ReluMasksGradOutput(torch.autograd.Function):
    """ReLU whose backward zeroes grad_output where x <= 0 with ``masked_fill_`` and returns it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clamp_min(0)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        # BUG: writes into the caller's grad_output; on a stride-0 grad_output (y.sum().backward())
        # torch only warns, and every element then aliases the one element written.
        return grad.masked_fill_(x <= 0, 0)


register(
    ReluMasksGradOutput,
    name="relu_masks_grad_output_bug",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.relu,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)


# --------------------------------------------------------------------------- y = x * x, saved input as scratch


class SquareScratchesSavedInput(torch.autograd.Function):
    """y = x * x; backward reuses the saved x as scratch (``x.mul_(2)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        # BUG: writes into the caller's x; a second backward through the graph (gradcheck runs
        # several) finds the saved x modified and raises.
        return grad * x.mul_(2)


register(
    SquareScratchesSavedInput,
    name="square_scratches_saved_input_bug",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * x,
    dtypes=(torch.float64, torch.float32),
    double_backward=False,
)
