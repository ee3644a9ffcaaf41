"""Small reusable checks for spec fields, in the style of ``hypothesis.internal.validation``.

Each ``check_*`` raises :class:`SpecError` (built by the caller's ``fail``, which knows the spec's
name) naming the field and echoing the bad value; each ``is_*`` is the predicate behind one.
Nothing here knows an input kind or a spec: the validators of :mod:`conformance.spec.validation`
are made of these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis.strategies import SearchStrategy

__all__ = [
    "IDENT",
    "NAME",
    "Fail",
    "SpecError",
    "check_bool",
    "check_callable",
    "check_listed",
    "check_optional_count",
    "check_sequence",
    "is_count",
    "is_identifier",
    "is_int",
    "is_number",
    "is_real",
    "is_strategy",
]

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")  # safe inside a pytest node id


class SpecError(ValueError):
    """A registered spec cannot work; the message names the spec and the field."""

    def __init__(self, spec_name: str, field_name: str, problem: str) -> None:
        self.spec_name = spec_name
        self.field_name = field_name
        self.problem = problem
        super().__init__(f"conformance spec {spec_name!r}, field {field_name!r}: {problem}")


# ``fail(field, problem)``: the SpecError to raise, for the spec being checked.
Fail = Callable[[str, str], SpecError]


def is_int(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any, low: int) -> bool:
    """An int (not a bool) of at least ``low``."""
    return is_int(value) and bool(value >= low)


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (maybe infinite or nan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_identifier(value: Any) -> bool:
    """A string that is a Python identifier (ASCII): an argument or dim name."""
    return isinstance(value, str) and IDENT.match(value) is not None


def is_real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return is_number(value) and math.isfinite(value)


def is_strategy(value: Any) -> bool:
    """A Hypothesis strategy (a Scalar drawn per example)."""
    return isinstance(value, SearchStrategy)


def check_bool(value: Any, fail: Fail, where: str) -> None:
    """``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise fail(where, f"must be True or False, got {value!r}")


def check_callable(value: Any, fail: Fail, where: str, *, prefix: str = "", hint: str = "") -> None:
    """``value`` is callable; the message is ``<prefix><value!r> is not callable<hint>``."""
    if not callable(value):
        raise fail(where, f"{prefix}{value!r} is not callable{hint}")


def check_sequence(
    value: Any,
    fail: Fail,
    where: str,
    problem: str,
    *,
    kinds: type | tuple[type, ...] = Sequence,
    exclude: type | tuple[type, ...] = (str, bytes),
    non_empty: bool = False,
) -> None:
    """``value`` is one of ``kinds`` (a sequence by default) but none of ``exclude`` (strings and
    bytes by default), and with ``non_empty`` not empty; ``problem`` says what was wanted (and
    echoes ``value``)."""
    if isinstance(value, exclude) or not isinstance(value, kinds) or (non_empty and not value):
        raise fail(where, problem)


def check_listed(value: Any, choices: Sequence[Any], fail: Fail, where: str, problem: str) -> None:
    """``value`` is one of ``choices``; ``problem`` names them (and echoes ``value``)."""
    if value not in choices:
        raise fail(where, problem)


def check_optional_count(value: Any, fail: Fail, where: str, *, low: int, problem: str) -> None:
    """``value`` is None or an int (not a bool) of at least ``low``."""
    if value is not None and not is_count(value, low):
        raise fail(where, problem)
