"""Collection: what each contract test checks, which tests the run keeps, what expectations mark
them, and the command that reruns one.

Every collected contract test carries its ``(contract, function, device)`` in
``item.user_properties`` under :data:`TEST_PROPERTY` (it travels with every report, also from
xdist workers and forked children), and its :class:`ContractTest` in ``item.stash``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import pytest

from autograd_conformance_plugin import CONTRACT_FIXTURE
from conformance.engine.contract import ContractInfo, contract_of
from conformance.engine.expectations import Expectation, Expectations
from conformance.engine.verdict import Outcome, Verdict
from conformance.plugin.devices import cuda_usable, no_cuda_reason
from conformance.plugin.options import RunOptions
from conformance.spec import Spec

__all__ = [
    "EXPECTATION_PROPERTY",
    "TEST_PROPERTY",
    "ContractTest",
    "apply_expectations",
    "contract_test",
    "contract_test_key",
    "deselect",
    "dtype_expectations_key",
    "keep_shard",
    "not_run_here_key",
    "report_not_run_here",
    "rerun_command",
    "shard_of_rows",
    "skip_without_cuda",
]

# user_properties keys a contract test's reports carry to the controller (also under xdist).
TEST_PROPERTY = "conformance_test"  # (contract, function, device)
EXPECTATION_PROPERTY = "conformance_expectation"  # label of the entry that xfails it


@dataclasses.dataclass(frozen=True)
class ContractTest:
    """What one collected contract test checks: put in ``item.stash`` at collection, from the
    test function's :func:`~conformance.engine.contract.contract` declaration and its parameter."""

    contract: ContractInfo
    spec: Spec
    device: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.contract.name, self.spec.name, self.device


contract_test_key = pytest.StashKey[ContractTest]()
dtype_expectations_key = pytest.StashKey[tuple[Expectation, ...]]()
not_run_here_key = pytest.StashKey[str]()  # why a test cannot run on this machine (its skip reason)


def contract_test(item: pytest.Item) -> ContractTest | None:
    """What a contract test item checks (its declaration and parameter), else None."""
    info = contract_of(getattr(item, "function", None))
    callspec = getattr(item, "callspec", None)
    if info is None or callspec is None or CONTRACT_FIXTURE not in callspec.params:
        return None
    spec, device = callspec.params[CONTRACT_FIXTURE]
    return ContractTest(contract=info, spec=spec, device=device)


def mark_contract_tests(items: list[pytest.Item], expectations: Expectations | None) -> None:
    """Stash what each contract test checks, label its reports, and mark what expectations expect."""
    for item in items:
        test = contract_test(item)
        if test is None:
            continue
        item.stash[contract_test_key] = test
        item.user_properties.append((TEST_PROPERTY, test.key))
        if expectations is not None:
            apply_expectations(item, test.key, expectations)


def skip_without_cuda(items: list[pytest.Item], run_dir: Path, options: RunOptions) -> None:
    """On a machine without usable CUDA, a ``-cuda`` contract test is skipped at setup, before its
    fixture builds a Target (about 1 ms a test, ~1,400 tests in the main job). Its verdict (not
    run here, with the reason and the command that reruns it elsewhere) is recorded now; the
    fixture still says the same should the skip mark be ignored (``-p no:skipping``)."""
    cuda_tests = [item for item in items if (test := item.stash.get(contract_test_key, None)) is not None and test.device == "cuda"]
    if not cuda_tests or cuda_usable():
        return
    reason = no_cuda_reason()
    for item in cuda_tests:
        verdict = Verdict(Outcome.NOT_RUN_HERE, reason, rerun=rerun_command(run_dir, item, options, "cuda"))
        item.user_properties.append(verdict.as_property())
        item.add_marker(pytest.mark.skip(reason=verdict.describe()))
        item.stash[not_run_here_key] = verdict.describe()


def report_not_run_here(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Report a test :func:`skip_without_cuda` marked as pytest would (logstart, a skipped setup
    report, a passed teardown report, logfinish), without pytest's setup and teardown hooks
    around it: they cost ~0.6 ms a test, ~1,400 tests in the main job. False (pytest runs the
    test as usual) for any other test, or where this pytest keeps its setup state elsewhere.
    Plugins that read ``pytest_runtest_makereport`` do not see these reports; the reports
    themselves (terminal, JUnit XML, xdist, the outcome matrix) are the same."""
    reason = item.stash.get(not_run_here_key, None)
    setup_state = getattr(item.session, "_setupstate", None)
    if reason is None or not hasattr(setup_state, "teardown_exact"):
        return False
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    started = time.perf_counter()
    path, line = item.reportinfo()[:2]
    keywords: dict[str, Literal[1]] = {name: 1 for name in item.keywords}
    ihook.pytest_runtest_logreport(report=pytest.TestReport(
        item.nodeid, item.location, keywords, "skipped", (os.fspath(path), (line or 0) + 1, f"Skipped: {reason}"), "setup",
        user_properties=item.user_properties, duration=time.perf_counter() - started,
    ))
    started = time.perf_counter()
    # What an earlier test kept set up for this one, and this one's nextitem does not need.
    assert setup_state is not None
    setup_state.teardown_exact(nextitem)
    ihook.pytest_runtest_logreport(report=pytest.TestReport(
        item.nodeid, item.location, keywords, "passed", None, "teardown", user_properties=item.user_properties,
        duration=time.perf_counter() - started,
    ))
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def apply_expectations(item: pytest.Item, key: tuple[str, str, str], expectations: Expectations) -> None:
    """An entry without a dtype xfails the whole test; those with one go to the runner, which
    xfails a failure in that dtype only."""
    matching = expectations.for_test(*key)
    whole = [e for e in matching if e.dtype is None]
    if whole:
        # Strict per test only for an entry that names this one test: a whole Function's entry
        # is stale when none of its tests deviates (Expectations.stale), not when one passes.
        item.add_marker(pytest.mark.xfail(
            reason=f"expected deviation {whole[0].label}: {whole[0].reason}", strict=expectations.strict and whole[0].one_test,
        ))
        item.user_properties.append((EXPECTATION_PROPERTY, whole[0].label))
    item.stash[dtype_expectations_key] = tuple(e for e in matching if e.dtype is not None)


def deselect(config: pytest.Config, items: list[pytest.Item], options: RunOptions) -> None:
    """Keep the contracts --contracts names, without those --skip-contracts names."""
    wanted, unwanted = set(options.contracts), set(options.skip_contracts)
    if not wanted and not unwanted:
        return
    kept, dropped = [], []
    for item in items:
        test = item.stash.get(contract_test_key, None)
        name = test.contract.name if test is not None else None
        if name is not None and ((wanted and name not in wanted) or name in unwanted):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def function_by_function(items: list[pytest.Item], *, slow: Callable[[Spec, str], bool] = lambda spec, device: False) -> None:
    """Order the contract tests Function by Function (each Function's contracts in their collected
    order), so that the tests sharing a Function's evaluations (:mod:`conformance.engine.pool`) run
    one after another; every other item keeps its place.

    The rows ``slow(spec, device)`` names (Triton kernels under the interpreter: 5 of the main job's
    60 Functions, 40% of its time) go first, in their collected order: xdist hands out rows in
    this order, and a long row handed out last keeps one worker busy while the others wait."""
    places = [index for index, item in enumerate(items) if item.stash.get(contract_test_key, None) is not None]
    tests = [items[index] for index in places]
    order: dict[tuple[str, str], tuple[bool, int]] = {}
    for item in tests:
        test = item.stash[contract_test_key]
        row = (test.spec.name, test.device)
        if row not in order:
            order[row] = (not slow(test.spec, test.device), len(order))
    tests.sort(key=lambda item: order[(item.stash[contract_test_key].spec.name, item.stash[contract_test_key].device)])
    for index, item in zip(places, tests):
        items[index] = item


def shard_of_rows(tests_per_row: Mapping[tuple[str, str], int], shards: int) -> dict[tuple[str, str], int]:
    """Slice (1..shards) of each (function, device) row: each device's rows spread over every slice,
    the largest first, each to the slice with the fewest tests of that device so far (the lowest on
    ties). A runner without CUDA skips every CUDA row: balanced over all rows at once, one slice of a
    CPU-only run got the CUDA rows and ran nothing (a new user's trial). Depends only on the rows and
    their counts, so every machine of a sharded run computes the same slices."""
    load: dict[str, list[int]] = {}
    assigned = {}
    for row, count in sorted(tests_per_row.items(), key=lambda entry: (entry[0][1], -entry[1], entry[0])):
        device_load = load.setdefault(row[1], [0] * shards)
        lightest = min(range(shards), key=lambda index: (device_load[index], index))
        assigned[row] = lightest + 1
        device_load[lightest] += count
    return assigned


def keep_shard(config: pytest.Config, items: list[pytest.Item], shard: tuple[int, int]) -> None:
    """Keep the contract tests of slice ``shard`` = (K, N); other items stay in slice 1."""
    index, count = shard
    rows = []
    for item in items:
        test = item.stash.get(contract_test_key, None)
        rows.append(None if test is None else (test.spec.name, test.device))
    slices = shard_of_rows(Counter(row for row in rows if row is not None), count)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item, row in zip(items, rows):
        (kept if (1 if row is None else slices[row]) == index else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@functools.lru_cache(maxsize=256)  # asked once per test, with a few distinct files
def _contract_file(run_dir: Path, path: Path) -> tuple[str, ...]:
    """A contract file as the rerun command names it: its path relative to ``run_dir`` (a copy in
    the directory pytest ran in), else ``--pyargs`` and its module (an installed copy)."""
    run_dir, path = run_dir.resolve(), path.resolve()
    if run_dir in path.parents and not {"site-packages", "dist-packages"} & set(path.parts):
        return (os.path.relpath(path, run_dir),)
    return ("--pyargs", f"conformance.{path.stem}")


def rerun_command(run_dir: Path, item: pytest.Item, options: RunOptions, device: str) -> str:
    """The command that replays ``item``'s examples, for how this suite was loaded.

    A copy inside the directory pytest ran in (checkout, vendored) is named by path; an
    installed one by ``--pyargs``. ``python -m pytest`` puts that directory on ``sys.path``
    like the run had it. Every option that shapes the examples is spelled out.
    """
    *flags, where = _contract_file(run_dir, Path(item.path))
    target = [*flags, f"{where}::{item.name}"]
    parts = ["python", "-m", "pytest", *target, f"--impl={options.impl}", f"--device={device}",
             f"--seed={options.seed}", f"--profile={options.profile}"]
    if options.max_examples is not None:
        parts.append(f"--max-examples={options.max_examples}")
    if options.dtypes is not None:
        parts.append("--dtypes=" + ",".join(options.dtypes))
    if not options.default_threads:
        parts.append(f"--threads={options.threads}")  # a parallel reduction's order follows it
    return shlex.join(parts)
