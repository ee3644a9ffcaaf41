"""An RMSNorm whose sum of squares is accumulated in the input's dtype, and its twin that
accumulates in float32: a hurried kernel's classic. In float16 the accumulator overflows to inf
once |x| reaches a few hundred, rsqrt(inf) is 0, and every output and gradient of that row is a
finite 0 where the truth is of order 1. Ordinary magnitudes never reach it.

A bias-add whose bias gradient is summed over the rows one row after the other, in the gradient's
own dtype, and its twin that sums in float32 (float64 for float64), one row after the other too:
over many rows with grad_outputs that do not cancel, a half-precision accumulator is off by many
rounding steps; the float32 one, sequential as it is, stays within the budget. And a per-channel
bias over time (a conv's) whose gradient is a running sum along the time dim in half precision,
and its float32 twin: the same defect along a named dim, not the rows.

A logsumexp over the last dim that accumulates in float32 and returns that float32 result for
float16 inputs (the downcast forgotten), and its twin that returns the input's dtype: the values
are right, the dtype is not the reference's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from conformance import Scalar, Tensor, register

DTYPES = (torch.float64, torch.float32, torch.float16)
BLOCK = 16


def _mean_of_squares(x: torch.Tensor, accumulator: torch.dtype) -> torch.Tensor:
    total = torch.zeros((*x.shape[:-1], 1), dtype=accumulator, device=x.device)
    for start in range(0, x.shape[-1], BLOCK):  # block by block, as a kernel's loop
        block = x[..., start:start + BLOCK].to(accumulator)
        total = total + (block * block).sum(-1, keepdim=True)
    return total / x.shape[-1]


def _rms_norm(accumulator_of: Any) -> type[torch.autograd.Function]:
    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            accumulator = accumulator_of(x.dtype)
            rstd = torch.rsqrt(_mean_of_squares(x, accumulator) + eps)
            ctx.save_for_backward(x, weight, rstd)
            return (x.to(accumulator) * rstd * weight.to(accumulator)).to(x.dtype)

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
            x, weight, rstd = ctx.saved_tensors
            wide = rstd.dtype
            normed = x.to(wide) * rstd
            scaled = grad_output.to(wide) * weight.to(wide)
            grad_x = grad_weight = None
            if ctx.needs_input_grad[0]:
                grad_x = (rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))).to(x.dtype)
            if ctx.needs_input_grad[1]:
                grad_weight = (grad_output.to(wide) * normed).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
            return grad_x, grad_weight, None

    return RMSNorm


RMSNormHalfAccumulator = _rms_norm(lambda dtype: dtype)
RMSNormFloat32Accumulator = _rms_norm(lambda dtype: torch.promote_types(dtype, torch.float32))


def _reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


INPUTS = [Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)]
register(RMSNormHalfAccumulator, name="rms_norm_half_accumulator", inputs=INPUTS, reference=_reference, dtypes=DTYPES,
         double_backward=False)
register(RMSNormFloat32Accumulator, name="rms_norm_float32_accumulator", inputs=INPUTS, reference=_reference,
         dtypes=DTYPES, double_backward=False)


def _logsumexp(downcast: bool) -> type[torch.autograd.Function]:
    class LogSumExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            wide = x.to(torch.promote_types(x.dtype, torch.float32))
            peak = wide.amax(-1, keepdim=True)
            lse = (peak + (wide - peak).exp().sum(-1, keepdim=True).log()).squeeze(-1)
            ctx.save_for_backward(x, lse)
            return lse.to(x.dtype) if downcast else lse

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
            x, lse = ctx.saved_tensors
            weights = (x.to(lse.dtype) - lse.unsqueeze(-1)).exp()
            return (grad_output.to(lse.dtype).unsqueeze(-1) * weights).to(x.dtype)

    return LogSumExp


for _downcast, _name in ((False, "logsumexp_float32_result"), (True, "logsumexp_input_dtype_result")):
    register(_logsumexp(_downcast), name=_name, inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.logsumexp(x, -1),
             dtypes=DTYPES, double_backward=False)


def _bias_add(accumulator_of: Any) -> type[torch.autograd.Function]:
    class BiasAdd(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return x + bias

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rows = grad_output.reshape(-1, grad_output.shape[-1])
            total = torch.zeros(rows.shape[-1], dtype=accumulator_of(grad_output.dtype), device=rows.device)
            for row in rows:  # a row at a time, as a kernel's loop over row blocks
                total += row.to(total.dtype)
            return grad_output, total.to(grad_output.dtype)

    return BiasAdd


for _accumulator_of, _name in ((lambda dtype: dtype, "bias_add_half_accumulator"),
                               (lambda dtype: torch.promote_types(dtype, torch.float32), "bias_add_float32_accumulator")):
    register(_bias_add(_accumulator_of), name=_name, inputs=[Tensor("x", "*batch d"), Tensor("bias", "d")],
             reference=lambda x, bias: x + bias, dtypes=(*DTYPES, torch.bfloat16), double_backward=False)


def _channel_bias(accumulator_of: Any) -> type[torch.autograd.Function]:
    class ChannelBias(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return x + bias[:, None]

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rows = grad_output.reshape(-1, *grad_output.shape[-2:])
            total = torch.zeros(rows.shape[-2], dtype=accumulator_of(grad_output.dtype), device=rows.device)
            for step in range(rows.shape[-1]):  # a time step at a time, as a scan over the sequence
                total += rows[..., step].sum(0).to(total.dtype)
            return grad_output, total.to(grad_output.dtype)

    return ChannelBias


for _accumulator_of, _name in ((lambda dtype: dtype, "channel_bias_half_accumulator"),
                               (lambda dtype: torch.promote_types(dtype, torch.float32), "channel_bias_float32_accumulator")):
    register(_channel_bias(_accumulator_of), name=_name, inputs=[Tensor("x", "*batch c l"), Tensor("bias", "c")],
             reference=lambda x, bias: x + bias[:, None], dtypes=(*DTYPES, torch.bfloat16), double_backward=False)
