"""Dim rules taken together (issue 28): for any set of rules, either every drawn size assignment
meets every rule, in every contract's case options (compile's growing sizes, stability's "single"
family, budgets that halve sizes), or the set is a SpecError at registration naming the conflict.

The oracle is independent of the suite's bound arithmetic: a set of rules is satisfiable iff
some assignment of small sizes meets them all, found by brute force. Small sizes suffice: dims
at their own minimum, raised along the ``max_size="<dim>"`` chain, stay below 24 here.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.spec import Dim, SpecError, Tensor
from strategies import CaseOptions, DimRule, cases, dim_sizes
from tests.conftest import REPO
from tests.strategies.helpers import checked_spec, collect_examples

NAMES = ("n", "f", "g")
SEARCHED = range(0, 25)
PROPERTY = settings(max_examples=120, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIND = settings(max_examples=300, database=None, deadline=None, derandomize=True)


@st.composite
def dim_declarations(draw: st.DrawFn) -> list[Dim]:
    """Up to three Dims with random bounds, multiples and ``max_size="<dim>"`` relations."""
    dims = []
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3), label="declared"):
        others = [other for other in NAMES if other != name]
        dims.append(Dim(
            name,
            min_size=draw(st.none() | st.integers(0, 6), label=f"{name}.min_size"),
            max_size=draw(st.none() | st.integers(1, 12) | st.sampled_from(others), label=f"{name}.max_size"),
            multiple_of=draw(st.sampled_from((1, 1, 2, 3, 4)), label=f"{name}.multiple_of"),
        ))
    return dims


def _in_a_cycle(dims: list[Dim]) -> bool:
    bound = {d.name: d.max_size for d in dims if isinstance(d.max_size, str)}
    for start in bound:
        seen, name = set(), start
        while name in bound:
            if name in seen:
                return True
            seen.add(name)
            name = bound[name]
    return False


def _meets(dims: list[Dim], sizes: dict[str, int], *, run_min: int) -> list[str]:
    """The rules ``sizes`` breaks (a dim without a min_size may be 0 only where the run allows)."""
    broken = []
    declared = {d.name: d for d in dims}
    for name, size in sizes.items():
        dim = declared.get(name, Dim(name))
        low = dim.min_size if dim.min_size is not None else min(run_min, 1)
        if size < low or size % dim.multiple_of:
            broken.append(f"{dim!r}: {name}={size}")
        if isinstance(dim.max_size, int) and size > dim.max_size:
            broken.append(f"{dim!r}: {name}={size}")
        if isinstance(dim.max_size, str) and dim.max_size in sizes and size > sizes[dim.max_size]:
            broken.append(f"{dim!r}: {name}={size} > {dim.max_size}={sizes[dim.max_size]}")
    return broken


def _satisfiable(dims: list[Dim], *, run_min: int = 1, extra_max: dict[str, int] | None = None) -> bool:
    """Some assignment of sizes in SEARCHED meets every rule (brute force, each dim's own rules first)."""
    declared = {d.name: d for d in dims}
    candidates = []
    for name in NAMES:
        dim = declared.get(name, Dim(name))
        high = min(h for h in (dim.max_size if isinstance(dim.max_size, int) else None, (extra_max or {}).get(name), SEARCHED[-1]) if h is not None)
        candidates.append([v for v in SEARCHED if v <= high and not _meets([dim], {name: v}, run_min=run_min)])
    relations = [(d.name, d.max_size) for d in dims if isinstance(d.max_size, str)]
    return any(
        all(sizes[f] <= sizes[n] for f, n in relations)
        for sizes in (dict(zip(NAMES, combo, strict=True)) for combo in itertools.product(*candidates))
    )


def _spec(dims: list[Dim]) -> Any:
    return checked_spec([Tensor("x", "n f"), Tensor("y", "g")], dims=dims)


case_options = st.builds(
    lambda low, extra, blocks, budget, unique: CaseOptions(
        min_size=low, max_size=low + extra, block_sizes=blocks, max_elements=budget, unique_dims=unique, max_batch_dims=0,
    ),
    st.integers(0, 3),  # 0: zero sizes; 2, 3: compile's growing sizes
    st.integers(0, 6),  # 0 with min_size=1: stability's "single" family
    st.sampled_from(((), (8,), (16,))),
    st.sampled_from((4, 16, 512)),  # small budgets halve the drawn sizes
    st.booleans(),
)


@PROPERTY
@given(st.data(), dim_declarations())
def test_rules_are_met_by_every_case_or_are_a_spec_error_naming_the_conflict(data: st.DataObject, dims: list[Dim]) -> None:
    if _in_a_cycle(dims) or not _satisfiable(dims):
        with pytest.raises(SpecError) as caught:
            _spec(dims)
        error = caught.value
        if "cycle" in error.problem:  # several dims at fault: each one in the cycle is echoed
            assert _in_a_cycle(dims) and error.field_name == "dims", str(error)
            assert all(repr(d) in error.problem for d in dims if isinstance(d.max_size, str) and f"{d.name!r} <=" in error.problem)
            return
        assert error.field_name.startswith("dims["), str(error)
        at_fault = dims[int(error.field_name.removeprefix("dims[").split("]")[0])]
        assert repr(at_fault) in error.problem, str(error)  # echoes the declaration
        assert f"{at_fault.name!r}" in error.problem and (
            "no legal size" in error.problem or "no multiple" in error.problem or "must be >= min_size" in error.problem
        ), str(error)
        return
    spec = _spec(dims)
    options = data.draw(case_options, label="options")
    case = data.draw(cases(spec, options), label="case")
    assert not _meets(dims, case.sizes, run_min=options.min_size), (options, case.sizes)


@st.composite
def rule_sets(draw: st.DrawFn) -> dict[str, DimRule]:
    rules = {}
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3), label="ruled"):
        low = draw(st.none() | st.integers(0, 6), label=f"{name}.min_size")
        high = draw(st.none() | st.integers(low or 0, 14), label=f"{name}.max_size")
        multiple = draw(st.sampled_from((1, 2, 3)), label=f"{name}.multiple_of")
        at_most = draw(st.none() | st.sampled_from([other for other in NAMES if other != name]), label=f"{name}.at_most")
        try:
            rules[name] = DimRule(min_size=low, max_size=high, multiple_of=multiple, at_most=at_most)
        except InvalidArgument:  # one dim's own bounds leave no size: DimRule's own validation
            continue
    return rules


def _as_dims(rules: dict[str, DimRule]) -> list[Dim]:
    return [
        Dim(name, min_size=r.min_size, max_size=r.at_most if r.at_most is not None else r.max_size, multiple_of=r.multiple_of)
        for name, r in rules.items()
    ]


@PROPERTY
@given(st.data(), rule_sets(), st.integers(0, 3), st.booleans())
def test_dim_sizes_meet_every_satisfiable_rule_set(data: st.DataObject, rules: dict[str, DimRule], low: int, unique: bool) -> None:
    # A DimRule may hold both max_size and at_most (a Dim one or the other): the oracle checks both.
    dims = _as_dims(rules)
    extra_max = {n: r.max_size for n, r in rules.items() if r.max_size is not None}
    if _in_a_cycle(dims) or not _satisfiable(dims, run_min=low, extra_max=extra_max):
        with pytest.raises(InvalidArgument):
            data.draw(dim_sizes(NAMES, rules=rules, min_size=low))
        return
    drawn = data.draw(dim_sizes(NAMES, rules=rules, min_size=low, max_size=low + 4, block_sizes=(8,), unique=unique))
    broken = _meets(dims, drawn, run_min=low) + [f"{n} > {m}" for n, m in extra_max.items() if drawn[n] > m]
    assert not broken, drawn


def test_the_issue_case_draws_n_at_least_the_smallest_legal_f() -> None:
    spec = _spec([Dim("f", multiple_of=2, max_size="n")])
    assert find(cases(spec), lambda c: True, settings=FIND).sizes == {"f": 2, "g": 1, "n": 2}
    # stability's "single" family: every dim as small as its rules allow, not 1 regardless.
    assert find(cases(spec, min_size=1, max_size=1, block_sizes=()), lambda c: True, settings=FIND).sizes == {"f": 2, "g": 1, "n": 2}
    # A failure that needs f == n > 2 still shrinks to the smallest such pair.
    assert find(cases(spec), lambda c: c.sizes["f"] == c.sizes["n"] > 2, settings=FIND).sizes["f"] == 4


def test_compile_growing_sizes_grow_where_the_rules_allow_and_stop_where_they_do_not() -> None:
    spec = _spec([Dim("f", multiple_of=2, max_size="n"), Dim("g", max_size=2)])
    for index in (1, 2):  # test_compile: later calls draw min_size=index + 1
        smallest = find(cases(spec, min_size=index + 1, max_size=max(7, index + 1)), lambda c: True, settings=FIND)
        assert smallest.sizes["n"] >= index + 1 and smallest.sizes["f"] >= index + 1, smallest.sizes
        assert smallest.sizes["f"] % 2 == 0 and smallest.sizes["f"] <= smallest.sizes["n"], smallest.sizes
        assert smallest.sizes["g"] == 2, smallest.sizes  # its max_size wins over the run's min_size


@pytest.mark.parametrize(
    ("dims", "field", "phrases"),
    [
        (
            [Dim("f", multiple_of=2, max_size="n"), Dim("n", max_size=1)], "dims[1]",
            ["Dim('n', max_size=1)", "Dim('f', max_size='n', multiple_of=2)", "dim 'n' has no legal size", ">= 2", "<= 1"],
        ),
        ([Dim("f", multiple_of=2, min_size=3, max_size=2)], "dims[0]", ["Dim('f', min_size=3, max_size=2, multiple_of=2)", "max_size=2"]),
        (
            [Dim("g", max_size="f"), Dim("f", min_size=5, max_size="n"), Dim("n", max_size=4)], "dims[2]",
            ["Dim('n', max_size=4)", "Dim('f', min_size=5, max_size='n')", "'f' >= 5 (min_size=5)"],
        ),
        (
            [Dim("n", max_size=5, multiple_of=3), Dim("f", max_size="n", min_size=4, multiple_of=2)], "dims[0]",
            ["dim 'n' has no legal size", ">= 6", "'f' >= 4 (min_size=4, multiple_of=2)", "<= 5 (max_size=5), a multiple of 3"],
        ),
        ([Dim("f", max_size="n"), Dim("n", max_size="g"), Dim("g", max_size="f")], "dims", ["cycle", "Dim('g', max_size='f')"]),
        ([Dim("f", max_size="q")], "dims[0].max_size", ["'q' is not a dim"]),
    ],
)
def test_conflicting_rules_are_a_spec_error_echoing_the_declarations(dims: list[Dim], field: str, phrases: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        _spec(dims)
    assert caught.value.field_name == field, str(caught.value)
    for phrase in phrases:
        assert phrase in caught.value.problem, (phrase, str(caught.value))


def test_a_rule_bound_wins_over_the_run_min_size_as_documented() -> None:
    drawn = collect_examples(dim_sizes(["n"], min_size=3, rules={"n": DimRule(max_size=2)}), 30)
    assert {s["n"] for s in drawn} == {2}


def test_the_documented_conflict_message_is_the_one_raised() -> None:
    with pytest.raises(SpecError) as caught:
        checked_spec(
            [Tensor("x", "*batch n"), Tensor("w", "f")],
            dims=[Dim("f", multiple_of=2, max_size="n"), Dim("n", max_size=1)], name="complex_gate",
        )
    assert f"\n    {caught.value}\n" in (REPO / "docs" / "specs.md").read_text(), str(caught.value)
