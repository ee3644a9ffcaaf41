"""cases(spec, ...): every family wired in and driven by the spec's symbolic shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.spec import Index, Mask, Scalar, Tensor
from strategies import cases, fit_to_budget, shape_of
from tests.strategies.helpers import collect_examples, make_spec

FAST = settings(max_examples=30, database=None, deadline=None)
FIND = settings(max_examples=300, database=None, deadline=None, derandomize=True)

ATTENTION = make_spec(
    [
        Tensor("q", "*batch sq d"),
        Tensor("k", "*batch sk d"),
        Tensor("v", "*batch sk dv"),
        Mask("mask", "*batch sq sk"),
        Tensor("bias", "sk", broadcastable=True),
        Index("ids", "sq", high="sk"),
        Scalar("scale", st.floats(0.1, 2.0)),
        Tensor("w", "d dv", requires_grad=False, domain="positive"),
    ],
    dtypes=(torch.float32, torch.float64),
)


def _symbolic_shape(spec_input, case) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return shape_of(spec_input, case.sizes, case.batches)


@FAST
@given(cases(ATTENTION, max_elements=256, block_sizes=(16, 32)))
def test_shapes_match_the_spec_and_shared_dims_agree(case) -> None:  # type: ignore[no-untyped-def]
    args = dict(zip((r.name for r in case.recipes), case.args(), strict=True))
    for spec_input in ATTENTION.inputs:
        if spec_input.kind == "scalar":
            assert 0.1 <= args[spec_input.name] <= 2.0
            continue
        assert tuple(args[spec_input.name].shape) == _symbolic_shape(spec_input, case)
        assert args[spec_input.name].numel() <= 256  # the element budget
    q, k, v = args["q"], args["k"], args["v"]
    assert q.shape[:-2] == k.shape[:-2] == v.shape[:-2] == args["mask"].shape[:-2]  # one *batch
    assert q.shape[-1] == k.shape[-1] == args["w"].shape[0]  # d shared
    assert k.shape[-2] == v.shape[-2] == args["mask"].shape[-1] == args["bias"].shape[0]  # sk shared
    assert args["mask"].dtype == torch.bool and args["ids"].dtype == torch.int64
    assert args["ids"].numel() == 0 or int(args["ids"].max()) < case.sizes["sk"]
    assert bool((args["w"] > 0).all()) and not args["w"].requires_grad
    assert case.requires_grad == {"q", "k", "v", "bias"}  # default: every differentiable input


def test_cases_reach_seqlen_q_ne_k_single_key_and_block_sizes() -> None:
    spec = make_spec([Tensor("q", "sq d"), Tensor("k", "sk d")])
    assert find(cases(spec), lambda c: c.sizes["sq"] != c.sizes["sk"], settings=FIND)
    assert find(cases(spec), lambda c: c.sizes["sk"] == 1 and c.sizes["sq"] > 1, settings=FIND)
    found = find(cases(spec, block_sizes=(32,), max_elements=4096), lambda c: c.sizes["d"] == 33, settings=FIND)
    assert found.sizes["d"] == 33


def test_batch_expands_to_zero_or_more_dims() -> None:
    spec = make_spec([Tensor("x", "*batch n")])
    assert find(cases(spec), lambda c: True).batches == {"batch": ()}
    assert len(find(cases(spec, max_batch_dims=3), lambda c: len(c.batches["batch"]) == 3, settings=FIND).batches["batch"]) == 3


def test_zero_size_dims_when_asked() -> None:
    spec = make_spec([Tensor("x", "n d")])
    case = find(cases(spec, min_size=0), lambda c: 0 in c.sizes.values(), settings=FIND)
    assert 0 in case.args()[0].shape
    with pytest.raises(Exception):  # noqa: B017 - never a zero size unless min_size=0
        find(cases(spec), lambda c: 0 in c.sizes.values(), settings=settings(FIND, max_examples=100))


@FAST
@given(cases(make_spec([Tensor("x", "*batch n d"), Tensor("b", "*batch n d", broadcastable=True)]), broadcast=True))
def test_broadcast_shapes_really_broadcast(case) -> None:  # type: ignore[no-untyped-def]
    x, b = case.args()
    assert torch.broadcast_shapes(x.shape, b.shape) == x.shape
    assert (x + b).shape == x.shape


def test_broadcast_reaches_dropped_and_size_one_dims() -> None:
    spec = make_spec([Tensor("x", "m n"), Tensor("b", "m n", broadcastable=True)])
    dropped = find(cases(spec, broadcast=True), lambda c: len(c.recipes[1].shape) == 1, settings=FIND)
    ones = find(cases(spec, broadcast=True), lambda c: c.recipes[1].shape[:1] == (1,) and c.sizes["m"] > 1, settings=FIND)
    assert dropped.recipes[1].shape == (dropped.sizes["n"],) or dropped.recipes[1].shape == (1,)
    assert ones.recipes[1].shape[0] == 1


def test_element_budget_is_respected_and_shrinkable() -> None:
    spec = make_spec([Tensor("x", "*batch n d"), Tensor("w", "d d")])
    sizes, batches = fit_to_budget(spec, {"n": 129, "d": 65}, {"batch": (4, 4)}, 64)
    assert all(len(shape_of(i, sizes, batches)) and torch.Size(shape_of(i, sizes, batches)).numel() <= 64 for i in spec.inputs)

    @FAST
    @given(cases(spec, max_elements=100, block_sizes=(64, 128)))
    def within(case) -> None:  # type: ignore[no-untyped-def]
        assert all(t.numel() <= 100 for t in case.args())

    within()


def test_requires_grad_subsets_in_cases() -> None:
    spec = make_spec([Tensor("x", "n"), Tensor("y", "n"), Tensor("c", "n", requires_grad=False)])
    seen = {case.requires_grad for case in collect_examples(cases(spec, requires_grad="subsets"), 100)}
    assert seen == {frozenset(), frozenset({"x"}), frozenset({"y"}), frozenset({"x", "y"})}
    assert find(cases(spec, requires_grad="nonempty"), lambda c: True).requires_grad == frozenset({"x"})
    case = find(cases(spec, requires_grad="subsets"), lambda c: c.requires_grad == {"y"}, settings=FIND)
    assert [a.requires_grad for a in case.args()] == [False, True, False]


def test_layouts_in_cases_are_really_strided_and_leaves() -> None:
    spec = make_spec([Tensor("x", "m n")])
    expanded = find(cases(spec, layouts=("expanded",)), lambda c: c.sizes["n"] > 1, settings=FIND)
    (x,) = expanded.args()
    assert x.stride()[-1] == 0 and x.is_leaf and x.requires_grad  # an expanded leaf, stride 0
    transposed = find(cases(spec, layouts=("transposed",)), lambda c: min(c.sizes.values()) > 1, settings=FIND)
    (x,) = transposed.args()
    assert not x.is_contiguous() and x.is_leaf
    assert torch.equal(x, transposed.args()[0].contiguous())


def test_mask_kinds_and_patterns_are_wired() -> None:
    spec = make_spec([Tensor("x", "sq sk"), Mask("mask", "sq sk")])
    case = find(cases(spec, mask_kinds=("masked_rows",)), lambda c: True)
    assert not bool(case.args()[1][0].any())  # a fully masked row
    causal = find(cases(spec, mask_kinds=("causal",)), lambda c: min(c.sizes.values()) > 1, settings=FIND)
    assert not bool(causal.args()[1][0, -1])  # the first query cannot see the last key
    ties = find(cases(spec, value_patterns=("ties",)), lambda c: c.sizes["sk"] > 4, settings=FIND)
    x = ties.args()[0]
    assert x.unique().numel() < x.numel()
    assert "pattern='ties'" in ties.repro()


@FAST
@given(st.data())
def test_same_draws_same_tensors(data: st.DataObject) -> None:
    case = data.draw(cases(ATTENTION, layouts=("contiguous", "sliced"), grad_output_kinds=("random", "per_row")), label="case")
    first, second = case.args(), case.args()
    for a, b in zip(first, second, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a is not b  # fresh tensors, identical values
    outs = [torch.zeros(3, 4)]
    assert torch.equal(case.grad_outputs(outs)[0], case.grad_outputs(outs)[0])


def _tensors_of_first_examples() -> list[torch.Tensor]:
    collected: list[torch.Tensor] = []

    @settings(max_examples=5, database=None, deadline=None, derandomize=True)
    @given(cases(ATTENTION, extreme=True))
    def collect(case) -> None:  # type: ignore[no-untyped-def]
        collected.extend(a for a in case.args() if isinstance(a, torch.Tensor))

    collect()
    return collected


def test_same_seed_same_case_values() -> None:
    first, second = _tensors_of_first_examples(), _tensors_of_first_examples()
    assert len(first) == len(second) > 0
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_failing_example_prints_labelled_draws() -> None:
    spec = make_spec([Tensor("x", "n")])

    @settings(max_examples=20, database=None, deadline=None, derandomize=True, report_multiple_bugs=False)
    @given(st.data())
    def failing(data: st.DataObject) -> None:
        case = data.draw(cases(spec), label="case")
        assert case.sizes["n"] < 2

    with pytest.raises(AssertionError) as info:
        failing()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Draw 1 (case): Case(" in notes and "x: tensor(2,)" in notes  # shrunk to n = 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requires_grad": "some"}, "requires_grad='some'"),
        ({"max_elements": 0}, "max_elements=0"),
        ({"layouts": ("diagonal",)}, "diagonal"),
        ({"mask_kinds": ()}, "mask_kinds=\\[\\]"),
        ({"grad_output_kinds": ("ones",)}, "ones"),
        ({"value_patterns": ("sorted",)}, "sorted"),
        ({"dtypes": ()}, "dtypes=\\(\\)"),
        ({"max_batch_dims": -1}, "max_batch_dims=-1"),
        ({"min_size": 5, "max_size": 2}, "max_size=2"),
        ({"block_sizes": (0,)}, "block_sizes=\\(0,\\)"),
    ],
)
def test_bad_arguments_raise_invalid_argument(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument, match=message):
        find(cases(ATTENTION, **kwargs), lambda c: True)
