"""Under xdist a row's contract tests go to one worker (conformance/plugin/scheduling.py), on
mock workers, as pytest-xdist tests its own schedulers."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.plugin.scheduling import FunctionScheduling, dist_named_by_user, row_of

ROWS = ("sdpa-cpu", "tanh-cpu", "tanh-cuda")


def _nodeid(contract: str, row: str) -> str:
    return f"conformance/test_{contract}.py::test_{contract}[{row}]"


# Collected Function by Function, as the plugin orders them; one test of the user's own at the end.
COLLECTION = [_nodeid(c, row) for row in ROWS for c in ("grad_meta", "reference", "stability")] + ["tests/test_mine.py::test_own[tanh-cpu]"]


class MockGateway:
    def __init__(self, name: str) -> None:
        self.id = name


class MockNode:
    """The part of xdist's WorkerController a scheduler uses."""

    def __init__(self, name: str) -> None:
        self.gateway = MockGateway(name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(pytester: pytest.Pytester, *nodes: MockNode) -> FunctionScheduling:
    config = pytester.parseconfig(f"--tx={len(nodes)}*popen")
    scheduler = FunctionScheduling(config, ROWS)
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    return scheduler


def _rows_of(node: MockNode) -> set[str | None]:
    return {row_of(COLLECTION[index], ROWS) for index in node.sent}


def _finish(scheduler: FunctionScheduling, node: MockNode, done: list[int]) -> None:
    for index in node.sent:
        if index not in done:
            done.append(index)
            scheduler.mark_test_complete(node, index)


def test_row_of_reads_the_parameter_id_of_known_rows_only() -> None:
    assert row_of(_nodeid("grad_meta", "tanh-cuda"), ROWS) == "tanh-cuda"
    assert row_of(_nodeid("grad_meta", "gelu-cpu"), ROWS) is None  # not a row of this run
    assert row_of("tests/test_mine.py::test_plain", ROWS) is None
    assert row_of("tests/test_mine.py::test_own[tanh-cpu", ROWS) is None


def test_a_dist_the_user_names_is_theirs() -> None:
    assert dist_named_by_user(["conformance", "-n", "2", "--dist", "load"], [])
    assert dist_named_by_user(["conformance", "--dist=loadfile"], [])
    assert dist_named_by_user(["conformance"], ["-q --dist=worksteal"])
    assert not dist_named_by_user(["conformance", "-n", "2", "--distance=3"], ["-q"])


def test_each_row_goes_to_one_worker_and_every_test_runs_once(pytester: pytest.Pytester) -> None:
    first, second = MockNode("gw0"), MockNode("gw1")
    scheduler = _scheduler(pytester, first, second)
    done: list[int] = []
    while not scheduler.tests_finished:
        progressed = len(done)
        for node in (first, second):
            _finish(scheduler, node, done)
        assert len(done) > progressed, "the scheduler stopped handing out work"
    assert sorted(first.sent + second.sent) == list(range(len(COLLECTION)))
    rows_first, rows_second = _rows_of(first) - {None}, _rows_of(second) - {None}
    assert rows_first and rows_second and not rows_first & rows_second, (rows_first, rows_second)
    for node in (first, second):  # each row's tests are sent back to back, in their collected order
        rows = [row_of(COLLECTION[index], ROWS) for index in node.sent]
        blocks = [row for position, row in enumerate(rows) if position == 0 or rows[position - 1] != row]
        assert len(blocks) == len(set(blocks)), rows
        for row in set(rows):
            indices = [index for index, its in zip(node.sent, rows) if its == row]
            assert indices == sorted(indices), (row, node.sent)


def test_a_crashed_test_is_not_run_again_and_the_rest_of_its_row_is(pytester: pytest.Pytester) -> None:
    first, second = MockNode("gw0"), MockNode("gw1")
    scheduler = _scheduler(pytester, first, second)
    row = next(iter(_rows_of(first) - {None}))
    tests = [index for index in first.sent if row_of(COLLECTION[index], ROWS) == row]
    scheduler.mark_test_complete(first, tests[0])  # the second test of the row crashes the worker
    crashed = scheduler.remove_node(first)
    assert crashed == COLLECTION[tests[1]]
    replacement = MockNode("gw2")
    scheduler.add_node(replacement)
    scheduler.add_node_collection(replacement, COLLECTION)
    scheduler.schedule()
    done: list[int] = [tests[0]]
    while not scheduler.tests_finished:
        progressed = len(done)
        for node in (second, replacement):
            _finish(scheduler, node, done)
        assert len(done) > progressed, "the scheduler stopped handing out work"
    rerun: list[Any] = second.sent + replacement.sent
    assert tests[1] not in rerun, "the test that crashed its worker ran again"
    assert all(index in rerun for index in tests[2:]), "the rest of the crashed row was lost"
    assert sorted([tests[0], tests[1], *rerun]) == list(range(len(COLLECTION)))
