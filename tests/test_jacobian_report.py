"""The located Jacobian mismatch that gradcheck's and gradgradcheck's reports give instead of
both Jacobians in full (conformance.engine.finite_differences.jacobian_mismatch), on small
Functions with one known derivative bug each."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from conformance.engine.finite_differences import LOCATED_JACOBIAN_CALLS, jacobian_mismatch


def _square(backward: Any) -> Any:
    """x**2 with ``backward(x, g)`` as its backward."""

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return backward(x, g)

    return lambda x: (Square.apply(x),)


def _dropped_tail(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    grad = 2 * x * g
    grad[..., -1] = 0
    return grad


def _x() -> torch.Tensor:
    return torch.linspace(-1.5, 2.0, 6, dtype=torch.float64).reshape(2, 3)


def test_a_correct_backward_has_no_mismatch() -> None:
    assert jacobian_mismatch(_square(lambda x, g: 2 * x * g), (_x(),), atol=1e-5, rtol=1e-3) is None


# x = [[-1.5, -0.8, -0.1], [0.6, 1.3, 2.0]]: d(x*x)/dx is diagonal, 2x; its largest entry is at [1, 2].
@pytest.mark.parametrize(
    ("backward", "at_output", "at_input", "analytical", "numerical", "count", "pattern"),
    [
        (lambda x, g: x * g, (1, 2), (1, 2), 2.0, 4.0, 6, "analytical = 0.5 x numerical at every differing entry"),
        (_dropped_tail, (1, 2), (1, 2), 0.0, 4.0, 2, "the analytical derivative is 0"),
        # with a one-hot grad_output, g.sum() is 1: every row gets the whole diagonal
        (lambda x, g: 2 * x * g.sum(), (0, 0), (1, 2), 4.0, 0.0, 30, "the numerical derivative is 0"),
        (lambda x, g: 2 * x * g / 0 * 0, (0, 0), (0, 0), float("nan"), -3.0, 36, "non-finite"),
        # 2x + 0.5 where x is not 0: no constant ratio, a constant difference
        (lambda x, g: (2 * x + 0.5) * g, (0, 2), (0, 2), 0.3, -0.2, 6, "analytical - numerical = 0.5 at every differing entry: a missing or extra term"),
    ],
    ids=["half", "tail", "summed", "nan", "term"],
)
def test_the_worst_entry_its_count_and_pattern_are_named(
    backward: Any, at_output: Any, at_input: Any, analytical: float, numerical: float, count: int, pattern: str
) -> None:
    found = jacobian_mismatch(_square(backward), (_x(),), atol=1e-5, rtol=1e-3)
    assert found is not None
    assert (found.at_output, found.at_input, found.count, found.total) == (at_output, at_input, count, 36), found
    assert found.numerical == pytest.approx(numerical, abs=1e-6), found
    assert found.analytical == pytest.approx(analytical, nan_ok=True), found
    assert pattern in found.pattern, found.pattern
    text = found.entry("output[0]", "x")
    want = f"d output[0][{at_output[0]}, {at_output[1]}] / d x[{at_input[0]}, {at_input[1]}]="
    assert text.startswith(want) and f"{count} of 36 entries differ" in text, text


def test_one_differing_value_names_neither_a_factor_nor_a_term_alone() -> None:
    """Entries that all share one derivative fit a factor and a term alike (a trial's filter bank
    missing a padded copy's term was told "a missing or extra factor")."""
    x = torch.full((2, 3), 0.75, dtype=torch.float64)
    found = jacobian_mismatch(_square(lambda a, g: (2 * a + 0.5) * g), (x,), atol=1e-5, rtol=1e-3)
    assert found is not None and "each the same derivative: a missing or extra factor or term" in found.pattern, found.pattern


def test_the_pair_torch_named_is_the_one_located() -> None:
    def two(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _square(lambda a, g: 2 * a * g)(x)[0], _square(lambda a, g: a * g)(y)[0]

    found = jacobian_mismatch(two, (_x(), _x()), atol=1e-5, rtol=1e-3)
    assert found is not None and (found.output, found.input) == (1, 1), found
    assert jacobian_mismatch(two, (_x(), _x()), atol=1e-5, rtol=1e-3, pair=(0, 0)) is None


def test_a_pair_too_large_or_a_backward_that_raises_is_left_to_torchs_message() -> None:
    big = torch.ones(LOCATED_JACOBIAN_CALLS // 3 + 1, dtype=torch.float64)  # one backward and two forwards per element
    assert jacobian_mismatch(_square(lambda x, g: x * g), (big,), atol=1e-5, rtol=1e-3) is None

    def raising(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("backward runs once")

    assert jacobian_mismatch(_square(raising), (_x(),), atol=1e-5, rtol=1e-3) is None


def test_a_forward_that_is_not_finite_near_the_inputs_is_named_as_such() -> None:
    def call(x: torch.Tensor) -> tuple[torch.Tensor]:  # x = 2.0 overflows to inf
        return (torch.where(x > 1.9, x * float("inf"), x * x),)

    found = jacobian_mismatch(call, (_x(),), atol=1e-5, rtol=1e-3)
    assert found is not None and "forward returns inf or NaN" in found.pattern, found
    at_nan = dataclasses.replace(found, analytical=-math.inf, numerical=math.nan)
    text = at_nan.entry("output[0]", "x")
    assert "=-inf, and the numerical derivative is nan: output[0] is not finite near these inputs" in text, text
