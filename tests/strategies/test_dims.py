"""Sizes, dim sizes, batch shapes and broadcast forms: ranges, coverage, shrinking, validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies import BLOCK_SIZES, batch_shapes, broadcast_forms, dim_sizes, sizes, sizes_near_blocks
from tests.strategies.helpers import collect_examples

FAST = settings(max_examples=40, database=None, deadline=None)
FIND = settings(max_examples=300, database=None, deadline=None, derandomize=True)


@FAST
@given(sizes(min_size=0, max_size=5, block_sizes=(16, 32)))
def test_sizes_stay_in_range(n: int) -> None:
    assert 0 <= n <= 33


@pytest.mark.parametrize("block", BLOCK_SIZES)
def test_sizes_reach_each_block_boundary(block: int) -> None:
    for target in (block - 1, block, block + 1):
        assert find(sizes(block_sizes=BLOCK_SIZES), lambda n, t=target: n == t, settings=FIND) == target


def test_sizes_cover_one_small_primes_and_non_powers_of_two() -> None:
    for target in (1, 2, 3, 5, 7):
        assert find(sizes(), lambda n, t=target: n == t, settings=FIND) == target
    # A non-power-of-two size beyond max_size that is not next to a block (the "any size" mode).
    assert find(sizes(block_sizes=(16,)), lambda n: 8 < n < 15 and n & (n - 1) != 0, settings=FIND) == 9


def test_sizes_shrink_to_min_size() -> None:
    assert find(sizes(min_size=2, block_sizes=(64,)), lambda n: True) == 2
    assert find(sizes(min_size=0), lambda n: True) == 0  # zero-size dims when allowed


def test_sizes_near_blocks_are_exact_neighbourhoods() -> None:
    values = set()
    find(sizes_near_blocks(block_sizes=(8, 64)), lambda n: (values.add(n) and False) or len(values) == 6, settings=FIND)
    assert values == {7, 8, 9, 63, 64, 65}


@FAST
@given(dim_sizes(["n", "d", "k"], unique=True, block_sizes=()))
def test_unique_dim_sizes_differ(drawn: dict[str, int]) -> None:
    assert list(drawn) == ["n", "d", "k"]
    assert len(set(drawn.values())) == 3


def test_dim_sizes_can_differ_and_coincide() -> None:
    assert find(dim_sizes(["n", "d"]), lambda s: s["n"] != s["d"], settings=FIND)
    assert find(dim_sizes(["n", "d"]), lambda s: s["n"] == s["d"] > 1, settings=FIND)


@FAST
@given(batch_shapes(max_dims=3))
def test_batch_shapes_expand_to_zero_to_n_dims(shape: tuple[int, ...]) -> None:
    assert 0 <= len(shape) <= 3 and all(1 <= s <= 4 for s in shape)


def test_batch_shapes_shrink_to_no_dims_and_reach_max() -> None:
    assert find(batch_shapes(), lambda s: True) == ()
    assert len(find(batch_shapes(max_dims=3), lambda s: len(s) == 3, settings=FIND)) == 3


@FAST
@given(st.data(), batch_shapes(min_dims=1, max_dims=3), st.integers(1, 5))
def test_broadcast_forms_really_broadcast(data: st.DataObject, batch: tuple[int, ...], d: int) -> None:
    full = (*batch, d)
    form = data.draw(broadcast_forms(full), label="form")
    assert len(form) <= len(full)
    assert torch.broadcast_shapes(form, full) == full
    assert torch.zeros(form).expand(full).shape == full


def test_broadcast_forms_drop_dims_and_use_size_one() -> None:
    assert find(broadcast_forms((2, 3, 4)), lambda s: len(s) == 1, settings=FIND) in ((4,), (1,))
    assert find(broadcast_forms((2, 3, 4)), lambda s: s == (2, 1, 4), settings=FIND) == (2, 1, 4)
    assert find(broadcast_forms((2, 3, 4)), lambda s: True) == (2, 3, 4)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: sizes(min_size=-1), "min_size=-1"),
        (lambda: sizes(min_size=3, max_size=2), "max_size=2"),
        (lambda: sizes(block_sizes=(1,)), "block_sizes=(1,)"),
        (lambda: sizes_near_blocks(block_sizes=()), "block_sizes=()"),
        (lambda: dim_sizes(["n", "n"]), "names=['n', 'n']"),
        (lambda: dim_sizes("nd"), "names='nd'"),
        (lambda: batch_shapes(min_dims=2, max_dims=1), "min_dims=2, max_dims=1"),
        (lambda: batch_shapes(min_side=-1), "min_side=-1"),
        (lambda: broadcast_forms([2, 3]), "shape=[2, 3]"),
    ],
)
def test_bad_arguments_raise_invalid_argument(factory, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        find(factory(), lambda v: True)


def test_a_smallest_size_above_every_block_draws_without_error() -> None:
    """min_size 18 is past 16 + 1: the block at 16 has no sizes near it and must not be drawn."""
    for n in collect_examples(sizes(min_size=18, max_size=18, block_sizes=(16,)), 5):
        assert n == 18
    for n in collect_examples(sizes(min_size=20, max_size=24, block_sizes=(16, 32)), 10):
        assert 20 <= n <= 33
