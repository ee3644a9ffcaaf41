"""Helpers for the suite's own tests: run the contract tests with pytester, read verdicts."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from conformance.engine.verdict import Verdict as RecordedVerdict
from conformance.engine.verdict import unreported_defects
from tests.zoo_runs import ZOO_RUNS

if not torch.cuda.is_available():
    # As the plugin does: triton reads TRITON_INTERPRET when it is imported, not only when
    # kernels are decorated, so choose the interpreter before anything imports triton (the warm-ups
    # below import torch._inductor, which does: tl.sum and the rest of triton.language.standard
    # would stay compiled-only, "Cannot call @triton.jit'd outside of the scope of a kernel").
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Let the pytest and Python children these tests start keep their bytecode: with
# PYTHONDONTWRITEBYTECODE set, each one recompiles the suite and re-rewrites the asserts of
# every module of the hypothesis plugin's distribution, about 2 s per child.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _warm_term_bounds() -> None:
    """Same for what the term bounds (conformance/engine/terms.py) import lazily while following a
    decomposition (torch._decomp pulls in parts of torch._inductor that register operators)."""
    from conformance.engine.terms import TermMagnitudes

    x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    with TermMagnitudes():
        y = torch.nn.functional.layer_norm(torch.softmax(x, -1), (3,))
        torch.autograd.grad(y.sum(), x)


_warm_term_bounds()

try:
    # torch.testing.assert_close imports torch.distributed.tensor lazily. pytester's in-process
    # runs drop modules first imported inside them, and importing it again re-registers torch
    # operator libraries (RuntimeError: Only a single TORCH_LIBRARY ...). Import it up front.
    import torch.distributed.tensor
except ImportError:  # torch built without distributed
    pass


def _warm_compile() -> None:
    """Same for torch.compile: its modules register cache artifact types in a process-wide
    factory when first imported, and a second import after pytester dropped them fails
    ("Artifact of type=autotune already registered"). One aot_eager compile imports what the
    compile contract uses; inductor's entry point is imported for --compile-backends=inductor."""
    import torch._inductor.compile_fx

    compiled = torch.compile(lambda x: (x * 2).sum(), backend="aot_eager", fullgraph=True)
    compiled(torch.ones(2, requires_grad=True)).backward()
    torch._dynamo.reset()


_warm_compile()

try:
    # Same for triton (imported by reference_ops.triton): re-importing its C extension after
    # pytester dropped it fails (No module named 'triton._C.libtriton.linear_layout').
    import triton  # noqa: F401
except ImportError:  # the optional extra is not installed
    pass

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
CONFORMANCE_DIR = REPO / "conformance"
ZOO = Path(__file__).resolve().parent / "zoo"


@dataclass
class Verdict:
    outcome: str  # "passed" | "failed" | "skipped"
    text: str  # the failure (or skip) report, "" when passed
    properties: dict[str, object] = field(default_factory=dict)  # the report's user_properties
    log: str = ""  # what pytest's log capture kept ("Captured log call")

    @property
    def recorded(self) -> RecordedVerdict:
        """The verdict the runner wrote into the report (fails the calling test when there is none)."""
        __tracebackhide__ = True
        recorded = RecordedVerdict.of(self.properties.items())
        assert recorded is not None, f"no verdict recorded; properties: {self.properties}"
        return recorded


@dataclass
class ConformanceRun:
    """Verdicts of one in-process ``pytest conformance`` run, keyed by (contract, name, device)."""

    result: pytest.RunResult | None  # None when another xdist worker made the run
    verdicts: dict[tuple[str, str, str], Verdict]
    run_dir: Path  # where pytest ran (repro scripts run from there)

    def verdict(self, contract: str, name: str, device: str = "cpu") -> Verdict:
        key = (contract, name, device)
        if key not in self.verdicts:
            raise KeyError(f"no test for {key}; collected: {sorted(self.verdicts)}")
        return self.verdicts[key]

    def outcome(self, contract: str, name: str, device: str = "cpu") -> str:
        """pytest's outcome, except "failed" for a blocked test that is the only report of its
        defect (its owner did not fail): the run's matrix and exit status fail it."""
        verdict = self.verdict(contract, name, device)
        if verdict.outcome == "skipped" and self._reports_unowned_defect(contract, name, device):
            return "failed"
        return verdict.outcome

    def _reports_unowned_defect(self, contract: str, name: str, device: str) -> bool:
        row = {}
        for (c, fn, dev), verdict in self.verdicts.items():
            recorded = RecordedVerdict.of(verdict.properties.items()) if (fn, dev) == (name, device) else None
            if recorded is not None:
                row[c] = (recorded.outcome, recorded.owner)
        found = unreported_defects(row).get(contract)
        return found is not None and found.reporter == contract

    def failed(self, contract: str, name: str, device: str = "cpu") -> str:
        """The failure text; fails the calling test when the contract did not fail."""
        __tracebackhide__ = True
        verdict = self.verdict(contract, name, device)
        outcome = self.outcome(contract, name, device)
        assert outcome == "failed", f"{contract}[{name}-{device}] {outcome}, but should have failed"
        return verdict.text

    def passed(self, contract: str, name: str, device: str = "cpu") -> None:
        __tracebackhide__ = True
        verdict = self.verdict(contract, name, device)
        assert verdict.outcome == "passed", (
            f"{contract}[{name}-{device}] {verdict.outcome}, but should have passed:\n{verdict.text}"
        )

    def names(self) -> set[str]:
        return {name for _, name, _ in self.verdicts}


_cache: dict[tuple[str, ...], ConformanceRun] = {}


# The slowest modules (measured, --durations): handed out first, so no worker starts one as the other ends.
HEAVIEST_FIRST = frozenset({
    "test_triton_kernels.py", "test_hostile.py", "test_docs.py", "test_benchmark.py", "test_global_state.py",
    "test_beyond_eager.py",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The repro-script replays read the zoo runs other modules make: collected last, they find the
    runs made (under ``--dist loadfile`` modules are handed out in collection order) instead of
    making one while its module's worker waits for it. The slowest modules go first (a stable sort:
    the rest keep their order)."""
    items.sort(key=lambda item: (item.path.name == "test_repro_scripts.py", item.path.name not in HEAVIEST_FIRST))


def _shared_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the parent of the workers' basetemps)."""
    basetemp = tmp_path_factory.getbasetemp()
    folder = (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "conformance-runs"
    folder.mkdir(exist_ok=True)
    return folder


def run_conformance(
    pytester: pytest.Pytester,
    impl: str | Path,
    *extra: str,
    contracts: Sequence[str] = (),
    max_examples: int | None = 5,  # None: the profile's count (and its coverage phase)
    cache: bool = True,
    shared: Path | None = None,
) -> ConformanceRun:
    """Run the contract tests in-process against ``impl``; cached per argument set, and with
    ``shared`` (a folder all xdist workers see) across workers too: the first worker to need a run
    makes it under a file lock and the others read its verdicts, so each run is made once however
    the tests are spread."""
    args = [
        str(CONFORMANCE_DIR),
        f"--impl={impl}",
        "--device=cpu",
        *([f"--max-examples={max_examples}"] if max_examples is not None else []),
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    if contracts:
        args.append(f"--contracts={','.join(contracts)}")
    key = tuple(args)
    if not cache:
        return _run(pytester, args)
    if key not in _cache:
        _cache[key] = _run(pytester, args) if shared is None else _shared_run(pytester, args, shared)
    return _cache[key]


def _shared_run(pytester: pytest.Pytester, args: list[str], shared: Path) -> ConformanceRun:
    """The run another worker made and stored in ``shared``, else this one (stored for the others)."""
    stored = shared / f"{hashlib.sha256(chr(0).join(args).encode()).hexdigest()[:24]}.pickle"
    with open(stored.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if stored.exists():
            verdicts, run_dir = pickle.loads(stored.read_bytes())
            return ConformanceRun(None, verdicts, run_dir)
        run = _run(pytester, args)
        stored.write_bytes(pickle.dumps((run.verdicts, run.run_dir)))
        return run


def _run(pytester: pytest.Pytester, args: list[str]) -> ConformanceRun:
    result = pytester.runpytest_inprocess(*args)
    verdicts: dict[tuple[str, str, str], Verdict] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            continue
        test = dict(report.user_properties).get("conformance_test")  # (contract, function, device), set at collection
        if test is None:
            continue
        contract, name, device = test
        text = str(report.longrepr) if report.longrepr else ""
        verdicts[(contract, name, device)] = Verdict(report.outcome, text, dict(report.user_properties), report.caplog)
    return ConformanceRun(result, verdicts, pytester.path)


@pytest.fixture
def zoo_run(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``zoo_run(name)`` -> the :class:`ConformanceRun` of ``tests.zoo_runs.ZOO_RUNS[name]``."""

    def run(name: str) -> ConformanceRun:
        spec = ZOO_RUNS[name]
        return run_conformance(pytester, ZOO / spec.file, *spec.extra, contracts=spec.contracts,
                               max_examples=spec.max_examples, shared=_shared_cache_dir(tmp_path_factory))

    return run


@pytest.fixture
def conformance_run(pytester: pytest.Pytester):  # type: ignore[no-untyped-def]
    """``conformance_run(impl, *extra, contracts=..., max_examples=...)`` -> :class:`ConformanceRun`."""

    def run(impl: str | Path, *extra: str, **kwargs):  # type: ignore[no-untyped-def]
        return run_conformance(pytester, impl, *extra, **kwargs)

    return run


@pytest.fixture
def clean_registry():  # type: ignore[no-untyped-def]
    """Leave the global registry as it was (specs registered by the test are for it only)."""
    from conformance import spec as spec_module

    saved = list(spec_module._REGISTRY)
    modules = set(sys.modules)
    yield
    spec_module._REGISTRY[:] = saved
    # A module imported here and cached would register nothing when a later test imports it again.
    for name in set(sys.modules) - modules:
        if name.startswith("_conformance_impl_"):
            del sys.modules[name]
