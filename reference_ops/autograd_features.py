"""Autograd features: the Function API beyond forward/backward, and memory patterns.

Seed patterns shown:

* ``Softplus`` -- seed 003 ``once_differentiable`` example: ``@once_differentiable`` backward,
  declared ``double_backward=False`` (double backward must raise, not be silently wrong).
* ``Lerp`` -- the new-style ``forward`` without ctx plus ``setup_context`` (torch >= 2.0).
* ``SinCos`` -- two outputs with ``ctx.set_materialize_grads(False)``: backward receives None
  for an output that got no gradient and must cope.
* ``Sort`` -- an index output marked with ``ctx.mark_non_differentiable`` (seed 002
  ``CompleteCtxExample`` lists the ctx methods); the gradient is scattered back by the indices.
* ``InplaceReLU`` -- seed 002 ``InplaceForward``, done right: ``ctx.mark_dirty`` on an input that requires grad (``relu_``, declared
  ``mutates=("x",)``); the suite passes declared-mutated inputs as clones of the leaves, the way
  an in-place op is used inside a model (autograd refuses ``mark_dirty`` on a leaf that requires
  grad).
* ``MulInto`` -- ``ctx.mark_dirty`` on an ``out=`` buffer: writes ``a * b`` into a preallocated
  tensor and returns it (declared ``mutates=("out",)``); the buffer's old values do not reach
  the result, so it gets no gradient.
* ``CheckpointedMLP`` -- seed 002 ``CheckpointedFunction``: saves the inputs only, recomputes
  the forward under ``torch.enable_grad()`` in backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Tensor, register
from reference_ops._common import ALL_FLOATS, upcast

__all__ = ["CheckpointedMLP", "InplaceReLU", "Lerp", "MulInto", "SinCos", "Softplus", "Sort"]


class Softplus(torch.autograd.Function):
    """y = log(1 + exp(x)), stably; once differentiable: d/dx = sigmoid(x)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        xf = upcast(x)
        return (torch.clamp(xf, min=0) + torch.log1p(torch.exp(-xf.abs()))).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return (upcast(grad_output) * torch.sigmoid(upcast(x))).to(x.dtype)


register(
    Softplus,
    name="softplus",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.logaddexp(x, torch.zeros_like(x)),
    dtypes=ALL_FLOATS,
    double_backward=False,
)


class Lerp(torch.autograd.Function):
    """y = start + weight * (end - start), new style: forward has no ctx, setup_context saves."""

    @staticmethod
    def forward(start: torch.Tensor, end: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return start + weight * (end - start)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        start, end, weight = inputs
        ctx.save_for_backward(start, end, weight)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        start, end, weight = ctx.saved_tensors
        grad_start = grad_end = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_start = grad_output * (1 - weight)
        if ctx.needs_input_grad[1]:
            grad_end = grad_output * weight
        if ctx.needs_input_grad[2]:
            grad_weight = grad_output * (end - start)
        return grad_start, grad_end, grad_weight


register(
    Lerp,
    name="lerp",
    inputs=[Tensor("start", "*batch n"), Tensor("end", "*batch n"), Tensor("weight", "*batch n", domain="unit")],
    reference=lambda start, end, weight: start + weight * (end - start),
    dtypes=ALL_FLOATS,
)


class SinCos(torch.autograd.Function):
    """(sin x, cos x); with materialize_grads off, an unused output's gradient arrives as None."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return torch.sin(x), torch.cos(x)

    @staticmethod
    def backward(ctx: Any, grad_sin: torch.Tensor | None, grad_cos: torch.Tensor | None) -> torch.Tensor | None:
        (x,) = ctx.saved_tensors
        grad_x = None
        if grad_sin is not None:
            grad_x = grad_sin * torch.cos(x)
        if grad_cos is not None:
            term = -grad_cos * torch.sin(x)
            grad_x = term if grad_x is None else grad_x + term
        return grad_x  # None when neither output got a gradient


register(
    SinCos,
    name="sincos",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: (torch.sin(x), torch.cos(x)),
    dtypes=ALL_FLOATS,
)


class Sort(torch.autograd.Function):
    """(values, indices) = stable sort along the last dim; indices are non-differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable=True: ties (constant rows, low precision) keep their order, as in the reference.
        values, indices = torch.sort(x, dim=-1, stable=True)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: torch.Tensor, grad_indices: torch.Tensor | None) -> torch.Tensor:
        (indices,) = ctx.saved_tensors
        # Out-of-place scatter: each value's gradient goes back to the position it came from.
        return torch.zeros_like(grad_values).scatter(-1, indices, grad_values)


register(
    Sort,
    name="sort",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: tuple(torch.sort(x, dim=-1, stable=True)),
    dtypes=ALL_FLOATS,
)


class MulInto(torch.autograd.Function):
    """out[...] = a * b written in place into the ``out`` buffer (mark_dirty), which is returned."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        out.copy_(a * b)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[None, torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad_output * b if ctx.needs_input_grad[1] else None
        grad_b = grad_output * a if ctx.needs_input_grad[2] else None
        return None, grad_a, grad_b  # the old contents of out do not reach the output


register(
    MulInto,
    name="mul_into",
    inputs=[Tensor("out", "*batch n", requires_grad=False), Tensor("a", "*batch n"), Tensor("b", "*batch n")],
    reference=lambda out, a, b: a * b,
    dtypes=ALL_FLOATS,
    mutates=("out",),
)


class InplaceReLU(torch.autograd.Function):
    """x.clamp_(min=0) in place (mark_dirty), returning x; backward masks by the saved *output*.

    The input's old values are gone after forward, so the mask comes from the result (as
    torch's own ``relu_`` does); saving the dirty tensor after ``mark_dirty`` saves the output.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(min=0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * (y > 0).to(grad_output.dtype)


register(
    InplaceReLU,
    name="relu_",
    inputs=[Tensor("x", "*batch n", domain="nonzero")],
    reference=torch.relu,
    dtypes=ALL_FLOATS,
    mutates=("x",),
    waivers={
        "compile": "torch 2.13's aot_eager gets the gradient of a Function that saves its dirtied input wrong "
        "(measured: eager [0, 1, 0], compiled [1, 1, 1] for x = [-0.5, 0.7, -1.2]): a torch.compile bug"
    },
)


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """tanh(x @ w1.T) @ w2.T, accumulated in float32 for half inputs."""
    return (torch.tanh(upcast(x) @ upcast(w1).T) @ upcast(w2).T).to(x.dtype)


class CheckpointedMLP(torch.autograd.Function):
    """tanh(x @ w1.T) @ w2.T without saving the hidden activation: backward recomputes it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w1, w2)  # inputs only; the (…, h) hidden layer is freed
        return _mlp(x, w1, w2)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        needed = [i for i, need in enumerate(ctx.needs_input_grad) if need]
        # Grad mode is on here exactly when the caller asked for create_graph: then recompute on
        # the saved tensors themselves so the result is differentiable again (double backward);
        # otherwise on detached copies, which keeps the recomputed graph local to this call.
        create_graph = torch.is_grad_enabled()
        if create_graph:
            inputs = list(saved)
        else:
            inputs = [t.detach().requires_grad_(i in needed) for i, t in enumerate(saved)]
        with torch.enable_grad():
            out = _mlp(*inputs)
            grads = torch.autograd.grad(out, [inputs[i] for i in needed], grad_output, create_graph=create_graph)
        result: list[torch.Tensor | None] = [None, None, None]
        for i, grad in zip(needed, grads):
            result[i] = grad
        return tuple(result)


register(
    CheckpointedMLP,
    name="checkpointed_mlp",
    inputs=[Tensor("x", "*batch d"), Tensor("w1", "h d"), Tensor("w2", "o h")],
    reference=lambda x, w1, w2: torch.tanh(x @ w1.T) @ w2.T,
    dtypes=ALL_FLOATS,
    waivers={"compile": "backward recomputes with torch.autograd.grad, which Dynamo does not trace in a Function's backward"},
)
