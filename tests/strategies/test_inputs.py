"""dtypes_for, requires_grad_subsets and layouts: coverage, shrinking, validation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.spec import Tensor
from strategies import LAYOUTS, apply_layout, dtypes_for, layouts, requires_grad_subsets
from tests.strategies.helpers import collect_examples, make_spec

FIND = settings(max_examples=300, database=None, deadline=None, derandomize=True)
FAST = settings(max_examples=30, database=None, deadline=None)
ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)




def test_dtypes_for_follow_the_spec_on_cpu() -> None:
    spec = make_spec([Tensor("x", "n")], dtypes=ALL_FLOATS)
    assert set(collect_examples(dtypes_for(spec, "cpu"), 60)) == set(ALL_FLOATS)
    assert find(dtypes_for(spec, "cpu"), lambda d: True) == torch.float64  # the spec's first
    assert set(collect_examples(dtypes_for(spec, "cpu", dtypes=(torch.float16,)), 10)) == {torch.float16}


def test_dtypes_for_respect_the_device() -> None:
    spec = make_spec([Tensor("x", "n")], dtypes=ALL_FLOATS)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgument, match="device='cuda'"):
            find(dtypes_for(spec, "cuda"), lambda v: True)
    elif not torch.cuda.is_bf16_supported():
        assert torch.bfloat16 not in set(collect_examples(dtypes_for(spec, "cuda"), 60))
    with pytest.raises(InvalidArgument, match="no dtype left"):
        dtypes_for(make_spec([Tensor("x", "n")], dtypes=(torch.float32,)), "cpu", dtypes=(torch.float64,))


@pytest.mark.parametrize("names", [("x",), ("q", "k", "v"), ("a", "b", "c", "d")])
def test_requires_grad_subsets_cover_every_subset(names: tuple[str, ...]) -> None:
    expected = {frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)}
    seen = set(collect_examples(requires_grad_subsets(names), 40 * len(expected)))
    assert seen == expected  # single inputs and the empty set included


def test_requires_grad_subsets_shrink_and_min_size() -> None:
    assert find(requires_grad_subsets(["q", "k", "v"]), lambda s: True) == frozenset()
    assert find(requires_grad_subsets(["q", "k", "v"]), lambda s: "v" in s) == frozenset({"v"})
    nonempty = set(collect_examples(requires_grad_subsets(["q", "k", "v"], min_size=1), 80))
    assert frozenset() not in nonempty and len(nonempty) == 7
    assert find(requires_grad_subsets(["q", "k"], min_size=2), lambda s: True) == frozenset({"q", "k"})
    assert find(requires_grad_subsets([]), lambda s: True) == frozenset()


@FAST
@given(st.data())
def test_layouts_are_really_non_contiguous_or_stride_zero(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4), label="ndim")
    layout = data.draw(layouts(ndim=ndim), label="layout")
    shape = data.draw(st.lists(st.integers(2, 4), min_size=ndim, max_size=ndim).map(tuple), label="shape")
    base = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    if layout == "expanded":
        base = base[..., :1].expand(shape).contiguous()  # only constant rows can be stride-0
    laid = apply_layout(base, layout)
    assert torch.equal(laid, base) and laid.shape == base.shape  # same values
    if layout == "contiguous":
        assert laid.is_contiguous()
    elif layout == "expanded":
        assert laid.stride()[-1] == 0
    elif layout == "offset":
        assert laid.storage_offset() > 0
    elif layout == "channels_last":
        assert laid.is_contiguous(memory_format=torch.channels_last) and not laid.is_contiguous()
    else:
        assert not laid.is_contiguous()


def test_layouts_filters() -> None:
    assert set(collect_examples(layouts(), 60)) == set(LAYOUTS)
    assert "expanded" not in set(collect_examples(layouts(allow_expanded=False), 60))
    assert set(collect_examples(layouts(ndim=1), 40)) == {"contiguous", "sliced", "offset", "expanded"}
    assert "channels_last" in set(collect_examples(layouts(ndim=4), 60))
    assert find(layouts(), lambda s: True) == "contiguous"
    with pytest.raises(InvalidArgument, match="'diagonal'"):
        layouts(kinds=("diagonal",))
    with pytest.raises(InvalidArgument, match="ndim=-1"):
        layouts(ndim=-1)
    with pytest.raises(InvalidArgument, match="no layout left"):
        layouts(kinds=("channels_last",), ndim=2)
    with pytest.raises(InvalidArgument, match="layout='diagonal'"):
        apply_layout(torch.zeros(2), "diagonal")


def test_requires_grad_subsets_validation() -> None:
    with pytest.raises(InvalidArgument, match=r"names=\['x', 'x'\]"):
        requires_grad_subsets(["x", "x"])
    with pytest.raises(InvalidArgument, match="min_size=3"):
        requires_grad_subsets(["x", "y"], min_size=3)
