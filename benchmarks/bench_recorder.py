"""A pytest plugin for benchmarks/run.py: what the contracts evaluate, and a bare replay of it.

Loaded only by the benchmark (``-p bench_recorder`` with ``benchmarks/`` on ``PYTHONPATH``) and
inert unless ``BENCH_RECORDER_OUT`` names the JSON file to write. It edits no file of the suite:
everything is monkeypatched in this process, at session start.

``BENCH_RECORDER_MODE=failures``: only timestamps -- when each test started and ended, and when
its first failing example raised (a ContractFailure, Blocked or ExampleAborted leaving the
property that Target.run hands to Hypothesis). Figure 4 reads them.

``BENCH_RECORDER_MODE=replay`` (default), figure 2: during the run, every *outermost* call of an
evaluation primitive made inside a test is timed, and the replayable ones are recorded with
their arguments (the Case objects and references to the tensors they were given):

* ``conformance.engine.evaluate.execute`` -> replayed as the Function's plain ``apply`` on inputs built
  from the same Case (same dtype/device/requires_grad), then ``torch.autograd.grad`` with the very
  grad_output tensors the suite used (no probe, no kept_flags, no callbacks);
* ``conformance.engine.evaluate.run_reference`` -> the same func on inputs built from the Case, and
  ``torch.autograd.grad`` with the same grad_outputs;
* ``conformance.engine.numerics.evaluate_spec`` -> the spec's reference (and surrogate) on fresh leaf
  copies of the same argument tensors, then ``torch.autograd.grad`` (no term-bound tracking);
* ``torch.autograd.gradcheck`` / ``gradgradcheck`` called on a closure made by
  ``conformance.engine.evaluate.function_of_tensors`` -> the same call (same inputs, grad_outputs and
  keyword arguments) on a bare closure: the unprobed Function's ``apply`` on the same fixed
  arguments, no clones;
* a direct call of such a closure (a forward only) -> the bare closure on the same tensors.

Other outermost torch-level calls a contract makes itself -- ``Function.apply`` (e.g. a probed
class), ``torch.autograd.grad`` / ``torch.autograd.backward``, a call of a callable that
``torch.compile`` returned (Dynamo's trace and compilation happen inside it), gradcheck on another callable --
cannot be replayed (their graph and inputs live only inside the contract), so only the time
spent inside them during the run is recorded ("not replayed"). After the run (still in this
process, under the suite's pinned global state and thread count, patches removed), the recorded
events are replayed once in a plain loop and timed event by event: building inputs from a Case
happens before the clock starts. Per test, the JSON holds pytest's phase durations, the
bookkeeping time this plugin added (subtracted by run.py), the number of examples drawn, the
in-run seconds of replayable and non-replayable calls, and the replay's wall and CPU seconds.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

OUT = os.environ.get("BENCH_RECORDER_OUT", "")
MODE = os.environ.get("BENCH_RECORDER_MODE", "replay")
_NODE = re.compile(r"test_(?P<contract>\w+)\.py::test_\w+\[(?P<function>.+)-(?P<device>cpu|cuda)\]$")


@dataclass
class Event:
    kind: str
    seconds: float  # in the suite run
    cpu: float
    data: tuple[Any, ...]


@dataclass
class TestRecord:
    nodeid: str
    start: float = 0.0  # time.time()
    end: float = 0.0
    cpu: float = 0.0  # process CPU seconds from logstart to logfinish
    first_failure: float | None = None
    durations: dict[str, float] = field(default_factory=dict)
    outcome: str = ""
    examples: int = 0
    bookkeeping: float = 0.0  # seconds this plugin spent recording (not the suite's)
    events: list[Event] = field(default_factory=list)
    unreplayed: dict[str, list[float]] = field(default_factory=dict)  # kind -> [count, seconds, cpu seconds]
    replay_wall: float = 0.0
    replay_cpu: float = 0.0
    replay_errors: int = 0
    replay_error_seconds: float = 0.0  # in-run seconds of events whose replay raised
    replay_error_cpu: float = 0.0
    replay_error_sample: str = ""

    def not_replayed(self, kind: str, seconds: float, cpu: float) -> None:
        entry = self.unreplayed.setdefault(kind, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += cpu


class _State:
    current: TestRecord | None = None
    depth = 0  # > 0 inside a timed call: nested calls are part of it
    tests: dict[str, TestRecord] = {}  # noqa: RUF012
    patches: list[tuple[Any, str, Any]] = []  # noqa: RUF012  (owner, attribute, original)
    originals: dict[int, Any] = {}  # noqa: RUF012  id(original) -> wrapper, for rebinding imported names


S = _State()


def _patch(owner: Any, name: str, wrapper: Any) -> None:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    S.patches.append((owner, name, original))
    setattr(owner, name, wrapper)
    if not isinstance(owner, type):
        S.originals[id(original)] = (original, wrapper)


def _rebind_imported_names() -> None:
    """``from conformance.engine.evaluate import execute`` made before the patch holds the original:
    point such module-level names of the suite's modules at the wrappers too."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "conformance" or module_name.startswith(("conformance.", "strategies."))):
            continue
        for attribute, value in list(vars(module).items()):
            found = S.originals.get(id(value))
            if found is not None and found[0] is value:
                setattr(module, attribute, found[1])
                S.patches.append((module, attribute, value))


def _unpatch() -> None:
    for owner, name, original in reversed(S.patches):
        setattr(owner, name, original)
    S.patches.clear()


def _timed(kind: str, call: Callable[[], Any], record: Callable[[Any, float], tuple[Any, ...] | None]) -> Any:
    """Run ``call``; if it is an outermost call inside a test, time it and keep what ``record``
    returns (replay data, or None: not replayable)."""
    test = S.current
    if test is None or S.depth:
        S.depth += 1
        try:
            return call()
        finally:
            S.depth -= 1
    S.depth = 1
    start, cpu = time.perf_counter(), time.process_time()
    try:
        result = call()
    except BaseException:
        test.not_replayed(f"{kind} (raised)", time.perf_counter() - start, time.process_time() - cpu)
        raise
    finally:
        S.depth = 0
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    booked = time.perf_counter()
    data = record(result, seconds)
    if data is None:
        test.not_replayed(kind, seconds, cpu)
    else:
        test.events.append(Event(kind, seconds, cpu, data))
    test.bookkeeping += time.perf_counter() - booked
    return result


def _plain_wrapper(kind: str, original: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _timed(kind, lambda: original(*args, **kwargs), lambda _, __: None)
    return wrapper


def _compile_wrapper(compile_original: Any) -> Any:
    def compile_wrapper(*args: Any, **kwargs: Any) -> Any:
        # A call of the compiled callable is an evaluation: Dynamo's tracing and AOTAutograd's
        # joint graph are what a bare compile test pays too (forward and backward are traced here).
        compiled = compile_original(*args, **kwargs)
        if not args and "model" not in kwargs:
            return compiled  # torch.compile(backend=...) used as a decorator factory
        return _plain_wrapper("compiled call (direct)", compiled)
    return compile_wrapper


def _install() -> None:
    import torch

    from conformance.engine import evaluate, numerics

    execute_sig = inspect.signature(evaluate.execute)
    reference_sig = inspect.signature(evaluate.run_reference)
    evaluate_sig = inspect.signature(numerics.evaluate_spec)
    fot_sig = inspect.signature(evaluate.function_of_tensors)
    gradcheck_sig = inspect.signature(torch.autograd.gradcheck)
    gradgradcheck_sig = inspect.signature(torch.autograd.gradgradcheck)
    execute, run_reference, evaluate_spec = evaluate.execute, evaluate.run_reference, numerics.evaluate_spec
    function_of_tensors = evaluate.function_of_tensors
    gradcheck, gradgradcheck = torch.autograd.gradcheck, torch.autograd.gradgradcheck
    grad, backward = torch.autograd.grad, torch.autograd.backward

    def bound(signature: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any]:
        binding = signature.bind(*args, **kwargs)
        binding.apply_defaults()
        return dict(binding.arguments)

    def execute_wrapper(*args: Any, **kwargs: Any) -> Any:
        def record(execution: Any, _: float) -> tuple[Any, ...] | None:
            a = bound(execute_sig, args, kwargs)
            backward_ran = bool(a.get("backward", True)) and bool(execution.grad_outputs)
            return (a["case"], a.get("dtype"), a.get("device"), a.get("requires_grad"), a.get("fn"),
                    backward_ran, list(execution.diff_positions), tuple(execution.grad_outputs), bool(a.get("retain_graph")))
        return _timed("execute", lambda: execute(*args, **kwargs), record)

    def reference_wrapper(*args: Any, **kwargs: Any) -> Any:
        def record(_: Any, __: float) -> tuple[Any, ...]:
            a = bound(reference_sig, args, kwargs)
            return (a["func"], a["case"], a["dtype"], a["device"], a.get("requires_grad"), a.get("grad_outputs_from"))
        return _timed("run_reference", lambda: run_reference(*args, **kwargs), record)

    def evaluate_wrapper(*args: Any, **kwargs: Any) -> Any:
        def record(_: Any, __: float) -> tuple[Any, ...]:
            a = bound(evaluate_sig, args, kwargs)
            return (a["spec"], list(a["args"]), list(a["names"]), dict(a["grad_outputs"]))
        return _timed("evaluate_spec", lambda: evaluate_spec(*args, **kwargs), record)

    def fot_wrapper(*args: Any, **kwargs: Any) -> Any:
        inner = function_of_tensors(*args, **kwargs)
        a = bound(fot_sig, args, kwargs)
        info = (a["case"], list(a["args"]), list(a["wrt_positions"]), a.get("fn"))

        def closure(*wrt: Any) -> Any:
            if S.current is None or S.depth:
                return inner(*wrt)  # inside gradcheck: part of that call
            return _timed("closure call", lambda: inner(*wrt), lambda _, __: (info, wrt))

        closure.bench_info = info  # type: ignore[attr-defined]
        return closure

    def check_wrapper(kind: str, original: Any, signature: inspect.Signature) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            def record(_: Any, __: float) -> tuple[Any, ...] | None:
                a = bound(signature, args, kwargs)
                info = getattr(a.pop("func"), "bench_info", None)
                if info is None:
                    return None
                extra = a.pop("kwargs", {}) if "kwargs" in a else {}
                return (info, a, extra)
            return _timed(kind, lambda: original(*args, **kwargs), record)
        return wrapper

    apply_original = torch.autograd.Function.__dict__["apply"].__func__

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if S.current is None or S.depth:
            return apply_original(cls, *args, **kwargs)
        return _timed("Function.apply (direct)", lambda: apply_original(cls, *args, **kwargs), lambda _, __: None)

    _patch(evaluate, "execute", execute_wrapper)
    _patch(evaluate, "run_reference", reference_wrapper)
    _patch(evaluate, "function_of_tensors", fot_wrapper)
    _patch(numerics, "evaluate_spec", evaluate_wrapper)
    _patch(torch.autograd, "gradcheck", check_wrapper("gradcheck", gradcheck, gradcheck_sig))
    _patch(torch.autograd, "gradgradcheck", check_wrapper("gradgradcheck", gradgradcheck, gradgradcheck_sig))
    _patch(torch.autograd, "grad", _plain_wrapper("autograd.grad (direct)", grad))
    _patch(torch.autograd, "backward", _plain_wrapper("autograd.backward (direct)", backward))
    _patch(torch.autograd.Function, "apply", classmethod(apply))
    _patch(torch, "compile", _compile_wrapper(torch.compile))
    _rebind_imported_names()


def _install_failure_stamps() -> None:
    from conformance.engine.runner import Target

    failures: list[type[BaseException]] = []
    for module, name in (("conformance.engine.report", "ContractFailure"), ("conformance.engine.defects", "Blocked"),
                         ("conformance.engine.watchdog", "ExampleAborted")):
        try:
            failures.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    caught = tuple(failures)
    original_property = Target._property
    original_draw = Target.draw_case

    def _property(self: Any, check: Any) -> Any:
        inner = original_property(self, check)

        def property_(data: Any) -> None:
            try:
                inner(data)
            except caught:
                test = S.current
                if test is not None and test.first_failure is None:
                    test.first_failure = time.time()
                raise

        property_.__name__ = property_.__qualname__ = inner.__name__
        return property_

    def draw_case(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if S.current is not None:
            S.current.examples += 1
        return original_draw(self, data, *args, **kwargs)

    _patch(Target, "_property", _property)
    _patch(Target, "draw_case", draw_case)


# ----------------------------------------------------------------------------- replay


def _bare_closure(info: tuple[Any, ...]) -> Callable[..., tuple[Any, ...]]:
    from conformance.engine.harness import as_tuple, forward_args, random_state

    case, args, wrt_positions, fn = info
    function = fn or case.spec.fn

    def call(*wrt: Any) -> tuple[Any, ...]:
        full = list(args)
        for position, tensor in zip(wrt_positions, wrt):
            full[position] = tensor
        with random_state(case.spec, case):  # a no-op unless the spec is declared nondeterministic
            outputs = as_tuple(function.apply(*forward_args(case, full)))
        return tuple(o for o in outputs if isinstance(o, torch_module().Tensor))

    return call


def torch_module() -> Any:
    import torch

    return torch


def _fresh(value: Any) -> Any:
    torch = torch_module()
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def _bare_evaluate(func: Any, args: list[Any], names: list[str], grad_outputs: dict[int, Any]) -> None:
    from conformance.engine.harness import as_tuple, differentiable_positions

    torch = torch_module()
    outputs = as_tuple(func(*args))
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    positions = [p for p in differentiable_positions(outputs) if p in grad_outputs]
    if wrt and positions:
        torch.autograd.grad(
            [outputs[p] for p in positions], wrt,
            [grad_outputs[p].detach().to(device=outputs[p].device, dtype=outputs[p].dtype) for p in positions],
            allow_unused=True,
        )


def _prepare(event: Event) -> Callable[[], Any]:
    """Build the event's inputs (untimed) and return the bare call to time."""
    from conformance.engine.harness import as_tuple, differentiable_positions, forward_args

    torch = torch_module()
    if event.kind == "execute":
        case, dtype, device, requires_grad, fn, backward_ran, diff_positions, grad_outputs, retain_graph = event.data
        args = case.args(dtype=dtype, device=device, requires_grad=requires_grad)
        forward = forward_args(case, args)
        function = fn or case.spec.fn

        def run_execute() -> None:
            outputs = as_tuple(function.apply(*forward))
            if backward_ran:
                wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
                torch.autograd.grad([outputs[p] for p in diff_positions], wrt, grad_outputs,
                                    allow_unused=True, retain_graph=retain_graph)

        return run_execute
    if event.kind == "run_reference":
        func, case, dtype, device, requires_grad, grad_outputs_from = event.data
        args = case.args(dtype=dtype, device=device, requires_grad=requires_grad)

        def run_reference() -> None:
            outputs = as_tuple(func(*args))
            positions = differentiable_positions(outputs)
            wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if not positions or not wrt:
                return
            diff = [outputs[p] for p in positions]
            if grad_outputs_from is not None:
                grads = tuple(g.detach().to(device=device, dtype=o.dtype) for g, o in zip(grad_outputs_from, diff))
            else:
                grads = case.grad_outputs(diff)
            torch.autograd.grad(diff, wrt, grads, allow_unused=True)

        return run_reference
    if event.kind == "evaluate_spec":
        spec, args, names, grad_outputs = event.data
        first = [_fresh(a) for a in args]
        second = [_fresh(a) for a in args] if spec.surrogate is not None else None

        def run_evaluate() -> None:
            _bare_evaluate(spec.reference, first, names, grad_outputs)
            if second is not None:
                _bare_evaluate(spec.surrogate, second, names, grad_outputs)

        return run_evaluate
    if event.kind in ("gradcheck", "gradgradcheck"):
        info, arguments, extra = event.data
        call = _bare_closure(info)
        check = torch.autograd.gradcheck if event.kind == "gradcheck" else torch.autograd.gradgradcheck
        return lambda: check(call, **arguments, **extra)
    if event.kind == "closure call":
        info, wrt = event.data
        call = _bare_closure(info)
        return lambda: call(*wrt)
    raise ValueError(f"no replay for {event.kind!r}")


def _replay(tests: list[TestRecord]) -> None:
    import torch

    try:
        from conformance.engine.global_state import pinned_global_state
    except ImportError:  # pragma: no cover - the suite always has it
        import contextlib

        pinned_global_state = contextlib.nullcontext  # type: ignore[assignment]
    threads = torch.get_num_threads()  # the run's --threads, still set (restored at unconfigure)
    with pinned_global_state():
        torch.set_num_threads(threads)
        for test in tests:
            for event in test.events:
                try:
                    run = _prepare(event)
                    wall, cpu = time.perf_counter(), time.process_time()
                    run()
                    test.replay_wall += time.perf_counter() - wall
                    test.replay_cpu += time.process_time() - cpu
                except Exception as error:  # counted: its in-run time is reported as not replayed
                    test.replay_errors += 1
                    test.replay_error_seconds += event.seconds
                    test.replay_error_cpu += event.cpu
                    if not test.replay_error_sample:
                        test.replay_error_sample = f"{event.kind}: {type(error).__name__}: {str(error)[:200]}"


# ----------------------------------------------------------------------------- hooks


def _active(config: pytest.Config) -> bool:
    return bool(OUT) and not hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not _active(session.config):
        return
    _install_failure_stamps()
    if MODE == "replay":
        _install()


def pytest_collection_finish(session: pytest.Session) -> None:
    if _active(session.config) and MODE == "replay":
        _rebind_imported_names()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if OUT:
        S.current = S.tests[nodeid] = TestRecord(nodeid, start=time.time(), cpu=time.process_time())
        S.depth = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test = S.tests.get(report.nodeid)
    if test is None:
        return
    test.durations[report.when] = report.duration
    if report.failed:
        test.outcome = "failed"
    elif report.skipped and test.outcome != "failed":
        test.outcome = "skipped"
    elif not test.outcome:
        test.outcome = "passed"


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    test = S.tests.get(nodeid)
    if test is not None:
        test.end = time.time()
        test.cpu = time.process_time() - test.cpu
    S.current = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _active(session.config):
        return
    _unpatch()
    tests = list(S.tests.values())
    replayed = MODE == "replay"
    started = time.perf_counter()
    if replayed:
        _replay(tests)
    origins: dict[str, str] = {}
    try:
        from conformance.spec import registered

        origins = {spec.name: spec.origin for spec in registered()}
    except Exception:  # the run may have failed before registering anything
        pass
    rows = []
    for test in tests:
        match = _NODE.search(test.nodeid)
        kinds: dict[str, list[float]] = {}
        for event in test.events:
            entry = kinds.setdefault(event.kind, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += event.seconds
            entry[2] += event.cpu
        rows.append({
            "nodeid": test.nodeid,
            "contract": match.group("contract") if match else "",
            "function": match.group("function") if match else "",
            "device": match.group("device") if match else "",
            "outcome": test.outcome,
            "durations": test.durations,
            "start": test.start,
            "end": test.end,
            "cpu": test.cpu,
            "first_failure": test.first_failure,
            "examples": test.examples,
            "bookkeeping": test.bookkeeping,
            "replayed": kinds,
            "not_replayed": test.unreplayed,
            "replay_wall": test.replay_wall,
            "replay_cpu": test.replay_cpu,
            "replay_errors": test.replay_errors,
            "replay_error_seconds": test.replay_error_seconds,
            "replay_error_cpu": test.replay_error_cpu,
            "replay_error_sample": test.replay_error_sample,
        })
    payload = {
        "mode": MODE,
        "threads": torch_module().get_num_threads() if "torch" in sys.modules else None,
        "replay_seconds": time.perf_counter() - started if replayed else 0.0,
        "origins": origins,
        "tests": rows,
    }
    with open(OUT, "w") as handle:
        json.dump(payload, handle)
    S.tests = {}
