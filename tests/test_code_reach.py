"""Which targets launch Triton kernels, Function by Function (conformance.engine.code_reach): a
plain Function defined next to a Triton kernel is compiled and tested in bfloat16 like any other
(found by a trial: every Function of a module that imported triton lost both)."""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any

import pytest
import torch

from conformance.engine.code_reach import reaches
from conformance.engine.triton_interpreter import uses_triton
from conformance.spec.targets import FunctionAdapter

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _launch(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _double_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def _through_a_helper(x: torch.Tensor) -> torch.Tensor:
    return _launch(x)


class TritonDouble(torch.autograd.Function):
    """Launches the kernel through two helpers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _through_a_helper(x.contiguous())

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return _launch(grad_output.contiguous())


class PlainDouble(torch.autograd.Function):
    """Plain torch, in the same module as the kernel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return sum(g * 2 for g in (grad_output,))  # type: ignore[return-value]  # a nested code object


class _Launcher:
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return _launch(x)


LAUNCHER = _Launcher()
KERNELS = {"double": _launch}


class ThroughAnObjectAndATable(torch.autograd.Function):
    """Reaches the kernel through a method of a module-level object and a dict of launchers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return LAUNCHER.run(x)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return KERNELS["double"](grad_output)


class ByName(torch.autograd.Function):
    """Looks its launcher up by name: too dynamic to follow, so the module decides (it has a kernel)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return getattr(importlib.import_module(__name__), "_launch")(x)  # noqa: B009

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return 2 * grad_output


@pytest.mark.parametrize(
    ("function", "launches"),
    [(TritonDouble, True), (PlainDouble, False), (ThroughAnObjectAndATable, True), (ByName, True)],
)
def test_a_function_uses_triton_only_when_its_code_reaches_a_kernel(function: type, launches: bool) -> None:
    assert uses_triton(FunctionAdapter(function)) is launches


def test_the_walk_says_when_it_cannot_tell() -> None:
    def found(value: object) -> bool:
        return value is _double_kernel

    assert reaches([TritonDouble.forward], found) is True
    assert reaches([PlainDouble.forward, PlainDouble.backward], found) is False
    assert reaches([ByName.forward], found) is None  # getattr: the caller falls back to the module
    assert reaches([functools.partial(_launch)], found) is True  # a partial: its function and arguments

    class Callable:
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return _launch(x)

    assert reaches([Callable()], found) is None  # an object with __call__: unread, the module decides


class _Holder:
    kernel = _double_kernel

    def __init__(self) -> None:
        self.launch = _launch

    @classmethod
    def by_class(cls, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        cls.kernel[(1,)](x, y, x.numel(), BLOCK=128)
        return y

    def by_self(self, x: torch.Tensor) -> torch.Tensor:
        return self.launch(x)


def _imports_its_launcher(x: torch.Tensor) -> torch.Tensor:
    from reference_ops.triton.elementwise import triton_gated  # bound at run time, in no namespace the walk reads

    return triton_gated(x, x)


HOLDER = _Holder()
NAMESPACE = types.SimpleNamespace(fwd=_double_kernel)
PARTIAL = functools.partial(_launch)
NESTED = [(_double_kernel, 128)]


@pytest.mark.parametrize(
    "code",
    [
        lambda x: _Holder.by_class(x),  # cls.kernel: looked up at run time
        lambda x: HOLDER.by_self(x),  # self.launch set in __init__
        lambda x: NAMESPACE.fwd[(1,)](x),  # a generic holder
        lambda x: PARTIAL(x),  # a module-level partial of a launcher
        lambda x: NESTED[0][0][(1,)](x),  # a table of (kernel, block) pairs
        lambda x: torch.ops.aten.mul(x, 2),  # a registered op: any kernel may run behind it
        _imports_its_launcher,  # a module imported inside the function: no namespace to read
    ],
)
def test_code_that_may_reach_a_kernel_is_never_called_plain(code: Any) -> None:
    """False would test a kernel-launching Function in bfloat16 under the interpreter and compile
    it: the walk answers True, or None (the module decides), never False, where it cannot read on."""
    assert reaches([code], lambda value: value is _double_kernel) is not False
