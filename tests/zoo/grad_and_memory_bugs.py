"""Known-buggy Functions for the behavioural contracts needs_input_grad, inplace, saved_tensors
and undefined_grads.

Each is registered under a name saying what is wrong. Most of them pass gradcheck, which is the
point: the meta-tests check that the intended contract fails, with a message that says why.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

# ----------------------------------------------------------------- needs_input_grad


class IgnoresNeedsInputGrad(torch.autograd.Function):
    """x * w elementwise; always computes both gradients, whatever requires grad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        return grad_output * w, grad_output * x


class SwappedNeedsInputGrad(torch.autograd.Function):
    """x * w elementwise; reads needs_input_grad[1] for x and [0] for w."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        grad_x = grad_output * w if ctx.needs_input_grad[1] else None
        grad_w = grad_output * x if ctx.needs_input_grad[0] else None
        return grad_x, grad_w


register(
    IgnoresNeedsInputGrad,
    name="ignores_needs_input_grad",
    inputs=[Tensor("x", "n"), Tensor("w", "n")],
    reference=lambda x, w: x * w,
)
register(
    SwappedNeedsInputGrad,
    name="swapped_needs_input_grad",
    inputs=[Tensor("x", "n"), Tensor("w", "n")],
    reference=lambda x, w: x * w,
)

# ----------------------------------------------------------------- inplace


class MutatesGradOutput(torch.autograd.Function):
    """y = 2x; backward scales grad_output in place and returns it (gradcheck passes this)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        grad_output.mul_(2)
        return grad_output


class ReluInputInPlaceNoMarkDirty(torch.autograd.Function):
    """relu that clamps its input in place and returns a copy, without ctx.mark_dirty."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(min=0)
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad_output * (y > 0)


class ModifiesSavedTensor(torch.autograd.Function):
    """y = exp(x) saving y; backward multiplies the saved y by grad_output in place."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y.mul_(grad_output)


class GradIntoInputData(torch.autograd.Function):
    """y = 3x; backward writes the gradient into x's storage through .data and returns it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 3

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        grad = x.data
        grad.copy_(grad_output * 3)
        return grad


class ScalesSavedInputView(torch.autograd.Function):
    """y = x * w; backward "saves memory" by scaling the saved (reshaped) view of x in place for
    w's gradient, which writes into the caller's x. gradcheck's next call then perturbs x
    through a view made under no_grad, and autograd refuses: inplace's defect, not gradcheck's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.reshape(-1, x.shape[-1]), w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        rows, w = ctx.saved_tensors
        grad_x = grad_output * w if ctx.needs_input_grad[0] else None
        grad_w = rows.mul_(grad_output.reshape(rows.shape)).sum(0) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class ReturnsInputView(torch.autograd.Function):
    """Identity that returns ``x.data``, an alias of its input autograd does not know about (a plain
    view such as ``x.view_as(x)`` is legal: autograd tracks it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.data

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


class AccumulatesIntoCtxBuffer(torch.autograd.Function):
    """y = 2x; backward accumulates into a buffer kept on ctx: right once, doubled on a rerun."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.buffer = torch.zeros_like(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        ctx.buffer.add_(grad_output * 2)
        return ctx.buffer.clone()


register(
    AccumulatesIntoCtxBuffer,
    name="accumulates_into_ctx_buffer",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: x * 2,
)
register(MutatesGradOutput, name="mutates_grad_output", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 2)
register(
    ReluInputInPlaceNoMarkDirty,
    name="relu_input_in_place_without_mark_dirty",
    inputs=[Tensor("x", "*batch n")],
    reference=torch.relu,
)
register(ModifiesSavedTensor, name="modifies_saved_tensor", inputs=[Tensor("x", "*batch n")], reference=torch.exp)
register(GradIntoInputData, name="grad_into_input_data", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 3)
register(ReturnsInputView, name="returns_input_view", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 1)
register(
    ScalesSavedInputView, name="scales_saved_input_view", inputs=[Tensor("x", "*batch n"), Tensor("w", "n")],
    reference=lambda x, w: x * w,
)

# ----------------------------------------------------------------- saved_tensors


class TensorOnCtx(torch.autograd.Function):
    """y = x**2 keeping x as ctx.x instead of save_for_backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * ctx.x * grad_output


_OUTPUT_CACHE: list[torch.Tensor] = []


class CachesOutputs(torch.autograd.Function):
    """y = x**2 that appends every output to a module-level list (a leak per call)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        y = x * x
        _OUTPUT_CACHE.append(y)
        del _OUTPUT_CACHE[:-64]  # bounded, so the suite itself does not grow without limit
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


register(TensorOnCtx, name="tensor_on_ctx", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x)
register(CachesOutputs, name="caches_outputs", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x)

# ----------------------------------------------------------------- undefined_grads


class NoneUnawareTwoOutputs(torch.autograd.Function):
    """(a, b) = (2x, x**2) with set_materialize_grads(False), but backward assumes both grads."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * x

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor | None, grad_b: torch.Tensor | None) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_a * 2 + grad_b * 2 * x  # type: ignore[operator]


register(
    NoneUnawareTwoOutputs,
    name="none_unaware_two_outputs",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: (x * 2, x * x),
)
