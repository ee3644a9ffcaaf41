"""The plugin: options, activation, collection ids, external modules, determinism."""

from __future__ import annotations

import collections
import gc
import importlib
import json
import os
import stat
import sys
import tempfile
import textwrap
import types
from typing import Any

import pytest
import torch

from autograd_conformance_plugin import FLIGHT_DIR_KEY, WorkersFirst, runs_tests_here
from conformance.engine import runner
from conformance.engine.literals import SHARED_HOME_PREFIX, shared_hypothesis_home
from conformance.engine.loader import load_impls
from conformance.engine.verdict import Verdict as RecordedVerdict
from conformance.plugin import collection
from conformance.plugin import session as session_module
from conformance.plugin.collection import ContractTest, contract_test_key
from conformance.plugin.heap import Heap
from conformance.plugin.options import parse_options
from conformance.plugin.session import ConformanceSession
from conformance.spec import Spec, registered
from strategies.cases import CaseOptions, cases
from tests.conftest import CONFORMANCE_DIR, ZOO, run_conformance

CORE = "--contracts=return_count,grad_meta,gradcheck"


def test_inert_in_an_unrelated_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            import sys
            from hypothesis import given, settings, strategies as st

            def test_nothing_imported():
                assert "reference_ops" not in sys.modules

            @given(st.integers())
            def test_hypothesis_defaults_untouched(n):
                assert settings.default.max_examples == 100
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "Functions registered" not in result.stdout.str()


def test_help_documents_the_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--help")
    text = result.stdout.str()
    for option in ("--impl=MODULES", "--device=DEVICE", "--max-examples=N", "--profile=NAME", "--seed=N", "--contracts=NAMES"):
        assert option in text
    assert "conformance_impl" in text  # the ini key


def test_ids_header_and_cuda_skips(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR / "test_grad_meta.py"), "--max-examples=2", "-p", "no:cacheprovider", "-rs", "-v"
    )
    text = result.stdout.str()
    assert "test_grad_meta[square-cpu] PASSED" in text
    assert "autograd-conformance: " in text and "Functions registered from --impl=reference_ops" in text
    import torch

    if not torch.cuda.is_available():
        assert "test_grad_meta[square-cuda] SKIPPED" in text
        assert "CUDA is not available on this machine" in text


def test_external_module_by_name(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ZOO))
    run = run_conformance(pytester, "correct_module", CORE, cache=False)
    assert run.names() == {"scaled_tanh"}
    for contract in ("return_count", "grad_meta", "gradcheck"):
        run.passed(contract, "scaled_tanh")


def test_external_file_by_path_and_ini_key(pytester: pytest.Pytester) -> None:
    pytester.makeini(f"[pytest]\nconformance_impl = {ZOO / 'correct_module.py'}\nconformance_max_examples = 3\n")
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), "--device=cpu", CORE, "-c", str(pytester.path / "tox.ini"))
    result.assert_outcomes(passed=3)


def test_a_scalar_strategy_in_a_spec_draws_no_hypothesis_warning_at_start_up(pytester: pytest.Pytester) -> None:
    """register() validates a Scalar's strategy while pytest loads --impl: Hypothesis' "slow code in
    plugin" warning for that check reached every run's output (corner_bugs' Scalar("causal", st.booleans()))."""
    result = pytester.runpytest_subprocess(
        str(CONFORMANCE_DIR), f"--impl={ZOO / 'corner_bugs.py'}", "--device=cpu", "--collect-only", "-q", "-p", "no:cacheprovider",
        "-W", "error::hypothesis.errors.HypothesisSideeffectWarning",
    )
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert "HypothesisSideeffectWarning" not in result.stdout.str() + result.stderr.str()


def test_contract_selection(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), "--device=cpu", "--max-examples=2", "--contracts=grad_meta", "-p", "no:cacheprovider"
    )
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] >= 5 and outcomes["deselected"] > 0
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR / "test_grad_meta.py"), "--device=cpu", "--max-examples=2", "--skip-contracts=grad_meta",
        "-p", "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def _verdicts(result: pytest.RunResult) -> list[str]:
    return sorted(line.split(" ")[0] + " " + line.split(" ")[1] for line in result.outlines if line.startswith(("PASSED", "FAILED")))


# Loaded by the -n 2 run below: what the xdist controller had done when it started its workers,
# and the restart budget xdist ended up with.
CONTROLLER_PROBE = textwrap.dedent(
    """
    import json, sys
    import pytest

    seen = {}

    def pytest_configure_node(node):
        seen.setdefault("torch_imported_before_workers", "torch" in sys.modules)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(session):
        if not hasattr(session.config, "workerinput"):
            seen["restart_budget"] = session.config.pluginmanager.getplugin("dsession")._max_worker_restart
            with open("controller_probe.json", "w") as probe:
                json.dump(seen, probe)
    """
)


def test_same_seed_same_verdicts_serial_and_xdist(pytester: pytest.Pytester) -> None:
    args = [str(CONFORMANCE_DIR), f"--impl={ZOO / 'core_bugs.py'}", "--device=cpu", "--max-examples=4", CORE, "-p", "no:cacheprovider", "-rA"]
    serial = pytester.runpytest_subprocess(*args, "--seed=7")
    pytester.makepyfile(controller_probe=CONTROLLER_PROBE)
    parallel = pytester.runpytest_subprocess(*args, "--seed=7", "-n", "2", "-p", "controller_probe")
    assert _verdicts(serial) and _verdicts(serial) == _verdicts(parallel)
    # The controller started its workers before importing torch and the --impl (both cores
    # busy from the start), and still raised xdist's restart cap to one per test it could run.
    probe = json.loads((pytester.path / "controller_probe.json").read_text())
    assert probe == {"torch_imported_before_workers": False, "restart_budget": probe["restart_budget"]}
    assert probe["restart_budget"] > 4 * 2 + len(_verdicts(parallel))
    assert any(line.startswith("autograd-conformance: suite in ") for line in parallel.outlines)
    # The falsifying example is a function of the seed: identical reports both ways.
    def falsifying(result: pytest.RunResult) -> list[str]:
        return sorted(line for line in result.outlines if line.strip().startswith("case: "))

    assert falsifying(serial) == falsifying(parallel) != []


TINY_SPEC = textwrap.dedent(
    """
    import torch
    from conformance import Tensor, register

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    register(Twice, name="twice", inputs=[Tensor("x", "n")], reference=lambda x: 2 * x)
    """
)


@pytest.mark.parametrize("impl", ["dup_twice_ops.py,dup_twice_ops", "dup_twice_ops,dup_twice_ops.py"])
@pytest.mark.usefixtures("clean_registry")
def test_same_file_as_path_and_module_is_one_set_of_specs(pytester: pytest.Pytester, impl: str) -> None:
    pytester.makepyfile(dup_twice_ops=TINY_SPEC)
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={impl}", "--device=cpu", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK, result.errlines
    collected = [line for line in result.outlines if "::test_" in line]
    assert len(collected) == len({line.split("::")[0] for line in collected}) == len(list(CONFORMANCE_DIR.glob("test_*.py"))), collected
    assert all(line.endswith("[twice-cpu]") for line in collected), collected


@pytest.mark.usefixtures("clean_registry")
def test_a_file_imported_by_path_then_by_name_still_has_its_specs(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry keeps the latest import's module name for a call site; the path's cached module
    then registers nothing new, and its specs are found by their file."""
    pytester.makepyfile(twice_ops_by_name=TINY_SPEC)
    monkeypatch.syspath_prepend(str(pytester.path))
    by_path = load_impls(str(pytester.path / "twice_ops_by_name.py"))
    importlib.import_module("twice_ops_by_name")
    assert [s.origin for s in registered() if s.name == "twice"] == ["twice_ops_by_name"]
    again = load_impls(str(pytester.path / "twice_ops_by_name.py"))
    assert [s.name for s in by_path] == [s.name for s in again] == ["twice"]


@pytest.mark.parametrize("cacheprovider", [True, False])
def test_no_hypothesis_folder_in_the_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cacheprovider: bool) -> None:
    """The suite keeps no example database; Hypothesis's constants cache goes to pytest's cache
    (or a temporary folder), not into `.hypothesis/` where the user runs."""
    monkeypatch.delenv("HYPOTHESIS_STORAGE_DIRECTORY", raising=False)
    temp = pytester.mkdir("temp")
    monkeypatch.setenv("TMPDIR", str(temp))
    pytester.makepyfile(tiny_ops=TINY_SPEC)
    ini = pytester.makeini("[pytest]\n")  # the user's project, not this repository's pyproject (no:cacheprovider)
    args = [str(CONFORMANCE_DIR), "--impl=tiny_ops.py", "--max-examples=2", "--device=cpu", "--contracts=grad_meta,reference",
            "-c", str(ini), f"--rootdir={pytester.path}"]
    result = pytester.runpytest_subprocess(*args, *([] if cacheprovider else ["-p", "no:cacheprovider"]))
    result.assert_outcomes(passed=2)
    assert not (pytester.path / ".hypothesis").exists()
    left = sorted(p.name for p in temp.iterdir() if not p.name.startswith("pytest-of-"))  # pytest's own basetemp
    if cacheprovider:
        assert any((pytester.path / ".pytest_cache" / "d" / "autograd-conformance-hypothesis").rglob("*"))
        assert left == []
    else:
        assert left == [f"{SHARED_HOME_PREFIX}{os.getuid()}"]


def test_without_a_cache_hypothesis_files_go_to_one_shared_folder_per_user(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed by a crashing Function never runs its clean-up: each such run (serial or
    an xdist worker) left a temporary folder behind. Without pytest's cache every run now uses
    the user's one folder, private to them; where that name is a link or open to others, a fresh
    folder that the clean-up removes."""
    from hypothesis import configuration

    monkeypatch.delenv("HYPOTHESIS_STORAGE_DIRECTORY", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cleanups: list[Any] = []
    config = types.SimpleNamespace(add_cleanup=cleanups.append, workerinput={"workerid": "gw3"})

    def home() -> Any:
        return vars(configuration).get("__hypothesis_home_directory")

    before = home()
    for _ in range(2):
        session_module._move_hypothesis_home(config)  # type: ignore[arg-type]
        try:
            assert home() == tmp_path / f"{SHARED_HOME_PREFIX}{os.getuid()}"
        finally:
            for cleanup in reversed(cleanups):
                cleanup()
            cleanups.clear()
        assert home() == before
    assert [p.name for p in tmp_path.iterdir()] == [f"{SHARED_HOME_PREFIX}{os.getuid()}"]
    assert stat.S_IMODE((tmp_path / f"{SHARED_HOME_PREFIX}{os.getuid()}").stat().st_mode) == 0o700


@pytest.mark.parametrize("unsafe", ["link", "open to others"])
def test_a_shared_hypothesis_folder_not_safely_ours_is_not_used(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, unsafe: str) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"{SHARED_HOME_PREFIX}{os.getuid()}"
    if unsafe == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        shared.symlink_to(tmp_path / "elsewhere")
    else:
        shared.mkdir()
        shared.chmod(0o777)
    home, cleanup = shared_hypothesis_home()
    assert home.parent == tmp_path and home.name.startswith(SHARED_HOME_PREFIX) and home != shared
    cleanup()
    assert not home.exists() and (shared.is_symlink() or shared.is_dir())


THREAD_SPEC = textwrap.dedent(
    """
    import torch
    from conformance import Tensor, register

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with open("threads_seen.txt", "a") as seen:
                seen.write(f"{torch.get_num_threads()}\\n")
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    register(Twice, name="threads_seen", inputs=[Tensor("x", "n")], reference=lambda x: x * 2)
    """
)


@pytest.mark.parametrize("threads", [None, 2])
def test_evaluations_run_with_the_suite_thread_count_and_the_user_setting_comes_back(
    pytester: pytest.Pytester, threads: int | None, clean_registry: None
) -> None:
    import torch

    pytester.makepyfile(threads_ops=THREAD_SPEC)
    user = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        option = [] if threads is None else [f"--threads={threads}"]
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE_DIR), "--impl=threads_ops", "--device=cpu", "--max-examples=2", "-p", "no:cacheprovider",
            "--contracts=reference,global_state,determinism", *option,
        )
        assert result.ret == pytest.ExitCode.OK, result.outlines[-20:] + result.errlines
        assert torch.get_num_threads() == 3  # the user's setting, put back when the run ended
    finally:
        torch.set_num_threads(user)
    seen = set((pytester.path / "threads_seen.txt").read_text().split())
    assert seen == {str(threads or 1)}, seen  # in every evaluation, whatever the user had set


def test_threads_must_be_positive(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), "--threads=0", "--device=cpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--threads=0 must be >= 1" in result.stderr.str()


def test_a_process_that_ran_the_suite_skips_the_final_garbage_collection_at_exit(pytester: pytest.Pytester) -> None:
    """The suite freezes the collector in an atexit callback (CPython's final collection over
    torch's objects costs ~1.2 s per process); a callback registered before the run runs after it."""
    pytester.makepyfile(run_then_exit=f"""
        import atexit, gc, pytest

        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
        code = pytest.main([{str(CONFORMANCE_DIR / "test_return_count.py")!r}, "--device=cpu", "--max-examples=1",
                            "-k", "square-cpu", "-p", "no:cacheprovider", "-q"])
        print("frozen after the run:", gc.get_freeze_count() > 0, "exit code:", int(code))
    """)
    result = pytester.run(sys.executable, "run_then_exit.py")
    assert "frozen after the run: False exit code: 0" in result.stdout.str(), result.stdout.lines[-20:] + result.stderr.lines
    assert "frozen at exit: True" in result.stdout.str()


class _FreezeCounts:
    """A plugin recording, while each test runs, how many objects are frozen and how many times
    the run has called gc.freeze."""

    def __init__(self) -> None:
        self.freezes = 0
        self.during: dict[str, tuple[int, int]] = {}

    def freeze(self) -> None:
        self.freezes += 1
        _real_freeze()

    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self.during[item.nodeid] = (gc.get_freeze_count(), self.freezes)


_real_freeze = gc.freeze


def test_what_outlives_a_functions_tests_is_frozen_during_the_run_and_given_back_after(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session freezes the survivors of a full collection where a new Function's tests begin
    (conformance.plugin.heap), once per Function, so the collector's walks skip torch's modules;
    the run ends with nothing of its own frozen."""
    assert gc.get_freeze_count() == 0, "another test left objects frozen"
    counts = _FreezeCounts()
    monkeypatch.setattr(gc, "freeze", counts.freeze)
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), "--contracts=return_count,grad_meta", "--device=cpu", "--max-examples=1",
        "-k", "square-cpu or sigmoid-cpu", "-p", "no:cacheprovider", plugins=[counts],
    )
    assert result.ret == pytest.ExitCode.OK, result.outlines[-20:]
    assert len(counts.during) == 4 and all(frozen > 0 for frozen, _ in counts.during.values()), counts.during
    assert [freezes for _, freezes in counts.during.values()] == [1, 1, 2, 2], counts.during  # Function by Function
    assert gc.get_freeze_count() == 0


def test_a_functions_tests_share_each_case_strategy(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis validates a strategy object on its first draw: contracts with equal case options
    draw from one object per Function and device, made again for the next Function."""
    made: collections.Counter[tuple[str, str, CaseOptions]] = collections.Counter()

    def counted(spec: Spec, options: CaseOptions, *, device: str) -> Any:
        made[spec.name, device, options] += 1
        return cases(spec, options, device=device)

    monkeypatch.setattr(runner, "cases", counted)
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), "--contracts=return_count,undefined_grads,determinism", "--device=cpu",
        "--max-examples=2", "-k", "square-cpu or sigmoid-cpu", "-p", "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.OK, result.outlines[-20:]
    assert {name for name, _, _ in made} == {"square", "sigmoid"}
    assert max(made.values()) == 1, f"strategies made={dict(made)}, but should be one per options and Function"


def test_the_heap_leaves_a_process_that_froze_objects_or_stopped_the_collector_as_it_is() -> None:
    assert gc.get_freeze_count() == 0, "another test left objects frozen"
    heap = Heap.for_this_process()
    heap.settle()
    try:
        assert gc.get_freeze_count() > 0 and heap.owned
        second = Heap.for_this_process()  # something in the process froze objects before this session's first settle
        second.settle()
        assert second.owned is False and not second.frozen
    finally:
        heap.release()
    assert gc.get_freeze_count() == 0
    forked_child = Heap(pid=os.getpid() + 1)  # --isolate's child: one test, then it ends
    forked_child.settle()
    assert gc.get_freeze_count() == 0 and not forked_child.frozen
    gc.disable()
    try:
        off = Heap.for_this_process()
        off.settle()
        assert gc.get_freeze_count() == 0 and off.owned is False
    finally:
        gc.enable()


class _Recorded:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def clear(self) -> None:
        self.log.append("pool cleared")

    def settle(self) -> None:
        self.log.append("heap settled")


def test_a_new_function_drops_the_shared_evaluations_before_the_heap_settles() -> None:
    """Evaluations kept for the previous Function would otherwise be frozen, and their autograd
    graphs (cyclic garbage once dropped) kept until the run ends."""
    log: list[str] = []
    session = types.SimpleNamespace(on_function=None, pool=_Recorded(log), heap=_Recorded(log))
    for name, device in [("square", "cpu"), ("square", "cpu"), ("sigmoid", "cpu"), ("sigmoid", "cuda"), ("sigmoid", "cuda")]:
        ConformanceSession.enter_function(session, name, device)  # type: ignore[arg-type]
    assert log == ["pool cleared", "heap settled"] * 3


def test_the_compile_contract_keeps_no_graphs_after_its_test(pytester: pytest.Pytester) -> None:
    """Dynamo's cache holds each example's FX graphs and fake tensors until a reset: the contract
    resets after its example, so a Function's graphs do not outlive its tests (nor get frozen)."""
    def graphs() -> int:
        gc.collect()
        return sum(issubclass(type(o), torch.fx.GraphModule) for o in gc.get_objects())  # type(): no lazy attribute lookups

    torch._dynamo.reset()  # graphs another test of this process left in Dynamo's cache
    before = graphs()
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR / "test_compile.py"), "--device=cpu", "--max-examples=1", "-k", "square-cpu",
        "-p", "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.OK, result.outlines[-20:]
    assert graphs() <= before


@pytest.mark.parametrize(
    ("option", "worker", "runs"),
    [
        ({"dist": "no", "tx": []}, False, True),  # serial
        ({"dist": "load", "tx": ["popen", "popen"]}, False, False),  # -n 2: the controller
        ({"dist": "load", "tx": ["popen", "popen"]}, True, True),  # -n 2: a worker
        ({"dist": "load", "tx": []}, False, True),  # --dist without workers runs here
        ({}, False, True),  # xdist not installed
    ],
)
def test_an_xdist_controller_takes_no_cpu_from_its_workers(option: dict[str, Any], worker: bool, runs: bool) -> None:
    """The controller runs no test, so it snapshots no literals (0.5 s of the main job's controller
    CPU, on the same cores as the workers); every process that runs tests does."""
    config = types.SimpleNamespace(option=types.SimpleNamespace(**option))
    if worker:
        config.workerinput = {"workerid": "gw0"}
    assert runs_tests_here(config) is runs
    kept: dict[str, Any] = {"untouched": None}
    session = types.SimpleNamespace(runs_tests=runs, specs=[], literals=kept, tracer=None)
    loop = ConformanceSession.pytest_runtestloop(session, None)  # type: ignore[arg-type]
    next(loop)
    assert (session.literals is kept) is not runs


@pytest.mark.parametrize("first_step", ["pytest_collection", "pytest_runtestloop"])
def test_a_controller_activates_once_after_its_workers_are_told_the_flight_folder(
    first_step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WorkersFirst hands each worker (MockNode) the flight folder before the suite is activated,
    then activates once, at whichever step comes first, with that same folder."""
    calls: list[tuple[Any, Any, Any]] = []
    header = ["autograd-conformance: suite in here"]

    def activate(config: Any, values: Any, flight_dir: Any) -> Any:
        calls.append((config, values, flight_dir))
        return types.SimpleNamespace(pytest_report_header=lambda config: header)

    monkeypatch.setattr(session_module, "activate", activate)
    written: list[str] = []
    terminal = types.SimpleNamespace(showheader=True, no_header=False, write_line=written.append)
    cleanups: list[Any] = []
    config = types.SimpleNamespace(
        add_cleanup=cleanups.append, pluginmanager=types.SimpleNamespace(getplugin=lambda name: terminal)
    )
    values = {"impl": "reference_ops"}
    plugin = WorkersFirst(config, values)  # type: ignore[arg-type]
    nodes = [types.SimpleNamespace(workerinput={"workerid": f"gw{i}"}) for i in range(2)]
    for node in nodes:
        plugin.pytest_configure_node(node)
    assert calls == [] and {node.workerinput[FLIGHT_DIR_KEY] for node in nodes} == {str(plugin.flight_dir)}
    getattr(plugin, first_step)(None)
    plugin.pytest_runtestloop(None)  # type: ignore[arg-type]
    assert calls == [(config, values, plugin.flight_dir)] and written == header
    assert plugin.flight_dir.is_dir()
    for cleanup in cleanups:
        cleanup()
    assert not plugin.flight_dir.exists()


class _FakeItem:
    """What skip_without_cuda reads and writes on a collected item."""

    def __init__(self, device: str | None) -> None:
        self.name = f"test_reference[softmax-{device}]"
        self.path = CONFORMANCE_DIR / "test_reference.py"
        self.stash = pytest.Stash()
        self.user_properties: list[tuple[str, object]] = []
        self.markers: list[pytest.Mark] = []
        if device is not None:
            self.stash[contract_test_key] = ContractTest(
                types.SimpleNamespace(name="reference"), types.SimpleNamespace(name="softmax"), device  # type: ignore[arg-type]
            )

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.mark)


@pytest.mark.parametrize("usable", [False, True])
def test_cuda_tests_skip_at_setup_with_their_verdict_where_cuda_is_unusable(monkeypatch: pytest.MonkeyPatch, usable: bool) -> None:
    monkeypatch.setattr(collection, "cuda_usable", lambda: usable)
    items = [_FakeItem("cpu"), _FakeItem("cuda"), _FakeItem(None)]
    options = parse_options({"impl": "reference_ops"}, run_dir=CONFORMANCE_DIR.parent)
    collection.skip_without_cuda(items, CONFORMANCE_DIR.parent, options)  # type: ignore[arg-type]
    marked = [[m.name for m in item.markers] for item in items]
    assert marked == [[], [] if usable else ["skip"], []], marked
    verdicts = [RecordedVerdict.of(item.user_properties) for item in items]
    if usable:
        assert verdicts == [None, None, None], verdicts
        return
    cuda = verdicts[1]
    assert cuda is not None and cuda.outcome.value == "not_run_here" and "CUDA is not available" in cuda.reason, cuda
    assert "test_reference.py::test_reference[softmax-cuda]" in cuda.rerun and "--device=cuda" in cuda.rerun, cuda.rerun
    assert items[1].markers[0].kwargs["reason"] == cuda.reason


def _reports_of(pytester: pytest.Pytester, *args: str) -> list[tuple[Any, ...]]:
    result = pytester.runpytest_inprocess(*args)
    return [
        (r.nodeid, r.when, r.outcome, r.longrepr if r.skipped else None, r.location, sorted(r.keywords), r.user_properties)
        for r in result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    ]


def test_tests_not_run_here_are_reported_as_pytest_would_without_its_setup_and_teardown(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests of two contract modules, CPU ones between CUDA ones (set up and torn down across
    modules), reported by the session's short path and by pytest's own protocol: the same reports."""
    if collection.cuda_usable():
        pytest.skip("CUDA is usable here: no test is skipped as not run here")
    args = (str(CONFORMANCE_DIR / "test_return_count.py"), str(CONFORMANCE_DIR / "test_grad_meta.py"), "-k", "square or softmax",
            "--max-examples=1", "-p", "no:cacheprovider")
    calls = collections.Counter[str]()
    short_path = collection.report_not_run_here

    def counted(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        reported = short_path(item, nextitem)
        calls[str(reported)] += 1
        return reported

    monkeypatch.setattr("conformance.plugin.session.report_not_run_here", counted)
    fast = _reports_of(pytester, *args)
    skipped = [r for r in fast if r[2] == "skipped"]
    # Every cuda test took the short path, every cpu test pytest's.
    assert calls["True"] == calls["False"] == len(skipped) > 1, (calls, len(skipped))
    assert all(r[1] == "setup" and "CUDA is not available" in r[3][2] for r in skipped), skipped
    monkeypatch.setattr("conformance.plugin.session.report_not_run_here", lambda item, nextitem: False)
    assert fast == _reports_of(pytester, *args)


def test_pytests_last_collection_runs_while_the_run_is_still_frozen(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest's unraisable-exception plugin collects once at unconfigure: the session gives its
    frozen objects back after that, so that walk skips them."""
    import _pytest.unraisableexception as unraisable

    assert gc.get_freeze_count() == 0, "another test left objects frozen"
    frozen_then: list[int] = []
    collect = unraisable.gc_collect_harder
    monkeypatch.setattr(unraisable, "gc_collect_harder", lambda n: (frozen_then.append(gc.get_freeze_count()), collect(n)))
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), "--contracts=return_count", "--device=cpu", "--max-examples=1", "-k", "square-cpu",
        "-p", "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.OK, result.outlines[-20:]
    assert frozen_then and frozen_then[0] > 0, frozen_then  # the run's own unconfigure comes first
    assert gc.get_freeze_count() == 0
