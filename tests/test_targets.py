"""Unit tests of the target adapters (conformance/spec/targets.py), without a pytest run of the suite:
what a Function or a custom op declares, how it is called, named and imported in a repro."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from conformance.spec.targets import CustomOpAdapter, FunctionAdapter, adapt, positional_arity


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class ScaleWithJvp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 3

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> torch.Tensor:
        return tangent * 3


@torch.library.custom_op("conformance_unit::scale_", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 2)


@torch.library.custom_op("conformance_unit::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _double_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad * 2


double.register_autograd(_double_backward)


def test_a_function_is_called_with_apply_and_named_by_its_qualname() -> None:
    adapter = adapt(Scale)
    assert isinstance(adapter, FunctionAdapter)
    assert adapter.display_name == "Scale" and adapter.kind == "autograd.Function"
    assert adapter.call(torch.ones(2)).tolist() == [2.0, 2.0]
    assert adapter.arity() == (1, 2)  # ctx skipped; factor has a default
    assert adapter.mutated_arguments() is None
    assert set(adapter.user_code()) == {"forward", "backward"}


def test_declared_transforms_are_read_from_the_class() -> None:
    plain, declared = adapt(Scale), adapt(ScaleWithJvp)
    assert [plain.declares(f) for f in ("jvp", "vmap", "setup_context")] == [False, False, False]
    assert [declared.declares(f) for f in ("jvp", "vmap", "setup_context")] == [True, True, True]
    assert declared.arity() == (1, 1)  # forward without ctx when setup_context is separate
    with pytest.raises(ValueError, match=r"unknown feature 'hessian'; choose from 'jvp', 'vmap', 'setup_context'"):
        plain.declares("hessian")


def test_a_custom_op_is_called_through_the_dispatcher_and_probed_through_its_registered_backward() -> None:
    adapter = adapt(double)
    assert isinstance(adapter, CustomOpAdapter)
    assert adapter.display_name == "conformance_unit::double" and adapter.kind == "custom op"
    assert adapter.call(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert adapter.arity() == (1, 1.0) and adapter.mutated_arguments() == ()
    x = torch.ones(3, requires_grad=True)
    (grad,) = torch.autograd.grad(adapter.function.apply(x).sum(), x)
    assert grad.tolist() == [2.0, 2.0, 2.0]  # the registered backward, reached through the probe Function
    assert adapt(torch.ops.conformance_unit.double).op is adapter.op  # the packet finds the same op


def test_a_custom_op_without_autograd_or_an_arbitrary_object_is_refused_with_what_is_accepted() -> None:
    # torch refuses register_autograd on an op that mutates its arguments: the way that works is named.
    with pytest.raises(TypeError, match=r"custom op conformance_unit::scale_ has no autograd formula, and torch gives none to an "
                       r"op that mutates its arguments \(out\): register a torch.autograd.Function whose forward calls it"):
        adapt(scale_into)
    with pytest.raises(RuntimeError):
        scale_into.register_autograd(lambda ctx, grad: (grad, None))  # what the message no longer suggests
    with pytest.raises(TypeError, match=r"^42 is neither a torch.autograd.Function subclass nor a torch.library.custom_op"):
        adapt(42)
    with pytest.raises(TypeError, match=r"is not a torch.library.custom_op"):
        adapt(torch.ops.aten.add)


def test_repro_imports_name_the_module_or_the_file_loaded_by_path() -> None:
    lines, callee = adapt(Scale).repro_import("")
    assert lines == [f"from {__name__} import Scale"] and callee == "Scale.apply"
    lines, callee = adapt(double).repro_import("")
    assert lines == [f"from {__name__} import double"] and callee == "double"


def test_positional_arity_counts_required_and_maximum() -> None:
    def f(ctx: Any, a: int, b: int = 1, *rest: int, key: int = 0) -> None: ...

    assert positional_arity(f, skip=1) == (1, math.inf)
    assert positional_arity(len, skip=0) is not None  # builtins with a signature
    assert positional_arity(type("NoSignature", (), {"__signature__": "broken"}), skip=0) is None
