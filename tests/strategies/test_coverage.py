"""The deterministic coverage phase's corners (strategies/coverage.py): what they cover, that they
fit the budget, that the same spec always gives the same ones, and that a case drawn at a corner
is that corner."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import Dim, Index, Mask, Scalar, Tensor
from strategies import CaseOptions, cases
from strategies.cases import case_kinds
from strategies.coverage import (
    BIG_SIZES,
    GRAD_KIND_LABEL,
    REQUIRES_GRAD_LABEL,
    Corner,
    coverage_corners,
    describe_coverage,
    finite_values,
    pairwise_rows,
    smaller_corners,
    smaller_sizes,
    summed_dims,
)
from strategies.draw import most_broadcast
from strategies.inputs import requires_grad_classes
from strategies.recipes import TensorRecipe
from tests.strategies.helpers import checked_spec, collect_examples

ATTENTION = checked_spec(
    [Tensor("q", "b m d"), Tensor("k", "b n d"), Tensor("v", "b n d"), Scalar("causal", st.booleans())],
    dims=[Dim("n", block_sizes=(64,))],
    dtypes=(torch.float64, torch.float32, torch.bfloat16),
)


@settings(max_examples=30, deadline=None, database=None)
@given(st.lists(st.integers(1, 4), max_size=5))
def test_pairwise_rows_cover_every_pair_of_levels(levels: list[int]) -> None:
    rows = pairwise_rows(levels)
    assert rows == pairwise_rows(levels)  # deterministic
    for i, j in itertools.combinations(range(len(levels)), 2):
        for a, b in itertools.product(range(levels[i]), range(levels[j])):
            assert any(row[i] == a and row[j] == b for row in rows), (levels, i, a, j, b)
    assert len(rows) <= 2 * max([1, *levels]) ** 2  # a greedy covering array, near max**2, not the product


def test_finite_values_lists_small_strategies_only() -> None:
    assert finite_values(st.booleans()) == (False, True)
    assert finite_values(st.sampled_from(["sum", "max"])) == ("sum", "max")
    assert finite_values(st.integers(-2, 1)) == (-2, -1, 0, 1)
    assert finite_values(st.just(7)) == (7,)
    assert finite_values(st.integers(0, 1000)) is None
    assert finite_values(st.floats(0, 1)) is None
    assert finite_values(st.sampled_from([1, 2]).map(str)) is None


def _corners(**overrides: object) -> tuple[Corner, ...]:
    options = {"dtypes": ATTENTION.dtypes, "max_elements": 512, "max_batch_dims": 2, **overrides}
    return coverage_corners(ATTENTION, **options)  # type: ignore[arg-type]


def test_corners_cover_flag_by_relation_pairs_and_every_dtype() -> None:
    corners = _corners()
    assert corners == _corners()  # the same spec gives the same corners
    seen = set()
    for corner in corners:
        sizes = dict(corner.sizes)
        relation = "<" if sizes["m"] < sizes["n"] else "=" if sizes["m"] == sizes["n"] else ">"
        seen.add((corner.choice("causal"), relation))
    assert {(c, r) for c in (0, 1) for r in "<=>"} <= seen
    assert {c.dtype_index for c in corners} == {0, 1, 2}


def test_corners_reach_past_common_and_declared_blocks_one_dim_at_a_time() -> None:
    corners = _corners()
    big = [dict(c.sizes) for c in corners if max(dict(c.sizes).values()) > 3]
    assert {s["n"] for s in big} >= {63, 64, 65, 129}  # n's own block: b-1, b, b+1, 2b+1
    for dim in ("b", "m", "d"):
        assert any(s[dim] == BIG_SIZES[0] for s in big), dim
    for sizes in big:  # one big dim per corner, the others at their smallest
        assert sorted(sizes.values())[-2] == 1, sizes


def test_a_dim_bounded_by_another_gets_its_big_corner_with_the_bounding_dim_raised_too() -> None:
    """A filter length L <= n was only ever drawn at 1 by the corners: its big size was cut back to
    n's smallest (a trial's filter-bank backward, wrong from L = 4, passed the default profile)."""
    spec = checked_spec([Tensor("x", "b n"), Tensor("w", "L")], dims=[Dim("L", max_size="n")])
    sizes = [dict(c.sizes) for c in coverage_corners(spec, dtypes=(torch.float64,), max_elements=512, max_batch_dims=2)]
    assert any(s["L"] == BIG_SIZES[0] and s["n"] == BIG_SIZES[0] and s["b"] == 1 for s in sizes), sizes
    assert all(s["L"] <= s["n"] for s in sizes)


def test_a_tight_budget_lowers_the_big_size_and_zero_is_a_corner_where_allowed() -> None:
    spec = checked_spec([Tensor("x", "r c")], dims=[Dim("r", min_size=0)])
    corners = coverage_corners(spec, dtypes=(torch.float64,), max_elements=40, max_batch_dims=2)
    sizes = [dict(c.sizes) for c in corners]
    assert {"r": 0, "c": 1} in sizes or any(s["r"] == 0 for s in sizes)
    assert max(s["c"] for s in sizes) == 33  # 129 and 65 exceed 40 elements, 33 fits
    assert all(s["r"] * s["c"] <= 40 for s in sizes)


@pytest.mark.parametrize("pairwise", [False, True])
def test_a_declared_blocks_sizes_keep_their_corner_and_give_up_the_batch_rows_instead(pairwise: bool) -> None:
    """b+1 = 257 fills the 512-element budget alone: a batch rank the pairwise array pairs with it
    gives way (a batch row of 2 would have halved n to 129, and 257 would never be drawn)."""
    spec = checked_spec([Tensor("x", "*batch n")], dims=[Dim("n", block_sizes=(256,))], dtypes=(torch.float32, torch.float16))
    options = CaseOptions(requires_grad="subsets", layouts=("contiguous", "transposed"), grad_output_kinds=("random", "zeros"))
    corners = coverage_corners(
        spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=2, kinds=case_kinds(spec, options), pairwise_kinds=pairwise,
    )
    by_n = {dict(c.sizes)["n"]: c for c in corners}
    assert {255, 256, 257} <= set(by_n), sorted(by_n)
    assert pairwise is False or any(c.batch_rank("batch") for c in corners)  # the pairs still have batch rows
    corner = by_n[257]
    assert corner.batch_rank("batch") == 0, corner
    for case in collect_examples(cases(spec, CaseOptions(dtypes=spec.dtypes, corner=corner)), 2):
        assert case.sizes["n"] == 257 and case.batches["batch"] == (), (case.sizes, case.batches)


def test_an_index_with_sentinels_is_a_pairwise_factor() -> None:
    spec = checked_spec([Tensor("logits", "n c"), Index("target", "n", high="c", sentinels=(-100,)), Scalar("ignore_index", -100)])
    corners = coverage_corners(spec, dtypes=(torch.float64,), max_elements=512, max_batch_dims=2)
    assert {c.choice("target sentinel fraction") for c in corners} == {0, 1}


@pytest.mark.parametrize("index", range(4))
def test_a_case_drawn_at_a_corner_is_that_corner(index: int) -> None:
    corner = _corners()[index + 4]
    drawn = collect_examples(cases(ATTENTION, CaseOptions(dtypes=ATTENTION.dtypes, corner=corner)), 3)
    for case in drawn:
        assert case.sizes == dict(corner.sizes)
        assert case.dtype == ATTENTION.dtypes[corner.dtype_index]
        causal = next(r.value for r in case.recipes if r.name == "causal")
        assert causal == (False, True)[corner.choice("causal") or 0]


def test_a_corner_must_be_a_corner() -> None:
    with pytest.raises(Exception, match="corner="):
        CaseOptions(corner="m=129")  # type: ignore[arg-type]


def test_a_factor_fixed_at_minus_one_covers_nothing_in_that_row() -> None:
    rows = pairwise_rows([2, 3], fixed=[{1: -1}, {1: -1}])
    assert [row[1] for row in rows[:2]] == [0, 0]  # the fixed rows, their -1 shown as 0
    for a, b in itertools.product(range(2), range(3)):  # every pair still met by a free row
        assert any(row == (a, b) for row in rows[2:]), (a, b)


def test_the_coverage_line_says_what_the_corners_reach() -> None:
    line = describe_coverage(ATTENTION, _corners(), ATTENTION.dtypes)
    assert line.startswith(f"{len(_corners())} corners: sizes up to 129")
    assert "causal: 2/2 values" in line and "m vs n: <, =, >" in line and "dtypes 3/3" in line


MASKED = checked_spec(
    [Tensor("x", "b n", broadcastable=True), Tensor("w", "n"), Mask("mask", "b n")], dtypes=(torch.float64, torch.float32),
)
VARIED = CaseOptions(
    requires_grad="nonempty", broadcast=True, layouts=("contiguous", "transposed", "sliced"),
    mask_kinds=("random", "all_true", "causal"), grad_output_kinds=("random", "per_row", "noncontiguous", "zeros"),
)


def test_case_kinds_list_what_the_contract_varies_beyond_the_spec() -> None:
    assert case_kinds(MASKED, VARIED) == (
        ("requires_grad", 3), ("broadcast", 2), ("x layout", 3), ("w layout", 3), ("mask mask kind", 3), ("grad_output kind", 4),
    )
    assert case_kinds(MASKED, CaseOptions()) == (("mask mask kind", 3),)  # every contract draws 3 mask kinds
    assert case_kinds(MASKED, CaseOptions(mask_kinds=("random",))) == ()  # one value each: no turns to take
    assert requires_grad_classes(["q", "k"]) == (frozenset({"q", "k"}), frozenset({"q"}), frozenset({"k"}), frozenset())
    assert requires_grad_classes(["x"], min_size=1) == (frozenset({"x"}),)


def test_every_value_of_every_case_kind_gets_a_corner_and_a_case_drawn_there_has_it() -> None:
    kinds = case_kinds(MASKED, VARIED)
    corners = coverage_corners(MASKED, dtypes=MASKED.dtypes, max_elements=512, max_batch_dims=2, kinds=kinds)
    for label, count in kinds:
        assert {c.choice(label) for c in corners} == set(range(count)), label
    seen: dict[str, set[object]] = {"requires_grad": set(), "broadcast": set(), "layout": set(), "mask": set(), "grad": set()}
    for corner in corners:
        (case,) = collect_examples(cases(MASKED, VARIED.replace(corner=corner)), 1)
        recipes = {r.name: r for r in case.recipes}
        assert case.requires_grad == requires_grad_classes(["x", "w"], min_size=1)[corner.choice("requires_grad") or 0]
        assert case.grad_kind == VARIED.grad_output_kinds[corner.choice("grad_output kind") or 0]
        assert recipes["mask"].mask_kind == VARIED.mask_kinds[corner.choice("mask mask kind") or 0]
        assert recipes["x"].layout == VARIED.layouts[corner.choice("x layout") or 0]
        full = (case.sizes["b"], case.sizes["n"])
        assert recipes["x"].shape == (() if corner.choice("broadcast") else full), (corner, recipes["x"].shape)
        seen["requires_grad"].add(case.requires_grad)
        seen["grad"].add(case.grad_kind)
    assert len(seen["requires_grad"]) == 3 and seen["grad"] == set(VARIED.grad_output_kinds)


def test_pairwise_kinds_cover_every_pair_of_dtype_and_case_kind_values() -> None:
    kinds = case_kinds(MASKED, VARIED)
    options = {"dtypes": MASKED.dtypes, "max_elements": 512, "max_batch_dims": 2, "kinds": kinds}
    one_at_a_time = coverage_corners(MASKED, **options)  # type: ignore[arg-type]
    pairwise = coverage_corners(MASKED, **options, pairwise_kinds=True)  # type: ignore[arg-type]
    assert pairwise == coverage_corners(MASKED, **options, pairwise_kinds=True)  # type: ignore[arg-type]
    factors = [("dtype", len(MASKED.dtypes)), *kinds]

    def level(corner: Corner, factor: str) -> int | None:
        return corner.dtype_index if factor == "dtype" else corner.choice(factor)

    missing = {
        (a, x, b, y)
        for (a, count_a), (b, count_b) in itertools.combinations(factors, 2)
        for x, y in itertools.product(range(count_a), range(count_b))
        if not any(level(c, a) == x and level(c, b) == y for c in pairwise)
    }
    assert not missing, sorted(missing)[:5]
    # The big-size corners spread the dtypes as without pairs (a tail bug in half precision only).
    assert len({c.dtype_index for c in pairwise if max(s for _, s in c.sizes) > 3}) > 1
    # One at a time covers every value but not every pair: pairs are what cost the extra corners.
    pairs_one_at_a_time = {(level(c, "requires_grad"), level(c, "grad_output kind")) for c in one_at_a_time}
    assert len(pairs_one_at_a_time) < 3 * 4 and len(one_at_a_time) < len(pairwise)


def test_extreme_cases_take_an_ordinary_and_two_extreme_scales_in_turn() -> None:
    """stability's extreme values are a draw the contract varies too: left at their simplest (scale
    1) by every corner, a naive softmax's overflow was found by no corner at the default profile;
    at 1e2 only, sqrt(sum(x * x)) overflowing float32 from 2e19 was found by none either."""
    extreme = CaseOptions(extreme=True, mask_kinds=("random",))
    kinds = case_kinds(MASKED, extreme)
    assert ("x scale", 3) in kinds and ("w scale", 3) in kinds and ("x scale", 3) not in case_kinds(MASKED, CaseOptions())
    corners = coverage_corners(MASKED, dtypes=MASKED.dtypes, max_elements=512, max_batch_dims=2, kinds=kinds)
    scales = set()
    for corner in corners:
        (case,) = collect_examples(cases(MASKED, extreme.replace(corner=corner)), 1)
        x = {r.name: r for r in case.recipes}["x"]
        assert isinstance(x, TensorRecipe)
        scale = x.scale
        largest = {torch.float64: 1e300, torch.float32: 1e30, torch.float16: 1e3}[case.dtype]
        assert scale == (1.0, 100.0, largest)[corner.choice("x scale") or 0], (corner, scale)
        scales.add((corner.choice("x scale") or 0, scale))
    assert {level for level, _ in scales} == {0, 1, 2}, scales


def test_the_most_broadcast_form_drops_leading_dims_and_ones_the_rest() -> None:
    assert most_broadcast((2, 3, 4), (True, True, True)) == ()
    assert most_broadcast((2, 3, 1, 4), (True, False, True, False)) == (3, 1, 4)
    assert most_broadcast((2, 3), (False, True)) == (2, 1)


def test_smaller_sizes_step_one_dim_down_the_block_ladder_smallest_first() -> None:
    """What the runner retries after a failure at a corner (forced sizes do not shrink)."""
    sizes = (("b", 1), ("m", 3), ("n", 129), ("d", 1))
    steps = smaller_sizes(ATTENTION, sizes)
    assert steps == smaller_sizes(ATTENTION, sizes)  # deterministic
    totals = [sum(s for _, s in step) for step in steps]
    assert totals == sorted(totals)  # smallest first
    assert all(all(s <= dict(sizes)[n] for n, s in step) and step != sizes for step in steps)
    n_steps = [dict(step)["n"] for step in steps if dict(step)["m"] == 3]
    assert n_steps == [1, 17, 33, 63, 64, 65], n_steps  # n's smallest, the common tails, its block 64's b-1, b, b+1
    assert [dict(step)["m"] for step in steps if dict(step)["n"] == 129] == [1]  # m steps down to its smallest
    assert smaller_sizes(ATTENTION, (("b", 1), ("m", 1), ("n", 1), ("d", 1))) == []  # nothing below the smallest


ROWS = checked_spec([Tensor("x", "*batch d"), Tensor("w", "d")], dtypes=(torch.float64,))


def test_a_batch_group_gets_a_corner_with_many_rows_and_a_case_drawn_there_has_them() -> None:
    """Kernels flatten ``*batch`` into rows and tile them: rank corners (sides of 2) never pass 4 rows."""
    corners = coverage_corners(ROWS, dtypes=ROWS.dtypes, max_elements=512, max_batch_dims=2)
    many = [c for c in corners if len(c.batch_shape("batch") or ()) == 1]
    assert len(many) == 1 and many[0].batch_shape("batch") == (129,), corners  # d=1 at its smallest: 129 rows fit
    assert many[0].batch_rank("batch") is None  # the whole shape is forced, not a rank
    tight = coverage_corners(ROWS, dtypes=ROWS.dtypes, max_elements=40, max_batch_dims=2)
    assert [c.batch_shape("batch") for c in tight if len(c.batch_shape("batch") or ()) == 1] == [(33,)]  # the largest of BIG_SIZES that fits
    assert not [c for c in coverage_corners(ROWS, dtypes=ROWS.dtypes, max_elements=512, max_batch_dims=0) if c.batch_shapes]
    for case in collect_examples(cases(ROWS, CaseOptions(dtypes=ROWS.dtypes, corner=many[0])), 2):
        x = next(r for r in case.recipes if r.name == "x")
        assert isinstance(x, TensorRecipe) and tuple(x.shape)[:-1] == (129,), x.shape
    assert "*batch ranks 0, 1, 2, (2, 1), 129 rows" in describe_coverage(ROWS, corners, ROWS.dtypes)


def test_the_first_rank_two_batch_corner_has_a_unit_dim_next_to_the_row() -> None:
    """(2, 1): squeeze() or a reduction without keepdim drops the wrong dim there; later rank-2
    corners alternate with sides of 2 (a kernel that takes shape[0] as the row count)."""
    spec = checked_spec([Tensor("x", "*batch n"), Scalar("mode", st.sampled_from(["a", "b", "c"]))], dtypes=(torch.float64,))
    corners = coverage_corners(spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=2)
    rank_two = [c.batch_shape("batch") or (2,) * (c.batch_rank("batch") or 0) for c in corners]
    rank_two = [shape for shape in rank_two if len(shape) == 2]
    assert rank_two[:2] == [(2, 1), (2, 2)], corners
    x = next(r for r in next(iter(collect_examples(
        cases(spec, CaseOptions(dtypes=spec.dtypes, corner=next(c for c in corners if c.batch_shape("batch") == (2, 1)))), 1,
    ))).recipes if r.name == "x")
    assert isinstance(x, TensorRecipe) and tuple(x.shape)[:-1] == (2, 1), x.shape
    one_dim = coverage_corners(spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=1)
    assert all(len(c.batch_shape("batch") or ()) <= 1 for c in one_dim)  # max_batch_dims=1: no rank-2 corner at all


def test_after_a_failure_a_many_rows_corner_is_tried_at_fewer_rows_smallest_first() -> None:
    corner = next(c for c in coverage_corners(ROWS, dtypes=ROWS.dtypes, max_elements=512, max_batch_dims=2) if c.batch_shapes)
    fewer = [c.batch_shape("batch") for c in smaller_corners(ROWS, corner)]
    assert fewer == [(2,), (17,), (33,), (65,)], fewer
    assert all(c.sizes == corner.sizes for c in smaller_corners(ROWS, corner))


def test_big_size_corners_keep_the_first_value_pattern_and_the_others_take_the_rest_in_turn() -> None:
    # ascending at a big size puts a row's maximum in its last, partial block; repeats (ties on purpose) go elsewhere
    spec = checked_spec([Tensor("x", "*batch n")])
    options = CaseOptions(value_patterns=("ascending", "random", "repeats"))
    kinds = case_kinds(spec, options)
    assert ("x pattern", 3) in kinds
    corners = coverage_corners(spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=2, kinds=kinds)
    big = [c for c in corners if dict(c.sizes).get("n", 0) >= 17 or len(c.batch_shape("batch") or ()) == 1]  # many rows too
    assert big and all(c.choice("x pattern") == 0 for c in big)
    assert {c.choice("x pattern") for c in corners if c not in big} == {1, 2}
    for corner in corners:
        (case,) = collect_examples(cases(spec, options.replace(corner=corner)), 1)
        (recipe,) = case.recipes
        assert isinstance(recipe, TensorRecipe) and recipe.pattern == options.value_patterns[corner.choice("x pattern") or 0]
    # A contract that keeps values apart (gradcheck's spacing) draws no pattern at all.
    assert not any(label == "x pattern" for label, _ in case_kinds(spec, options.replace(spacing=1e-3)))


def test_each_summed_dim_gets_a_corner_of_many_steps_in_the_lowest_half_precision_with_constant_grads() -> None:
    # A bias's gradient is summed over time (l) and a weight's over time too: a running sum kept in
    # half precision is off by many steps at l=129 with grad_outputs that never cancel.
    spec = checked_spec(
        [Tensor("x", "*batch c l"), Tensor("w", "c k"), Tensor("bias", "c")],
        dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
    )
    assert summed_dims(spec) == ("l", "k")  # c: every input has it
    options = CaseOptions(grad_output_kinds=("random", "constant"), requires_grad="subsets")
    kinds = case_kinds(spec, options)
    corners = coverage_corners(spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=2, kinds=kinds, constant_grad_kind=1)
    plain = coverage_corners(spec, dtypes=spec.dtypes, max_elements=512, max_batch_dims=2, kinds=kinds)

    def many_steps(found: tuple[Corner, ...], dim: str) -> list[Corner]:
        return [
            c for c in found if dict(c.sizes)[dim] == 129 and c.dtype_index == 3
            and c.choice(GRAD_KIND_LABEL) == 1 and c.choice(REQUIRES_GRAD_LABEL) == 0
        ]

    steps = many_steps(corners, "l") + many_steps(corners, "k")
    assert len(steps) == 2, corners
    assert not (many_steps(plain, "l") and many_steps(plain, "k")), plain  # without them, luck only
    for corner in steps:
        (case,) = collect_examples(cases(spec, options.replace(dtypes=spec.dtypes, corner=corner)), 1)
        assert case.dtype == torch.bfloat16 and case.grad_kind == "constant" and case.requires_grad == {"x", "w", "bias"}, case
    # Not where the contract never draws constant grad_outputs, nor without a half precision dtype.
    wide = (torch.float64, torch.float32)
    assert coverage_corners(spec, dtypes=wide, max_elements=512, max_batch_dims=2, kinds=kinds, constant_grad_kind=1) == (
        coverage_corners(spec, dtypes=wide, max_elements=512, max_batch_dims=2, kinds=kinds)
    )
