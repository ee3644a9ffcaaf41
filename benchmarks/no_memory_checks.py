"""Benchmark-only pytest plugin (``-p no_memory_checks``, benchmarks/ on PYTHONPATH): the
suite's allocation checks -- poisoned, canary-margined allocations in every evaluation -- are
replaced by a no-op, so figure 6 can price them. Never for real runs: with it, an unwritten
element or a stray store goes unseen (or corrupts the heap)."""

from __future__ import annotations

import contextlib
from typing import Any


class NoAllocationChecks(contextlib.AbstractContextManager["NoAllocationChecks"]):
    """Stands in for conformance.engine.memory.Allocations: same attributes, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.allocations = 0
        self.canaries: list[Any] = []

    def __exit__(self, *exc: object) -> None:
        return None


def pytest_configure(config: Any) -> None:
    import conformance.engine.probe as probe

    probe.Allocations = NoAllocationChecks  # type: ignore[misc,assignment]
