"""The pytest plugin: options, loading ``--impl``, and parametrizing the contract tests.

Registered through the ``pytest11`` entry point, it stays inert in a run that does not ask for
it: it adds its options and a marker, and does nothing else unless the run collects the contract
tests in this package or passes ``--impl``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.loader import ImplError, load_impls
from conformance.outcomes import Expectations, OutcomeMatrix, test_key
from conformance.runner import PROFILES, STATUS_PROPERTY, RunOptions, Target
from conformance.spec import Spec, SpecError

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_IMPL = "reference_ops"
DEVICE_CHOICES = ("auto", "cpu", "cuda")
_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

_state_key = pytest.StashKey["_State"]()


class _State:
    def __init__(self) -> None:
        self.specs: list[Spec] | None = None
        self.options: RunOptions | None = None
        self.devices: tuple[str, ...] = ()
        self.expectations: Expectations | None = None
        self.matrix = OutcomeMatrix()


# ------------------------------------------------------------------------ options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "autograd-conformance (contract tests for torch.autograd.Function)")

    def option(name: str, ini: str, help_text: str, **kwargs: Any) -> None:
        group.addoption(name, dest=ini, default=None, help=f"{help_text} (ini: {ini})", **kwargs)
        parser.addini(ini, help_text, default=None)

    option(
        "--impl",
        "conformance_impl",
        "comma-separated modules or paths to .py files whose register() calls are tested; "
        f"default {DEFAULT_IMPL}",
        metavar="MODULES",
    )
    option(
        "--device",
        "conformance_device",
        "auto (cpu, plus cuda tests that skip when CUDA is absent), cpu or cuda; default auto",
        metavar="DEVICE",
    )
    option(
        "--max-examples",
        "conformance_max_examples",
        "Hypothesis examples per test; overrides the profile's",
        metavar="N",
    )
    option(
        "--profile",
        "conformance_profile",
        f"Hypothesis settings profile: {', '.join(PROFILES)}; default dev",
        metavar="NAME",
    )
    option(
        "--seed",
        "conformance_seed",
        "base seed for every property (same seed => same examples and verdicts); default 0",
        metavar="N",
    )
    option(
        "--dtypes",
        "conformance_dtypes",
        f"comma-separated dtypes to test, from {', '.join(_DTYPES)}; default every dtype the spec lists",
        metavar="DTYPES",
    )
    option(
        "--contracts",
        "conformance_contracts",
        "comma-separated contracts to run (e.g. gradcheck,grad_meta); default all",
        metavar="NAMES",
    )
    option(
        "--expectations",
        "conformance_expectations",
        "JSON file of known deviations {\"contract[name-device]\": \"reason\"}: those tests xfail "
        "with the reason; entries that match nothing or pass are reported as stale",
        metavar="FILE",
    )
    option(
        "--conformance-report",
        "conformance_report",
        "write PATH.json and PATH.md: the matrix of Functions x contracts with outcomes",
        metavar="PATH",
    )
    option(
        "--skip-contracts",
        "conformance_skip_contracts",
        "comma-separated contracts to leave out",
        metavar="NAMES",
    )


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


def _read_options(config: pytest.Config) -> tuple[RunOptions, tuple[str, ...]]:
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
    devices = ("cpu", "cuda") if device == "auto" else (device,)
    options = RunOptions(
        profile=profile,
        max_examples=max_examples,
        seed=seed,
        impl=_setting(config, "conformance_impl") or DEFAULT_IMPL,
        dtypes=tuple(_DTYPES[d] for d in dtype_names) or None,
    )
    return options, devices


# ------------------------------------------------------------------------ activation


def _targets_this_package(config: pytest.Config) -> bool:
    """True when the invocation names this package (a path inside it, or ``--pyargs conformance``)."""
    for arg in config.args:
        path_part = str(arg).split("::")[0]
        if path_part == "conformance" or path_part.startswith("conformance."):
            return True
        try:
            resolved = (Path(config.invocation_params.dir) / path_part).resolve()
        except OSError:
            continue
        if resolved == PACKAGE_DIR or PACKAGE_DIR in resolved.parents:
            return True
    return False


def _prepare_devices(config: pytest.Config) -> None:
    if not torch.cuda.is_available():
        # Triton kernels can only run under the interpreter, which must be chosen before
        # any @triton.jit function is decorated, i.e. before the --impl modules are imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())  # one GPU per worker


def _load(config: pytest.Config) -> list[Spec]:
    state = config.stash[_state_key]
    if state.specs is None:
        assert state.options is not None
        _prepare_devices(config)
        try:
            state.specs = load_impls(state.options.impl)
        except (SpecError, ImplError) as error:
            raise pytest.UsageError(str(error)) from None
        _check_contract_names(config)
    return state.specs


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance_contract(name): a contract test of autograd-conformance (set by the plugin)"
    )
    state = _State()
    config.stash[_state_key] = state
    explicit_impl = config.getoption("conformance_impl", default=None) is not None
    if not (explicit_impl or _targets_this_package(config)):
        return  # inert: options are parsed lazily if contract tests are collected anyway
    _ensure_options(config)
    _load(config)


def _ensure_options(config: pytest.Config) -> _State:
    state = config.stash[_state_key]
    if state.options is None:
        state.options, state.devices = _read_options(config)
    if state.expectations is None:
        path = _setting(config, "conformance_expectations")
        if path:
            state.expectations = Expectations.load(path)
    return state


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(_state_key, None)
    if state is None or state.specs is None or state.options is None:
        return None
    names = ", ".join(s.name for s in state.specs)
    cuda = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cuda: not available, tests skip"
    return [
        f"autograd-conformance: {len(state.specs)} Functions registered from --impl={state.options.impl}: {names}",
        f"autograd-conformance: devices {', '.join(state.devices)} [{cuda}]; profile {state.options.profile}; "
        f"seed {state.options.seed}; torch {torch.__version__}",
    ]


# ------------------------------------------------------------------------ collection

CONTRACT_FIXTURE = "conformance_target"


def _contract_name(function_name: str) -> str:
    return function_name[len("test_"):] if function_name.startswith("test_") else function_name


def known_contracts() -> list[str]:
    return sorted(p.stem[len("test_"):] for p in PACKAGE_DIR.glob("test_*.py"))


def _check_contract_names(config: pytest.Config) -> None:
    known = known_contracts()
    for flag, name in (("--contracts", "conformance_contracts"), ("--skip-contracts", "conformance_skip_contracts")):
        unknown = [c for c in _list_setting(config, name) if c not in known]
        if unknown:
            raise pytest.UsageError(f"{flag}: unknown contracts {unknown}; choose from {', '.join(known)}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CONTRACT_FIXTURE not in metafunc.fixturenames:
        return
    state = _ensure_options(metafunc.config)
    specs = _load(metafunc.config)
    cuda_available = torch.cuda.is_available()
    params = []
    for spec in specs:
        for device in state.devices:
            if device not in spec.devices:
                continue
            marks = []
            if device == "cuda" and not cuda_available:
                marks.append(pytest.mark.skip(reason="CUDA is not available on this machine (torch.cuda.is_available() is False)"))
            params.append(pytest.param((spec, device), id=f"{spec.name}-{device}", marks=marks))
    metafunc.parametrize(CONTRACT_FIXTURE, params, indirect=True)


def _item_key(item: pytest.Item) -> tuple[str, str] | None:
    """(contract, param id) of a contract test item, else None."""
    if CONTRACT_FIXTURE not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    return _contract_name(getattr(item, "originalname", item.name)), callspec.id


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash.get(_state_key, None)
    if state is None or state.options is None:
        return
    if state.expectations is not None:
        for item in items:
            key = _item_key(item)
            reason = state.expectations.reason_for(test_key(*key)) if key else None
            if reason is not None:
                item.add_marker(pytest.mark.xfail(reason=f"expected deviation: {reason}", strict=False))
    wanted = set(_list_setting(config, "conformance_contracts"))
    unwanted = set(_list_setting(config, "conformance_skip_contracts"))
    if not wanted and not unwanted:
        return
    kept, dropped = [], []
    for item in items:
        fixturenames = getattr(item, "fixturenames", ())
        contract = _contract_name(getattr(item, "originalname", item.name))
        if CONTRACT_FIXTURE in fixturenames and ((wanted and contract not in wanted) or contract in unwanted):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def conformance_target(request: pytest.FixtureRequest) -> Target:
    """The registered Function and device this contract test checks."""
    spec, device = request.param
    state = _ensure_options(request.config)
    assert state.options is not None
    target = Target(
        spec=spec,
        device=device,
        contract=_contract_name(request.node.originalname),
        options=state.options,
        nodeid=request.node.nodeid,
        user_properties=request.node.user_properties,
    )
    if not target.dtypes():
        pytest.skip(f"--dtypes excludes every dtype {spec.name!r} lists ({', '.join(str(d) for d in spec.dtypes)})")
    reason = spec.waivers.get(target.contract)
    if reason is not None:
        request.node.user_properties.append((STATUS_PROPERTY, "waived"))
        pytest.skip(f"waived by spec {spec.name!r}: {reason}")
    return target


# ------------------------------------------------------------------------ outcomes


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    state = config.stash.get(_state_key, None)
    if state is None or state.options is None or "::test_" not in report.nodeid or "[" not in report.nodeid:
        return
    function, _, param = report.nodeid.rpartition("::")[2].partition("[")
    if report.when != "call" and report.passed:
        return
    outcome: str = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.when != "call" and report.failed:
        outcome = "error"
    elif report.skipped:
        status = dict(report.user_properties).get(STATUS_PROPERTY)
        if isinstance(status, str):
            outcome = status
    key = (_contract_name(function), param.rstrip("]"))
    state.matrix.record(key[0], key[1], outcome)
    if outcome == "xpassed" and state.expectations is not None:
        state.expectations.passed_anyway.add(test_key(*key))


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    if state is None or state.options is None or hasattr(config, "workerinput"):
        return
    if state.expectations is not None:
        stale = state.expectations.stale()
        if stale:
            terminalreporter.section("autograd-conformance: stale expectations")
            for line in stale:
                terminalreporter.write_line(f"{state.expectations.path}: {line}")
    path = _setting(config, "conformance_report")
    if path and state.matrix.outcomes:
        header = pytest_report_header(config) or []
        json_path, md_path = state.matrix.write(path, header)
        terminalreporter.write_line(f"autograd-conformance: report written to {json_path} and {md_path}")
