"""Buggy Functions for decisive verdicts: one defect each, failed by exactly the contract that owns
it, every other contract that meets it "blocked by" that owner (issue "Decisive verdicts").

* ``crash_on_1d`` (RowCenter): y = x - mean(x, -1); forward reads the row count as
  ``x.shape[-2]``, so it raises IndexError on 1-D input, a valid input of the spec. A crash on
  plain inputs is return_count's; every other contract that meets it is blocked by it.
* ``crash_on_expanded_grad`` (ViewGradScale): y = 2 * x; backward calls ``grad.view(-1)``, which
  raises on the stride-0 grad_output ``y.sum().backward()`` produces. A crash only a layout causes
  is layouts'; out_of_bounds and unwritten_memory meet it too and are blocked by layouts.
* ``float64_crash_wrong_float32`` (Float32Buffer): y = 2x through a float32 buffer that forward
  fills with ``-finfo(x.dtype).max`` -- an overflow, so float64 (listed for gradcheck) raises:
  return_count's crash; backward returns 3g, which the float32 cases show: reference checks the
  dtypes that run and fails too (two defects). ``float64_crash_right_float32``: the same crash with
  a right backward: return_count fails, reference is blocked by it.
* ``crash_on_1d_wrong_grad`` (CrashOn1D): y = 2x that raises on 1-D input (return_count's crash)
  and whose backward returns 3g: gradcheck, which never goes through per-dtype checks, goes on past
  the crashing examples and fails on its own.
* ``unreduced_wrong_bias`` (UnreducedWrongBias): y = x + b with b broadcast over rows; backward
  returns the unreduced gradient for b, and scaled by 2. grad_meta fails for the shape; the engine
  sums it, and gradcheck and reference see the wrong values.
* ``unreduced_right_bias`` (UnreducedRightBias): the same unreduced gradient with right values:
  grad_meta fails, and nothing else does (gradcheck and reference judge the repaired gradient).
* ``attention_unneeded_dk_dv`` (AttentionAllGrads): dk and dv computed when only q needs a
  gradient: advice from unneeded_grads naming the extra matrix products, not a failure.
* ``silent_wrong_double_backward`` (SavedSigmoidSoftplus): softplus registered with
  ``double_backward=False`` whose backward multiplies by a sigmoid saved in forward, so double
  backward runs and silently gives a zero second derivative: gradgradcheck fails (a defect, not
  advice). ``silent_wrong_double_backward_float32``: the same, float32 only (no gradgradcheck):
  judged against the reference's double backward, it fails too.
* ``detached_at_unit_grad_output`` (UnitGradOutputFastPath): a scalar loss whose backward returns a
  gradient computed in forward when grad_output is 1: no graph at loss.backward(create_graph=True);
  gradgradcheck fails, with grad_output all ones.
* ``scales_input_through_reshape`` (ScaleThroughReshape): y = 2 w x, computed by scaling
  ``x.reshape(-1, n)`` in place -- a view of x, not the scratch copy its author assumed -- without
  ``mark_dirty``. inplace fails; compile (aot_eager differs from eager) and the finite differences
  of gradcheck and gradgradcheck, which that write can explain, say "blocked by inplace".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Tensor, register


class RowCenter(torch.autograd.Function):
    """y = x - mean(x, -1), written for 2-D (rows, n) input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        rows, n = x.shape[-2], x.shape[-1]  # BUG: IndexError on 1-D input
        ctx.n = n
        return x - x.reshape(-1, rows, n).mean(-1, keepdim=True).reshape((*x.shape[:-1], 1))

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out - grad_out.mean(-1, keepdim=True)


register(
    RowCenter, name="crash_on_1d", inputs=[Tensor("x", "*batch n")], reference=lambda x: x - x.mean(-1, keepdim=True),
)


def _float32_buffer(factor: float) -> type[torch.autograd.Function]:
    class Float32Buffer(torch.autograd.Function):
        """y = 2x through a float32 buffer initialised with the input dtype's lowest value."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            buffer = torch.full(x.shape, -torch.finfo(x.dtype).max, dtype=torch.float32)  # BUG: overflows for float64
            buffer.copy_(x * 2)
            return buffer.to(x.dtype)

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
            return grad_out * factor

    return Float32Buffer


for _factor, _name in ((3.0, "float64_crash_wrong_float32"), (2.0, "float64_crash_right_float32")):
    register(
        _float32_buffer(_factor), name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 2,
        dtypes=(torch.float64, torch.float32),
    )


class CrashOn1D(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 1:
            raise RuntimeError("1-D input not supported")  # BUG: a valid input of the spec
        return 2 * x

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        return 3 * grad_out  # BUG: 2 is right


register(
    CrashOn1D, name="crash_on_1d_wrong_grad", inputs=[Tensor("x", "*batch n")], reference=lambda x: 2 * x,
    dtypes=(torch.float64, torch.float32),
)


class ViewGradScale(torch.autograd.Function):
    """y = 2 * x; backward flattens grad_output with .view."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        flat = grad_out.view(-1)  # BUG: raises on a stride-0 or transposed grad_output; use reshape
        return (flat * 2).view(grad_out.shape)


register(ViewGradScale, name="crash_on_expanded_grad", inputs=[Tensor("x", "m n")], reference=lambda x: x * 2)


class UnreducedWrongBias(torch.autograd.Function):
    """y = x + b, b of shape (n,) broadcast over the rows of x (m, n)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x + b

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad_out, 2 * grad_out  # BUG: (m, n) for b (not summed over rows) and scaled by 2


register(
    UnreducedWrongBias, name="unreduced_wrong_bias", inputs=[Tensor("x", "m n"), Tensor("b", "n")], reference=lambda x, b: x + b,
)


class SavedSigmoidSoftplus(torch.autograd.Function):
    """y = softplus(x); backward multiplies by sigmoid(x) saved from forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(torch.sigmoid(x))  # BUG for double backward: a constant to it
        return F.softplus(x)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        (s,) = ctx.saved_tensors
        return grad_out * s


# The _float32 twin is float32 only (a Triton kernel's dtypes): no gradgradcheck, so the reference's
# double backward judges it.
for _suffix, _dtypes in (("", {}), ("_float32", {"dtypes": (torch.float32,)})):
    register(SavedSigmoidSoftplus, name="silent_wrong_double_backward" + _suffix, inputs=[Tensor("x", "*batch n")], reference=F.softplus, double_backward=False, **_dtypes)


class AttentionAllGrads(torch.autograd.Function):
    """y = softmax(q k^T) v; backward computes dq, dk and dv whatever needs them: dk and dv cost
    two matrix products each that nobody uses when only q needs a gradient (advice, not a defect)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        ctx.save_for_backward(q, k, v, p)
        return p @ v

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, p = ctx.saved_tensors
        dtypes = (q.dtype, k.dtype, v.dtype)  # under autocast forward's products are bfloat16
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
        q, k, v, grad_out, p = (t.to(dtype) for t in (q, k, v, grad_out, p))
        dp = grad_out @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq = ds @ k
        dk = ds.transpose(-1, -2) @ q  # computed even when k needs no gradient
        dv = p.transpose(-1, -2) @ grad_out  # computed even when v needs no gradient
        return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])


register(
    AttentionAllGrads,
    name="attention_unneeded_dk_dv",
    inputs=[Tensor("q", "*batch m d"), Tensor("k", "*batch n d"), Tensor("v", "*batch n d")],
    reference=lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v,
    double_backward=False,
)


class UnreducedRightBias(torch.autograd.Function):
    """y = x + b, b of shape (n,) broadcast over the rows of x (m, n); grad b left unreduced."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x + b

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad_out, grad_out  # BUG: (m, n) for b; the engine sums it to (n,), so the values are right


register(
    UnreducedRightBias, name="unreduced_right_bias", inputs=[Tensor("x", "m n"), Tensor("b", "n")], reference=lambda x, b: x + b,
)


class ScaleThroughReshape(torch.autograd.Function):
    """y = 2 w x, scaled in place through ``x.reshape`` (a view of a contiguous x)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.clone(), w)
        rows = x.reshape(-1, x.shape[-1])
        rows.mul_(w * 2.0)  # BUG: rows is x itself, written without mark_dirty
        return rows.reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad_out * w * 2.0, (grad_out * x * 2.0).reshape(-1, w.shape[-1]).sum(0)


register(
    ScaleThroughReshape, name="scales_input_through_reshape", inputs=[Tensor("x", "*batch n"), Tensor("w", "n")],
    reference=lambda x, w: 2.0 * w * x,
)


class UnitGradOutputFastPath(torch.autograd.Function):
    """loss = sum(x ** 2); backward skips the multiply when grad_output is 1 (what loss.backward()
    passes), returning 2x computed in forward: right to first order, but with no graph, so a
    gradient penalty built on loss.backward(create_graph=True) gets nothing (Liger's losses do this)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, 2 * x.detach())
        return (x * x).sum()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
        x, grad_at_one = ctx.saved_tensors
        if torch.equal(grad_out, torch.ones_like(grad_out)):
            return grad_at_one  # BUG for double backward: no graph at grad_output 1
        return grad_out * 2 * x


register(
    UnitGradOutputFastPath,
    name="detached_at_unit_grad_output",
    inputs=[Tensor("x", "n")],
    reference=lambda x: (x * x).sum(),
    double_backward=False,
)
