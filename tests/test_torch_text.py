"""conformance.engine.torch_text reads torch's own messages: each reading, against the message the
installed torch really produces. Pinned to torch 2.13 (the messages are prose, not an API):
another torch is skipped with the reason, and whoever moves the pin re-checks these first."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from torch.autograd.function import once_differentiable
from torch.autograd.gradcheck import GradcheckError

from conformance.engine.torch_text import (
    JIT_SCRIPT_DEPRECATION,
    PINNED_TORCH,
    dynamo_refuses_jvp,
    dynamo_unbacked_symbol,
    gradcheck_input,
    gradcheck_not_reentrant,
    is_once_differentiable_node,
    jacobian_pair,
    modified_no_grad_view,
    modified_saved_tensor,
    raised_by_once_differentiable,
    without_guard_latency_profile,
    without_slow_mode_jacobians,
)

pytestmark = pytest.mark.skipif(
    torch.__version__.split("+")[0].rsplit(".", 1)[0] != PINNED_TORCH,
    reason=f"torch_text is pinned to the messages of torch {PINNED_TORCH}; this is torch {torch.__version__} "
    "(check each message below against it, then move PINNED_TORCH)",
)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(3, generator=generator, dtype=torch.float64) + 0.5).requires_grad_()
    y = (torch.rand(3, generator=generator, dtype=torch.float64) + 0.5).requires_grad_()
    return x, y


def _gradcheck_message(check: Any, fn: Any, inputs: tuple[torch.Tensor, ...]) -> str:
    with pytest.raises(GradcheckError) as raised:
        check(fn, inputs)
    return str(raised.value)


class WrongSecondInput(torch.autograd.Function):
    """x * y whose gradient for y (input 1) is 1.5 times too large."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return grad * y, grad * x * 1.5


class RandomBackward(torch.autograd.Function):
    """2x whose backward adds noise: right on average, different on every call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2 + torch.rand_like(grad) * 1e-3


class DetachedSecondDerivative(torch.autograd.Function):
    """x * x * y whose backward detaches one factor of grad[y]: d(grad[y])/dx is half what it is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x * y * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return 2 * grad * x * y, grad * x * x.detach()


class OnceSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * grad * x


class DoubleWithJvp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor) -> torch.Tensor:
        return tangent * 2


def test_gradcheck_names_the_wrong_input() -> None:
    message = _gradcheck_message(torch.autograd.gradcheck, WrongSecondInput.apply, _inputs())
    assert gradcheck_input(message) == 1, message[:300]
    assert not gradcheck_not_reentrant(message)


def test_fast_mode_without_slow_mode_jacobians_keeps_the_verdict_and_the_named_input() -> None:
    """The search's brief fast-mode check: the same GradcheckError naming the same input, without
    the slow-mode recomputation torch appends (one backward per element); torch's step is back after."""
    fast = lambda fn, inputs: torch.autograd.gradcheck(fn, inputs, fast_mode=True)  # noqa: E731
    full = _gradcheck_message(fast, WrongSecondInput.apply, _inputs())
    assert "recompute numerical and analytical jacobians in slow mode" in full, full[-300:]
    calls: list[int] = []
    slow_step = torch.autograd.gradcheck.__globals__["_get_analytical_jacobian"]  # slow mode's analytical Jacobian
    torch.autograd.gradcheck.__globals__["_get_analytical_jacobian"] = lambda *a, **k: (calls.append(1), slow_step(*a, **k))[1]
    try:
        with without_slow_mode_jacobians():
            brief = _gradcheck_message(fast, WrongSecondInput.apply, _inputs())
        assert calls == [], "slow-mode Jacobians were computed under without_slow_mode_jacobians()"
        assert gradcheck_input(brief) == gradcheck_input(full) == 1, brief
        assert "recompute numerical and analytical jacobians in slow mode" not in brief, brief
        assert "not recomputed" in brief, brief
        _gradcheck_message(fast, WrongSecondInput.apply, _inputs())
        assert calls, "torch's slow-mode step was not restored after the block"
    finally:
        torch.autograd.gradcheck.__globals__["_get_analytical_jacobian"] = slow_step


def test_compile_without_guard_latency_profile_still_guards() -> None:
    """Dynamo measures each new frame's guard latency (a cache flush and a timed check) by this
    name; inside the block it does not, and the compiled function is still guarded: a new dtype
    recompiles. torch's step is back after."""
    import torch._dynamo.guards as guards

    measured: list[int] = []
    step = guards.profile_guard_manager
    guards.profile_guard_manager = lambda *args, **kwargs: (measured.append(1), step(*args, **kwargs))[1]

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    try:
        torch._dynamo.reset()
        with without_guard_latency_profile():
            compiled = torch.compile(double, backend="eager")
            assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
            assert torch.equal(compiled(torch.ones(3, dtype=torch.float64)), torch.full((3,), 2.0, dtype=torch.float64))
            variants = len(torch._dynamo.eval_frame._debug_get_cache_entry_list(double.__code__))
        assert measured == [], "Dynamo measured guard latency under without_guard_latency_profile()"
        assert variants == 2, f"variants={variants}, but should be 2 [float32 then float64 through one compiled function]"
        torch._dynamo.reset()
        torch.compile(double, backend="eager")(torch.ones(3))
        assert measured, "Dynamo's guard-latency step was not restored after the block (or torch renamed it)"
    finally:
        guards.profile_guard_manager = step
        torch._dynamo.reset()


def test_gradcheck_reports_a_backward_that_is_not_reentrant() -> None:
    message = _gradcheck_message(torch.autograd.gradcheck, RandomBackward.apply, (_inputs()[0],))
    assert gradcheck_not_reentrant(message), message[:300]


def test_gradgradcheck_names_the_gradient_and_the_input() -> None:
    message = _gradcheck_message(torch.autograd.gradgradcheck, DetachedSecondDerivative.apply, _inputs())
    # grad[y] (output 1 of the first derivative) is wrong with respect to x (input 0).
    assert jacobian_pair(message) == (1, 0), message[:300]
    assert jacobian_pair("no such phrase") is None


def test_double_backward_through_once_differentiable() -> None:
    x = _inputs()[0]
    out = OnceSquare.apply(x)
    grad_output = torch.ones_like(out).requires_grad_()
    (grad,) = torch.autograd.grad(out, x, grad_output, create_graph=True)
    assert is_once_differentiable_node(grad.grad_fn), grad.grad_fn
    plain = torch.autograd.grad(x * x, x, grad_output, create_graph=True)[0]
    assert not is_once_differentiable_node(plain.grad_fn), plain.grad_fn
    with pytest.raises(RuntimeError) as raised:
        torch.autograd.backward([grad], [torch.ones_like(grad)])
    assert raised_by_once_differentiable(raised.value), str(raised.value)
    assert not raised_by_once_differentiable(RuntimeError("element 0 of tensors does not require grad"))


def test_a_saved_tensor_written_in_place_is_recognised_on_the_second_backward() -> None:
    x = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)
    y = x.exp()  # exp saves its output
    y.sum().backward(retain_graph=True)
    with torch.no_grad():
        y.mul_(2)
    with pytest.raises(RuntimeError) as raised:
        y.sum().backward()
    assert modified_saved_tensor(raised.value), str(raised.value)
    assert not modified_saved_tensor(RuntimeError("element 0 of tensors does not require grad"))


def test_an_in_place_write_into_a_no_grad_view_is_recognised() -> None:
    base = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        view = base[0]
    with pytest.raises(RuntimeError) as into_the_view:
        view.mul_(2)
    other = base.clone()
    with torch.no_grad():
        base_view = other[0]
    with pytest.raises(RuntimeError) as through_the_base:
        other.mul_(2)
        base_view.sum().backward()
    for raised in (into_the_view, through_the_base):
        assert modified_no_grad_view(raised.value), str(raised.value)
    assert not modified_no_grad_view(RuntimeError("element 0 of tensors does not require grad"))


def test_dynamo_refuses_a_function_with_jvp() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: DoubleWithJvp.apply(t), backend="eager", fullgraph=True)
    with pytest.raises(Exception) as raised:
        compiled(torch.rand(3, requires_grad=True))
    torch._dynamo.reset()
    assert dynamo_refuses_jvp(" ".join(str(raised.value).split())), str(raised.value)[:300]


def test_the_jit_script_deprecation_warning_is_matched() -> None:
    def plus_one(t: torch.Tensor) -> torch.Tensor:
        return t + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.script(plus_one)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert deprecations, [str(w.message) for w in caught]
    # warnings.filterwarnings matches its message pattern with re.match, case-insensitively.
    assert any(re.match(JIT_SCRIPT_DEPRECATION, str(w.message), re.IGNORECASE) for w in deprecations), [
        str(w.message) for w in deprecations
    ]
    assert not re.match(JIT_SCRIPT_DEPRECATION, "torch.jit.trace is fine", re.IGNORECASE)


class _MeanOverACountReadInForward(torch.autograd.Function):
    """A masked mean that keeps its count as a Python int (int(tensor) in forward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        count = valid.sum().clamp(min=1)
        ctx.count = int(count)
        return (x * valid).sum() / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.count * torch.ones(1, dtype=grad.dtype), None


def test_dynamo_failing_on_a_number_read_from_a_tensor_is_recognised() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, v: _MeanOverACountReadInForward.apply(x, v), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as raised:
        compiled(torch.rand(5, dtype=torch.float64, requires_grad=True), torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    torch._dynamo.reset()
    assert dynamo_unbacked_symbol(str(raised.value)), str(raised.value)[:300]
    assert not dynamo_unbacked_symbol("Dynamo does not know how to trace the builtin `print`")
