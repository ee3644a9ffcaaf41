"""MLP activations: the SwiGLU-style fused gate-up.

Pattern shown: one input holding two operands side by side (the fused ``gate_up_proj`` output
of a LLaMA-style MLP), split inside the Function, and a gradient assembled back into the same
packed layout.

* ``FusedGateUp`` -- ``h = [gate | up]`` over the last dim (``2 * f``), ``out = silu(gate) * up``
  of shape ``(*batch, f)``. Backward is written out rather than left to autograd:
  ``d silu(x) = s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``, so
  ``d gate = g * up * silu'(gate)`` and ``d up = g * silu(gate)``, concatenated. It saves the
  input only and recomputes the sigmoid (a saved sigmoid would be a constant to double
  backward); written with differentiable ops, it is twice differentiable.

Computed on a contiguous copy in a wider dtype, rounded once (``reference_ops._common.upcast``).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["FusedGateUp"]


def _split(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up): the two halves of the last dim."""
    f = h.shape[-1] // 2
    return h[..., :f], h[..., f:]


def _gate_up_reference(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


class FusedGateUp(torch.autograd.Function):
    """out = silu(gate) * up with h = [gate | up]; hand-written backward into h's packed layout."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        gate, up = _split(upcast(h))
        return (gate * torch.sigmoid(gate) * up).to(h.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor | None:
        (h,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        gate, up = _split(upcast(h))
        g = upcast(grad_output)
        s = torch.sigmoid(gate)
        grad_gate = g * up * (s * (1 + gate * (1 - s)))
        grad_up = g * (gate * s)
        return torch.cat([grad_gate, grad_up], dim=-1).to(h.dtype)


register(
    FusedGateUp,
    name="gate_up",
    inputs=[Tensor("h", "*batch 2*f")],
    reference=_gate_up_reference,
    dtypes=ALL_FLOATS,
    saves="inputs",
)
