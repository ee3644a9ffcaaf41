"""Masks, grad_outputs and tensor values: each kind is what it says, seeds are deterministic."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies import (
    DOMAINS,
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    additive_mask_from_seed,
    additive_masks,
    grad_output_from_seed,
    grad_outputs,
    magnitudes,
    mask_from_seed,
    masks,
    tensor_from_seed,
    tensors,
)
from strategies.coverage import finite_values
from strategies.recipes import IndexRecipe
from strategies.values import corner_magnitudes
from tests.strategies.helpers import collect_examples

FAST = settings(max_examples=25, database=None, deadline=None)
FIND = settings(max_examples=300, database=None, deadline=None, derandomize=True)
shapes = st.sampled_from([(3, 5), (2, 4, 4), (2, 6, 3), (7,)])


@FAST
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(MASK_KINDS))
def test_mask_kinds(shape: tuple[int, ...], seed: int, kind: str) -> None:
    mask = mask_from_seed(shape, seed=seed, kind=kind)
    assert mask.dtype == torch.bool and tuple(mask.shape) == shape
    if kind == "all_true":
        assert bool(mask.all())
    elif kind == "causal" and len(shape) >= 2:
        q, k = shape[-2:]
        expected = torch.ones(q, k, dtype=torch.bool).tril(max(k - q, 0))
        assert torch.equal(mask, expected.expand(shape))
        assert bool(mask[..., -1, :].all())  # the last query sees every key
    elif kind == "padding":
        lengths = mask.sum(-1)
        assert bool((lengths >= 1).all())
        # a kept prefix per row: keep[j] implies keep[j-1]
        assert bool((mask[..., 1:] <= mask[..., :-1]).all())
    elif kind == "masked_rows":
        rows = mask[..., 0, :] if len(shape) >= 2 else mask
        assert not bool(rows.any())  # at least one fully masked row
    elif kind == "left_padding":
        assert bool((mask.sum(-1) >= 1).all())
        # a kept suffix per row: keep[j] implies keep[j+1]; the first row is padded when it can be
        assert bool((mask[..., :-1] <= mask[..., 1:]).all())
        if mask.numel() and shape[-1] >= 2:
            assert not bool(mask.reshape(-1, shape[-1])[0, 0])
    assert torch.equal(mask, mask_from_seed(shape, seed=seed, kind=kind))  # same seed, same mask


def test_random_mask_density_is_drawn() -> None:
    def density(m: torch.Tensor) -> float:
        return m.float().mean().item()

    shape = (16, 16)
    sparse = find(masks(shape, kinds=("random",)), lambda m: density(m) < 0.15, settings=FIND)
    dense = find(masks(shape, kinds=("random",)), lambda m: density(m) > 0.85, settings=FIND)
    assert density(sparse) < 0.15 and density(dense) > 0.85


@FAST
@given(st.data())
def test_masks_have_the_requested_kind(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(MASK_KINDS), label="kind")
    mask = data.draw(masks((3, 4, 5), kinds=(kind,)), label="mask")
    assert tuple(mask.shape) == (3, 4, 5) and mask.dtype == torch.bool
    if kind == "all_true":
        assert bool(mask.all())
    if kind == "masked_rows":
        assert not bool(mask[:, 0, :].any())


@FAST
@given(additive_masks((2, 4, 4), torch.float32, kinds=("causal", "masked_rows")))
def test_additive_masks_are_zero_or_minus_inf(mask: torch.Tensor) -> None:
    assert mask.dtype == torch.float32
    assert bool(((mask == 0) | (mask == float("-inf"))).all())
    # causal keeps the whole last query row; masked_rows masks the whole first one
    assert bool((mask[:, -1] == 0).all()) or bool((mask[:, 0] == float("-inf")).all())


def test_additive_mask_has_fully_masked_rows() -> None:
    mask = additive_mask_from_seed((2, 3, 4), torch.float16, seed=5, kind="masked_rows")
    assert bool((mask[:, 0, :] == float("-inf")).all())
    assert torch.softmax(mask.float(), -1)[:, 0].isnan().all()  # what an unguarded kernel computes


@FAST
@given(shape=shapes, seed=st.integers(0, 10**6), kind=st.sampled_from(GRAD_OUTPUT_KINDS))
def test_grad_output_kinds(shape: tuple[int, ...], seed: int, kind: str) -> None:
    grad = grad_output_from_seed(shape, torch.float32, seed=seed, kind=kind, scale=3.0)
    assert tuple(grad.shape) == shape and grad.dtype == torch.float32
    if kind == "zeros":
        assert not bool(grad.any())
    elif kind == "expanded":
        assert all(s == 0 for s in grad.stride())  # what y.sum().backward() passes
        assert bool((grad == 3.0).all())
    elif kind == "noncontiguous":
        assert not grad.is_contiguous()
    elif kind == "per_row" and shape[0] > 1:
        # rows scaled by different powers of ten relative to the random kind
        plain = grad_output_from_seed(shape, torch.float64, seed=seed, kind="random", scale=3.0)
        ratios = (grad.double() / plain).reshape(shape[0], -1)[:, 0]
        assert torch.allclose(torch.log10(ratios), torch.log10(ratios).round(), atol=1e-4)
    assert torch.equal(grad, grad_output_from_seed(shape, torch.float32, seed=seed, kind=kind, scale=3.0))


def test_grad_outputs_strategy_reaches_every_kind() -> None:
    seen = {
        "expanded" if 0 in g.stride() else "noncontiguous" if not g.is_contiguous() else "other"
        for g in collect_examples(grad_outputs((3, 4), kinds=GRAD_OUTPUT_KINDS), 100)
    }
    assert seen == {"expanded", "noncontiguous", "other"}


@FAST
@given(st.data())
def test_tensor_domains(data: st.DataObject) -> None:
    domain = data.draw(st.sampled_from([*DOMAINS, (-3.0, -1.0)]), label="domain")
    x = data.draw(tensors((4, 6), torch.float64, domain=domain, patterns=("random", "ties"), extreme=True), label="x")
    assert x.shape == (4, 6) and x.dtype == torch.float64 and bool(x.isfinite().all())
    _assert_in_domain(x, domain)


def _assert_in_domain(x: torch.Tensor, domain: Any) -> None:
    if domain == "positive":
        assert bool((x > 0).all())
    elif domain == "nonzero":
        assert bool((x != 0).all())
    elif domain == "unit":
        assert bool(((x > 0) & (x < 1)).all())
    elif isinstance(domain, tuple):
        assert bool(((x > domain[0]) & (x < domain[1])).all())


def test_value_patterns() -> None:
    ties = tensor_from_seed((8, 16), torch.float64, seed=3, pattern="ties")
    assert ties.unique().numel() < ties.numel() // 4  # many exactly equal values
    for domain in ("positive", "nonzero", "unit", (2.0, 5.0)):
        tied = tensor_from_seed((8, 16), torch.float64, seed=3, pattern="ties", domain=domain)
        plain = tensor_from_seed((8, 16), torch.float64, seed=3, domain=domain)
        assert tied.unique().numel() <= 8 and (tied > 0).all() == (plain > 0).all()
    near = tensor_from_seed((8, 16), torch.float64, seed=3, pattern="near_zero")
    assert (near == 0).any() and ((near != 0) & (near.abs() < 1e-2)).any()
    const = tensor_from_seed((3, 5), torch.float32, seed=1, constant_rows=True)
    assert bool((const == const[:, :1]).all())


@pytest.mark.parametrize("domain", ["real", "positive", "nonzero", "unit", (-2.0, 1.0)])
def test_ascending_values_increase_along_every_dim_and_keep_their_domain(domain: Any) -> None:
    x = tensor_from_seed((3, 4, 5), torch.float64, seed=11, pattern="ascending", domain=domain)
    for dim in range(3):
        assert bool((x.diff(dim=dim) >= 0).all()), dim
    assert x.flatten()[-1] == x.max()
    _assert_in_domain(x, domain)
    if domain in ("real", "nonzero"):  # magnitudes: scores q @ k.T of two such tensors increase too
        assert bool((x >= 0).all())
        scores = x[0] @ x[1].T
        assert bool((scores.diff(dim=-1) >= 0).all())


def test_same_seed_same_tensor_on_every_dtype() -> None:
    a = tensor_from_seed((5, 7), torch.float32, seed=42, domain="nonzero", scale=10.0)
    b = tensor_from_seed((5, 7), torch.float32, seed=42, domain="nonzero", scale=10.0)
    c = tensor_from_seed((5, 7), torch.float64, seed=42, domain="nonzero", scale=10.0)
    assert torch.equal(a, b) and torch.equal(a, c.float())
    assert not torch.equal(a, tensor_from_seed((5, 7), torch.float32, seed=43, domain="nonzero", scale=10.0))


def test_torch_global_rng_is_untouched() -> None:
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    tensor_from_seed((4,), torch.float32, seed=1)
    mask_from_seed((4, 4), seed=1)
    grad_output_from_seed((4, 4), torch.float32, seed=1, kind="per_row")
    assert torch.equal(torch.rand(3), before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_extreme_magnitudes_are_dtype_aware(dtype: torch.dtype) -> None:
    seen = set(collect_examples(magnitudes(dtype=dtype, extreme=True), 100))
    top = torch.finfo(dtype).max
    assert max(seen) * 64 <= top  # headroom: a small reduction of such values stays finite
    assert max(seen) >= (top / 64) ** 0.75  # but close to the dtype's range (1e3 for float16, 1e300 for float64)
    assert min(seen) < 1e-3 and min(seen) > torch.finfo(dtype).tiny  # tiny scales, still normal numbers
    assert find(magnitudes(dtype=dtype, extreme=True), lambda s: True) == 1.0


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: masks((2, 3), kinds=("diagonal",)), "diagonal"),
        (lambda: masks((2, -3)), "shape="),
        (lambda: masks((2, 3), kinds=()), "empty"),
        (lambda: additive_masks((2, 3), torch.int64), "dtype=torch.int64"),
        (lambda: grad_outputs((2, 3), kinds=("ones",)), "ones"),
        (lambda: grad_outputs((2, 3), torch.int32), "dtype=torch.int32"),
        (lambda: tensors((2,), domain="negative"), "domain='negative'"),
        (lambda: tensors((2,), domain=(1.0, 0.0)), r"domain=\(1.0, 0.0\)"),
        (lambda: tensors((2,), patterns=("sorted",)), "sorted"),
        (lambda: tensors((2,), domain="positive", patterns=("near_zero",)), "near_zero"),
        (lambda: magnitudes(dtype=torch.int64), "dtype=torch.int64"),
    ],
)
def test_bad_arguments_raise_invalid_argument(factory, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=message):
        find(factory(), lambda v: True)


def test_an_index_case_line_says_how_many_sentinels_it_holds() -> None:
    """It printed the drawn fraction ("30% set to [-100]") for a one-element target holding none."""
    for shape in ((1,), (5,), (3, 4)):
        recipe = IndexRecipe("target", shape=shape, seed=1015724052, high=2, sentinels=(-100,), sentinel_fraction=0.3)
        held = int((recipe.build(torch.int64, "cpu") == -100).sum())
        numel = math.prod(shape)
        assert recipe.describe() == f"target: index{shape} < 2, {held} of {numel} set to [-100]", recipe.describe()


def test_extreme_magnitudes_shrink_to_the_smallest_that_fails_and_corners_take_the_largest() -> None:
    """A failure at large scales is reported at the smallest extreme scale that shows it; the coverage
    phase takes 1, 1e2 and the dtype's largest in turn (strategies.values.corner_magnitudes)."""
    assert find(magnitudes(dtype=torch.float32, extreme=True), lambda v: v >= 1e4, settings=FIND) == 1e4
    assert find(magnitudes(dtype=torch.float64, extreme=True), lambda v: v >= 1e4, settings=FIND) == 1e4
    for dtype, largest in ((torch.float64, 1e300), (torch.float32, 1e30), (torch.float16, 1e3)):
        assert finite_values(corner_magnitudes(dtype=dtype)) == (1.0, 100.0, largest)
