"""One strategy object per arguments: Hypothesis validates a strategy object (and computes its
emptiness and reuse properties) on its first draw, and a case draws these on every example, so a
strategy built anew per draw costs that work every time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from hypothesis import strategies as st

__all__ = ["just", "reused", "sampled"]

_Made = TypeVar("_Made")
_Value = TypeVar("_Value")


def reused(factory: Callable[..., _Made], *args: Any, **kwargs: Any) -> _Made:
    """``factory(*args, **kwargs)``, one object per (hashable) arguments of the same types:
    ``0``, ``False`` and ``0.0`` are equal keys to a dict, but not the same draw, so the key
    holds the arguments' ``repr`` beside them (it tells those apart, inside tuples too, at a
    third of the cost of walking them)."""
    named = tuple(sorted(kwargs.items())) if kwargs else ()
    key = (factory, args, named, repr(args), repr(named) if named else "")
    try:
        made = _MADE.get(key)
    except TypeError:  # an unhashable argument (a list inside a tuple): a new object, as without this
        return factory(*args, **kwargs)
    if made is None:
        if len(_MADE) >= _MAX_MADE:
            _MADE.clear()
        made = _MADE[key] = factory(*args, **kwargs)
    return cast(_Made, made)


_MAX_MADE = 4096
_MADE: dict[Any, Any] = {}


def sampled(values: tuple[_Value, ...]) -> st.SearchStrategy[_Value]:
    """``st.sampled_from(values)``, one object per tuple of values."""
    return reused(st.sampled_from, tuple(values))


def just(value: _Value) -> st.SearchStrategy[_Value]:
    """``st.just(value)``, one object per value when the value is hashable."""
    return reused(st.just, value)
