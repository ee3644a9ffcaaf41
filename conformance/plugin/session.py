"""The active side of the plugin: options, loading ``--impl``, parametrizing the contract tests,
expectations, rerun commands and the outcome matrix.

``autograd_conformance_plugin`` (the light module pytest loads at start-up) imports this module
and calls :func:`activate` only in runs that use the suite.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from autograd_conformance_plugin import CONTRACT_FIXTURE, DEFAULT_IMPL, DEVICE_CHOICES, DTYPE_NAMES
from conformance.engine.contract import ContractInfo, contract_of, discover
from conformance.engine.expectations import Expectation, Expectations
from conformance.engine.global_state import SUITE_THREADS
from conformance.plugin.isolation import FLIGHT_DIR_KEY, ForkIsolation, XdistCrashReports
from conformance.plugin.loader import ImplError, load_impls
from conformance.plugin.outcomes import Cell, OutcomeMatrix, RunInfo
from conformance.engine.runner import (
    COMPILE_BACKENDS,
    DEFAULT_COMPILE_BACKENDS,
    FAILURE_PROPERTY,
    FAILURE_REPORT_PROPERTY,
    NOT_APPLICABLE,
    NOT_RUN_HERE,
    PROFILES,
    REPRO_PROPERTY,
    STATUS_PROPERTY,
    UNMET_EXPECTATION_PROPERTY,
    RunOptions,
    Target,
)
from conformance.spec import Spec, SpecError
from conformance.engine.watchdog import DEFAULT_EXAMPLE_TIMEOUT, FlightRecorder

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # conformance/
_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

# ------------------------------------------------------------------------ options


def _setting(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name, default=None)
    if value is None:
        value = config.getini(name)
    return None if value in (None, "") else str(value)


def _int_setting(config: pytest.Config, name: str, flag: str) -> int | None:
    raw = _setting(config, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(f"{flag}={raw!r} is not an integer; pass e.g. {flag}=20") from None


def _list_setting(config: pytest.Config, name: str) -> list[str]:
    raw = _setting(config, name)
    return [item.strip() for item in raw.split(",") if item.strip()] if raw else []


def _cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _cuda_findings() -> str:
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (
        f"torch {torch.__version__} ({build}), torch.cuda.is_available()={torch.cuda.is_available()}, "
        f"torch.cuda.device_count()={torch.cuda.device_count()}"
    )


# Options that take a value, with an example and what leaving them out means. Given empty on the
# command line (`--impl=$IMPL` with IMPL unset) they would silently mean the default.
_VALUE_OPTIONS = (
    ("conformance_impl", "--impl", "--impl=mypkg or --impl=path/to/specs.py", f"the bundled {DEFAULT_IMPL}"),
    ("conformance_device", "--device", "--device=cpu", "auto"),
    ("conformance_gpus_per_worker", "--gpus-per-worker", "--gpus-per-worker=1", "1"),
    ("conformance_max_examples", "--max-examples", "--max-examples=20", "the profile's"),
    ("conformance_profile", "--profile", "--profile=ci", "dev"),
    ("conformance_seed", "--seed", "--seed=0", "seed 0"),
    ("conformance_dtypes", "--dtypes", "--dtypes=float32,bfloat16", "every dtype the spec lists"),
    ("conformance_contracts", "--contracts", "--contracts=gradcheck,grad_meta", "every contract"),
    ("conformance_skip_contracts", "--skip-contracts", "--skip-contracts=gradgradcheck", "none skipped"),
    ("conformance_compile_backends", "--compile-backends", "--compile-backends=aot_eager,inductor", "aot_eager"),
    ("conformance_expectations", "--expectations", "--expectations=expectations.json", "no expectations"),
    ("conformance_report", "--conformance-report", "--conformance-report=reports/conformance", "no report"),
)


def _check_no_empty_values(config: pytest.Config) -> None:
    """An option given an empty value on the command line is a usage error, not the default."""
    for name, flag, example, default in _VALUE_OPTIONS:
        value = config.getoption(name, default=None)
        if value is not None and not str(value).replace(",", " ").strip():
            raise pytest.UsageError(
                f"{flag} is empty ({flag}={value!r}; an unset variable?); pass e.g. {example}, "
                f"or leave {flag} out for the default ({default})"
            )


def _check_report_path(config: pytest.Config) -> None:
    """--conformance-report's folder is created and must be writable before the run, not after it."""
    raw = _setting(config, "conformance_report")
    if raw is None:
        return
    base = _resolve(config, raw)
    problem = None
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=base.parent, prefix=".conformance-report-probe-"):
            pass
    except OSError as error:
        problem = f"cannot write into {str(base.parent)!r} ({type(error).__name__}: {error})"
    for suffix in (".json", ".md", ".html"):
        if problem is None and Path(f"{base}{suffix}").is_dir():
            problem = f"{str(base) + suffix!r} is a directory"
    if problem is None and Path(f"{base}.repro").exists() and not Path(f"{base}.repro").is_dir():
        problem = f"{str(base) + '.repro'!r} (the repro scripts' folder) is a file"
    if problem is not None:
        raise pytest.UsageError(
            f"--conformance-report={raw}: {problem}; pass a path in a writable folder, "
            "e.g. --conformance-report=reports/conformance"
        )


def _read_options(config: pytest.Config) -> tuple[RunOptions, tuple[str, ...]]:
    _check_no_empty_values(config)
    profile = _setting(config, "conformance_profile") or "dev"
    if profile not in PROFILES:
        raise pytest.UsageError(f"--profile={profile!r} is not one of {', '.join(PROFILES)}; pass e.g. --profile=ci")
    max_examples = _int_setting(config, "conformance_max_examples", "--max-examples")
    if max_examples is not None and max_examples < 1:
        raise pytest.UsageError(f"--max-examples={max_examples} must be >= 1")
    seed = _int_setting(config, "conformance_seed", "--seed") or 0
    dtype_names = _list_setting(config, "conformance_dtypes")
    unknown = [d for d in dtype_names if d not in _DTYPES]
    if unknown:
        raise pytest.UsageError(f"--dtypes: unknown {unknown}; choose from {', '.join(_DTYPES)}")
    device = _setting(config, "conformance_device") or "auto"
    if device not in DEVICE_CHOICES:
        raise pytest.UsageError(f"--device={device!r} is not one of {', '.join(DEVICE_CHOICES)}; pass e.g. --device=cpu")
    if device == "cuda" and not _cuda_usable():
        # A GPU job that silently skips everything would pass while testing nothing.
        raise pytest.UsageError(
            f"--device=cuda, but CUDA is not usable here: {_cuda_findings()}. Run on a machine with a working "
            "CUDA driver and a CUDA build of torch, or pass --device=cpu (or auto)"
        )
    devices = ("cpu", "cuda") if device == "auto" else (device,)
    threads = _int_setting(config, "conformance_threads", "--threads")
    threads = SUITE_THREADS if threads is None else threads
    if threads < 1:
        raise pytest.UsageError(f"--threads={threads} must be >= 1 (torch intra-op threads per process)")
    backends = tuple(_list_setting(config, "conformance_compile_backends")) or DEFAULT_COMPILE_BACKENDS
    unknown_backends = [b for b in backends if b not in COMPILE_BACKENDS]
    if unknown_backends:
        raise pytest.UsageError(
            f"--compile-backends: unknown {unknown_backends}; choose from {', '.join(COMPILE_BACKENDS)}, "
            "e.g. --compile-backends=aot_eager,inductor"
        )
    options = RunOptions(
        compile_backends=tuple(dict.fromkeys(backends)),
        threads=threads,
        profile=profile,
        max_examples=max_examples,
        seed=seed,
        impl=_setting(config, "conformance_impl") or DEFAULT_IMPL,
        dtypes=tuple(_DTYPES[d] for d in dtype_names) or None,
    )
    _check_report_path(config)
    return options, devices


def _example_timeout(config: pytest.Config) -> float | None:
    raw = _setting(config, "conformance_example_timeout")
    if raw is None:
        return DEFAULT_EXAMPLE_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise pytest.UsageError(
            f"--example-timeout={raw!r} is not a number of seconds >= 0; pass e.g. --example-timeout=60 (0: no limit)"
        )
    return seconds or None


def _flag(config: pytest.Config, name: str) -> bool:
    return (_setting(config, name) or "").lower() in ("1", "true", "yes")


# ------------------------------------------------------------------------ activation


def worker_gpus(worker: str, visible: int, per_worker: int = 1) -> tuple[int, ...]:
    """The CUDA device indices (among the visible ones) xdist worker ``worker`` uses.

    Worker ``gwN`` gets ``per_worker`` consecutive devices starting at ``N * per_worker``, wrapping
    around the ``visible`` devices (so more workers than GPUs share them round-robin). Outside
    xdist (``worker`` is ``""`` or ``"master"``) the first ``per_worker`` devices. Indices are
    relative to ``CUDA_VISIBLE_DEVICES``, as torch's are.
    """
    if visible < 1:
        raise ValueError(f"visible={visible!r}: no CUDA device to assign")
    if per_worker < 1 or per_worker > visible:
        raise ValueError(f"per_worker={per_worker!r} must be between 1 and the {visible} visible devices")
    number = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    first = number * per_worker
    return tuple((first + i) % visible for i in range(per_worker))


def _prepare_devices(config: pytest.Config) -> None:
    if not torch.cuda.is_available():
        # Triton kernels can only run under the interpreter, which must be chosen before
        # any @triton.jit function is decorated, i.e. before the --impl modules are imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if importlib.util.find_spec("triton") is not None:
            from conformance.engine.triton_interpreter import install

            install()  # libdevice fallbacks, autotune without a driver, bfloat16 refused
        return
    per_worker = _int_setting(config, "conformance_gpus_per_worker", "--gpus-per-worker") or 1
    try:
        gpus = worker_gpus(os.environ.get("PYTEST_XDIST_WORKER", ""), torch.cuda.device_count(), per_worker)
    except ValueError as error:
        raise pytest.UsageError(f"--gpus-per-worker={per_worker}: {error}") from None
    torch.cuda.set_device(gpus[0])


def _triton_mode() -> str:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "not installed"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "native"
    from conformance.engine.triton_interpreter import installed

    if installed():
        return "interpreted (bfloat16 disabled; libdevice fallbacks and one autotune config per test id)"
    return "interpreted (bfloat16 disabled)"


# user_properties keys a contract test's reports carry to the controller (also under xdist).
TEST_PROPERTY = "conformance_test"  # (contract, function, device)
RERUN_PROPERTY = "conformance_rerun"
EXPECTATION_PROPERTY = "conformance_expectation"  # label of the entry that xfails it

_session_key = pytest.StashKey["ConformanceSession"]()
_dtype_expectations_key: pytest.StashKey[tuple[Expectation, ...]] = pytest.StashKey()


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


class ConformanceSession:
    """The run's options, specs, expectations and outcomes, and the hooks that use them.

    Registered in ``pytest_configure`` (one per process: the controller and each xdist worker).
    Workers collect and run; the controller sees every report, so it alone keeps the matrix,
    decides staleness and writes reports.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.options: RunOptions | None = None
        self.devices: tuple[str, ...] = ()
        self.specs: list[Spec] | None = None
        self.expectations: Expectations | None = None
        self.matrix = OutcomeMatrix()
        self.is_worker = hasattr(config, "workerinput")
        self.flight: FlightRecorder | None = None
        self.own_flight_dir: Path | None = None  # made (and removed) by this process
        self.user_threads: int | None = None  # torch's thread count before the run set its own
        self.contracts: dict[str, ContractInfo] = {}  # every contract of the suite, by name

    # ---------------------------------------------------------------- setup

    def ensure_options(self) -> RunOptions:
        if self.options is None:
            options, self.devices = _read_options(self.config)
            self.options = dataclasses.replace(options, example_timeout=_example_timeout(self.config))
            path = _setting(self.config, "conformance_expectations")
            if path:
                strict = _flag(self.config, "conformance_strict_expectations")
                self.expectations = Expectations.load(path, strict=strict, dtypes=_DTYPES)
        return self.options

    def watch_crashes(self) -> None:
        """Set up what reports a test whose process dies: this process's flight recorder, fork
        isolation (``--isolate``) and, on an xdist controller, crash reports for its workers."""
        config = self.config
        workerinput = getattr(config, "workerinput", {})
        if FLIGHT_DIR_KEY in workerinput:
            flight_dir = Path(workerinput[FLIGHT_DIR_KEY])
        else:
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
                # this process has already imported the same --impl modules.
                config.option.maxworkerrestart = str(4 * int(numprocesses) + len(self.possible_tests()))
        if _flag(config, "conformance_isolate"):
            if not hasattr(os, "fork"):
                raise pytest.UsageError("--isolate needs os.fork, which this platform lacks; use -n 1 (pytest-xdist) instead")
            if "cuda" in self.devices and _cuda_usable():
                raise pytest.UsageError(
                    "--isolate forks a child per test, and CUDA cannot be used in a forked child: pass --device=cpu "
                    "with --isolate, or contain CUDA crashes with pytest-xdist (-n 1 or more) instead"
                )
            config.pluginmanager.register(ForkIsolation(config, self.flight), "autograd-conformance-isolation")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.user_threads is not None:
            torch.set_num_threads(self.user_threads)
        if self.flight is not None:
            self.flight.close()
        if self.own_flight_dir is not None:
            shutil.rmtree(self.own_flight_dir, ignore_errors=True)

    def load(self) -> list[Spec]:
        if self.specs is None:
            options = self.ensure_options()
            _prepare_devices(self.config)
            # Set once for the run (each example pins it too, but then finds it already right:
            # torch.set_num_threads costs ~0.1 ms); pytest_unconfigure puts the user's back.
            self.user_threads = torch.get_num_threads()
            torch.set_num_threads(options.threads)
            # Like pytest's `pythonpath`: an uninstalled project's modules import from where it runs.
            search = [Path(self.config.invocation_params.dir), Path(self.config.rootpath)]
            try:
                self.specs = load_impls(options.impl, search_paths=search)
            except (SpecError, ImplError) as error:
                raise pytest.UsageError(str(error)) from None
            self.contracts = discover()
            _check_contract_names(self.config, self.contracts)
        return self.specs

    def possible_tests(self) -> list[tuple[str, str, str]]:
        """Every (contract, function, device) the registered Functions have, whatever this run selects."""
        return [(c, s.name, d) for s in self.specs or () for d in s.devices for c in self.contracts]

    # ---------------------------------------------------------------- hooks

    def pytest_report_header(self, config: pytest.Config) -> list[str] | None:
        if self.specs is None or self.options is None:
            return None
        names = ", ".join(s.name for s in self.specs)
        cuda = f"cuda ({torch.cuda.get_device_name()})" if _cuda_usable() else "cuda: not available, CUDA tests not run"
        return [
            f"autograd-conformance: suite in {PACKAGE_DIR.parent}; {len(self.specs)} Functions registered from "
            f"--impl={self.options.impl}: {names}",
            f"autograd-conformance: devices {', '.join(self.devices)} [{cuda}]; profile {self.options.profile}; "
            f"seed {self.options.seed}; triton {_triton_mode()}; torch {torch.__version__}",
        ]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if CONTRACT_FIXTURE not in metafunc.fixturenames:
            return
        params = [
            pytest.param((spec, device), id=f"{spec.name}-{device}")
            for spec in self.load()
            for device in self.devices
            if device in spec.devices
        ]
        metafunc.parametrize(CONTRACT_FIXTURE, params, indirect=True)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.options is None:
            return
        for item in items:
            test = _contract_test(item)
            if test is None:
                continue
            item.stash[contract_test_key] = test
            key = test.key
            item.user_properties.append((TEST_PROPERTY, key))
            if self.expectations is not None:
                self._apply_expectations(item, key)
        wanted = set(_list_setting(config, "conformance_contracts"))
        unwanted = set(_list_setting(config, "conformance_skip_contracts"))
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

    def _apply_expectations(self, item: pytest.Item, key: tuple[str, str, str]) -> None:
        assert self.expectations is not None
        matching = self.expectations.for_test(*key)
        whole = [e for e in matching if e.dtype is None]
        if whole:
            item.add_marker(pytest.mark.xfail(
                reason=f"expected deviation {whole[0].label}: {whole[0].reason}", strict=self.expectations.strict,
            ))
            item.user_properties.append((EXPECTATION_PROPERTY, whole[0].label))
        item.stash[_dtype_expectations_key] = tuple(e for e in matching if e.dtype is not None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        properties = dict(report.user_properties)
        key = properties.get(TEST_PROPERTY)
        if not isinstance(key, (tuple, list)) or (report.when != "call" and report.passed):
            return
        contract, function, device = key
        outcome, reason = _outcome_and_reason(report, properties)
        self.matrix.record(function, device, contract, Cell(
            outcome=outcome,
            reason=reason,
            duration=report.duration if report.when == "call" else 0.0,
            repro=str(properties.get(REPRO_PROPERTY, "")),
            message=_failure_message(report, properties) if outcome in ("failed", "error", "xpassed") else "",
            rerun=str(properties.get(RERUN_PROPERTY, "")),
        ))
        if self.expectations is not None:
            if outcome == "xpassed" and isinstance(properties.get(EXPECTATION_PROPERTY), str):
                self.expectations.xpassed.add(str(properties[EXPECTATION_PROPERTY]))
            for name, value in report.user_properties:
                if name == UNMET_EXPECTATION_PROPERTY:
                    self.expectations.xpassed.add(str(value))

    def stale_expectations(self) -> list[str]:
        if self.expectations is None or self.specs is None:
            return []
        return self.expectations.stale(self.possible_tests())

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker or self.options is None:
            return
        stale = self.stale_expectations()
        if stale:
            assert self.expectations is not None
            strict = " (strict: the run fails)" if self.expectations.strict else ""
            terminalreporter.section(f"autograd-conformance: stale expectations{strict}")
            for line in stale:
                terminalreporter.write_line(f"{self.expectations.path}: {line}")
        if self.matrix.totals() and sum(self.matrix.totals().values()):
            lines = self.matrix.terminal_lines(verbosity=config.get_verbosity())
            if lines:
                terminalreporter.section("autograd-conformance")
                for line in lines:
                    terminalreporter.write_line(line)
        path = _setting(config, "conformance_report")
        if path and sum(self.matrix.totals().values()):
            written = self.matrix.write(_resolve(config, path), self.run_info())
            terminalreporter.write_line(f"autograd-conformance: report written to {', '.join(str(p) for p in written)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker or self.expectations is None or not self.expectations.strict:
            return
        if self.stale_expectations() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def run_info(self) -> RunInfo:
        assert self.options is not None
        versions = {"python": platform.python_version(), "torch": torch.__version__}
        for package, dist in (("hypothesis", "hypothesis"), ("pytest", "pytest"), ("triton", "triton"),
                              ("autograd-conformance", "autograd-conformance")):
            try:
                versions[package] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                versions[package] = "not installed"
        described = f"cuda: {torch.cuda.get_device_name()}" if _cuda_usable() else "cpu only (CUDA not available)"
        dtypes = tuple(str(d).removeprefix("torch.") for d in self.options.dtypes) if self.options.dtypes else None
        return RunInfo(
            seed=self.options.seed,
            profile=self.options.profile,
            max_examples=self.options.hypothesis_settings().max_examples,
            impl=self.options.impl,
            devices=self.devices,
            dtypes=dtypes,
            device_description=described,
            triton=_triton_mode(),
            versions=versions,
            command=shlex.join(["pytest", *self.config.invocation_params.args]),
            header=tuple(self.pytest_report_header(self.config) or ()),
        )


def _resolve(config: pytest.Config, path: str) -> Path:
    return Path(config.invocation_params.dir) / path


def _failure_message(report: pytest.TestReport, properties: dict[str, Any]) -> str:
    """The contract's own report when the failure is a contract failure, else pytest's text."""
    own = properties.get(FAILURE_REPORT_PROPERTY)
    return str(own) if own and report.when == "call" else report.longreprtext


def _outcome_and_reason(report: pytest.TestReport, properties: dict[str, Any]) -> tuple[str, str]:
    """The matrix outcome of one report and its one-line reason."""
    status = properties.get(STATUS_PROPERTY)
    if hasattr(report, "wasxfail"):
        return ("xfailed" if report.skipped else "xpassed"), str(report.wasxfail)
    if report.failed:
        failure = properties.get(FAILURE_PROPERTY)
        reason = str(failure) if failure else (report.longreprtext.strip().splitlines() or [""])[-1]
        return ("failed" if report.when == "call" else "error"), reason
    if report.skipped:
        longrepr = report.longrepr
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        outcomes = {NOT_APPLICABLE: "not_applicable", NOT_RUN_HERE: "not_run_here", "waived": "waived"}
        if isinstance(status, str) and status.startswith("blocked by "):
            return "blocked", reason
        return outcomes.get(str(status), "skipped"), reason
    return "passed", ""


def _move_hypothesis_home(config: pytest.Config) -> None:
    """Keep Hypothesis's home folder (its cache of the constants it finds in source files) out of
    the user's project: `.hypothesis/` in the current directory by default, although the suite
    uses no example database. It goes into pytest's cache, else a temporary folder removed after
    the run; HYPOTHESIS_STORAGE_DIRECTORY, when set, is left to decide."""
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
        scratch = tempfile.TemporaryDirectory(prefix="autograd-conformance-hypothesis-")
        config.add_cleanup(scratch.cleanup)
        home = Path(scratch.name)
    previous = vars(configuration).get("__hypothesis_home_directory")  # restored for in-process runs
    configuration.set_hypothesis_home_dir(home)
    config.add_cleanup(lambda: configuration.set_hypothesis_home_dir(previous))


def activate(config: pytest.Config) -> ConformanceSession:
    """Register this run's session (called by the start-up plugin when the run uses the suite)."""
    session = ConformanceSession(config)
    config.stash[_session_key] = session
    config.pluginmanager.register(session, "autograd-conformance-session")
    _move_hypothesis_home(config)
    session.load()
    session.watch_crashes()
    return session


# ------------------------------------------------------------------------ collection


def known_contracts() -> list[str]:
    return sorted(discover())


def _check_contract_names(config: pytest.Config, contracts: dict[str, ContractInfo]) -> None:
    known = sorted(contracts)
    for flag, name in (("--contracts", "conformance_contracts"), ("--skip-contracts", "conformance_skip_contracts")):
        unknown = [c for c in _list_setting(config, name) if c not in known]
        if unknown:
            raise pytest.UsageError(f"{flag}: unknown contracts {unknown}; choose from {', '.join(known)}")


def _contract_test(item: pytest.Item) -> ContractTest | None:
    """What a contract test item checks (its declaration and parameter), else None."""
    info = contract_of(getattr(item, "function", None))
    callspec = getattr(item, "callspec", None)
    if info is None or callspec is None or CONTRACT_FIXTURE not in callspec.params:
        return None
    spec, device = callspec.params[CONTRACT_FIXTURE]
    return ContractTest(contract=info, spec=spec, device=device)


def rerun_command(config: pytest.Config, item: pytest.Item, options: RunOptions, device: str) -> str:
    """The command that replays ``item``'s examples, for how this suite was loaded.

    A copy inside the directory pytest ran in (checkout, vendored) is named by path; an
    installed one by ``--pyargs``. ``python -m pytest`` puts that directory on ``sys.path``
    like the run had it. Every option that shapes the examples is spelled out.
    """
    run_dir = Path(config.invocation_params.dir).resolve()
    path = Path(item.path).resolve()
    if run_dir in path.parents and not {"site-packages", "dist-packages"} & set(path.parts):
        selector = f"{os.path.relpath(path, run_dir)}::{item.name}"
        target = [selector]
    else:
        target = ["--pyargs", f"conformance.{path.stem}::{item.name}"]
    parts = ["python", "-m", "pytest", *target, f"--impl={options.impl}", f"--device={device}",
             f"--seed={options.seed}", f"--profile={options.profile}"]
    if options.max_examples is not None:
        parts.append(f"--max-examples={options.max_examples}")
    if options.dtypes is not None:
        parts.append("--dtypes=" + ",".join(str(d).removeprefix("torch.") for d in options.dtypes))
    if options.threads != SUITE_THREADS:
        parts.append(f"--threads={options.threads}")  # a parallel reduction's order follows it
    return shlex.join(parts)


def _repro_dir(request: pytest.FixtureRequest) -> Path:
    report = _setting(request.config, "conformance_report")
    if report:
        return _resolve(request.config, f"{report}.repro")
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    return factory.getbasetemp() / "conformance-repro"


def make_target(request: pytest.FixtureRequest) -> Target:
    """The ``conformance_target`` fixture's value: the Function and device this test checks."""
    node = request.node
    test = node.stash.get(contract_test_key, None)
    if test is None:  # collected without the session's modifyitems hook (a plugin dropped it)
        test = _contract_test(node)
        if test is None:
            raise pytest.UsageError(f"{node.nodeid} uses {CONTRACT_FIXTURE} but is not a declared @contract test")
    spec, device = test.spec, test.device
    session = request.config.stash[_session_key]
    options = session.ensure_options()
    rerun = rerun_command(request.config, node, options, device)
    node.user_properties.append((RERUN_PROPERTY, rerun))
    if session.flight is not None:
        session.flight.start_test(node.nodeid, test.contract.name, spec.name, device, rerun)
    target = Target(
        flight=session.flight,
        spec=spec,
        device=device,
        contract=test.contract.name,
        case_options=test.contract.case,
        contract_examples=test.contract.max_examples,
        options=options,
        nodeid=node.nodeid,
        user_properties=node.user_properties,
        rerun=rerun,
        repro_dir=_repro_dir(request),
        run_dir=Path(request.config.invocation_params.dir),
        dtype_expectations=node.stash.get(_dtype_expectations_key, ()),
        strict_expectations=session.expectations is not None and session.expectations.strict,
    )
    if device == "cuda" and not _cuda_usable():
        target.not_run_here(f"CUDA is not available on this machine ({_cuda_findings()})")
    if not target.dtypes():
        target.not_run_here(f"--dtypes excludes every dtype {spec.name!r} lists ({', '.join(str(d) for d in spec.dtypes)})")
    reason = spec.waivers.get(target.contract)
    if reason is not None:
        node.user_properties.append((STATUS_PROPERTY, "waived"))
        pytest.skip(f"waived by spec {spec.name!r}: {reason}")
    for requirement in test.contract.requires:
        requirement.check(target)  # skips (n/a or not run here) when unmet
    return target
