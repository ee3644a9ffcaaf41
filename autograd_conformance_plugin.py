"""The pytest plugin of autograd-conformance: the only module pytest imports at start-up.

It is registered through the ``pytest11`` entry point in every environment the suite is
installed in, so it must cost nothing and break nothing in runs that do not use it: it imports
neither torch nor the suite's packages (``conformance``, ``strategies``, ``reference_ops`` --
generic names a user's project may also have), only adds its options, and hides the contract
test modules from collection. A run that names the suite (a path inside ``conformance/``,
``--pyargs conformance``) or passes ``--impl`` activates it: then the suite is imported and a
:class:`conformance.plugin.session.ConformanceSession` takes over.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

# Where this module was installed; the suite's packages sit next to it.
PLUGIN_ROOT = Path(__file__).resolve().parent
SUITE_PACKAGES = ("conformance", "strategies")  # reference_ops is optional (a vendored copy may omit it)
DEFAULT_IMPL = "reference_ops"
DEVICE_CHOICES = ("auto", "cpu", "cuda")
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
PROFILE_NAMES = ("dev", "ci", "thorough")  # conformance/profiles.py holds their settings
CONTRACT_FIXTURE = "conformance_target"

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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "autograd-conformance (contract tests for torch.autograd.Function)")

    def option(name: str, ini: str, help_text: str, **kwargs: Any) -> None:
        group.addoption(name, dest=ini, default=None, help=f"{help_text} (ini: {ini})", **kwargs)
        parser.addini(ini, help_text, default=None)

    option(
        "--impl",
        "conformance_impl",
        "comma-separated modules or paths to .py files whose register() calls are tested; "
        f"default {DEFAULT_IMPL}. Module names are also looked up in the directory pytest runs in "
        "and the rootdir, so an uninstalled project works",
        metavar="MODULES",
    )
    option(
        "--device",
        "conformance_device",
        "auto (cpu, plus cuda tests reported as not run here when CUDA is absent), cpu, or cuda "
        "(a usage error when CUDA is not usable); default auto",
        metavar="DEVICE",
    )
    option(
        "--gpus-per-worker",
        "conformance_gpus_per_worker",
        "under pytest-xdist with CUDA: how many visible GPUs each worker gets (worker gwN is pinned to "
        "the first of its own); default 1",
        metavar="N",
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
        f"Hypothesis settings profile: {', '.join(PROFILE_NAMES)}; default dev",
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
        f"comma-separated dtypes to test, from {', '.join(DTYPE_NAMES)}; default every dtype the spec lists",
        metavar="DTYPES",
    )
    option(
        "--contracts",
        "conformance_contracts",
        "comma-separated contracts to run (e.g. gradcheck,grad_meta); default all",
        metavar="NAMES",
    )
    option(
        "--skip-contracts",
        "conformance_skip_contracts",
        "comma-separated contracts to leave out",
        metavar="NAMES",
    )
    option(
        "--expectations",
        "conformance_expectations",
        "JSON file of known deviations, {\"contract[name-device]\": \"reason\"} or a list of "
        "{contract, function, device, dtype, reason} objects: those tests xfail with the reason; "
        "entries that match no test or pass are reported as stale",
        metavar="FILE",
    )
    option(
        "--strict-expectations",
        "conformance_strict_expectations",
        "fail the run on a stale expectation (one that matches no test, or whose test passed)",
        action="store_const",
        const="true",
    )
    option(
        "--example-timeout",
        "conformance_example_timeout",
        "seconds one example may run before it fails as a hang naming the phase (forward, backward, "
        "reference, gradcheck); 0 for no limit; a spec's register(..., timeout=) overrides it; default 300",
        metavar="SECONDS",
    )
    option(
        "--threads",
        "conformance_threads",
        "torch intra-op threads the suite's evaluations run with; the suite's tensors are small, so "
        "more threads only spin; the previous setting is put back when the run ends; default 1",
        metavar="N",
    )
    option(
        "--compile-backends",
        "conformance_compile_backends",
        "comma-separated torch.compile backends the compile contract checks (fullgraph=True): aot_eager "
        "(the default: AOTAutograd's graphs run eagerly, seconds per Function) and/or inductor (generated "
        "kernels: a C++ compiler on CPU, ~15 s for the first Function)",
        metavar="NAMES",
    )
    option(
        "--isolate",
        "conformance_isolate",
        "run every contract test in a forked child process, so a Function that exits the process or "
        "segfaults fails its test (with its case) and the run goes on; CPU only (use -n N for CUDA)",
        action="store_const",
        const="true",
    )
    option(
        "--conformance-report",
        "conformance_report",
        "write PATH.json, PATH.md and PATH.html: the matrix of Functions x contracts with outcomes, "
        "reasons and repro scripts (written to PATH.repro/)",
        metavar="PATH",
    )


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
    from conformance.plugin.session import activate

    activate(config)


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
