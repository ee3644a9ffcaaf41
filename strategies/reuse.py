"""One strategy object per arguments: Hypothesis validates a strategy object (and computes its
emptiness and reuse properties) on its first draw, and a case draws these on every example, so a
strategy built anew per draw costs that work every time."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from hypothesis import strategies as st

__all__ = ["just", "reused", "sampled"]

_Made = TypeVar("_Made")
_Value = TypeVar("_Value")


def reused(factory: Callable[..., _Made], *args: Any, **kwargs: Any) -> _Made:
    """``factory(*args, **kwargs)``, one object per (hashable) arguments."""
    return cast(_Made, _made(factory, *args, **kwargs))


@functools.lru_cache(maxsize=4096)
def _made(factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return factory(*args, **kwargs)


def sampled(values: tuple[_Value, ...]) -> st.SearchStrategy[_Value]:
    """``st.sampled_from(values)``, one object per tuple of values."""
    return reused(st.sampled_from, tuple(values))


def just(value: _Value) -> st.SearchStrategy[_Value]:
    """``st.just(value)``, one object per value when the value is hashable."""
    if isinstance(value, Hashable):
        try:
            return reused(st.just, value)
        except TypeError:  # hashable type, unhashable contents (a tuple holding a list)
            pass
    return st.just(value)
