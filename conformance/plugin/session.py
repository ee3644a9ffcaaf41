"""The active side of the plugin: one :class:`ConformanceSession` per process, registered by
:func:`activate`, which ``autograd_conformance_plugin`` (the light module pytest loads at
start-up) calls only in runs that use the suite, with the option values it read.

Options are typed in :mod:`~conformance.plugin.options`, devices set up in
:mod:`~conformance.plugin.devices`, contract tests collected and selected in
:mod:`~conformance.plugin.collection`; the outcome matrix and its reports are
:mod:`~conformance.plugin.outcomes`'. Each test's verdict arrives as a
:class:`~conformance.engine.verdict.Verdict` in its reports' user properties.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import importlib.metadata
import logging
import os
import platform
import shlex
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis.strategies import SearchStrategy

from autograd_conformance_plugin import CONTRACT_FIXTURE, DTYPE_NAMES, FLIGHT_DIR_KEY, OptionValue, runs_tests_here
from conformance.engine.author_code import Executed, Region, Tracer, regions_of
from conformance.engine.contract import ContractInfo, admit, discover
from conformance.engine.expectations import Expectations
from conformance.engine.literals import Literals, shared_hypothesis_home, snapshot
from conformance.engine.loader import ImplError, load_impls
from conformance.engine.pool import EvaluationPool
from conformance.engine.probe import forget_probe_classes
from conformance.engine.report import ContractFailure
from conformance.engine.runner import Target
from conformance.engine.triton_interpreter import runs_interpreted
from conformance.engine.verdict import Outcome, Verdict, tier_of
from conformance.engine.watchdog import FlightRecorder, run_endings
from conformance.plugin.collection import (
    EXPECTATION_PROPERTY,
    TEST_PROPERTY,
    contract_test,
    contract_test_key,
    deselect,
    dtype_expectations_key,
    function_by_function,
    keep_shard,
    mark_contract_tests,
    report_not_run_here,
    rerun_command,
    skip_without_cuda,
)
from conformance.plugin.devices import cuda_usable, describe_cuda, no_cuda_reason, prepare_devices, triton_mode
from conformance.plugin.heap import Heap
from conformance.plugin.isolation import ForkIsolation, XdistCrashReports
from conformance.plugin.options import RunOptions, check_contract_names, parse_options
from conformance.plugin.outcomes import FAILURE_OUTCOMES, Cell, OutcomeMatrix, RunInfo, author_gap_lines
from conformance.plugin.reports import write_reports
from conformance.spec import Spec, SpecError
from strategies import CaseOptions
from strategies.cases import Case
from strategies.coverage import coverage_corners, describe_coverage

__all__ = ["ConformanceSession", "activate", "cell_of", "make_target"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # conformance/

_session_key = pytest.StashKey["ConformanceSession"]()


AUTHOR_CODE_KEY = "conformance_author_code"  # an xdist worker's Executed, in its workeroutput

class ConformanceSession:
    """The run's options, specs, expectations and outcomes, and the hooks that use them.

    Registered in ``pytest_configure`` (one per process: the controller and each xdist worker).
    Workers collect and run; the controller sees every report, so it alone keeps the matrix,
    decides staleness and writes reports.
    """

    def __init__(self, config: pytest.Config, options: RunOptions) -> None:
        self.config = config
        self.options = options
        self.engine_options = options.engine()  # what every Target runs with
        self.run_dir = Path(config.invocation_params.dir)
        self.expectations: Expectations | None = None
        if options.expectations:
            self.expectations = Expectations.load(
                options.expectations, strict=options.strict_expectations, dtypes=DTYPE_NAMES
            )
        self.specs: list[Spec] = []
        self.matrix = OutcomeMatrix()
        # The reports of failed and blocked contract tests, by (function, device, contract): the
        # matrix may change their verdicts at the end, and pytest's own counts follow it.
        self.reports: dict[tuple[str, str, str], pytest.TestReport] = {}
        self.is_worker = hasattr(config, "workerinput")
        self.runs_tests = runs_tests_here(config)
        self.flight: FlightRecorder | None = None
        self.own_flight_dir: Path | None = None  # made (and removed) by this process
        self.user_threads: int | None = None  # torch's thread count before the run set its own
        self.contracts: dict[str, ContractInfo] = {}  # every contract of the suite, by name
        # --author-coverage: each Function's own code, and what of it ran (this process, plus workers')
        self.author_regions: dict[str, tuple[Region, ...]] = {}
        self.author_executed = Executed()
        self.tracer: Tracer | None = None
        self.pool = EvaluationPool()  # evaluations shared by the tests of the Function the run is on
        # Their case strategies too: Hypothesis validates a strategy object on its first draw.
        self.case_strategies: dict[CaseOptions, SearchStrategy[Case]] = {}
        self.simplest_cases: dict[CaseOptions, Case] = {}  # see Target._simplest_case
        self.chosen_options: dict[tuple[Any, ...], CaseOptions] = {}  # see Target._options_for
        self.heap = Heap.for_this_process()
        self.on_function: tuple[str, str] | None = None  # the (Function, device) the run's tests are on
        self.literals: dict[str, Literals] = {}  # the constants Hypothesis draws, by Function

    # ---------------------------------------------------------------- setup

    def load(self) -> None:
        """Set up devices and threads, import the ``--impl`` targets and the contracts."""
        prepare_devices(self.options.gpus_per_worker)
        # Set once for the run (each example pins it too, but then finds it already right:
        # torch.set_num_threads costs ~0.1 ms); pytest_unconfigure puts the user's back.
        self.user_threads = torch.get_num_threads()
        torch.set_num_threads(self.options.threads)
        # Like pytest's `pythonpath`: an uninstalled project's modules import from where it runs.
        search = [self.run_dir, Path(self.config.rootpath)]
        try:
            self.specs = load_impls(self.options.impl, search_paths=search)
        except (SpecError, ImplError) as error:
            raise pytest.UsageError(str(error)) from None
        self.contracts = discover()
        check_contract_names(self.options, sorted(self.contracts))
        if self.options.author_coverage:
            self.start_author_coverage()

    def start_author_coverage(self) -> None:
        """Measure the author's files only (coverage.py, branches), from here to the end of the tests."""
        import coverage  # a dependency (pytest-cov's); imported only when asked for

        if self.options.isolate:
            raise pytest.UsageError(
                "--author-coverage with --isolate: what ran in the forked children would be lost; use -n N "
                "(pytest-xdist) instead, whose workers report it"
            )
        if coverage.Coverage.current() is not None:
            raise pytest.UsageError(
                "--author-coverage: coverage.py is already measuring this run (pytest-cov's --cov?), and one process "
                "has one tracer; drop one of the two"
            )
        self.author_regions = {spec.name: regions_of(spec) for spec in self.specs}
        files = {region.file for regions in self.author_regions.values() for region in regions}
        if files:  # none: every Function's code is outside its package (nothing of the author's to measure)
            self.tracer = Tracer(files)
            self.tracer.start()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        # Once, after collection (Hypothesis warns of disk access during plugin set-up): a module
        # imported later, by a test or a plugin, leaves the draws alone. An xdist controller runs
        # no test: its CPU would be taken from the workers.
        if self.runs_tests:
            self.literals = snapshot(self.specs)
        try:
            return (yield)
        finally:
            if self.tracer is not None:
                executed = self.tracer.stop()
                self.tracer = None
                self.author_executed.update(executed)
                if self.is_worker:
                    self.config.workeroutput[AUTHOR_CODE_KEY] = executed.to_json()  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """An xdist worker's share of what ran (its flight record is read elsewhere)."""
        data = getattr(node, "workeroutput", {}).get(AUTHOR_CODE_KEY)
        if data is not None:
            self.author_executed.update(Executed.from_json(data))

    def watch_crashes(self, flight_dir: Path | None = None) -> None:
        """Set up what reports a test whose process dies: this process's flight recorder, fork
        isolation (``--isolate``) and, on an xdist controller, crash reports for its workers
        (whose flight records go to ``flight_dir``, already given to them)."""
        config = self.config
        workerinput = getattr(config, "workerinput", {})
        if FLIGHT_DIR_KEY in workerinput:
            flight_dir = Path(workerinput[FLIGHT_DIR_KEY])
        elif flight_dir is None:
            flight_dir = self.own_flight_dir = Path(tempfile.mkdtemp(prefix="conformance-flight-"))
        self.flight = FlightRecorder(flight_dir, str(workerinput.get("workerid", "main")))
        if self.is_worker:
            self.flight.catch_fatal_signals()  # a segfault's stack goes into the crash report
        elif hasattr(config.hook, "pytest_handlecrashitem"):
            config.pluginmanager.register(XdistCrashReports(flight_dir), "autograd-conformance-crashes")
            numprocesses = getattr(config.option, "numprocesses", None)
            if numprocesses and getattr(config.option, "maxworkerrestart", "") is None:
                # One restart per test that may crash its worker, so crashing Functions cannot end
                # the run early (xdist's default is 4 per worker). Collection cannot crash-loop:
                # this process imports the same --impl modules before xdist handles any event.
                raise_restart_budget(config, 4 * int(numprocesses) + len(self.possible_tests()))
        if self.options.isolate:
            if not hasattr(os, "fork"):
                raise pytest.UsageError("--isolate needs os.fork, which this platform lacks; use -n 1 (pytest-xdist) instead")
            if "cuda" in self.options.devices and cuda_usable():
                raise pytest.UsageError(
                    "--isolate forks a child per test, and CUDA cannot be used in a forked child: pass --device=cpu "
                    "with --isolate, or contain CUDA crashes with pytest-xdist (-n 1 or more) instead"
                )
            config.pluginmanager.register(ForkIsolation(config, self.flight), "autograd-conformance-isolation")

    @pytest.hookimpl(trylast=True)  # after pytest's unraisable-exception collection: see Heap.release
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.heap.release()
        if self.user_threads is not None:
            torch.set_num_threads(self.user_threads)
        if self.flight is not None:
            self.flight.close()
        if self.own_flight_dir is not None:
            shutil.rmtree(self.own_flight_dir, ignore_errors=True)

    def enter_function(self, name: str, device: str) -> None:
        """Where the run's tests move on to another Function or device (the plugin orders them so):
        the previous one's shared evaluations are dropped and what outlives them is frozen."""
        if (name, device) == self.on_function:
            return
        self.on_function = (name, device)
        self.pool.clear()
        forget_probe_classes()
        self.case_strategies = {}
        self.simplest_cases = {}
        self.chosen_options = {}
        # The last failure's traceback (kept for post-mortem debugging) would be frozen with
        # its frames and tensors; pytest drops it at the next test's call anyway.
        for name_of_last in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name_of_last):
                delattr(sys, name_of_last)
        self.heap.settle()

    def possible_tests(self) -> list[tuple[str, str, str]]:
        """Every (contract, function, device) the registered Functions have, whatever this run selects."""
        return [(c, s.name, d) for s in self.specs for d in s.devices for c in self.contracts]

    # ---------------------------------------------------------------- hooks

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        names = ", ".join(s.name for s in self.specs)
        return [
            f"autograd-conformance: suite in {PACKAGE_DIR.parent}; {len(self.specs)} Functions registered from "
            f"--impl={self.options.impl}: {names}",
            f"autograd-conformance: devices {', '.join(self.options.devices)} [{describe_cuda()}]; profile "
            f"{self.options.profile}; seed {self.options.seed}; triton {triton_mode()}; torch {torch.__version__}",
        ]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if CONTRACT_FIXTURE not in metafunc.fixturenames:
            return
        params = [
            pytest.param((spec, device), id=f"{spec.name}-{device}")
            for spec in self.specs
            for device in self.options.devices
            if device in spec.devices
        ]
        metafunc.parametrize(CONTRACT_FIXTURE, params, indirect=True)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        mark_contract_tests(items, self.expectations)
        deselect(config, items, self.options)
        if self.options.shard is not None:
            keep_shard(config, items, self.options.shard)
        skip_without_cuda(items, self.run_dir, self.options)
        function_by_function(items, slow=lambda spec, device: runs_interpreted(spec.op, device))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        return True if report_not_run_here(item, nextitem) else None

    @pytest.hookimpl(wrapper=True, trylast=True)  # trylast: inside pytest's own log capture
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        if contract_test_key not in item.stash:
            return (yield)  # a test of the user's own, in the same run: pytest's capture as usual
        with torch_trace_uncaptured():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A contract failure reads as its report (message, case, repro, rerun), without frames of
        the suite's internals; ``--tb=long`` (or any explicit --tb) brings them back."""
        report: pytest.TestReport = yield
        failure = call.excinfo.value if call.excinfo is not None else None
        if report.failed and isinstance(failure, ContractFailure) and item.config.getoption("tbstyle", "auto") == "auto":
            report.longrepr = str(failure)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        recorded = cell_of(report)
        if recorded is None:
            return
        (contract, function, device), cell, verdict = recorded
        if self.expectations is not None:
            label = dict(report.user_properties).get(EXPECTATION_PROPERTY)
            if isinstance(label, str) and cell.outcome == "xfailed":
                self.expectations.deviated.add(label)
            if isinstance(label, str) and cell.outcome == "xpassed":
                self.expectations.xpassed.add(label)
                if not self.expectations.one_test(label):  # a test a whole Function's entry selects that passes
                    cell = dataclasses.replace(cell, outcome="passed", reason="")
            if verdict is not None:
                self.expectations.xpassed.update(verdict.unmet_expectations)
        self.matrix.record(function, device, contract, cell)
        if cell.outcome in ("failed", "blocked"):
            self.reports[(function, device, contract)] = report

    def coverage_lines(self) -> list[tuple[str, str]]:
        """Per Function, what its corners reach (sizes, Scalar values, size orders, dtypes), for the
        default case options; a contract with its own dtypes or budget sees a subset. An explicit
        --max-examples runs no corners: each line then says so."""
        lines = []
        skipped = "no corners ran (an explicit --max-examples runs random examples only); under a profile: "
        for spec in self.specs:
            dtypes = tuple(d for d in spec.dtypes if self.options.dtypes is None or str(d).removeprefix("torch.") in self.options.dtypes)
            budget = min(CaseOptions().max_elements, spec.max_elements or CaseOptions().max_elements)
            corners = coverage_corners(spec, dtypes=dtypes, max_elements=budget, max_batch_dims=CaseOptions().max_batch_dims)
            reached = describe_coverage(spec, corners, dtypes)
            lines.append((spec.name, reached if self.options.max_examples is None else skipped + reached))
        return lines

    def stale_expectations(self) -> list[str]:
        if self.expectations is None:
            return []
        return self.expectations.stale(self.possible_tests())

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker:
            return
        stale = self.stale_expectations()
        if stale:
            assert self.expectations is not None
            strict = " (strict: the run fails)" if self.expectations.strict else ""
            terminalreporter.section(f"autograd-conformance: stale expectations{strict}")
            for line in stale:
                terminalreporter.write_line(f"{self.expectations.path}: {line}")
        if self.options.shard is not None and not self.matrix:
            k, n = self.options.shard
            terminalreporter.write_line(f"autograd-conformance: shard {k}/{n} holds no Function (fewer rows than shards)")
        elif not self.matrix:
            return
        lines = self.matrix.terminal_lines(verbosity=config.get_verbosity())
        if lines:
            terminalreporter.section("autograd-conformance")
            for line in lines:
                terminalreporter.write_line(line)
        if self.author_regions:
            ran = {function for function, _ in self.matrix.rows()}
            self.matrix.author_code = {
                name: (regions, self.author_executed) for name, regions in self.author_regions.items() if name in ran
            }
            terminalreporter.section("autograd-conformance: author code no example ran (--author-coverage)")
            gap_lines = author_gap_lines(self.matrix.author_gaps())
            for line in gap_lines or ["every line and branch of every Function's own code ran"]:
                terminalreporter.write_line(line)
        ran = {function for function, _ in self.matrix.rows()}
        self.matrix.coverage_phase = {name: line for name, line in self.coverage_lines() if name in ran}
        if config.get_verbosity() > 0:
            terminalreporter.section("autograd-conformance: what the coverage phase reached")
            for name, line in self.matrix.coverage_phase.items():
                terminalreporter.write_line(f"{name}: {line}")
        if self.options.report is not None:
            written = write_reports(self.matrix, self.options.report, self.run_info())
            terminalreporter.write_line(f"autograd-conformance: report written to {', '.join(str(p) for p in written)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and self.options.shard is not None and self.specs:
            # A slice left empty because the run has fewer rows than slices: that slice passed.
            session.exitstatus = pytest.ExitCode.OK
        changed = []
        if self.flight is not None:  # the run's flight folder: every process's notes
            changed = self.matrix.one_failure_per_ending(run_endings(self.flight.record_path.parent))
        # A test blocked by a defect whose owner passed is the defect's only report: it fails.
        unowned = self.matrix.report_unowned_defects()
        self.follow_the_matrix([*changed, *unowned])
        self.matrix.name_chain_roots()  # every blocked cell names its defect's one failure
        strict_stale = self.expectations is not None and self.expectations.strict and self.stale_expectations()
        if (unowned or strict_stale) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def follow_the_matrix(self, changed: Sequence[tuple[str, str, str]]) -> None:
        """pytest's own counts and summary follow the matrix where it changed a verdict at the end
        (a blocked test that reports an unowned defect fails; a later noter of a hang is blocked
        by the first): the test's report moves to the terminal's list of its new outcome."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        for key in changed:
            report, cell = self.reports.get(key), self.matrix.cell(*key)
            if report is None or cell is None or terminal is None:
                continue
            outcome = {"failed": "failed", "blocked": "skipped"}.get(cell.outcome)
            if outcome is None or outcome == report.outcome:
                continue
            listed = terminal.stats.get(report.outcome, [])
            if report in listed:
                listed.remove(report)
            if outcome == "failed":
                report.longrepr = cell.message or cell.reason
            else:  # pytest reads a skip's (path, line, reason)
                report.longrepr = (report.location[0], (report.location[1] or 0) + 1, f"Skipped: {cell.reason}")
            report.outcome = outcome  # type: ignore[assignment]  # pytest's Literal
            terminal.stats.setdefault(outcome, []).append(report)

    def run_info(self) -> RunInfo:
        versions = {"python": platform.python_version(), "torch": torch.__version__}
        for package, dist in (("hypothesis", "hypothesis"), ("pytest", "pytest"), ("triton", "triton"),
                              ("autograd-conformance", "autograd-conformance")):
            try:
                versions[package] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                versions[package] = "not installed"
        described = f"cuda: {torch.cuda.get_device_name()}" if cuda_usable() else "cpu only (CUDA not available)"
        return RunInfo(
            seed=self.options.seed,
            profile=self.options.profile,
            max_examples=self.engine_options.hypothesis_settings().max_examples,
            impl=self.options.impl,
            devices=self.options.devices,
            dtypes=self.options.dtypes,
            device_description=described,
            triton=triton_mode(),
            versions=versions,
            command=shlex.join(["pytest", *self.config.invocation_params.args]),
            header=tuple(self.pytest_report_header(self.config)),
            shard="" if self.options.shard is None else "{}/{}".format(*self.options.shard),
        )


def cell_of(report: pytest.TestReport) -> tuple[tuple[str, str, str], Cell, Verdict | None] | None:
    """The matrix cell one report of a contract test makes, with the test's key and verdict; None
    for a report of another test, or a passed setup or teardown."""
    properties = dict(report.user_properties)
    key = properties.get(TEST_PROPERTY)
    if not isinstance(key, (tuple, list)) or (report.when != "call" and report.passed):
        return None
    contract, function, device = (str(part) for part in key)
    verdict = Verdict.of(report.user_properties)
    outcome, reason = _outcome_and_reason(report, verdict)
    message = ""
    if outcome.value in FAILURE_OUTCOMES or outcome in (Outcome.ADVICE, Outcome.UPSTREAM):
        own = verdict.message if verdict is not None and report.when == "call" else ""
        message = own or report.longreprtext
    cell = Cell(
        outcome=outcome.value,
        reason=reason,
        duration=report.duration if report.when == "call" else 0.0,
        repro=verdict.repro if verdict is not None else "",
        message=message,
        rerun=verdict.rerun if verdict is not None else "",
        owner=verdict.owner if verdict is not None and outcome is Outcome.BLOCKED else "",
        tier=tier_of(outcome, verdict.tier if verdict is not None and outcome is Outcome.FAILED else ""),
    )
    return (contract, function, device), cell, verdict


def _outcome_and_reason(report: pytest.TestReport, verdict: Verdict | None) -> tuple[Outcome, str]:
    """The matrix outcome of one report and its one-line reason: pytest says whether the phase
    passed, failed, skipped or xfailed; the test's verdict says why."""
    if hasattr(report, "wasxfail"):
        return (Outcome.XFAILED if report.skipped else Outcome.XPASSED), str(report.wasxfail)
    if report.failed:
        outcome = Outcome.FAILED if report.when == "call" else Outcome.ERROR
        if verdict is not None and verdict.outcome is Outcome.FAILED and verdict.reason:
            return outcome, verdict.reason
        return outcome, (report.longreprtext.strip().splitlines() or [""])[-1]
    if report.skipped:
        if verdict is not None and verdict.skipped:
            return verdict.outcome, verdict.describe()
        # Skipped by something other than the suite (a marker, another plugin): pytest's words.
        longrepr = report.longrepr
        reason = str(longrepr[2]) if isinstance(longrepr, (tuple, list)) else str(longrepr)
        return Outcome.SKIPPED, reason.removeprefix("Skipped: ")
    if verdict is not None and verdict.outcome in (Outcome.ADVICE, Outcome.UPSTREAM):
        return verdict.outcome, verdict.reason
    return Outcome.PASSED, ""


def _move_hypothesis_home(config: pytest.Config) -> None:
    """Keep Hypothesis's home folder (its cache of the constants it finds in source files) out of
    the user's project: `.hypothesis/` in the current directory by default, although the suite
    uses no example database. It goes into pytest's cache, else into the user's one shared folder
    in the temporary directory (``literals.shared_hypothesis_home``: nothing left behind by a
    process a crashing Function kills, serial or an xdist worker); HYPOTHESIS_STORAGE_DIRECTORY,
    when set, is left to decide."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis import configuration

    home: Path | None = None
    cache = getattr(config, "cache", None)
    if cache is not None:
        try:
            home = Path(cache.mkdir("autograd-conformance-hypothesis"))
        except OSError:
            home = None
    if home is None:
        home, cleanup = shared_hypothesis_home()
        config.add_cleanup(cleanup)
    previous = vars(configuration).get("__hypothesis_home_directory")  # restored for in-process runs
    configuration.set_hypothesis_home_dir(home)
    config.add_cleanup(lambda: configuration.set_hypothesis_home_dir(previous))


@contextlib.contextmanager
def torch_trace_uncaptured() -> Iterator[None]:
    """Without pytest's log capture on torch's structured-trace logger (``torch.__trace``): torch
    keeps it at DEBUG for its own trace files (TORCH_TRACE), and pytest also captures loggers that
    do not propagate, so every compile filled a failure's "Captured log call" with empty DEBUG lines."""
    logger = logging.getLogger("torch.__trace")
    captured = [handler for handler in logger.handlers if type(handler).__module__ == "_pytest.logging"]
    for handler in captured:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in captured:
            logger.addHandler(handler)  # pytest removes its own at the end of the phase


_EXIT: dict[str, bool] = {"fast": False}  # process-wide: whether the atexit freeze is registered


def exit_without_final_collection() -> None:
    """At interpreter exit, freeze the garbage collector before CPython's final collection.

    With torch and the suite loaded that collection walks every object the process is about to
    free anyway: ~1.2 s per process (measured), paid by every run and, under xdist, by the
    controller waiting for each worker to exit. An atexit callback runs before it, and only when
    the interpreter is ending: a process that embeds pytest keeps its collector. Registered once.
    """
    if not _EXIT["fast"]:
        atexit.register(gc.freeze)
        _EXIT["fast"] = True


def raise_restart_budget(config: Any, budget: int) -> None:
    """Let xdist restart crashed workers ``budget`` times. xdist reads ``--max-worker-restart``
    when it makes its DSession, in its pytest_configure; a controller activates after that (see
    ``autograd_conformance_plugin.WorkersFirst``), so the DSession's copy is set too."""
    config.option.maxworkerrestart = str(budget)
    dsession = config.pluginmanager.getplugin("dsession")
    if dsession is not None and hasattr(dsession, "_max_worker_restart"):
        dsession._max_worker_restart = budget


def activate(
    config: pytest.Config, values: Mapping[str, OptionValue], *, flight_dir: Path | None = None
) -> ConformanceSession:
    """Register this run's session (called by the start-up plugin when the run uses the suite,
    with the option values it read, and on an xdist controller the folder its workers were told
    to keep flight records in)."""
    exit_without_final_collection()
    session = ConformanceSession(config, parse_options(values, run_dir=Path(config.invocation_params.dir)))
    config.stash[_session_key] = session
    config.pluginmanager.register(session, "autograd-conformance-session")
    _move_hypothesis_home(config)
    session.load()
    session.watch_crashes(flight_dir)
    return session


def _repro_dir(request: pytest.FixtureRequest, options: RunOptions) -> Path:
    chosen = options.repro_dir()
    if chosen is not None:
        return chosen
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    return factory.getbasetemp() / "conformance-repro"


def make_target(request: pytest.FixtureRequest) -> Target:
    """The ``conformance_target`` fixture's value: the Function and device this test checks."""
    node = request.node
    test = node.stash.get(contract_test_key, None)
    if test is None:  # collected without the session's modifyitems hook (a plugin dropped it)
        test = contract_test(node)
        if test is None:
            raise pytest.UsageError(f"{node.nodeid} uses {CONTRACT_FIXTURE} but is not a declared @contract test")
    spec, device = test.spec, test.device
    session = request.config.stash[_session_key]
    session.enter_function(spec.name, device)
    options = session.options
    rerun = rerun_command(session.run_dir, node, options, device)
    if session.flight is not None:
        session.flight.start_test(node.nodeid, test.contract.name, spec.name, device, rerun)
    target = Target(
        flight=session.flight,
        spec=spec,
        device=device,
        contract=test.contract.name,
        case_options=test.contract.case,
        contract_examples=test.contract.max_examples,
        compares_values=test.contract.compares_values,
        options=session.engine_options,
        nodeid=node.nodeid,
        user_properties=node.user_properties,
        rerun=rerun,
        repro_dir=_repro_dir(request, options),
        run_dir=session.run_dir,
        dtype_expectations=node.stash.get(dtype_expectations_key, ()),
        strict_expectations=session.expectations is not None and session.expectations.strict,
        pool=session.pool,
        case_strategies=session.case_strategies,
        simplest_cases=session.simplest_cases,
        chosen_options=session.chosen_options,
        literals=session.literals.get(spec.name),
    )
    if device == "cuda" and not cuda_usable():
        target.not_run_here(no_cuda_reason())
    admit(target, test.contract)
    return target
