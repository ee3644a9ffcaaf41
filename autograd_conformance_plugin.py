"""The pytest plugin of autograd-conformance: the only module pytest imports at start-up.

It is registered through the ``pytest11`` entry point in every environment the suite is
installed in, so it must cost nothing and break nothing in runs that do not use it: it imports
neither torch nor the suite's packages (``conformance``, ``strategies``, ``reference_ops`` --
generic names a user's project may also have), only adds its options, and hides the contract
test modules from collection. A run that names the suite (a path inside ``conformance/``,
``--pyargs conformance``) or passes ``--impl`` activates it: its option values are read once
(:func:`read_values`, from the table :data:`OPTIONS`), then the suite is imported and a
:class:`conformance.plugin.session.ConformanceSession` takes over with them -- on an xdist
controller only once its workers are started (:class:`WorkersFirst`).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

import pytest

# Where this module was installed; the suite's packages sit next to it.
PLUGIN_ROOT = Path(__file__).resolve().parent
SUITE_PACKAGES = ("conformance", "strategies")  # reference_ops is optional (a vendored copy may omit it)
DEFAULT_IMPL = "reference_ops"
CONTRACT_FIXTURE = "conformance_target"

# The run's vocabularies, kept here once: this module cannot import the suite, and the suite
# receives the values it parses.
DEVICE_CHOICES = ("auto", "cpu", "cuda")
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
# torch.compile backends the compile contract knows how to judge (--compile-backends).
COMPILE_BACKENDS = ("aot_eager", "inductor", "eager")
# Hypothesis settings per --profile. Every profile is seeded per test (the same --seed gives the
# same examples and verdicts on any machine) and runs without an example database (a failure
# replayed from one machine's history would make verdicts depend on it); they differ in how
# hard they look.
PROFILES: Mapping[str, Mapping[str, int | bool]] = MappingProxyType({
    "dev": MappingProxyType({"max_examples": 5}),  # the local loop: a first verdict fast
    "ci": MappingProxyType({"max_examples": 10, "derandomize": True}),  # fixed count, printed seed: what CI gates on
    "thorough": MappingProxyType({"max_examples": 100}),  # before a release, or after touching a backward
})
PROFILE_NAMES = tuple(PROFILES)

# The key under which an xdist controller tells each worker where flight records go.
FLIGHT_DIR_KEY = "conformance_flight_dir"

_active_key = pytest.StashKey[bool]()
_root_key = pytest.StashKey[Path]()


def suite_root() -> Path:
    """The folder holding the ``conformance`` package that ``import conformance`` would load --
    a vendored copy first on sys.path wins over an installed one -- found without importing it;
    this module's own folder when that package is not the suite (a user's own ``conformance``)."""
    found = importlib.util.find_spec("conformance")
    if found is not None and found.origin:
        package = Path(found.origin).resolve().parent
        if (package / "plugin" / "session.py").is_file() and (package / "test_grad_meta.py").is_file():
            return package.parent
    return PLUGIN_ROOT


def _package_dir(config: pytest.Config) -> Path:
    root = config.stash.get(_root_key, None)
    if root is None:
        root = config.stash[_root_key] = suite_root()
    return root / "conformance"


OptionValue = str | int | float | bool | tuple[str, ...] | None
OptionKind = Literal["str", "int", "float", "list", "flag"]


@dataclass(frozen=True)
class Option:
    """One option of the suite: its flag, its ini key, how its value is read and what it means.

    ``kind`` is ``str``, ``int``, ``float``, ``list`` (comma-separated) or ``flag`` (no value on
    the command line; true/yes/1 in an ini file). ``choices`` restricts a ``str`` or the items
    of a ``list``. ``example`` is what error messages suggest; ``unset`` what leaving the option
    out means (``help`` ends with it).
    """

    flag: str
    kind: OptionKind
    help: str
    default: OptionValue = None
    choices: tuple[str, ...] = ()
    metavar: str = ""
    example: str = ""
    unset: str = ""

    @property
    def name(self) -> str:
        """The key of its value in :func:`read_values`' result (the flag without dashes)."""
        return self.flag.removeprefix("--").removeprefix("conformance-").replace("-", "_")

    @property
    def ini(self) -> str:
        return f"conformance_{self.name}"


OPTIONS: tuple[Option, ...] = (
    Option(
        "--impl", "str",
        "comma-separated modules or paths to .py files whose register() calls are tested. Module names are "
        "also looked up in the directory pytest runs in and the rootdir, so an uninstalled project works",
        default=DEFAULT_IMPL, metavar="MODULES", example="--impl=mypkg or --impl=path/to/specs.py",
        unset=f"the bundled {DEFAULT_IMPL}",
    ),
    Option(
        "--device", "str",
        "auto (cpu, plus cuda tests reported as not run here when CUDA is absent), cpu, or cuda "
        "(a usage error when CUDA is not usable)",
        default="auto", choices=DEVICE_CHOICES, metavar="DEVICE", example="--device=cpu", unset="auto",
    ),
    Option(
        "--gpus-per-worker", "int",
        "under pytest-xdist with CUDA: how many visible GPUs each worker gets (worker gwN is pinned to "
        "the first of its own)",
        default=1, metavar="N", example="--gpus-per-worker=1", unset="1",
    ),
    Option(
        "--max-examples", "int", "Hypothesis examples per test; overrides the profile's",
        metavar="N", example="--max-examples=20", unset="the profile's",
    ),
    Option(
        "--profile", "str", f"Hypothesis settings profile: {', '.join(PROFILE_NAMES)}",
        default="dev", choices=PROFILE_NAMES, metavar="NAME", example="--profile=ci", unset="dev",
    ),
    Option(
        "--seed", "int", "base seed for every property (same seed => same examples and verdicts)",
        default=0, metavar="N", example="--seed=0", unset="seed 0",
    ),
    Option(
        "--dtypes", "list", f"comma-separated dtypes to test, from {', '.join(DTYPE_NAMES)}",
        default=(), choices=DTYPE_NAMES, metavar="DTYPES", example="--dtypes=float32,bfloat16",
        unset="every dtype the spec lists",
    ),
    Option(
        "--contracts", "list", "comma-separated contracts to run (e.g. gradcheck,grad_meta)",
        default=(), metavar="NAMES", example="--contracts=gradcheck,grad_meta", unset="every contract",
    ),
    Option(
        "--skip-contracts", "list", "comma-separated contracts to leave out",
        default=(), metavar="NAMES", example="--skip-contracts=gradgradcheck", unset="none skipped",
    ),
    Option(
        "--expectations", "str",
        "JSON file of known deviations, {\"contract[name-device]\": \"reason\"} or a list of "
        "{contract, function, device, dtype, reason} objects: those tests xfail with the reason; "
        "entries that match no test or pass are reported as stale",
        metavar="FILE", example="--expectations=expectations.json", unset="no expectations",
    ),
    Option(
        "--strict-expectations", "flag",
        "fail the run on a stale expectation (one that matches no test, or whose test passed)",
        default=False,
    ),
    Option(
        "--example-timeout", "float",
        "seconds one example may run before it fails as a hang naming the phase (forward, backward, "
        "reference, gradcheck); 0 for no limit; a spec's register(..., timeout=) overrides it",
        default=300.0, metavar="SECONDS", example="--example-timeout=60", unset="300",
    ),
    Option(
        "--threads", "int",
        "torch intra-op threads the suite's evaluations run with; the suite's tensors are small, so "
        "more threads only spin; the previous setting is put back when the run ends",
        default=1, metavar="N", example="--threads=1", unset="1",
    ),
    Option(
        "--compile-backends", "list",
        "comma-separated torch.compile backends the compile contract checks: aot_eager "
        "(AOTAutograd's graphs run eagerly, seconds per Function) and/or inductor (generated "
        "kernels: a C++ compiler on CPU, ~15 s for the first Function)",
        default=("aot_eager",), choices=COMPILE_BACKENDS, metavar="NAMES",
        example="--compile-backends=aot_eager,inductor", unset="aot_eager",
    ),
    Option(
        "--advice", "str",
        "what advice does (performance or hygiene of correct code: a graph break, a recompile, unneeded "
        "gradient work, an undeclared double backward): report it, or fail the test",
        default="report", choices=("report", "fail"), metavar="ACTION", example="--advice=fail", unset="report",
    ),
    Option(
        "--upstream", "str",
        "what an upstream finding does (only torch.compile or another torch component is wrong while eager is "
        "right: torch's bug): report it with a repro and workaround, or fail the test",
        default="report", choices=("report", "fail"), metavar="ACTION", example="--upstream=fail", unset="report",
    ),
    Option(
        "--isolate", "flag",
        "run every contract test in a forked child process, so a Function that exits the process or "
        "segfaults fails its test (with its case) and the run goes on; CPU only (use -n N for CUDA)",
        default=False,
    ),
    Option(
        "--author-coverage", "flag",
        "measure with coverage.py which lines and branches of each Function's own code (forward, backward, "
        "jvp, vmap and the helpers they call in its package) no example ran; listed per Function in the "
        "terminal summary and the reports. It slows a run by about half (measured), so it is off by default",
        default=False,
    ),
    Option(
        "--shard", "str",
        "run slice K of N: every contract test of one Function on one device goes to the same slice, the "
        "slices balanced by test count and the same on every machine; merge the slices' reports with "
        "`python -m conformance.plugin.merge`",
        metavar="K/N", example="--shard=2/3", unset="the whole run",
    ),
    Option(
        "--conformance-report", "str",
        "write PATH.json, PATH.md and PATH.html: the matrix of Functions x contracts with outcomes, "
        "reasons and repro scripts (written to PATH.repro/); a PATH ending in .json, .md or .html "
        "names the same three files",
        metavar="PATH", example="--conformance-report=reports/conformance", unset="no report",
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "autograd-conformance (contract tests for torch.autograd.Function)")
    for option in OPTIONS:
        help_text = f"{option.help}; default {option.unset}" if option.unset else option.help
        if option.kind == "flag":
            group.addoption(option.flag, dest=option.ini, action="store_true", default=None, help=f"{help_text} (ini: {option.ini})")
            parser.addini(option.ini, help_text, default=None)
        else:
            group.addoption(option.flag, dest=option.ini, default=None, metavar=option.metavar, help=f"{help_text} (ini: {option.ini})")
            parser.addini(option.ini, help_text, default=None)


class _Settings(Protocol):
    def getoption(self, name: str, default: Any = ...) -> Any: ...

    def getini(self, name: str) -> Any: ...


def read_values(config: _Settings) -> dict[str, OptionValue]:
    """Every option's value by :attr:`Option.name`: the command line's, else the ini file's, else the
    default; converted by kind and checked against its choices. Raises :class:`pytest.UsageError`
    that echoes the bad value (an empty value on the command line is one: `--impl=$IMPL` with
    IMPL unset must not quietly mean the default)."""
    values = {option.name: _read(config, option) for option in OPTIONS}
    values["seed"] = _seed_or_hypothesis_seed(config, values["seed"])
    return values


def _seed_or_hypothesis_seed(config: _Settings, seed: OptionValue) -> OptionValue:
    """Every property of the suite is seeded from ``--seed``; Hypothesis's own ``--hypothesis-seed``
    never reaches them, so a run given only that one used seed 0 without a word. An integer
    there is the run's seed when ``--seed`` is not given; anything else is a usage error."""
    given = config.getoption("hypothesis_seed", default=None)
    if given is None:
        return seed
    try:
        wanted = int(str(given))
    except ValueError:
        raise pytest.UsageError(
            f"--hypothesis-seed={given!r}: autograd-conformance seeds its examples from an integer; "
            f"pass e.g. --seed=0 (or --hypothesis-seed=0)"
        ) from None
    explicit = config.getoption("conformance_seed", default=None)
    if explicit is not None and int(str(explicit)) != wanted:
        raise pytest.UsageError(
            f"--hypothesis-seed={given!r} and --seed={explicit!r}: autograd-conformance seeds its examples from one "
            f"seed; give one of them (--seed is the suite's own)"
        )
    return wanted


def _read(config: _Settings, option: Option) -> OptionValue:
    given = config.getoption(option.ini, default=None)
    if option.kind == "flag":
        if given is not None:
            return bool(given)
        configured = config.getini(option.ini)
        return str(configured).strip().lower() in ("1", "true", "yes") if configured else bool(option.default)
    if given is not None and not str(given).replace(",", " ").strip():
        raise pytest.UsageError(
            f"{option.flag} is empty ({option.flag}={given!r}; an unset variable?); pass e.g. {option.example}, "
            f"or leave {option.flag} out for the default ({option.unset})"
        )
    raw = given if given is not None else config.getini(option.ini)
    if raw is None or str(raw).strip() == "":
        return option.default
    return _convert(option, str(raw))


def _convert(option: Option, raw: str) -> OptionValue:
    flag, example = option.flag, option.example
    if option.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise pytest.UsageError(f"{flag}={raw!r} is not an integer; pass e.g. {example}") from None
    if option.kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise pytest.UsageError(f"{flag}={raw!r} is not a number; pass e.g. {example}") from None
    if option.kind == "list":
        items = tuple(dict.fromkeys(item.strip() for item in raw.split(",") if item.strip()))
        unknown = [item for item in items if option.choices and item not in option.choices]
        if unknown:
            raise pytest.UsageError(f"{flag}: unknown {unknown}; choose from {', '.join(option.choices)}, e.g. {example}")
        return items
    if option.choices and raw not in option.choices:
        raise pytest.UsageError(f"{flag}={raw!r} is not one of {', '.join(option.choices)}; pass e.g. {example}")
    return raw


def targets_the_suite(config: pytest.Config) -> bool:
    """True when the invocation names the suite: a path inside ``conformance/`` (or that folder),
    or ``--pyargs conformance[.test_x]``."""
    package_dir = _package_dir(config)
    for arg in config.args:
        path_part = str(arg).split("::")[0]
        if path_part == "conformance" or path_part.startswith("conformance."):
            return True
        try:
            resolved = (Path(config.invocation_params.dir) / path_part).resolve()
        except OSError:
            continue
        if resolved == package_dir or package_dir in resolved.parents:
            return True
    return False


def check_suite_imports(root: Path) -> None:
    """One clear error when a package of the user's shadows one of the suite's."""
    for name in SUITE_PACKAGES:
        found = importlib.util.find_spec(name)
        origin = Path(found.origin).resolve() if found is not None and found.origin else None
        expected = root / name / "__init__.py"
        if origin != expected:
            where = str(origin) if origin else "nothing importable"
            raise pytest.UsageError(
                f"autograd-conformance needs its own top-level package {name!r} ({expected}), but "
                f"'import {name}' finds {where} first on sys.path. Rename your package, or run the suite "
                f"where yours is not importable: `pytest --import-mode=importlib --pyargs conformance ...` "
                f"from another directory (not `python -m pytest`, which puts the current directory first)"
            )


def runs_tests_here(config: Any) -> bool:
    """False on an xdist controller, which hands every test to a worker and only receives reports
    (xdist's own test: a --dist mode and workers to send to, both set before pytest_configure)."""
    if hasattr(config, "workerinput"):
        return True
    option = config.option
    return getattr(option, "dist", "no") == "no" or not getattr(option, "tx", None)


class WorkersFirst:
    """On an xdist controller: the suite is activated after xdist has started the workers.

    Activation imports torch and the ``--impl`` modules (~1.5 s); each worker does the same for
    itself, so a controller that activated first kept both cores waiting for it. Until then this
    plugin gives xdist what it needs while starting the workers (where flight records go) and
    activates at the controller's first step after that (``pytest_collection``), printing the
    header lines the terminal could not have yet."""

    def __init__(self, config: pytest.Config, values: Mapping[str, OptionValue]) -> None:
        self.config = config
        self.values = values
        self.flight_dir = Path(tempfile.mkdtemp(prefix="conformance-flight-"))
        config.add_cleanup(lambda: shutil.rmtree(self.flight_dir, ignore_errors=True))
        self.activated = False

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[FLIGHT_DIR_KEY] = str(self.flight_dir)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        self.activate()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        self.activate()  # when another plugin's pytest_collection answered first

    def activate(self) -> None:
        if self.activated:
            return
        self.activated = True
        from conformance.plugin.session import activate

        activated = activate(self.config, self.values, flight_dir=self.flight_dir)
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        if terminal is not None and terminal.showheader and not terminal.no_header:
            for line in activated.pytest_report_header(self.config):
                terminal.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance_contract(name): a contract test of autograd-conformance (set by the plugin)"
    )
    active = config.getoption("conformance_impl", default=None) is not None or targets_the_suite(config)
    config.stash[_active_key] = active
    if not active:
        return  # inert: nothing imported, contract modules hidden from collection
    check_suite_imports(_package_dir(config).parent)
    values = read_values(config)  # parsed once here, typed and checked by conformance.plugin.options
    if not runs_tests_here(config):
        config.pluginmanager.register(WorkersFirst(config, values), "autograd-conformance-workers-first")
        return
    from conformance.plugin.session import activate

    activate(config, values)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In a run that does not use the suite (e.g. a host project's own ``pytest tests`` next to a
    vendored copy), the contract modules are not collected at all."""
    if config.stash.get(_active_key, False):
        return None
    package_dir = _package_dir(config)
    if collection_path == package_dir or package_dir in collection_path.parents:
        return True
    return None


@pytest.fixture
def conformance_target(request: pytest.FixtureRequest) -> Any:
    """The registered Function and device this contract test checks."""
    from conformance.plugin.session import make_target

    return make_target(request)
