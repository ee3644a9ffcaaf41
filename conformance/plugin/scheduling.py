"""Under pytest-xdist, a Function's contract tests go to one worker together.

The tests of one row (a Function on one device) share that Function's plain evaluations
(:mod:`conformance.engine.pool`); xdist's default ``--dist load`` hands consecutive tests to
alternating workers, so each worker's pool sees only part of a row and evaluates again what
the other worker already has. :class:`FunctionScheduling` makes each row one unit of work
(xdist's ``loadscope`` machinery with the row as the scope); any other test is a unit of its own.
Collection puts the rows known to be slowest first (:func:`~conformance.plugin.collection.function_by_function`),
so the last unit a worker takes is a short one.

It replaces xdist's default only: an explicit ``--dist`` (any mode, ``load`` included) is
the user's choice and is left alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable

import pytest
from xdist.scheduler.loadscope import LoadScopeScheduling
from xdist.workermanage import WorkerController

__all__ = ["FunctionScheduling", "dist_named_by_user", "row_of"]


def row_of(nodeid: str, rows: Collection[str]) -> str | None:
    """The row (``"<function>-<device>"``, the test's parameter id) of a contract test's node id,
    or None for a test that is not one of ``rows``'s."""
    head, bracket, tail = nodeid.rpartition("[")
    if not bracket or "::" not in head or not tail.endswith("]"):
        return None
    row = tail[:-1]
    return row if row in rows else None


def dist_named_by_user(args: Iterable[str], addopts: Iterable[str]) -> bool:
    """Whether the command line, ``PYTEST_ADDOPTS`` or the ini ``addopts`` name a ``--dist``."""
    return any(arg == "--dist" or arg.startswith("--dist=") for arg in args) or any(
        word == "--dist" or word.startswith("--dist=") for text in addopts for word in shlex.split(text)
    )


class FunctionScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped here
    """xdist's scope scheduling with a row (a Function on one device) as the scope.

    A worker that crashes is replaced; the test that was running when it crashed is reported by
    xdist (and the suite's crash report) and not run again, the rest of its row goes back to the
    queue (``loadscope`` itself would queue the crashed test again, and crash again)."""

    def __init__(self, config: pytest.Config, rows: Collection[str], log: object | None = None) -> None:
        super().__init__(config, log)
        self.rows = frozenset(rows)

    def _split_scope(self, nodeid: str) -> str:
        row = row_of(nodeid, self.rows)
        return nodeid if row is None else f"row {row}"

    def remove_node(self, node: WorkerController) -> str | None:
        workload = self.assigned_work.pop(node)
        pending: list[str] = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crashed = pending[0]  # a worker runs its units in the order it got them
        for scope, unit in workload.items():
            if crashed in unit:
                unit[crashed] = True
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed
