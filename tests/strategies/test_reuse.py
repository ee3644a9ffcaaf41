"""strategies.reuse: one strategy object per arguments, never one shared by values Python finds
equal but a draw must tell apart (0 / False / 0.0, 0.0 / -0.0)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from strategies.reuse import just, reused, sampled


def test_the_same_arguments_give_the_same_object() -> None:
    assert sampled(("a", "b")) is sampled(("a", "b"))
    assert just(3) is just(3)
    assert reused(st.integers, min_value=0, max_value=5) is reused(st.integers, max_value=5, min_value=0)


@given(st.data())
def test_equal_values_of_other_types_or_signs_are_other_objects(data: st.DataObject) -> None:
    picked = [just(0), just(False), just(0.0), just(-0.0)]
    assert len({id(s) for s in picked}) == 4
    values = [data.draw(s) for s in picked]
    assert [type(v) for v in values] == [int, bool, float, float]
    assert str(values[3]) == "-0.0"
    assert sampled((1, 2)) is not sampled((1.0, 2.0))
    assert sampled((frozenset({1}),)) is not sampled((frozenset({True}),))


@given(st.data())
def test_unhashable_arguments_still_give_a_strategy(data: st.DataObject) -> None:
    first, second = just(([1],)), just(([1],))
    assert first is not second
    assert data.draw(first) == ([1],)


@given(st.data())
def test_reused_strategies_draw_what_fresh_ones_do(data: st.DataObject) -> None:
    assert data.draw(sampled((-0.0,))) == 0.0 and str(data.draw(sampled((-0.0,)))) == "-0.0"
    assert data.draw(just(True)) is True


def test_the_key_tells_apart_types_inside_nested_arguments_and_ignores_keyword_order() -> None:
    # dict and list make a new object per call: only the cache can hand back the same one.
    assert reused(dict, a=1, b=(2,)) is reused(dict, b=(2,), a=1)
    assert reused(dict, a=1, b=(2,)) is not reused(dict, a=1, b=(2.0,))
    assert reused(list, ((1, ("x", 0)),)) is reused(list, ((1, ("x", 0)),))
    assert reused(list, ((1, ("x", 0)),)) is not reused(list, ((1, ("x", False)),))
    assert reused(list, ((0.0,),)) is not reused(list, ((-0.0,),))
