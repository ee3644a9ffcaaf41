"""What a Function keeps on ctx: correct ways next to their buggy twins (the saved_tensors contract).

Written as a third party would: plain torch.autograd.Functions and ``register``. The correct ones
keep a numpy *copy*, keep non-tensor metadata (shapes, Python floats, a namedtuple) nested three
deep, or save through ``ctx.save_for_backward`` (x, ``x.detach()`` -- which shares x's version
counter -- or ``x.clone()``); every contract passes them. The buggy twins keep
a tensor three levels deep in nested tuples, or a numpy *view* of the input whose memory backward
reads, or save ``x.data`` (an alias outside x's version counter): writes to the input after forward
then change the gradient, and nothing notices.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from conformance import Tensor, register

Meta = namedtuple("Meta", ["scale", "shape"])


def _from_numpy(array: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(array).to(device=like.device, dtype=like.dtype)


# ----------------------------------------------------------------- correct


class SquareKeepsNumpyCopy(torch.autograd.Function):
    """y = x**2; keeps a numpy copy of x (its own memory) for a host-side backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.x_np = x.detach().cpu().numpy().copy()
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * _from_numpy(ctx.x_np, grad_output) * grad_output


class ScaleKeepsNestedMetadata(torch.autograd.Function):
    """y = 1.5 * x * x; saves x, and keeps shapes and floats three (and four) levels deep."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.meta = ((x.shape, (1.5, x.dim())), {"meta": [Meta(scale=1.5, shape=tuple(x.shape))]})
        return 1.5 * x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        (shape, (scale, _)), extra = ctx.meta
        assert extra["meta"][0].scale == scale and tuple(shape) == extra["meta"][0].shape
        return 2 * scale * x * grad_output


class SquareSavesForBackward(torch.autograd.Function):
    """y = x**2, x kept through ctx.save_for_backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


class SquareSavesDetached(torch.autograd.Function):
    """y = x**2 saving x.detach(): an alias that shares x's version counter, so a write to x
    after forward makes backward raise as saving x itself does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.detach())
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


class CubeSavesClone(torch.autograd.Function):
    """y = x**3 saving x.clone(): a write to x after forward leaves the saved values alone. The
    clone, made in forward (where autograd records nothing), has no history: declared
    once-differentiable (twice-differentiable, it fails gradgradcheck on its own)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.clone())
        return x * x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad_output


# ----------------------------------------------------------------- buggy twins


class SquareTensorThreeDeep(torch.autograd.Function):
    """y = x**2 keeping x as ctx.cache[0][1][0], three levels of tuples down."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.cache = ((x.shape, (x,)),)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.cache[0][1]
        return 2 * x * grad_output


class SquareKeepsNumpyView(torch.autograd.Function):
    """y = x**2 keeping x.detach().numpy() -- a view of x's memory -- for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.x_np = x.detach().numpy()
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * _from_numpy(ctx.x_np, grad_output) * grad_output


class CubeSavesInputData(torch.autograd.Function):
    """y = x**3 saving x.data: an alias outside x's version counter. A write to x between
    forward and backward silently changes the gradient (and the second derivative is lost)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.data)
        return x * x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad_output


class CubeSavesInputDataOnce(CubeSavesInputData):
    """The same save of x.data, declared once-differentiable: only the write shows it."""

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad_output


def square(x: torch.Tensor) -> torch.Tensor:
    return x * x


register(SquareKeepsNumpyCopy, name="keeps_numpy_copy", inputs=[Tensor("x", "*batch n")], reference=square,
         double_backward=False)
register(ScaleKeepsNestedMetadata, name="keeps_nested_metadata", inputs=[Tensor("x", "*batch n")],
         reference=lambda x: 1.5 * x * x)
register(SquareSavesForBackward, name="saves_for_backward", inputs=[Tensor("x", "*batch n")], reference=square)
register(SquareTensorThreeDeep, name="tensor_three_deep", inputs=[Tensor("x", "*batch n")], reference=square)
register(SquareKeepsNumpyView, name="numpy_view_of_input", inputs=[Tensor("x", "*batch n")], reference=square,
         double_backward=False, devices=("cpu",))
register(SquareSavesDetached, name="saves_detached", inputs=[Tensor("x", "*batch n")], reference=square,
         double_backward=False)
register(CubeSavesClone, name="saves_clone", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x * x,
         double_backward=False)
register(CubeSavesInputData, name="saves_input_data", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x * x)
register(CubeSavesInputDataOnce, name="saves_input_data_once", inputs=[Tensor("x", "*batch n")],
         reference=lambda x: x * x * x, double_backward=False)


class _MulKeepsInputOnClass(torch.autograd.Function):
    """y = x * w; backward reads x from a class attribute: the last forward's x, not its own."""

    last_x: torch.Tensor | None = None

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        _MulKeepsInputOnClass.last_x = x.detach()
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (w,) = ctx.saved_tensors
        x = _MulKeepsInputOnClass.last_x
        assert x is not None
        return grad_output * w, (grad_output * x).reshape(-1, w.shape[-1]).sum(0)


class _MulKeepsInputOnCtx(torch.autograd.Function):
    """The twin: x saved for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad_output * w, (grad_output * x).reshape(-1, w.shape[-1]).sum(0)


for _fn, _name in ((_MulKeepsInputOnClass, "mul_keeps_input_on_class"), (_MulKeepsInputOnCtx, "mul_keeps_input_on_ctx")):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n"), Tensor("w", "n")], reference=lambda x, w: x * w,
             double_backward=False)
