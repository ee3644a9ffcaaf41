"""conformance.engine.pool: one evaluation per equal case and options for a Function's tests --
shared where sharing cannot change a verdict, made again where it could (a declared-random
Function, another RNG regime or options, a tensor handed out earlier and written since)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from conformance.engine.pool import EvaluationPool
from conformance.engine.runner import Target
from conformance.spec import Scalar, Spec, Tensor
from strategies.cases import Case
from strategies.recipes import ScalarRecipe, TensorRecipe

CALLS: list[str] = []
WORKSPACE = torch.zeros(3, dtype=torch.float64)


class CountedScale(torch.autograd.Function):
    """y = 2x, counting its forward calls."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        CALLS.append("forward")
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class ReusedWorkspace(torch.autograd.Function):
    """y = 2x written into one module-level buffer on every call: an earlier output changes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        CALLS.append("forward")
        WORKSPACE.copy_(x.detach() * 2)
        return WORKSPACE.view_as(WORKSPACE)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class UndeclaredNoise(torch.autograd.Function):
    """y = 2x + noise from torch's generator, not declared nondeterministic (determinism's defect)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        CALLS.append("forward")
        return x * 2 + torch.rand_like(x) * 1e-6

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class ScaledBy(torch.autograd.Function):
    """y = scale * x for a Scalar ``scale``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: Any) -> torch.Tensor:
        CALLS.append("forward")
        ctx.scale = float(scale)
        return x * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def _spec(fn: type[torch.autograd.Function], *, name: str, nondeterministic: bool = False, scalar: bool = False) -> Spec:
    inputs = (Tensor("x", "3"), Scalar("scale", 2.0)) if scalar else (Tensor("x", "3"),)
    return Spec(
        fn=fn, name=name, inputs=inputs, reference=lambda x, *rest: 2 * x, dtypes=(torch.float64,),
        devices=("cpu",), double_backward=False, surrogate=None, mutates=(), nondeterministic=nondeterministic,
    )


def _case(spec: Spec, seed: int = 0, scale: Any = None) -> Case:
    recipes: tuple[Any, ...] = (TensorRecipe(name="x", shape=(3,), seed=seed),)
    if scale is not None:
        recipes += (ScalarRecipe(name="scale", value=scale),)
    return Case(
        spec=spec, device="cpu", dtype=torch.float64, sizes={}, batches={}, recipes=recipes, requires_grad=frozenset({"x"}),
    )


def _target(spec: Spec, pool: EvaluationPool | None, contract: str = "return_count") -> Target:
    return Target(spec=spec, device="cpu", contract=contract, pool=pool)


def test_an_equal_case_is_evaluated_once_for_every_test_of_the_function() -> None:
    spec, pool = _spec(CountedScale, name="counted"), EvaluationPool()
    CALLS.clear()
    first = _target(spec, pool, "return_count").execution(_case(spec))
    again = _case(spec)  # equal, not the same object
    second = _target(spec, pool, "grad_meta").execution(again)
    assert CALLS == ["forward"], f"forward calls={len(CALLS)}, but should be 1 [two tests, one equal case]"
    assert second.case is again and first.outputs[0] is second.outputs[0]
    torch.testing.assert_close(second.grads["x"], 2 * second.grad_outputs_before[0])
    assert (pool.stats.made, pool.stats.served) == (1, 1)


def test_other_values_options_or_rng_regimes_are_evaluated_again() -> None:
    spec, pool = _spec(CountedScale, name="counted"), EvaluationPool()
    target = _target(spec, pool)
    CALLS.clear()
    target.execution(_case(spec))
    target.execution(_case(spec, seed=1))  # other values
    target.execution(_case(spec), requires_grad=frozenset())  # other options
    target.execution(_case(spec), rng="fixed_rng(0)")  # another caller's seeding
    assert len(CALLS) == 4, f"forward calls={len(CALLS)}, but should be 4 [four different evaluations]"
    target.execution(_case(spec), rng="fixed_rng(0)")
    assert len(CALLS) == 4 and pool.stats.served == 1


def test_a_declared_random_function_is_never_shared_and_frees_the_previous_functions() -> None:
    earlier, spec, pool = _spec(CountedScale, name="earlier"), _spec(CountedScale, name="random_scale", nondeterministic=True), EvaluationPool()
    _target(earlier, pool).execution(_case(earlier))
    CALLS.clear()
    for _ in range(2):
        _target(spec, pool).execution(_case(spec))
    assert len(CALLS) == 2 and pool.stats.unshared == 2 and pool.stats.served == 0
    _target(earlier, pool).execution(_case(earlier))
    assert len(CALLS) == 3, "the earlier Function's evaluation outlived the run's move to another Function"


def test_an_evaluation_that_draws_random_numbers_is_not_kept() -> None:
    """Every example starts from the same generator states: serving an evaluation that drew would
    leave the next evaluation another state than a fresh call leaves it."""
    spec, pool = _spec(UndeclaredNoise, name="noise"), EvaluationPool()
    CALLS.clear()
    for _ in range(2):
        _target(spec, pool).execution(_case(spec))
    assert len(CALLS) == 2 and pool.stats.drew == 2 and pool.stats.served == 0, pool.stats


FRESH_PYTHON_STATE = random.Random(0).getstate()


class _AttrDict(dict):  # type: ignore[type-arg]
    """The config idiom whose attribute lookup raises KeyError, not AttributeError."""

    __getattr__ = dict.__getitem__


CONFIG = _AttrDict(scale=2.0)


class ScaledByConfig(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        CALLS.append("forward")
        return x * CONFIG.scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * CONFIG.scale


def test_an_object_that_answers_every_attribute_with_an_error_is_shared_as_usual() -> None:
    """The walk that asks whether a Function may draw from Python's or numpy's generator meets
    the user's objects; one whose __getattr__ raises KeyError must not break the evaluation."""
    spec, pool = _spec(ScaledByConfig, name="scaled_by_config"), EvaluationPool()
    CALLS.clear()
    for _ in range(2):
        _target(spec, pool).execution(_case(spec))
    assert len(CALLS) == 1 and pool.stats.served == 1, f"calls={len(CALLS)}, pool={pool.stats}, but should be 1 call, served=1"


def _cache_a_gaussian() -> None:
    np.random.randn()  # draws a pair: the second is kept for the next call


DRAWS: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
    # (what the example did before the evaluation, what the Function does in it)
    "python random (a bound method, as ``from random import random`` binds it)": (lambda: None, random.random),
    "python, reseeded": (lambda: None, lambda: random.seed(42)),
    "numpy, one value": (lambda: None, lambda: np.random.random()),
    "numpy, a whole key's worth (the key is refilled)": (lambda: None, lambda: np.random.random(312)),
    "numpy, reseeded": (lambda: None, lambda: np.random.seed(7)),
    "numpy, reseeded from an array": (lambda: None, lambda: np.random.seed([1, 2, 3])),
    "numpy, reseeded from an array after another": (lambda: np.random.seed([4, 5]), lambda: np.random.seed([1, 2, 3])),
    "numpy, a first Gaussian": (lambda: None, lambda: np.random.randn()),
    "numpy, a cached second Gaussian": (_cache_a_gaussian, lambda: np.random.randn()),
    "numpy, a value after a draw": (lambda: np.random.random(5), lambda: np.random.random()),
    "torch": (lambda: None, lambda: torch.rand(1)),
}


@pytest.mark.parametrize("before, draw", DRAWS.values(), ids=DRAWS.keys())
def test_a_draw_from_any_global_generator_keeps_the_evaluation_out(
    before: Callable[[], object], draw: Callable[[], object]
) -> None:
    """Every way of moving a global generator counts as a draw: a cheaper mark of where a
    generator stands (its position and first key word) would miss the reseeds and the cached
    Gaussian."""

    class DrawsOnce(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            CALLS.append("forward")
            draw()
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * 2

    spec, pool = _spec(DrawsOnce, name="draws_once"), EvaluationPool()
    for _ in range(2):
        random.setstate(FRESH_PYTHON_STATE)  # as Hypothesis starts each example
        np.random.seed(0)
        before()
        _target(spec, pool).execution(_case(spec))
    assert pool.stats.drew == 2 and pool.stats.served == 0, f"pool={pool.stats}, but should be drew=2, served=0"


def test_a_scalar_whose_repr_rounds_is_not_shared() -> None:
    """The key is the case's repro text: two numpy arrays that print alike are other cases."""
    spec, pool = _spec(ScaledBy, name="scaled", scalar=True), EvaluationPool()
    target = _target(spec, pool)
    CALLS.clear()
    first = target.execution(_case(spec, scale=np.array(0.123456789)))
    second = target.execution(_case(spec, scale=np.array(0.1234567891)))
    assert len(CALLS) == 2 and pool.stats.unshared == 2
    assert not torch.equal(first.outputs[0], second.outputs[0])
    target.execution(_case(spec, scale=0.5))
    target.execution(_case(spec, scale=0.5))
    assert len(CALLS) == 3 and pool.stats.served == 1


def test_an_evaluation_whose_tensors_changed_since_is_made_again() -> None:
    spec, pool = _spec(ReusedWorkspace, name="workspace"), EvaluationPool()
    target = _target(spec, pool)
    CALLS.clear()
    kept = target.execution(_case(spec, seed=0))
    target.execution(_case(spec, seed=1))  # overwrites the buffer kept's output is
    assert not torch.equal(kept.outputs[0], 2 * kept.args[0].detach())
    fresh = target.execution(_case(spec, seed=0))
    assert len(CALLS) == 3 and pool.stats.stale == 1, (CALLS, pool.stats)
    torch.testing.assert_close(fresh.outputs[0], 2 * fresh.args[0].detach())


def test_another_function_starts_an_empty_pool_and_no_pool_evaluates_every_time() -> None:
    first, second, pool = _spec(CountedScale, name="one"), _spec(CountedScale, name="two"), EvaluationPool()
    CALLS.clear()
    _target(first, pool).execution(_case(first))
    _target(second, pool).execution(_case(second))
    _target(first, pool).execution(_case(first))  # the run moved on: not kept
    _target(first, None).execution(_case(first))
    _target(first, None).execution(_case(first))
    assert len(CALLS) == 5 and pool.stats.served == 0


def test_a_case_differing_only_in_notes_shares_and_keeps_its_own_notes() -> None:
    spec, pool = _spec(CountedScale, name="counted"), EvaluationPool()
    CALLS.clear()
    _target(spec, pool).execution(_case(spec))
    noted = dataclasses.replace(_case(spec), notes={"family": "extreme"})
    served = _target(spec, pool, "stability").execution(noted)
    assert len(CALLS) == 1 and served.case.notes == {"family": "extreme"}


def _judge(verdicts: list[str], outcome: str) -> Callable[[], str]:
    def judge() -> str:
        verdicts.append(outcome)
        if outcome == "fail":
            raise AssertionError("the judged values are wrong")
        return outcome

    return judge


def test_a_case_drawn_again_is_judged_once_per_contract_and_key() -> None:
    spec, pool = _spec(CountedScale, name="counted"), EvaluationPool()
    stability, reference = _target(spec, pool, "stability"), _target(spec, pool, "reference")
    judged: list[str] = []
    first = stability.execution(_case(spec))
    assert stability.judged_once(first, "extreme", _judge(judged, "compared")) == "compared"
    again = stability.execution(_case(spec))  # served: the same tensors, intact
    assert stability.judged_once(again, "extreme", _judge(judged, "not again")) == "compared"
    assert judged == ["compared"], f"judgements={judged}, but should be 1 [an equal case, served again]"
    # Another key (a family judged by another rule), another contract: judged for themselves.
    assert stability.judged_once(again, "single", _judge(judged, "single")) == "single"
    assert reference.judged_once(reference.execution(_case(spec)), "extreme", _judge(judged, "reference")) == "reference"
    assert judged == ["compared", "single", "reference"]


def test_a_failing_judgement_is_not_kept_and_fails_again() -> None:
    spec, pool = _spec(CountedScale, name="counted"), EvaluationPool()
    target = _target(spec, pool, "reference")
    judged: list[str] = []
    for _ in range(2):
        with pytest.raises(AssertionError, match="wrong"):
            target.judged_once(target.execution(_case(spec)), "values", _judge(judged, "fail"))
    assert judged == ["fail", "fail"], f"judgements={judged}, but should be 2 [a failure is never remembered]"


@pytest.mark.parametrize(
    "fn, nondeterministic",
    [(UndeclaredNoise, False), (CountedScale, True), (ReusedWorkspace, False)],
    ids=["drew from a generator", "declared random", "tensors written since"],
)
def test_an_evaluation_the_pool_does_not_serve_again_is_judged_every_time(fn: type[torch.autograd.Function], nondeterministic: bool) -> None:
    spec, pool = _spec(fn, name=f"judged_{fn.__name__}", nondeterministic=nondeterministic), EvaluationPool()
    target = _target(spec, pool, "stability")
    judged: list[str] = []
    for seed in (0, 1, 0):  # seed 1 overwrites ReusedWorkspace's buffer: seed 0's evaluation is stale
        target.judged_once(target.execution(_case(spec, seed=seed)), "extreme", _judge(judged, f"seed {seed}"))
    assert judged == ["seed 0", "seed 1", "seed 0"], f"judgements={judged}, but seed 0 should be judged again"
