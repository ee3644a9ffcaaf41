"""A Function whose dims are related (``f`` even and ``f <= n``), written the way third-party code
is: forward asserts what it needs and fails on anything else. Every case the suite draws must
meet the declared relations (issue 28: ``n`` was drawn 1 while ``f`` could not be below 2, so
forward raised and every contract failed); the correct Function passes every contract, and its
twin with one wrong index in backward is caught by the contracts that own wrong gradients.

``complex_gate``: the first ``f`` features of ``x`` are ``f // 2`` complex numbers (re, im pairs),
each multiplied by its complex weight in ``w``; the other ``n - f`` features pass through.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Dim, Tensor, register


def complex_gate_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    f = w.shape[-1]
    pairs = x[..., :f].unflatten(-1, (f // 2, 2))
    weights = w.unflatten(-1, (f // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    wr, wi = weights[..., 0], weights[..., 1]
    gated = torch.stack((a * wr - b * wi, a * wi + b * wr), dim=-1).flatten(-2)
    return torch.cat((gated, x[..., f:]), dim=-1)


class ComplexGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n, f = x.shape[-1], w.shape[0]
        assert f % 2 == 0 and f <= n, f"complex_gate needs an even f <= n, got f={f}, n={n}"
        groups = f // 2
        pairs = x[..., :f].reshape(*x.shape[:-1], groups, 2)
        wr, wi = w[0::2], w[1::2]
        a, b = pairs[..., 0], pairs[..., 1]
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        out[..., 0:f:2] = a * wr - b * wi
        out[..., 1:f:2] = a * wi + b * wr
        out[..., f:] = x[..., f:]
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        return _gate_grads(ctx, grad_out, x, w, w[0::2], w[1::2])


def _gate_grads(
    ctx: Any, grad_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, wr: torch.Tensor, wi: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of complex_gate, given each group's weight (re ``wr``, im ``wi``) for grad x."""
    f = w.shape[0]
    groups = f // 2
    g = grad_out[..., :f].reshape(*grad_out.shape[:-1], groups, 2)
    pairs = x[..., :f].reshape(*x.shape[:-1], groups, 2)
    gr, gi = g[..., 0], g[..., 1]
    a, b = pairs[..., 0], pairs[..., 1]
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
        grad_x[..., 0:f:2] = gr * wr + gi * wi
        grad_x[..., 1:f:2] = gi * wr - gr * wi
        grad_x[..., f:] = grad_out[..., f:]
    if ctx.needs_input_grad[1]:
        grad_w = torch.empty_like(w)
        grad_w[0::2] = (gr * a + gi * b).reshape(-1, groups).sum(0)
        grad_w[1::2] = (gi * a - gr * b).reshape(-1, groups).sum(0)
    return grad_x, grad_w


class ComplexGateTailIndexBug(ComplexGate):
    """backward reads the last group's weight with re and im swapped (one wrong index)."""

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        f = w.shape[0]
        wr = torch.cat((w[0 : f - 2 : 2], w[f - 1 : f]))  # BUG: the last group's re is w[f - 2]
        wi = torch.cat((w[1 : f - 2 : 2], w[f - 2 : f - 1]))  # BUG: ... and its im w[f - 1]
        return _gate_grads(ctx, grad_out, x, w, wr, wi)


register(
    ComplexGate,
    name="complex_gate",
    inputs=[Tensor("x", "*batch n"), Tensor("w", "f")],
    reference=complex_gate_reference,
    dims=[Dim("f", multiple_of=2, max_size="n")],
    dtypes=(torch.float64, torch.float32),
)
register(
    ComplexGateTailIndexBug,
    name="complex_gate_tail_index_bug",
    inputs=[Tensor("x", "*batch n"), Tensor("w", "f")],
    reference=complex_gate_reference,
    dims=[Dim("f", multiple_of=2, max_size="n")],
    dtypes=(torch.float64, torch.float32),
)
