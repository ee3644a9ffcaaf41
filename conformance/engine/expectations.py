"""Expectations: known deviations, loaded from a JSON file, that xfail instead of failing.

Two forms are accepted::

    {"gradcheck[myop-cpu]": "reason", ...}                       # one test per entry
    [{"contract": "gradgradcheck", "function": "myop", "device": "cpu",
      "dtype": "float16", "reason": "..."}, ...]                  # any subset of the selectors

An entry without ``dtype`` xfails every test it selects. An entry with ``dtype`` xfails a test
only when the failing example is in that dtype; a failure in another dtype still fails.

Staleness is decided where every report arrives (the controller under xdist), against every
test the run *could* collect, so serial and ``-n 2`` runs agree: an entry that selects no test
of the registered Functions is stale, and so is one whose test passed (XPASS, or its dtype was
exercised without failing). An entry that selects several tests (a whole Function: its defect
fails one contract and blocks the others, which pass where it is not met) is stale only when none
of them deviated; its tests that pass are passes, never a strict XPASS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Expectation", "Expectations", "expected_in", "unmet"]

SELECTORS = ("contract", "function", "device", "dtype")
_KEY = re.compile(r"^(?P<contract>\w+)\[(?P<function>.+)-(?P<device>[a-z]+)\]$")


@dataclass(frozen=True)
class Expectation:
    """One known deviation: the tests it selects (``None`` selects any) and why."""

    reason: str
    contract: str | None = None
    function: str | None = None
    device: str | None = None
    dtype: str | None = None
    label: str = ""  # how the file wrote it, for messages

    @property
    def one_test(self) -> bool:
        """Whether the entry names one test (a contract, a function and a device, in every dtype)."""
        return None not in (self.contract, self.function, self.device) and self.dtype is None

    def selects(self, contract: str, function: str, device: str) -> bool:
        return all(
            wanted is None or wanted == got
            for wanted, got in ((self.contract, contract), (self.function, function), (self.device, device))
        )


@dataclass
class Expectations:
    """The entries of an ``--expectations`` file, and what the run saw of them."""

    path: str
    entries: tuple[Expectation, ...]
    strict: bool = False
    xpassed: set[str] = field(default_factory=set)  # labels of entries whose test passed
    deviated: set[str] = field(default_factory=set)  # labels of entries whose test failed as expected (xfailed)

    @classmethod
    def load(cls, path: str, *, strict: bool = False, dtypes: Iterable[str] = ()) -> Expectations:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as error:
            raise pytest.UsageError(f"--expectations={path}: cannot read it ({error})") from None
        except json.JSONDecodeError as error:
            raise pytest.UsageError(f"--expectations={path}: not valid JSON ({error})") from None
        if isinstance(data, dict):
            entries = tuple(_from_key(path, key, reason) for key, reason in data.items())
        elif isinstance(data, list):
            entries = tuple(_from_object(path, position, item, tuple(dtypes)) for position, item in enumerate(data))
        else:
            raise pytest.UsageError(_usage(path, f"got a JSON {type(data).__name__}"))
        return cls(path=path, entries=entries, strict=strict)

    def for_test(self, contract: str, function: str, device: str) -> list[Expectation]:
        return [e for e in self.entries if e.selects(contract, function, device)]

    def stale(self, possible_tests: Iterable[tuple[str, str, str]]) -> list[str]:
        """One line per stale entry: it selects none of ``possible_tests``, or its test passed."""
        possible = list(possible_tests)
        lines = [
            f"{e.label}: matches no test of the registered Functions"
            for e in self.entries
            if not any(e.selects(*test) for test in possible)
        ]
        lines += [f"{label}: passed, the deviation is gone" for label in sorted(self.xpassed - self.deviated)]
        return lines

    def one_test(self, label: str) -> bool:
        """Whether the entry written ``label`` names one test (see :attr:`Expectation.one_test`)."""
        return any(e.label == label and e.one_test for e in self.entries)


def expected_in(expectations: Sequence[Expectation], dtype: object) -> Expectation | None:
    """The dtype expectation (among a test's) that expects a failure in ``dtype`` (a torch dtype,
    or its name), else None."""
    name = str(dtype).removeprefix("torch.")
    return next((e for e in expectations if e.dtype == name), None)


def unmet(expectations: Sequence[Expectation], dtypes_seen: Iterable[object]) -> list[Expectation]:
    """The dtype expectations whose dtype was among ``dtypes_seen`` by a test that did not fail:
    their deviation did not occur, so they are stale."""
    chosen = [expected_in(expectations, dtype) for dtype in dtypes_seen]
    return [e for e in expectations if any(c is e for c in chosen)]


def _usage(path: str, problem: str) -> str:
    return (
        f"--expectations={path}: {problem}; write either a JSON object mapping \"contract[name-device]\" to a "
        'non-empty reason, e.g. {"gradgradcheck[myop-cpu]": "second derivative not implemented yet"}, or a list '
        'of objects with a "reason" and any of "contract", "function", "device", "dtype", e.g. '
        '[{"function": "myop", "dtype": "float16", "reason": "fp16 accumulation, tracked in #12"}]'
    )


def _from_key(path: str, key: Any, reason: Any) -> Expectation:
    match = _KEY.match(key) if isinstance(key, str) else None
    if match is None:
        raise pytest.UsageError(_usage(path, f"key {key!r} is not of the form contract[name-device]"))
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(_usage(path, f"{key!r} has no reason"))
    return Expectation(reason=reason, label=key, **match.groupdict())


def _from_object(path: str, position: int, item: Any, dtypes: tuple[str, ...]) -> Expectation:
    where = f"entry {position}"
    if not isinstance(item, dict):
        raise pytest.UsageError(_usage(path, f"{where} is a {type(item).__name__}, not an object"))
    unknown = sorted(set(item) - {*SELECTORS, "reason"})
    if unknown:
        raise pytest.UsageError(_usage(path, f"{where} has unknown keys {unknown}"))
    reason = item.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(_usage(path, f"{where} has no reason"))
    selectors = {k: item[k] for k in SELECTORS if item.get(k) is not None}
    if not selectors:
        raise pytest.UsageError(_usage(path, f"{where} selects every test; name a contract, function, device or dtype"))
    bad = [k for k, v in selectors.items() if not isinstance(v, str) or not v]
    if bad:
        raise pytest.UsageError(_usage(path, f"{where}: {bad} must be non-empty strings"))
    if dtypes and "dtype" in selectors and selectors["dtype"] not in dtypes:
        raise pytest.UsageError(_usage(path, f"{where}: dtype {selectors['dtype']!r} is not one of {', '.join(dtypes)}"))
    label = ", ".join(f"{k}={v}" for k, v in selectors.items())
    return Expectation(reason=reason, label=f"[{label}]", **selectors)
