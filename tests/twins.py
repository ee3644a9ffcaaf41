"""Correct twins of registered Functions, built from their spec's reference.

``reference_twin(spec)`` is a Function whose forward is the spec's reference and whose backward
is autograd through the reference, recomputed from the saved inputs (checkpoint style, so
double backward works and nothing but inputs is saved; gradients are written into
``torch.empty_like`` buffers like a kernel's). It is what a buggy Function should
have been, so a repro script replayed against it must pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.spec import Spec


def reference_twin(spec: Spec) -> type[torch.autograd.Function]:
    reference = spec.reference

    class ReferenceTwin(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            ctx.save_for_backward(*(args[i] for i in positions))
            ctx.positions = positions
            ctx.others = [None if isinstance(a, torch.Tensor) else a for a in args]
            out = reference(*args)
            outs = out if isinstance(out, tuple) else (out,)
            ctx.mark_non_differentiable(*(o for o in outs if isinstance(o, torch.Tensor) and not o.is_floating_point()))
            return out

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            create_graph = torch.is_grad_enabled()  # True under double backward (create_graph=True)
            args = list(ctx.others)
            saved = ctx.saved_tensors
            wrt = []
            for position, tensor in zip(ctx.positions, saved):
                needed = ctx.needs_input_grad[position]
                leaf = tensor if create_graph and needed else tensor.detach().requires_grad_(needed)
                args[position] = leaf
                if needed:
                    wrt.append((position, leaf))
            with torch.enable_grad():
                out = reference(*args)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
            result: list[Any] = [None] * len(args)
            if pairs and wrt:
                got = torch.autograd.grad(
                    [o for o, _ in pairs], [leaf for _, leaf in wrt], [g for _, g in pairs],
                    allow_unused=True, create_graph=create_graph,
                )
                for (position, leaf), grad in zip(wrt, got):
                    # Stored into a fresh torch.empty_like buffer, as a kernel would: every element
                    # written, so the twin is checked (not n/a) by unwritten_memory too.
                    result[position] = torch.zeros_like(leaf) if grad is None else torch.empty_like(grad).copy_(grad)
            return tuple(result)

    if not spec.double_backward:
        # As the spec declares: double backward must raise.
        ReferenceTwin.backward = staticmethod(torch.autograd.function.once_differentiable(ReferenceTwin.backward))  # type: ignore[method-assign]
    ReferenceTwin.__qualname__ = ReferenceTwin.__name__ = f"ReferenceTwinOf{spec.fn.__name__}"
    return ReferenceTwin


def with_twin(spec: Spec) -> Spec:
    twin = reference_twin(spec)
    # The adapter too: contracts that call the target as users do (compile, forward_ad, func) go
    # through spec.op, which must be the twin's.
    return dataclasses.replace(spec, fn=twin)  # the spec's op adapter follows fn
