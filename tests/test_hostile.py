"""Hostile Functions never take the run down (tests/zoo/hostile.py).

Hangs in forward and backward, a hang signals cannot reach, os._exit, a segfault, sys.exit and a
self-raised KeyboardInterrupt run next to a correct Function and Functions that leak global
state, in one run: serially under --isolate, and under -n 2 without it (xdist restarts crashed
workers; the suite fills in their reports). The run finishes, every hostile Function fails once
(the other contract that met its act is blocked by that failure) with a message naming what it
did and where, the correct one passes, and the leaks fail global_state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.engine.watchdog import RunEnding
from conformance.plugin.outcomes import Cell, OutcomeMatrix
from tests.conftest import ZOO

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = "gradcheck,global_state"  # what the checks read: each more contract costs each hang a timeout
TIMEOUT = 10  # seconds per example: well above a first example's lazy imports on a loaded 2-core machine (5 s was once exceeded under -n 2 with other load), far below a hang

# What each hostile Function's gradcheck failure must say (its summary line).
EXPECTED: dict[str, str | tuple[str, ...]] = {
    "hangs_in_forward": "should finish [hung in forward of HangsInForward (hostile.py:",
    "hangs_in_backward": "should finish [hung in backward of HangsInBackward (hostile.py:",
    # Serially the blocked signal leaves only the hard deadline; under xdist another thread of the
    # worker takes the signal and the soft one fires: either way the hang fails in time.
    "hangs_natively": ("did not return within its time budget, so the process was ended", "should finish [hung in forward of HangsNatively"),
    "exits_in_backward": "the process died while running this test",
    "segfaults_in_forward": "the process died while running this test",
    "calls_sys_exit": "sys.exit('unsupported input') was called, but a Function should never exit the program",
    "raises_keyboard_interrupt": "raised KeyboardInterrupt itself, but should never",
}


HOSTILE_MODES = {"serial-isolate": ("--isolate",), "xdist-2": ("-n", "2")}
HANG_MODES = {"serial": (), "xdist-2": ("-n", "2")}


@dataclass
class Started:
    """One run of the suite in its own process, started and not yet waited for."""

    process: subprocess.Popen[str]
    folder: Path

    def results(self) -> list[dict[str, Any]]:
        """Wait for it; its report's cells (the run must fail: every run here holds a hostile Function)."""
        self.process.wait(timeout=900)
        output = (self.folder / "output.txt").read_text()
        assert self.process.returncode == 1, output[-6000:]
        cells: list[dict[str, Any]] = json.loads((self.folder / "report.json").read_text())["results"]
        return cells


def _start(folder: Path, impl: str, *extra: str) -> Started:
    command = [
        sys.executable, "-m", "pytest", str(REPO / "conformance"), f"--impl={impl}", "--device=cpu",
        "--max-examples=2", f"--example-timeout={TIMEOUT}", "-p", "no:cacheprovider", "-q",
        f"--conformance-report={folder / 'report'}", *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Output to a file, not a pipe: a run nobody reads yet must never block on a full pipe.
    with open(folder / "output.txt", "w") as output:
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
    return Started(process, folder)


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """The module's four runs, started at once: each mostly sleeps out a hang's time budget, so
    side by side they cost about the longest one's wall time instead of the sum (~140 s -> ~60 s)."""
    hostile = ",".join(str(ZOO / f) for f in ("hostile.py", "correct_module.py", "global_state_bugs.py"))
    runs = {
        **{f"hostile {mode}": _start(tmp_path_factory.mktemp("hostile"), hostile, f"--contracts={CONTRACTS}", *extra)
           for mode, extra in HOSTILE_MODES.items()},
        **{f"hang {mode}": _start(tmp_path_factory.mktemp("hang"), str(ZOO / "hostile.py"), "-k", "hangs_in_backward", *extra)
           for mode, extra in HANG_MODES.items()},
    }
    yield runs
    for run in runs.values():
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def test_the_matrix_keeps_one_failure_per_run_ending_in_contract_order() -> None:
    """Two xdist workers that met one sys.exit at once both failed; the run's matrix keeps the
    failure of the first contract in contract order (the one a serial run fails) and blocks the
    other by it. A row whose later contract was blocked at run time, and a failure that is no
    run ending, are left as they are."""
    matrix = OutcomeMatrix()
    exit_ = RunEnding("exit", "global_state", "sys.exit(2) was called, but a Function should never exit the program", "x: (3,)")
    late = RunEnding("exit", "return_count", "sys.exit(2) was called, but a Function should never exit the program", "x: (1,)")
    matrix.record("exits", "cpu", "return_count", Cell("failed", reason=late.summary, rerun="pytest return_count"))
    matrix.record("exits", "cpu", "global_state", Cell("failed", reason=exit_.summary, rerun="pytest global_state"))
    matrix.record("exits", "cpu", "reference", Cell("failed", reason="output[0] differs"))
    # Blocked at run time by the later noter's act, or by a defect of its own: only the first moves.
    by_act = Cell("blocked", reason=f"blocked by return_count: {late.summary}", owner="return_count")
    by_other = Cell("blocked", reason="blocked by return_count: grad['x'].shape=(2,), but should be (3,)", owner="return_count")
    matrix.record("exits", "cpu", "autocast", by_act)
    matrix.record("exits", "cpu", "layouts", by_other)
    matrix.record("dies", "cpu", "gradcheck", Cell("failed", reason="the process died"))
    blocked = Cell("blocked", reason="blocked by gradcheck: the process died", owner="gradcheck")
    matrix.record("dies", "cpu", "inplace", blocked)
    died = RunEnding("death", "gradcheck", "the process died", "")
    endings = {("exits", "cpu"): [exit_, late], ("dies", "cpu"): [died, RunEnding("death", "inplace", "the process died", "")]}

    assert matrix.one_failure_per_ending(endings) == [("exits", "cpu", "autocast"), ("exits", "cpu", "return_count")]
    moved = matrix.cell("exits", "cpu", "autocast")
    assert moved is not None and moved.outcome == "blocked" and moved.owner == "global_state", moved
    assert matrix.cell("exits", "cpu", "layouts") == by_other

    cell = matrix.cell("exits", "cpu", "return_count")
    assert cell is not None and cell.outcome == "blocked" and cell.owner == "global_state", cell
    assert cell.reason.startswith(f"blocked by global_state: {exit_.summary}; see global_state; case: x: (3,)"), cell.reason
    assert cell.rerun == "pytest return_count"
    assert [matrix.cell("exits", "cpu", c).outcome for c in ("global_state", "reference")] == ["failed", "failed"]  # type: ignore[union-attr]
    assert matrix.cell("dies", "cpu", "inplace") == blocked


@pytest.mark.parametrize("mode", sorted(HOSTILE_MODES))
def test_hostile_functions_fail_and_the_run_goes_on(started: dict[str, Started], mode: str) -> None:
    results = {(r["function"], r["contract"]): r for r in started[f"hostile {mode}"].results()}
    for name, summary in EXPECTED.items():
        # One act, one failure: the first contract (in contract order) whose example the act
        # ended fails; the other is blocked by it, also where two workers met it at once.
        row = [results[(name, c)] for c in CONTRACTS.split(",")]
        failed = [r for r in row if r["outcome"] == "failed"]
        assert len(failed) == 1, (name, row)
        alternatives = (summary,) if isinstance(summary, str) else summary
        for result in row:
            if result["outcome"] == "blocked":
                assert result["owner"] in {r["contract"] for r in failed}, (name, result)
                assert any(s in result["reason"] for s in alternatives), (name, result["reason"])
            else:
                assert result["outcome"] == "failed", (name, result)
        result = failed[0]
        assert any(s in result["reason"] for s in alternatives), (name, result["reason"])
        assert "case:" in result["message"], (name, result["message"])  # the example it died on
        assert "rerun:" in result["message"], (name, result["message"])
    assert results[("scaled_tanh", "gradcheck")]["outcome"] == "passed", results[("scaled_tanh", "gradcheck")]["message"][-1500:]
    assert results[("scaled_tanh", "global_state")]["outcome"] == "passed", results[("scaled_tanh", "global_state")]["message"][-1500:]
    assert results[("leaks_default_dtype", "global_state")]["outcome"] == "failed", results[("leaks_default_dtype", "global_state")]["message"][-1500:]
    assert results[("leaks_default_dtype", "gradcheck")]["outcome"] == "passed", results[("leaks_default_dtype", "gradcheck")]["message"][-1500:]
    native = next(results[("hangs_natively", c)]["message"] for c in CONTRACTS.split(",") if results[("hangs_natively", c)]["outcome"] == "failed")
    assert "hostile.py" in native, native  # where it hung: from the frames or faulthandler's dump


def test_hostile_verdicts_are_the_same_serially_and_under_xdist(started: dict[str, Started]) -> None:
    """Same seed, same verdicts: which contract fails for a run-ending act and which is blocked by
    it does not depend on how the run was split over processes."""
    rows = {
        mode: {(r["function"], r["contract"]): (r["outcome"], r.get("owner", "")) for r in started[f"hostile {mode}"].results()}
        for mode in HOSTILE_MODES
    }
    serial, xdist = rows["serial-isolate"], rows["xdist-2"]
    assert serial == xdist, {key: (serial.get(key), xdist.get(key)) for key in serial.keys() | xdist.keys() if serial.get(key) != xdist.get(key)}


@pytest.mark.parametrize("mode", sorted(HANG_MODES))
def test_one_hang_is_one_failure_and_costs_one_budget(started: dict[str, Started], mode: str) -> None:
    """A backward that hangs, over every contract: the first contract to meet it waits out one
    example budget and fails; every other is blocked by it at once (in this process or another)."""
    cells = started[f"hang {mode}"].results()
    failed = [c for c in cells if c["outcome"] == "failed"]
    blocked = [c for c in cells if c["outcome"] == "blocked"]
    owners = {c["contract"] for c in failed}
    assert len(failed) == 1, [(c["contract"], c["reason"]) for c in failed]  # also where two workers met it at once
    assert all("should finish [hung in backward of HangsInBackward" in c["reason"] for c in failed), failed
    assert len(blocked) >= 10 and all(c["owner"] in owners for c in blocked), blocked
    total = sum(c["duration"] for c in cells)
    print(f"hanging backward, {len(cells)} contract tests {mode}: {total:.1f} s in tests, "
          f"budget {TIMEOUT} s per example; failed: {sorted(owners)}")
    assert total < 3 * TIMEOUT, total


def test_sys_exit_while_importing_impl_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(2)\n")
    command = [sys.executable, "-m", "pytest", str(REPO / "conformance"), "--impl=exits.py", "-p", "no:cacheprovider"]
    result = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "--impl=exits.py: importing it called sys.exit(2)" in result.stderr
    assert "INTERNALERROR" not in result.stdout + result.stderr
