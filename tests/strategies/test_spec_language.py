"""The spec language for real kernels: dim rules, scaled dims, per-dim broadcasting,
case-dependent scalars, derived inputs, sentinels, varlen offsets, additive masks, budgets.

For each: the constraint holds on every drawn case, shrinking goes to the smallest legal case,
and a declaration that cannot work is a SpecError naming the field.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from conformance.spec import (
    AdditiveMask,
    Derived,
    Dim,
    Index,
    Offsets,
    Scalar,
    SpecError,
    Tensor,
)
from strategies import cases
from strategies.cases import CaseOptions
from strategies.recipes import DerivedContext, OffsetsRecipe
from tests.strategies.helpers import checked_spec

FAST = settings(max_examples=40, database=None, deadline=None)
FIND = settings(max_examples=400, database=None, deadline=None, derandomize=True)


def _args(case: Any) -> dict[str, Any]:
    return dict(zip((r.name for r in case.recipes), case.args(), strict=True))


def _positions_table(ctx: DerivedContext) -> torch.Tensor:
    """cos of positions (a random start per row + arange): the same seed gives the same table."""
    rows = ctx.shape[0] if len(ctx.shape) == 4 else 1
    s, d = ctx.shape[-3], ctx.shape[-1]
    start = torch.randint(0, 64, (rows, 1), generator=ctx.generator)
    angles = (start + torch.arange(s)).to(torch.float64)[..., None] / (10.0 ** torch.arange(d // 2, dtype=torch.float64))
    return torch.cat([angles, angles], dim=-1).cos().reshape(ctx.shape)


def _spd(ctx: DerivedContext) -> torch.Tensor:
    a = torch.randn(ctx.shape, generator=ctx.generator, dtype=torch.float64)
    return a @ a.transpose(-1, -2) + ctx.shape[-1] * torch.eye(ctx.shape[-1], dtype=torch.float64)


ROTARY = checked_spec(
    [
        Tensor("x", "b s h d:even"),
        Derived("cos", _positions_table, "b s 1 d", broadcast="b"),
        Derived("sin", _positions_table, "b s 1 d", broadcast="b", seed_from="cos"),
    ]
)


# --------------------------------------------------------------------------- dims


@FAST
@given(cases(checked_spec([Tensor("x", "n d:even"), Tensor("h", "n 2*f"), Tensor("w", "k m")],
                          dims=[Dim("m", multiple_of=8, max_size=40), Dim("k", max_size="n")]), max_elements=4096))
def test_dim_rules_hold_on_every_case(case: Any) -> None:
    sizes = case.sizes
    assert sizes["d"] % 2 == 0 and sizes["d"] >= 2
    assert sizes["m"] % 8 == 0 and 8 <= sizes["m"] <= 40
    assert sizes["k"] <= sizes["n"]
    args = _args(case)
    assert args["h"].shape[-1] == 2 * sizes["f"]


def test_dim_rules_shrink_to_the_smallest_legal_sizes() -> None:
    spec = checked_spec([Tensor("x", "n d:even"), Tensor("h", "n 2*f"), Tensor("w", "m")], dims=[Dim("m", multiple_of=8)])
    smallest = find(cases(spec), lambda c: True, settings=FIND)
    assert smallest.sizes == {"n": 1, "d": 2, "f": 1, "m": 8}
    # A failure needing a large even d shrinks to the smallest even d above the threshold.
    assert find(cases(spec), lambda c: c.sizes["d"] > 9, settings=FIND).sizes["d"] == 10


def test_budget_halving_keeps_multiples_and_at_most() -> None:
    spec = checked_spec([Tensor("x", "n d:8"), Tensor("y", "k")], dims=[Dim("k", max_size="n")], max_elements=64)
    for case in _examples(cases(spec, block_sizes=(64,)), 60):
        assert case.sizes["d"] % 8 == 0 and case.sizes["k"] <= case.sizes["n"]
        assert case.sizes["n"] * case.sizes["d"] <= 64 or case.sizes["n"] == 1


def test_zero_size_dims_are_opt_in_per_dim() -> None:
    spec = checked_spec([Tensor("x", "n d")], dims=[Dim("n", min_size=0)])
    assert find(cases(spec), lambda c: True, settings=FIND).sizes == {"n": 0, "d": 1}
    assert all(c.sizes["d"] >= 1 for c in _examples(cases(spec), 60))
    assert any(c.sizes["n"] == 0 for c in _examples(cases(spec), 60))


def test_per_dim_block_sizes_reach_their_boundaries() -> None:
    spec = checked_spec([Tensor("x", "n")], dims=[Dim("n", block_sizes=(64,))])
    drawn = {c.sizes["n"] for c in _examples(cases(spec, block_sizes=()), 200)}
    assert {63, 64, 65} & drawn


# --------------------------------------------------------------------------- broadcasting


@FAST
@given(cases(ROTARY, broadcast=True))
def test_partial_broadcast_only_touches_the_named_dims(case: Any) -> None:
    x, cos, sin = case.args()
    b, s, _, d = x.shape
    assert cos.shape in {(b, s, 1, d), (1, s, 1, d), (s, 1, d)}
    assert cos.shape == sin.shape
    assert bool((cos.abs() <= 1).all())


def test_partial_broadcast_reaches_every_form_and_shrinks_to_the_full_shape() -> None:
    seen = {len(c.recipes[1].shape) * 10 + c.recipes[1].shape[0] for c in _examples(cases(ROTARY, broadcast=True), 200)
            if c.sizes["b"] > 1 and c.sizes["s"] > 1}
    assert any(key // 10 == 3 for key in seen)  # leading batch dim dropped
    assert any(key == 41 for key in seen)  # batch dim set to 1
    smallest = find(cases(ROTARY, broadcast=True), lambda c: c.sizes["b"] > 1, settings=FIND)
    assert smallest.recipes[1].shape == (smallest.sizes["b"], smallest.sizes["s"], 1, smallest.sizes["d"])


# --------------------------------------------------------------------------- scalars, derived


@FAST
@given(cases(checked_spec([Tensor("x", "*batch n"), Scalar("dim", from_case=lambda case: st.integers(-case.ndim("x"), case.ndim("x") - 1))])))
def test_case_dependent_scalar_lies_in_the_drawn_rank(case: Any) -> None:
    x, dim = case.args()
    assert -x.ndim <= dim < x.ndim


def test_case_dependent_scalar_shrinks_to_its_smallest_value() -> None:
    spec = checked_spec([Tensor("x", "*batch n"), Scalar("dim", from_case=lambda case: st.integers(-case.ndim("x"), case.ndim("x") - 1))])
    assert find(cases(spec), lambda c: True, settings=FIND).recipes[1].value == 0


@FAST
@given(cases(checked_spec([Derived("a", _spd, "n n", requires_grad=True)]), dtypes=(torch.float64,)))
def test_derived_inputs_hold_their_precondition_and_can_require_grad(case: Any) -> None:
    (a,) = case.args()
    assert a.requires_grad and a.is_leaf
    torch.linalg.cholesky(a.detach())  # positive definite
    assert torch.equal(a, case.args()[0])  # same seed, same values


def test_derived_tables_with_seed_from_share_positions() -> None:
    for case in _examples(cases(ROTARY), 10):
        _, cos, sin = case.args()
        assert torch.equal(cos, sin)  # the same function and seed: the same positions


def test_derived_values_agree_across_dtypes() -> None:
    for case in _examples(cases(ROTARY), 10):
        low = case.args(dtype=torch.float32)[1]
        high = case.args(dtype=torch.float64)[1]
        assert torch.equal(low, high.to(torch.float32))


# --------------------------------------------------------------------------- sentinels, offsets, masks


@FAST
@given(cases(checked_spec([Tensor("logits", "n c"), Index("target", "n", high="c", sentinels=(-100,))])))
def test_index_values_are_valid_or_a_sentinel(case: Any) -> None:
    logits, target = case.args()
    valid = (target >= 0) & (target < logits.shape[1])
    assert bool((valid | (target == -100)).all())


def test_sentinels_reach_none_some_and_all_and_shrink_to_none() -> None:
    spec = checked_spec([Tensor("logits", "n c"), Index("target", "n", high="c", sentinels=(-100,))])
    fractions = {c.recipes[1].sentinel_fraction for c in _examples(cases(spec), 100)}
    assert fractions == {0.0, 0.3, 1.0}
    assert find(cases(spec), lambda c: True, settings=FIND).recipes[1].sentinel_fraction == 0.0
    everything = find(cases(spec), lambda c: c.recipes[1].sentinel_fraction == 1.0 and c.sizes["n"] > 1, settings=FIND)
    assert bool((everything.args()[1] == -100).all())


VARLEN = checked_spec(
    [
        Tensor("q", "t h d"),
        Offsets("cu_seqlens", sequences="b", total="t"),
        Scalar("max_seqlen", from_case=lambda case: case.max_length("cu_seqlens")),
    ]
)


@FAST
@given(cases(VARLEN, block_sizes=(16,)))
def test_offsets_are_cumulative_lengths_of_the_packed_dim(case: Any) -> None:
    q, cu, max_seqlen = case.args()
    assert cu.dtype == torch.int32 and cu.shape == (case.sizes["b"] + 1,)
    assert int(cu[0]) == 0 and int(cu[-1]) == q.shape[0] == case.sizes["t"]
    lengths = cu[1:] - cu[:-1]
    assert bool((lengths >= 0).all())
    assert max_seqlen == int(lengths.max())


def test_offsets_reach_empty_and_tail_sequences_and_shrink_to_the_smallest() -> None:
    drawn = _examples(cases(VARLEN, block_sizes=(16,)), 200)
    assert any(0 in c.recipes[1].lengths[:-1] for c in drawn)  # an empty sequence before a non-empty one
    assert any(c.recipes[1].lengths[-1] not in (0,) and c.sizes["t"] % 16 for c in drawn)
    smallest = find(cases(VARLEN), lambda c: True, settings=FIND)
    assert smallest.recipes[1] == OffsetsRecipe("cu_seqlens", values=(0, 1))
    empty_first = find(cases(VARLEN), lambda c: c.recipes[1].lengths[0] == 0, settings=FIND)
    assert empty_first.recipes[1].values == (0, 0, 1)


@FAST
@given(cases(checked_spec([Tensor("s", "n m"), AdditiveMask("bias", "n m")]), dtypes=(torch.float32, torch.float16)))
def test_additive_masks_are_zero_or_minus_inf_in_the_case_dtype(case: Any) -> None:
    _, bias = case.args()
    assert bias.dtype == case.dtype and not bias.requires_grad
    assert bool(((bias == 0) | (bias == -math.inf)).all())
    assert "bias" not in case.requires_grad


def test_spec_element_budget_caps_every_contract() -> None:
    spec = checked_spec([Tensor("x", "n d")], max_elements=16)
    assert all(c.sizes["n"] * c.sizes["d"] <= 16 for c in _examples(cases(spec, max_elements=512, block_sizes=(32,)), 60))


# --------------------------------------------------------------------------- invalid declarations


def _x(shape: str = "n d") -> Tensor:
    return Tensor("x", shape)


@pytest.mark.parametrize(
    ("inputs", "fields", "field", "phrase"),
    [
        ([_x("n d:odd")], {}, "inputs[0].shape", "'d:odd'"),
        ([_x("n 0*f")], {}, "inputs[0].shape", "factor >= 1"),
        ([_x()], {"dims": [Dim("zz")]}, "dims[0].name", "'zz' is not a dim"),
        ([_x()], {"dims": [Dim("n", multiple_of=0)]}, "dims[0].multiple_of", "int >= 1"),
        ([_x()], {"dims": [Dim("n", min_size=-1)]}, "dims[0].min_size", "int >= 0"),
        ([_x()], {"dims": [Dim("n", max_size="zz")]}, "dims[0].max_size", "'zz' is not a dim"),
        ([_x()], {"dims": [Dim("n", max_size="n")]}, "dims[0].max_size", "bounded by itself"),
        ([_x()], {"dims": [Dim("n", block_sizes=(1,))]}, "dims[0].block_sizes", "ints >= 2"),
        ([_x()], {"dims": [Dim("n", min_size=9, max_size=4)]}, "dims[0]", "max_size=4 must be >= min_size=9"),
        ([_x("n d:8")], {"dims": [Dim("d", max_size=4)]}, "dims[0]", "no multiple of 8"),
        ([_x()], {"dims": [Dim("n", max_size="d"), Dim("d", max_size="n")]}, "dims", "cycle"),
        ([_x()], {"dims": [Dim("n"), Dim("n")]}, "dims[1].name", "declared twice"),
        ([Tensor("x", "b s d", broadcast="q")], {}, "inputs[0].broadcast", "'q' is not a dim"),
        ([Tensor("x", "b s d", broadcast="b", broadcastable=True)], {}, "inputs[0].broadcast", "not both"),
        ([_x(), Offsets("cu", sequences="b", total="t")], {}, "inputs[1].total", "not a dim of any tensor"),
        ([_x(), Offsets("cu", sequences="n", total="n")], {}, "inputs[1].total", "must differ"),
        ([Derived("x", 3, "n")], {}, "inputs[0].fn", "not callable"),  # type: ignore[arg-type]
        ([Derived("x", _spd, "n n", seed_from="y")], {}, "inputs[0].seed_from", "not an earlier Derived"),
        ([_x(), Index("i", "n", high="d", sentinels=(0,))], {}, "inputs[1].sentinels", "could be a valid index"),
        ([_x(), Index("i", "n", high="d", sentinels="x")], {}, "inputs[1].sentinels", "tuple of ints"),  # type: ignore[arg-type]
        ([_x(), Scalar("s", 1, from_case=lambda c: 1)], {}, "inputs[1].from_case", "not both"),
        ([_x(), Scalar("s")], {}, "inputs[1].value", "needs a value"),
        ([_x(), Scalar("s", from_case=3)], {}, "inputs[1].from_case", "not callable"),  # type: ignore[arg-type]
        ([_x()], {"max_elements": 0}, "max_elements", "positive int"),
        ([_x()], {"max_examples": 1.5}, "max_examples", "positive int"),
        ([_x()], {"tolerances": {torch.float32: {"floor_ulps": 0}}}, "tolerances", "floor_ulps"),
        ([_x()], {"tolerances": {torch.float32: {"floor_ulps": 2.5}}}, "tolerances", "floor_ulps"),
    ],
)
def test_invalid_declarations_are_a_spec_error_naming_the_field(
    inputs: list[Any], fields: dict[str, Any], field: str, phrase: str
) -> None:
    with pytest.raises(SpecError) as caught:
        checked_spec(inputs, **fields)
    assert caught.value.field_name == field, str(caught.value)
    assert phrase in caught.value.problem, str(caught.value)


def _examples(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    from tests.strategies.helpers import collect_examples

    return collect_examples(strategy, count)


# --------------------------------------------------------------------------- budgets and the floor


def test_a_spec_caps_its_own_examples_and_elements() -> None:
    from conformance.engine.runner import RunOptions, Target

    spec = checked_spec([Tensor("x", "n d")], max_examples=3, max_elements=16)
    seen: list[Any] = []

    def check(target: Target, data: st.DataObject) -> None:
        seen.append(target.draw_case(data, CaseOptions(max_elements=512, block_sizes=(32,))))
        target.checked()

    Target(spec=spec, device="cpu", contract="meta", options=RunOptions(max_examples=20)).run(check)
    assert 1 <= len(seen) <= 3
    assert all(case.sizes["n"] * case.sizes["d"] <= 16 for case in seen)


def test_floor_ulps_raises_the_floor_for_an_exact_reference() -> None:
    from conformance.engine.numerics import compare_budget, ulp

    truth = torch.tensor([1.0, 0.5], dtype=torch.float64)
    exact = truth.to(torch.float32)  # the reference is exact in float32: its own error is 0
    kernel = exact + 3 * ulp(1.0, torch.float32)  # 3 rounding steps off at the largest value

    def compare(steps: int) -> Any:
        return compare_budget(kernel, truth, exact, torch.float32, k=2.0, what="output", where="meta", steps=steps)

    failed = compare(2)
    assert failed is not None and "(2 ulps at 1," in failed.summary
    assert compare(4) is None
