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
    ``0``, ``False`` and ``0.0`` are equal keys to a dict, but not the same draw."""
    key = (factory, _typed(args), _typed(tuple(sorted(kwargs.items()))))
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


def _typed(value: Any) -> Any:
    """``value`` as a key that tells apart values Python finds equal (1 and 1.0 and True, 0.0
    and -0.0), inside tuples and frozensets too."""
    if isinstance(value, (float, complex)):
        return type(value), repr(value)
    if isinstance(value, tuple):
        return type(value), tuple(_typed(item) for item in value)
    if isinstance(value, frozenset):
        return frozenset, frozenset(_typed(item) for item in value)
    return type(value), value


def sampled(values: tuple[_Value, ...]) -> st.SearchStrategy[_Value]:
    """``st.sampled_from(values)``, one object per tuple of values."""
    return reused(st.sampled_from, tuple(values))


def just(value: _Value) -> st.SearchStrategy[_Value]:
    """``st.just(value)``, one object per value when the value is hashable."""
    return reused(st.just, value)
