"""Functions a contract could pass without checking anything (a vacuous pass).

Each gets an honest verdict in every contract -- a failure, "blocked by <owner>", or a skip
that says why the contract has nothing to check -- never a pass without a checked example
(tests/test_vacuous_passes.py).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Index, Mask, Tensor, register


class BackwardAlwaysRaises(torch.autograd.Function):
    """A correct forward whose backward was never written."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("backward of double is not implemented yet")


class ForwardReturnsList(torch.autograd.Function):
    """Returns [y, z] instead of (y, z): autograd does not track tensors inside a list."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> Any:
        return [x * 2, x * 3]

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, grad_z: torch.Tensor) -> torch.Tensor:
        return grad_y * 2 + grad_z * 3


class ForwardReturnsDict(torch.autograd.Function):
    """Returns {"y": y}: autograd does not track tensors inside a dict."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> Any:
        return {"y": x * 2}

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> torch.Tensor:
        return grad_y * 2


class ForwardReturnsNone(torch.autograd.Function):
    """Writes its result somewhere else and returns None."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> None:
        x.detach().mul(2)
        return None

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> torch.Tensor:
        raise AssertionError("never called: forward returned no tensor")


class MaskedIndex(torch.autograd.Function):
    """index where mask, else 0: only Index/Mask inputs, so nothing is differentiable."""

    @staticmethod
    def forward(ctx: Any, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, index, torch.zeros_like(index))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[None, None]:
        return None, None


class ConstantProduct(torch.autograd.Function):
    """x * y with both tensors declared requires_grad=False (buffers, never trained)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return grad_output * y, grad_output * x


register(BackwardAlwaysRaises, name="backward_always_raises", inputs=[Tensor("x", "n")], reference=lambda x: x * 2)
register(ForwardReturnsList, name="forward_returns_list", inputs=[Tensor("x", "n")], reference=lambda x: (x * 2, x * 3))
register(ForwardReturnsDict, name="forward_returns_dict", inputs=[Tensor("x", "n")], reference=lambda x: x * 2)
register(ForwardReturnsNone, name="forward_returns_none", inputs=[Tensor("x", "n")], reference=lambda x: x * 2)
register(
    MaskedIndex,
    name="masked_index",
    inputs=[Index("index", "n", "n"), Mask("mask", "n")],
    reference=lambda index, mask: torch.where(mask, index, torch.zeros_like(index)),
)
register(
    ConstantProduct,
    name="constant_product",
    inputs=[Tensor("x", "n", requires_grad=False), Tensor("y", "n", requires_grad=False)],
    reference=lambda x, y: x * y,
)
