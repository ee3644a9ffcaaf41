"""gradcheck's fast mode scales atol by sum(u) * sum(v): the default atol misses a backward 5% off
on a few thousand elements; the contract's FAST_ATOL catches it without failing correct ops."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import conformance
from conformance import Tensor
from conformance.engine.finite_differences import FAST_ATOL, FAST_RTOL, FD_EPS, check_first_derivatives
from conformance.engine.finite_differences import GRADCHECK_FAST_MODE_ELEMENTS as FAST_MODE_ELEMENTS
from conformance.engine.verdict import Outcome
from reference_ops.elementwise import Square
from tests.zoo.gradcheck_bugs import FivePercentOffSquare


def _fast_gradcheck(fn: Any, x: torch.Tensor, **tolerances: float) -> bool:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return torch.autograd.gradcheck(fn.apply, (x,), fast_mode=True, raise_exception=False, **tolerances)


def test_default_fast_mode_misses_five_percent_but_contract_tolerance_catches_it() -> None:
    x = torch.randn(40, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    assert x.numel() > FAST_MODE_ELEMENTS
    assert _fast_gradcheck(FivePercentOffSquare, x)  # torch's defaults: passes a wrong backward
    assert not _fast_gradcheck(FivePercentOffSquare, x, atol=FAST_ATOL, rtol=FAST_RTOL)
    assert _fast_gradcheck(Square, x, atol=FAST_ATOL, rtol=FAST_RTOL)


def test_gradcheck_contract_catches_five_percent_in_fast_mode(zoo_run) -> None:  # type: ignore[no-untyped-def]
    run = zoo_run("gradcheck_bugs")
    text = run.failed("gradcheck", "five_percent_off")
    assert "fast mode, atol=1e-08" in text and "analytical grad['x'] != numerical" in text
    # The search skipped torch's slow-mode recomputation; the reported example has it.
    assert "The max per-element difference (slow mode) is" in text and "not recomputed" not in text, text


def test_a_backward_that_changes_its_state_is_not_reentrant(zoo_run) -> None:  # type: ignore[no-untyped-def]
    text = zoo_run("gradcheck_bugs").failed("gradcheck", "counting_scale")
    # Judged at the rounding-level tolerance: a difference of 1e-3 is no summation order.
    assert "backward is not reentrant" in text and "nondet_tol=1e-10" in text


def test_backward_calls_that_differ_by_rounding_pass_gradcheck(zoo_run) -> None:  # type: ignore[no-untyped-def]
    # Summation order that varies between calls (atomics, cuDNN) is determinism's to judge: at
    # nondet_tol=0 gradcheck's verdict would depend on the order drawn (flaky on a GPU).
    zoo_run("gradcheck_bugs").passed("gradcheck", "shuffled_row_sum")


@pytest.mark.parametrize("contract", ["gradcheck", "gradgradcheck"])
@pytest.mark.parametrize(
    ("correct", "said"),
    [
        # x.float(): a central difference at eps=1e-6 rounds to 0.9984 where the derivative is 1.
        ("float32_output", "output[0] is float32 for float64 inputs"),
        # exp computed in float32 and cast back: gradcheck blamed an exact backward for "a constant
        # factor" (1.05x, the noise of float32 rounding over eps=1e-6; found by a trial).
        ("float32_inside", "output[0] holds float32 values"),
    ],
)
def test_lower_precision_outputs_of_float64_inputs_are_left_to_the_reference_contract(  # type: ignore[no-untyped-def]
    zoo_run, contract: str, correct: str, said: str
) -> None:
    run = zoo_run("float32_output")
    for name in (correct, f"{correct}_doubled_grad"):
        verdict = run.verdict(contract, name)
        assert verdict.outcome == "skipped", f"{contract}[{name}] {verdict.outcome}:\n{verdict.text}"
        assert said in verdict.text and "the reference contract" in verdict.text, verdict.text
    run.passed("reference", correct)
    assert "grad['x']" in run.failed("reference", f"{correct}_doubled_grad")


class _NoiseRedrawnInBackward(torch.autograd.Function):
    """Declared random; backward draws its own noise (stochastic rounding done in backward), so two
    backward calls on one graph differ."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return 2 * x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return 2 * grad * (1 + 1e-6 * torch.randn_like(grad))


def test_a_declared_random_function_is_not_told_to_declare_itself_random(clean_registry) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_NoiseRedrawnInBackward, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x,
                          nondeterministic=True, contracts=["gradcheck", "inplace"], device="cpu", max_examples=3)
    text = str(raised.value)
    assert "The spec declares nondeterministic=True" in text and "Declare nondeterministic=True" not in text, text
    # One defect, one failure: a backward that differs from itself through one graph is inplace's.
    verdicts = {r.contract: r.verdict for r in raised.value.result.results}
    assert verdicts["inplace"].outcome is Outcome.FAILED, verdicts
    assert verdicts["gradcheck"].outcome is Outcome.BLOCKED and verdicts["gradcheck"].owner == "inplace", verdicts


class _TwiceAndExp(torch.autograd.Function):
    """(2x, exp x), right to every order: at x ~ 30 grad['x'] ~ 1e13, where an eps=1e-6 step of
    grad_output[0] (d grad['x'] / d grad_output[0] = 2) is lost in float64's rounding."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        y = x.exp()
        ctx.save_for_backward(y)
        return x * 2, y

    @staticmethod
    def backward(ctx: Any, grad_twice: torch.Tensor | None, grad_exp: torch.Tensor | None) -> torch.Tensor | None:
        (y,) = ctx.saved_tensors
        grad = None if grad_twice is None else grad_twice * 2
        if grad_exp is not None:
            grad = grad_exp * y if grad is None else grad + grad_exp * y
        return grad


@pytest.mark.parametrize("seed", [3, 14])
def test_second_derivatives_finite_differences_cannot_resolve_are_not_judged(clean_registry, seed: int) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: these seeds draw x ~ 30, and gradgradcheck blamed a correct backward
    # ("the numerical derivative is 0"); the reference's own gradgradcheck fails there too.
    result = conformance.check(
        _TwiceAndExp, inputs=[Tensor("x", "*batch n")], reference=lambda x: (x * 2, x.exp()),
        dtypes=(torch.float64, torch.float32), contracts=["gradgradcheck"], device="cpu", profile="ci", seed=seed,
    )
    assert [r.verdict.outcome for r in result.results] == [Outcome.PASSED], result


def _stiff_sine(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(2e5 * x)


def test_a_stiff_function_is_judged_again_at_a_smaller_step() -> None:
    # Central differences at 1e-6 are off by h^2 k^2 / 6 = 0.7% of sin(k x)'s derivative at k = 2e5
    # (a recurrence over many steps curves like this): right at 1e-7; a wrong factor fails at both.
    x = torch.tensor([0.3, 1.1], dtype=torch.float64, requires_grad=True)
    outputs = (_stiff_sine(x),)
    failing_alone = torch.autograd.gradcheck(lambda t: (_stiff_sine(t),), (x,), eps=FD_EPS, raise_exception=False)
    assert not failing_alone  # the check the contract made before
    assert check_first_derivatives(lambda t: (_stiff_sine(t),), (x,), outputs, fast=False, nondeterministic=False, brief=True).error is None

    def off_by_a_factor(t: torch.Tensor) -> tuple[torch.Tensor]:
        return (_stiff_sine(t.detach()) + 0.99 * (_stiff_sine(t) - _stiff_sine(t).detach()),)

    assert check_first_derivatives(off_by_a_factor, (x,), outputs, fast=False, nondeterministic=False, brief=True).error is not None
