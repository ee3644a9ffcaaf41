"""Ties drawn on purpose and the rule that judges a gradient there (conformance.engine.ties), on
fake values, with the values pattern that makes them; and the float64 truth's NaN gradients that
no output depends on (numerics.without_undefined_nans)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import conformance
from conformance import Scalar, Tensor
from conformance.engine.evaluate import Evaluated
from conformance.engine.numerics import without_undefined_nans
from conformance.engine.ties import compare_tie_sums, tie_groups, tie_slot_cases
from conformance.engine.verdict import Outcome
from strategies.values import tensor_from_seed

F64 = torch.float64


def test_tie_groups_are_the_equal_values_of_a_tensor() -> None:
    x = torch.tensor([[1.0, 1.0, 2.0], [3.0, 1.0, 2.0]], dtype=F64)
    groups = tie_groups(x)
    assert groups is not None
    assert sorted(int(s) for s in groups.sizes) == [1, 2, 3]
    assert groups.members(int(groups.ids[0])) == [(0, 0), (0, 1), (1, 1)]
    assert sorted(groups.ranks()[groups.ids == groups.ids[0]].tolist()) == [0, 1, 2]
    assert tie_groups(torch.arange(6, dtype=F64)) is None  # nothing tied
    assert tie_groups(torch.tensor([1, 1])) is None  # not floating


def test_a_tied_elements_gradient_may_be_split_any_way_but_its_sum_is_judged() -> None:
    x = torch.tensor([0.5, 0.5, -1.0], dtype=F64)  # the maximum tied
    groups = tie_groups(x)
    assert groups is not None
    truth = torch.tensor([2.0, 0.0, 0.0], dtype=F64)  # the reference's one index

    def judged(actual: list[float], dtype: torch.dtype = F64, resampled: Any = ()) -> Any:
        return compare_tie_sums(
            torch.tensor(actual, dtype=F64).to(dtype), truth, truth.to(dtype), dtype, groups, resampled=resampled, k=3,
            steps=2, input_name="x", what="grad['x']", where="f.backward",
        )

    assert judged([0.0, 2.0, 0.0]) is None  # the last tied element
    assert judged([1.0, 1.0, 0.0]) is None  # split evenly
    assert judged([2.0, 0.0, 0.0], torch.bfloat16) is None
    doubled = judged([2.0, 2.0, 0.0])  # grad * (x == max): every tied element gets it all
    assert doubled is not None
    assert doubled.summary.startswith("sum of grad['x'] over the 2 elements where x == 0.5 ((0,), (1,))=4, but should be 2")
    assert judged([2.0, 2.0, 0.0], torch.bfloat16) is not None
    assert judged([0.0, 0.0, 0.0]) is not None  # none of them
    # Where the sum itself moves when the tie breaks (a kink at the tied value too), the budget moves with it.
    moved = torch.tensor([2.0, 2.0, 0.0], dtype=F64)
    assert judged([2.0, 2.0, 0.0], resampled=[(moved, moved)]) is None


def test_slot_resamples_make_each_tied_element_once_the_largest_and_once_the_smallest() -> None:
    x = torch.tensor([0.25, 0.25, 0.25, 1.0], dtype=F64)
    groups = tie_groups(x)
    assert groups is not None
    moved = [args[0] for args, _ in tie_slot_cases([x], {}, {0: groups})]
    assert len(moved) == 6  # 3 ranks, each up and down
    tied = [m[:3] for m in moved]
    assert {int(m.argmax()) for m in tied} == {0, 1, 2}
    assert {int(m.argmin()) for m in tied} == {0, 1, 2}
    assert all(float(m[3]) == 1.0 for m in moved)  # an untied element stays
    assert all(len(set(m[:3].tolist())) > 1 for m in moved)


def test_the_spread_of_a_tied_elements_sensitivity_is_its_groups_largest() -> None:
    groups = tie_groups(torch.tensor([1.0, 1.0, 2.0], dtype=F64))
    assert groups is not None
    assert groups.spread(torch.tensor([0.5, 0.0, 0.25], dtype=F64)).tolist() == [0.5, 0.5, 0.25]


@pytest.mark.parametrize("shape", [(6, 8), (3, 4, 5)])
def test_repeats_draw_runs_of_equal_values_along_every_dim(shape: tuple[int, ...]) -> None:
    tied_along = set()
    for seed in range(4):
        x = tensor_from_seed(shape, torch.float32, seed=seed, pattern="repeats")
        assert x.shape == shape and bool(torch.isfinite(x).all())
        for dim in range(len(shape)):
            if bool((x.diff(dim=dim) == 0).any()):
                tied_along.add(dim)
        assert x.unique().numel() < x.numel()
    assert tied_along == set(range(len(shape)))
    assert torch.equal(tensor_from_seed(shape, torch.float32, seed=1, pattern="repeats"), tensor_from_seed(shape, torch.float32, seed=1, pattern="repeats"))


def test_a_nan_gradient_of_the_truth_where_no_output_depends_on_the_input_is_zero() -> None:
    x = torch.tensor([0.3, -0.2, 0.7], dtype=F64, requires_grad=True)
    bias = torch.tensor([-torch.inf, 0.0, 0.0], dtype=F64)
    y = torch.logcumsumexp(x + bias, -1)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert bool(torch.isnan(grad[0]))  # torch's own backward: -inf - -inf

    class FakeSpec:
        reference = staticmethod(lambda x, bias: torch.logcumsumexp(x + bias, -1))
        nondeterministic = False

    class FakeCase:
        spec = FakeSpec
        rng_seed = 0
        device = "cpu"

    evaluated = Evaluated((y.detach(),), {"x": grad, "bias": None})
    fixed = without_undefined_nans(FakeSpec, FakeCase, [x.detach(), bias], ["x", "bias"], evaluated)  # type: ignore[arg-type]
    assert fixed.grads["x"] is not None and fixed.grads["x"].tolist()[0] == 0.0
    assert torch.equal(fixed.grads["x"][1:], grad[1:])
    # A NaN that an output does depend on stays: sqrt of a negative input.
    z = torch.tensor([-1.0, 4.0], dtype=F64)
    nan_grad = torch.tensor([float("nan"), 0.25], dtype=F64)
    FakeSpec.reference = staticmethod(lambda z: torch.sqrt(z))
    kept = without_undefined_nans(FakeSpec, FakeCase, [z], ["z"], Evaluated((torch.sqrt(z),), {"z": nan_grad}))  # type: ignore[arg-type]
    assert kept.grads["z"] is nan_grad


class _QuantCodes(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.round(x / scale)
        packed = codes.to(torch.int16)
        ctx.mark_non_differentiable(packed)
        return packed, codes * scale

    @staticmethod
    def backward(ctx: Any, grad_codes: torch.Tensor | None, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return 2 * grad, None  # the straight-through gradient doubled: wrong in every dtype


def test_a_surrogate_specs_wrong_gradient_fails_gradcheck_and_blocks_reference() -> None:
    # A new user's trial: both failed, although gradcheck's own rule (the surrogate's gradient in float64) rejects it.
    result = conformance.check(
        _QuantCodes, inputs=[Tensor("x", "*batch n"), Scalar("scale", 0.1)],
        reference=lambda x, scale: (torch.round(x / scale).to(torch.int16), torch.round(x / scale) * scale),
        surrogate=lambda x, scale: (torch.round(x / scale).to(torch.int16), x.clone()),
        dtypes=(torch.float64, torch.float32), double_backward=False, contracts=["gradcheck", "reference"], device="cpu",
        profile="ci", raise_on_failure=False,
    )
    outcomes = {r.contract: r for r in result.results}
    assert outcomes["gradcheck"].verdict.outcome is Outcome.FAILED, result
    reference = outcomes["reference"].verdict
    assert reference.outcome is Outcome.BLOCKED and reference.owner == "gradcheck", result
    assert "differs from the surrogate's too" in reference.reason, result
