"""Functions that declare autocast support with ``torch.amp.custom_fwd`` / ``custom_bwd``.

* ``autocast_linear`` (AutocastLinear): y = x @ w.T + b. Under autocast the matmul runs in the
  autocast dtype (bfloat16 on CPU); backward runs under forward's autocast state (custom_bwd) and
  returns each gradient in its own input's dtype (``.to(x.dtype)``) -- a float32 weight gets a
  float32 dtype gradient even when the matmul ran in bfloat16 (the engine would cast a bfloat16 one back).
* ``autocast_fp32_softmax`` (Float32Softmax): ``custom_fwd(cast_inputs=torch.float32)``: the
  softmax always runs in float32 (autocast off inside), as numerically sensitive kernels do;
  gradients come back in the input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

__all__ = ["AutocastLinear", "Float32Softmax"]


class AutocastLinear(torch.autograd.Function):
    """y = x @ w.T + b, autocast-aware (custom_fwd/custom_bwd); gradients in the inputs' dtypes."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.b_dtype = b.dtype
        return x @ w.T + b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        grad_x = (grad @ w).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (grad.mT @ x).to(w.dtype) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0).to(ctx.b_dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


register(
    AutocastLinear,
    name="autocast_linear",
    inputs=[Tensor("x", "n d"), Tensor("w", "o d"), Tensor("b", "o")],
    reference=lambda x, w, b: x @ w.T + b,
    dtypes=(torch.float64, torch.float32),
)


class Float32Softmax(torch.autograd.Function):
    """softmax over the last dim, always computed in float32 under autocast (cast_inputs)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        grad = grad.to(y.dtype)
        return y * (grad - (grad * y).sum(-1, keepdim=True))


register(
    Float32Softmax,
    name="autocast_fp32_softmax",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.softmax(x, dim=-1),
    dtypes=(torch.float64, torch.float32),
)
