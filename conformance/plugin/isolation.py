"""Crash containment: a test whose Function kills the process is reported, and the run goes on.

* ``--isolate`` (:class:`ForkIsolation`) runs every contract test in a forked child of the
  process that would have run it (the serial pytest process, or each xdist worker). The child
  sends its reports back through a pipe; when it dies instead (``os._exit``, a segfault, the
  hard deadline of :mod:`conformance.engine.watchdog`), the parent reports that test as failed with
  what the child's flight record says: the example's case and where it was. Forking costs a
  few milliseconds per test; CPU only, since CUDA cannot be used in a forked child once the
  parent has touched it (use ``-n N`` there).
* Under pytest-xdist without ``--isolate`` (:class:`XdistCrashReports`), xdist already reports
  the test a crashed worker was running and restarts the worker; this plugin fills that report
  from the worker's flight record, so it names the contract, case and rerun like any failure,
  and raises xdist's restart cap so that crashing Functions do not end the run.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Literal

import pytest
from _pytest.runner import runtestprotocol

from conformance.engine.verdict import Outcome, Verdict
from conformance.engine.watchdog import Crash, FlightRecorder, describe_crash
from conformance.plugin.collection import TEST_PROPERTY, not_run_here_key

__all__ = ["ForkIsolation", "XdistCrashReports", "crash_outcome", "crash_text", "exit_status_text"]

def exit_status_text(status: int) -> str:
    """``os.waitpid``'s status in words: "killed by SIGSEGV", "exited with code 3"."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended with status {status}"


def crash_text(crash: Crash) -> str:
    """The failure report of a crashed test, in the format of every contract failure."""
    lines = [f"[{crash.contract}] {crash.function!r}: {crash.summary}"]
    lines.extend(f"  {line}" for line in crash.details.splitlines())
    if crash.case:
        lines.append(f"  case: {crash.case}")
    else:
        lines.append("  case: none drawn yet (it died while the test was being set up)")
    if crash.rerun:
        lines.append(f"  rerun: {crash.rerun}")
    return "\n".join(lines)


def crash_properties(crash: Crash, text: str) -> list[tuple[str, object]]:
    """The user_properties a crash report carries into the outcome matrix: the test it was, and
    its verdict (failed, with the crash report as its message)."""
    verdict = Verdict(Outcome.FAILED, crash.summary, case=crash.case or "", rerun=crash.rerun or "", message=text)
    return [(TEST_PROPERTY, (crash.contract, crash.function, crash.device)), verdict.as_property()]


def crash_outcome(crash: Crash, flight_dir: Path) -> tuple[Literal["failed", "skipped"], str, list[tuple[str, object]]]:
    """``(pytest outcome, report text, user_properties)`` of a test whose process died: failed
    with the crash report, or -- one act, one failure -- skipped as blocked by the contract of the
    same Function and device whose example ended first (a death, a hang, an exit: noted in the
    flight folder, :func:`conformance.engine.watchdog.note_run_ending`)."""
    first = crash.noted(flight_dir)
    if first.contract == crash.contract:
        text = crash_text(crash)
        return "failed", text, crash_properties(crash, text)
    verdict = Verdict(Outcome.BLOCKED, first.summary, owner=first.contract, case=first.case, rerun=crash.rerun or "")
    return "skipped", verdict.describe(), [(TEST_PROPERTY, (crash.contract, crash.function, crash.device)), verdict.as_property()]


def _longrepr(outcome: str, item_location: tuple[str, int | None, str], text: str) -> Any:
    """A report's longrepr: a skip's is pytest's ``(path, line, reason)``."""
    path, line, _ = item_location
    return (path, line or 0, f"Skipped: {text}") if outcome == "skipped" else text


def warm_up() -> None:
    """Import what torch imports lazily on a first backward (sympy alone takes over a second),
    so forked children inherit it instead of each paying again. Imports only: running torch
    ops here would start its thread pool, which a forked child cannot use (it deadlocks)."""
    import torch._decomp
    import torch.fx.experimental.symbolic_shapes
    import torch.testing  # noqa: F401

    import conformance.engine.terms  # noqa: F401


class ForkIsolation:
    """``--isolate``: every contract test runs in a forked child (see the module docstring)."""

    def __init__(self, config: pytest.Config, flight: FlightRecorder) -> None:
        self.config = config
        self.flight = flight
        warm_up()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if not any(name == TEST_PROPERTY for name, _ in item.user_properties) or not_run_here_key in item.stash:
            return None  # not a contract test (pytest runs it as usual), or one the session reports as not run here
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in self._run_in_child(item):
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _run_in_child(self, item: pytest.Item) -> list[pytest.TestReport]:
        # basetemp must exist before forking, or every child would number a fresh one (and
        # prune the others' repro scripts); pytest keeps its factory on the config.
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is not None:
            factory.getbasetemp()
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: run the test, send the reports, never return into pytest
            code = 0
            try:
                os.close(read_fd)
                self.flight.catch_fatal_signals()
                reports = runtestprotocol(item, log=False, nextitem=None)
                payload = pickle.dumps([
                    self.config.hook.pytest_report_to_serializable(config=self.config, report=r) for r in reports
                ])
                with os.fdopen(write_fd, "wb") as pipe:
                    pipe.write(payload)
            except BaseException:  # the child must reach os._exit
                traceback.print_exc()
                code = 70
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
        if payload and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return [
                self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
                for data in pickle.loads(payload)
            ]
        return [self._crash_report(item, exit_status_text(status))]

    def _crash_report(self, item: pytest.Item, status: str) -> pytest.TestReport:
        flight_dir = self.flight.record_path.parent
        crash = describe_crash(flight_dir, self.flight.record_path.stem, exit_status=status)
        outcome: Literal["failed", "skipped"] = "failed"
        if crash is None or crash.nodeid != item.nodeid:
            text = f"the process running {item.nodeid} died ({status}) before the test started"
            properties: list[tuple[str, object]] = []
        else:
            outcome, text, properties = crash_outcome(crash, flight_dir)
        return pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={name: 1 for name in item.keywords},
            outcome=outcome,
            longrepr=_longrepr(outcome, item.location, text),
            when="call",
            user_properties=[*item.user_properties, *properties],
        )


class XdistCrashReports:
    """On the xdist controller: turns xdist's bare "worker crashed" report into the contract
    failure its flight record describes (the workers were told where flight records go by
    ``autograd_conformance_plugin.WorkersFirst``)."""

    def __init__(self, flight_dir: Path) -> None:
        self.flight_dir = flight_dir

    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        crash = describe_crash(self.flight_dir, str(getattr(worker, "id", "")), exit_status="the xdist worker crashed")
        if crash is None or crash.nodeid != crashitem:
            return
        outcome, text, properties = crash_outcome(crash, self.flight_dir)
        report.outcome = outcome
        report.longrepr = _longrepr(outcome, report.location, text)
        report.when = "call"
        report.user_properties = [*report.user_properties, *properties]

