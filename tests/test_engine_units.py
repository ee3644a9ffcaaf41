"""Unit tests of the engine's judging parts on fake records, without a pytest run of the suite:
the defect classifier (which contract owns a defect; "blocked by" for the others) and the
watchdog (phases of a stuck example, the time budget, crash records)."""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import importlib
import itertools
import math
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import conformance
from conformance.engine import simplest
from conformance.engine.defects import BackwardError, Blocked, Defect, forward_defect, require_sound, structural_defects
from conformance.engine.evaluate import unversioned_saves
from conformance.engine.finite_differences import FD_EPS, LARGEST_STEP, resolving_steps
from conformance.engine.harness import Execution, changed_elements
from conformance.engine.memory import AllocationPolicy, Unwritten, WatchedCode, plain_arguments
from conformance.engine.numerics import exactly_equal, float32_baseline
from conformance.engine.overlap import shares_memory
from conformance.engine.probe import BackwardCall, Recorder, forget_probe_classes, probe, record_into
from conformance.engine.provenance import BackwardOps, extra_ops
from conformance.engine.report import ContractFailure, advise, fail, upstream_noted
from conformance.engine.runner import RunOptions, Target
from conformance.engine.stack_room import with_room
from conformance.engine.verdict import VERDICT_PROPERTY, Outcome
from conformance.engine.verdict import Verdict as RecordedVerdict
from conformance.engine.watchdog import (
    HARD_SLACK,
    ExampleTimeout,
    FlightRecorder,
    RunEnding,
    describe_crash,
    example_deadline,
    hard_deadline,
    note_run_ending,
    one_hard_timer,
    phase_at,
    phase_marks,
    run_endings,
    run_endings_in,
)
from conformance.plugin.isolation import crash_outcome
from conformance.spec import Tensor
from conformance.spec.targets import adapt
from strategies.cases import CaseOptions, cases
from strategies.recipes import ScalarRecipe, TensorRecipe
from tests.strategies.helpers import collect_examples, make_spec

# ----------------------------------------------------------------------------- defects


def _case() -> Any:
    """A stand-in for a Case: forward(x: Tensor (3,), w: Tensor (2, 3), alpha: a Python scalar)."""
    recipes = (TensorRecipe(name="x", shape=(3,)), TensorRecipe(name="w", shape=(2, 3)), ScalarRecipe(name="alpha", value=2.0))
    spec = SimpleNamespace(display_name="MyFn", name="my_fn", waivers={})
    return SimpleNamespace(recipes=recipes, spec=spec, requires_grad=frozenset(), dtype=torch.float64)


def _args() -> list[Any]:
    return [torch.zeros(3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64), 2.0]


def _execution(*raw: Any, outputs: tuple[Any, ...] | None = None, error: BaseException | None = None) -> Execution:
    calls = [BackwardCall(raw=tuple(raw))] if raw else []
    if error is not None:
        calls = [BackwardCall(raw=None, error=error)]
    return Execution(
        case=_case(), args=_args(), outputs=outputs if outputs is not None else (torch.zeros(2, 3, dtype=torch.float64),),
        recorder=Recorder(calls=calls), backward_error=error,
    )


def _right_grads() -> tuple[Any, ...]:
    return torch.ones(3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64), None


def _failure(contract: str, execution: Execution) -> ContractFailure:
    with pytest.raises(ContractFailure) as raised:
        require_sound(contract, execution)
    return raised.value


def _blocked(contract: str, execution: Execution) -> Blocked:
    with pytest.raises(Blocked) as raised:
        require_sound(contract, execution)
    return raised.value


def test_a_sound_record_passes_every_contract() -> None:
    execution = _execution(*_right_grads())
    assert structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs) == []
    for contract in ("return_count", "grad_meta", "gradcheck", "reference", "unwritten_memory"):
        require_sound(contract, execution)  # raises nothing


def test_a_missing_gradient_is_return_counts_and_blocks_the_others() -> None:
    execution = _execution(torch.ones(3, dtype=torch.float64))  # one gradient for three inputs
    defects = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert [d.owner for d in defects] == ["return_count"]
    assert "len(backward return)=1, but should be 3" in _failure("return_count", execution).summary
    blocked = _blocked("gradcheck", execution)
    assert blocked.defect.owner == "return_count"
    assert str(blocked).startswith("blocked by return_count: len(backward return)=1")


def test_a_missing_entry_is_named_by_the_shapes_of_the_gradients_returned() -> None:
    # forward(x (3,), w (2, 3), alpha); backward returned w's gradient and alpha's None only: x's
    # entry is the one missing, though by position alpha's is.
    execution = _execution(torch.ones(2, 3, dtype=torch.float64), None)
    text = str(_failure("return_count", execution))
    assert "the entry for ['x'] is missing (the returned gradients match the other inputs' shapes, in order)" in text, text
    execution = _execution(torch.ones(3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64))  # alpha's None left off
    text = str(_failure("return_count", execution))
    assert "the gradient for ['alpha'] is missing" in text, text


def test_a_gradient_for_a_scalar_input_is_return_counts() -> None:
    x, w, _ = _right_grads()
    execution = _execution(x, w, torch.tensor(1.0))
    assert "grad['alpha']" in _failure("return_count", execution).summary
    assert _blocked("grad_meta", execution).defect.owner == "return_count"


def test_a_gradient_reduced_over_some_broadcast_dims_gets_the_reduction_hint() -> None:
    """x (3,) broadcast to the output (4, 2, 3); backward summed its gradient over dim 1 only: the
    engine repairs (4, 1, 3), so the hint is to reduce over every broadcast dim, not the gradient order."""
    _, w, _ = _right_grads()
    outputs = (torch.zeros(4, 2, 3, dtype=torch.float64),)
    execution = _execution(torch.ones(4, 1, 3, dtype=torch.float64), w, None, outputs=outputs)
    (defect,) = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert defect.summary.startswith("grad['x'].shape=(4, 1, 3), but should be (3,)")
    assert "'x' (3,) broadcasts to (4, 2, 3), the shape of another input or output in this call, and the gradient was reduced over only some of" in defect.details[0]
    assert "sum_to_size" in defect.details[0] and "order" not in defect.details[0]
    # A shape the input never broadcast to keeps the other hint.
    execution = _execution(torch.ones(5, 3, dtype=torch.float64), w, None, outputs=outputs)
    (defect,) = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert "was not broadcast to (5, 3)" in defect.details[0]
    # Reduced too far (a trial: the other hint blamed the order of the gradients).
    execution = _execution(torch.ones((), dtype=torch.float64), w, None, outputs=outputs)
    (defect,) = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert "fewer elements or dims than 'x'" in defect.details[0] and "order" not in defect.details[0]


def test_a_broadcast_gradient_is_grad_metas_with_the_reduction_hint() -> None:
    _, w, _ = _right_grads()
    execution = _execution(torch.ones(2, 3, dtype=torch.float64), w, None)  # grad of x (3,) not summed over dim 0
    (defect,) = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert defect.owner == "grad_meta"
    assert defect.summary.startswith("grad['x'].shape=(2, 3), but should be (3,)")
    assert "sum_to_size" in defect.details[0]
    assert "grad['x'].shape" in _failure("grad_meta", execution).summary
    assert _blocked("determinism", execution).defect.owner == "grad_meta"
    for judge in ("gradcheck", "reference"):  # they judge the gradient the engine repaired
        require_sound(judge, execution)
    execution.case.spec.waivers = {"grad_meta": "relies on the engine's reduction"}
    require_sound("determinism", execution)  # waived: nobody is blocked by a repaired shape


def test_a_wrong_dtype_is_grad_metas() -> None:
    _, w, _ = _right_grads()
    execution = _execution(torch.ones(3, dtype=torch.float32), w, None)
    (defect,) = structural_defects(execution.case, execution.recorder.last, execution.args, execution.outputs)
    assert (defect.owner, defect.summary.split(",")[0]) == ("grad_meta", "grad['x'].dtype=torch.float32")
    assert _blocked("needs_input_grad", execution).defect is not None


def test_a_forward_without_a_tensor_is_return_counts() -> None:
    outputs = ([torch.zeros(3)],)  # a list: autograd does not track it
    execution = _execution(outputs=outputs)
    defect = forward_defect(execution.case, outputs)
    assert defect is not None and defect.owner == "return_count"
    assert "forward returned a list" in _failure("return_count", execution).summary
    assert _blocked("layouts", execution).defect.owner == "return_count"
    assert forward_defect(execution.case, (torch.zeros(3),)) is None


def test_unwritten_elements_are_unwritten_memorys() -> None:
    execution = _execution(*_right_grads())
    execution.unwritten = [Unwritten("output[0]", 2, 6, (1, 2), "NaN")]
    assert "output[0][1, 2]=NaN from a poisoned allocation" in _failure("unwritten_memory", execution).summary
    assert _blocked("determinism", execution).defect.owner == "unwritten_memory"


def _crash(contract: str, execution: Execution) -> BackwardError:
    with pytest.raises(BackwardError) as raised:
        require_sound(contract, execution)
    return raised.value


def test_a_backward_that_raises_is_a_crash_for_the_runner_to_give_its_owner() -> None:
    execution = _execution(error=ValueError("shapes do not match"))
    for contract in ("gradcheck", "inplace"):
        crash = _crash(contract, execution)
        assert crash.summary.startswith(
            "backward raised ValueError (shapes do not match), but should return gradients [MyFn.backward]"
        )
        assert crash.case is execution.case and isinstance(crash.__cause__, ValueError)


def test_an_engine_error_is_labelled_as_the_engines() -> None:
    execution = _execution(*_right_grads())
    execution.backward_error = RuntimeError("Function MyFnBackward returned an invalid gradient at index 0")
    execution.recorder.calls[-1].error = None
    assert "backward (raised by the autograd engine)" in _crash("reference", execution).summary


# ----------------------------------------------------------------------------- watchdog


def _user_forward(capture: list[FrameType]) -> None:
    frame = sys._getframe()
    capture.append(frame)


def test_phase_at_names_the_users_code_and_falls_back_outside_it() -> None:
    marks = phase_marks("MyFn", {"forward": _user_forward}, reference=None, surrogate=None)
    frames: list[FrameType] = []
    _user_forward(frames)
    phase = phase_at(frames[0], marks, "somewhere else")
    assert phase.startswith("forward of MyFn (test_engine_units.py:"), phase
    assert phase_at(sys._getframe(), marks, "somewhere else") == "somewhere else"
    assert phase_at(None, marks, "nothing") == "nothing"


def test_phase_at_names_the_reference() -> None:
    def reference(capture: list[FrameType]) -> None:
        capture.append(sys._getframe())

    marks = phase_marks("MyFn", {}, reference=reference, surrogate=None)
    frames: list[FrameType] = []
    reference(frames)
    assert phase_at(frames[0], marks, "?").startswith("the reference (")


def test_example_deadline_raises_a_timeout_naming_the_phase(tmp_path: Path) -> None:
    with open(tmp_path / "stack", "w+", encoding="utf-8") as stack, pytest.raises(ExampleTimeout) as raised:
        with example_deadline(0.5, phase=lambda frame: "backward of MyFn", stack_file=stack):
            end = time.monotonic() + 20
            while time.monotonic() < end:
                time.sleep(0.01)
    assert raised.value.phase == "backward of MyFn"
    assert "no result within 0.5 s, in backward of MyFn" in str(raised.value)


def test_example_deadline_lets_a_quick_example_through(tmp_path: Path) -> None:
    with open(tmp_path / "stack", "w+", encoding="utf-8") as stack:
        with example_deadline(30.0, phase=lambda frame: "?", stack_file=stack) as interrupts:
            total = sum(range(1000))
    assert total == 499500 and not interrupts.real


def test_one_hard_timer_arms_once_for_many_examples_and_cancels_at_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, float | None]] = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda seconds, **kwargs: calls.append(("arm", seconds)))
    monkeypatch.setattr(faulthandler, "cancel_dump_traceback_later", lambda: calls.append(("cancel", None)))
    with open(tmp_path / "stack", "w+", encoding="utf-8") as stack:
        for _ in range(3):
            with hard_deadline(10.0, stack):
                pass
        assert calls == [("arm", 10.0), ("cancel", None)] * 3, calls  # outside: per block, exact
        calls.clear()
        with one_hard_timer():
            for seconds in (10.0, 10.0, 10.0, 30.0, 10.0):
                with hard_deadline(seconds, stack):
                    pass
            assert calls == [("arm", 10.0 + HARD_SLACK), ("arm", 30.0 + HARD_SLACK), ("arm", 10.0 + HARD_SLACK)], calls
        assert calls[-1] == ("cancel", None), calls  # nothing armed between tests


def test_a_native_hang_inside_one_hard_timer_still_ends_the_process(tmp_path: Path) -> None:
    program = (
        "import sys, time\n"
        "from conformance.engine.watchdog import hard_deadline, one_hard_timer\n"
        "with one_hard_timer():\n"
        "    with hard_deadline(0.2, sys.stderr):\n"
        "        pass\n"
        "    with hard_deadline(0.5, sys.stderr):\n"
        "        time.sleep(30)\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent)
    took = time.monotonic() - start
    assert done.returncode != 0 and "Timeout" in done.stderr, (done.returncode, done.stderr[-2000:])
    assert took < 0.5 + HARD_SLACK + 10, f"took {took:.1f} s, but should end within its budget and slack"


def test_a_crash_is_read_back_from_the_flight_record(tmp_path: Path) -> None:
    recorder = FlightRecorder(tmp_path, "gw0")
    try:
        assert describe_crash(tmp_path, "gw0") is None  # nothing running yet
        recorder.start_test("conformance/test_gradcheck.py::test_gradcheck[my_fn-cpu]", "gradcheck", "my_fn", "cpu", "pytest ...")
        recorder.start_example("x: (3,) float64", 10.0)
        crash = describe_crash(tmp_path, "gw0", exit_status="killed by SIGSEGV")
        assert crash is not None
        assert (crash.contract, crash.function, crash.device, crash.case) == ("gradcheck", "my_fn", "cpu", "x: (3,) float64")
        assert crash.summary == "the process died while running this test (killed by SIGSEGV)"
        recorder.stack_file.write(
            "Timeout (0:00:20)!\nThread 0x1 (most recent call first):\n  File \"other.py\", line 1 in idle\n"
            "Current thread 0x2 (most recent call first):\n  File \"user.py\", line 7 in backward\n"
            "  File \"conformance/engine/runner.py\", line 300 in run\n"
        )
        recorder.stack_file.flush()
        hung = describe_crash(tmp_path, "gw0")
        assert hung is not None and hung.summary.startswith("the example did not return within its time budget")
        assert hung.details.splitlines()[1].strip() == 'File "user.py", line 7 in backward'
    finally:
        recorder.close()
    assert describe_crash(tmp_path, "gw1") is None  # another process: no record


def test_the_first_run_ending_in_contract_order_owns_it_and_a_later_crash_is_blocked_by_it(tmp_path: Path) -> None:
    """One act, one failure: each contract's first note stays, and the Function's first note in
    contract order owns the act, whichever was written first (two xdist workers). A crash of a
    later contract is reported as blocked by it; of the owner itself, or of another Function, as
    the failure."""
    exit_ = RunEnding("exit", "global_state", "sys.exit(2) was called, but a Function should never exit the program", "x: (3,) float64")
    late = RunEnding("exit", "return_count", "sys.exit(2) was called", "x: (2,) float64")
    assert run_endings_in(tmp_path, "my_fn", "cpu") == []
    assert note_run_ending(tmp_path, "my_fn", "cpu", late) == late  # met first in time, by a later contract
    assert note_run_ending(tmp_path, "my_fn", "cpu", exit_) == exit_  # an earlier contract owns it
    assert note_run_ending(tmp_path, "my_fn", "cpu", dataclasses.replace(exit_, summary="again")) == exit_  # its first note stays
    assert run_endings_in(tmp_path, "my_fn", "cpu") == [exit_, late]
    assert run_endings_in(tmp_path, "my_fn", "cuda") == []  # each device its own
    recorder = FlightRecorder(tmp_path, "gw0")
    try:
        outcomes = {}
        for function, contract in (("my_fn", "gradcheck"), ("my_fn", "global_state"), ("other_fn", "gradcheck")):
            recorder.start_test(f"conformance/test_{contract}.py::test_{contract}[{function}-cpu]", contract, function, "cpu", "pytest ...")
            recorder.start_example("x: (1,) float64", 10.0)
            crash = describe_crash(tmp_path, "gw0", exit_status="killed by SIGSEGV")
            assert crash is not None
            outcome, text, properties = crash_outcome(crash, tmp_path)
            outcomes[function, contract] = outcome, text, RecordedVerdict.from_json(str(dict(properties)[VERDICT_PROPERTY]))
    finally:
        recorder.close()
    outcome, text, verdict = outcomes["my_fn", "gradcheck"]
    assert outcome == "skipped" and verdict.outcome is Outcome.BLOCKED and verdict.owner == "global_state", (outcome, verdict)
    assert text.startswith("blocked by global_state: sys.exit(2) was called") and "case: x: (3,) float64" in text, text
    outcome, text, verdict = outcomes["my_fn", "global_state"]  # the contract that noted the exit
    assert outcome == "failed" and verdict.outcome is Outcome.FAILED and "killed by SIGSEGV" in text, (outcome, text)
    outcome, text, verdict = outcomes["other_fn", "gradcheck"]  # its first act: noted, and its failure
    assert outcome == "failed" and verdict.outcome is Outcome.FAILED, (outcome, text)
    assert run_endings(tmp_path) == {
        ("my_fn", "cpu"): [exit_, run_endings_in(tmp_path, "my_fn", "cpu")[1], late],
        ("other_fn", "cpu"): [RunEnding("death", "gradcheck", verdict.reason, "x: (1,) float64")],
    }
    assert run_endings_in(tmp_path, "my_fn", "cpu")[1].contract == "gradcheck"


def test_the_flight_record_reads_back_the_last_example_after_a_longer_one(tmp_path: Path) -> None:
    """Each case drawn overwrites the record in place (padded, not truncated), and each test starts
    from an empty file: a record left longer by a child forked for an earlier test (--isolate),
    which this process never saw, must not corrupt it."""
    recorder = FlightRecorder(tmp_path, "main")
    try:
        (tmp_path / "main.json").write_text('{"nodeid": "' + "x" * 5000 + '"}', encoding="utf-8")  # another process's
        recorder.start_test("conformance/test_reference.py::test_reference[f-cpu]", "reference", "f", "cpu", "pytest ...")
        recorder.start_example("x: (300,) float64, " + "layout=strided " * 50, 10.0)
        recorder.start_example("x: (3,) float64", 10.0)
        crash = describe_crash(tmp_path, "main")
        assert crash is not None, "the flight record no longer parses"
        assert (crash.nodeid, crash.case) == ("conformance/test_reference.py::test_reference[f-cpu]", "x: (3,) float64")
    finally:
        recorder.close()


# ----------------------------------------------------------------------------- provenance


def test_provenance_tells_by_products_and_views_from_extra_work() -> None:
    g, x, w = (torch.rand(3, 4, dtype=torch.float64) for _ in range(3))
    traced = BackwardOps(recording=True)
    with traced:
        dx = g * w
        dw = g * x  # only the unneeded gradient needs it
        scan = torch.cumsum(g, dim=-1)
        da = scan * x  # built from scan: scan is a by-product of da
        halves = torch.cat([dx, dw], dim=0)
        half = halves[3:]  # a view of it
        buffer = torch.empty_like(x)  # filled by a kernel the dispatcher cannot see
        handed_back = torch.empty_like(x)
        handed_back.set_(buffer.untyped_storage(), 0, (3, 4), (4, 1))  # the Triton interpreter's plumbing
    work = extra_ops(traced, [dx], [dw])
    assert work is not None and work.ops == {"aten.mul.Tensor": 1} and work.describe() == "aten.mul.Tensor"
    assert extra_ops(traced, [da], [scan]) is None
    assert extra_ops(traced, [halves], [half]) is None  # a view of a needed gradient
    assert extra_ops(traced, [dx], [half]) is not None  # ... but not of dx alone: cat and dw's mul are extra
    opaque = extra_ops(traced, [dx], [buffer])
    assert opaque is not None and opaque.opaque and "cannot see" in opaque.describe()
    assert extra_ops(traced, [dx], [handed_back]) == opaque  # set_ is no work of the Function's
    assert extra_ops(traced, [dx], [g]) is None  # grad_output passed through: no work at all


@pytest.mark.parametrize("packed", [False, True], ids=["halves", "interleaved"])
def test_provenance_follows_writes_into_views_of_a_shared_buffer(packed: bool) -> None:
    """dk and dv as views of one buffer -- its halves, or interleaved as flash-attention's packed
    (n, 2, d) layout, whose byte spans overlap without a common element -- accumulated block by block
    through slices (a fused attention backward): dv's work is the adds and products written into its
    elements, not code the dispatcher cannot see; dk's elements do not depend on them."""
    g, k, v = (torch.rand(4, 3, dtype=torch.float64) for _ in range(3))
    traced = BackwardOps(recording=True)
    with traced:
        dkv = torch.zeros(4, 2, 3, dtype=torch.float64) if packed else torch.zeros(2, 4, 3, dtype=torch.float64)
        dk, dv = dkv.unbind(1 if packed else 0)
        for block in (slice(0, 2), slice(2, 4)):
            dk[block].add_(g[block] * v[block])
            dv[block].add_(g[block] * k[block])
    work = extra_ops(traced, [dk], [dv])
    assert work is not None and not work.opaque, work
    assert work.ops == {"aten.add_.Tensor": 2, "aten.mul.Tensor": 2}, work.ops
    assert extra_ops(traced, [dkv], [dv]) is None  # dv is part of the needed buffer


def test_shares_memory_is_element_exact_for_interleaved_views() -> None:
    buffer = torch.zeros(5, 2)
    assert not shares_memory(buffer[:, 0], buffer[:, 1])  # interleaved columns: overlapping spans, no element in common
    assert shares_memory(buffer[:, 0], buffer[1:3])  # rows 1-2 hold column 0's elements 1-2
    assert shares_memory(buffer, buffer[2, 1]) and not shares_memory(buffer[:2], buffer[2:])
    assert not shares_memory(buffer, torch.zeros(5, 2)) and not shares_memory(buffer[:0], buffer)
    assert shares_memory(buffer.view(torch.int32)[:, 1], buffer[:, 1])  # another element size: by span, erring towards sharing


def _target(*, contract_examples: int | None, spec_cap: int | None, run_examples: int | None, profile: int = 5) -> Target:
    spec = dataclasses.replace(make_spec([Tensor("x", "n")]), max_examples=spec_cap)
    options = RunOptions(profile_settings={"max_examples": profile}, max_examples=run_examples)
    return Target(spec=spec, device="cpu", options=options, contract_examples=contract_examples)


@pytest.mark.parametrize(
    ("contract_examples", "spec_cap", "run_examples", "expected"),
    [
        (None, None, None, 5),  # the profile's
        (None, None, 12, 12),  # --max-examples overrides the profile
        (1, None, 12, 1),  # compile's own count caps --max-examples
        (4, None, None, 4),  # and the profile's
        (4, None, 2, 2),  # a smaller --max-examples still lowers it
        (None, 3, 12, 3),  # the spec's max_examples caps too
        (4, 2, None, 2),
    ],
)
def test_a_contracts_own_count_and_a_spec_cap_bound_the_runs_examples(
    contract_examples: int | None, spec_cap: int | None, run_examples: int | None, expected: int
) -> None:
    target = _target(contract_examples=contract_examples, spec_cap=spec_cap, run_examples=run_examples)
    assert target.example_count() == expected
    assert target.example_count(1) == 1


def test_the_coverage_phase_runs_every_corner_under_a_profile_and_none_under_an_explicit_count() -> None:
    spec = make_spec([Tensor("q", "m d"), Tensor("k", "n d")])

    def phases(*, run_examples: int | None, contract_examples: int | None = None) -> list[tuple[bool, int]]:
        target = Target(
            spec=spec, device="cpu", contract_examples=contract_examples,
            options=RunOptions(profile_settings={"max_examples": 5}, max_examples=run_examples),
        )
        corners = target.coverage_corners()
        assert len(corners) > 5 and corners == target.coverage_corners()
        return [(corner is not None, examples) for corner, examples in target._phases(None)]

    profile = phases(run_examples=None)
    assert profile[:-1] == [(True, 1)] * (len(profile) - 1) and profile[-1] == (False, 1)  # every corner, one random
    assert phases(run_examples=2) == [(False, 2)]  # an explicit count: random examples only
    assert phases(run_examples=None, contract_examples=1) == [(False, 1)]  # so is a contract's own cap


def test_the_random_phase_after_the_corners_is_random_and_follows_the_seed() -> None:
    """Hypothesis' engine runs the simplest example first: after the corners (whose smallest case it
    is) a phase of one example was that one at every seed. Now it is a random example."""
    spec = make_spec([Tensor("q", "m d"), Tensor("k", "n d")])

    def random_cases(seed_: int) -> list[str]:
        target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 5}, seed=seed_))
        randoms: list[str] = []

        def check(target: Target, data: Any) -> None:
            case = target.draw_case(data)
            if target.corner is None:
                randoms.append(f"{case.describe()} {case.recipes} {case.grad_seed}")
            target.checked()

        target.run(check)
        assert len(randoms) == 1, randoms  # the rejected simplest example never reaches the check
        return randoms

    assert len({tuple(random_cases(s)) for s in range(4)}) == 4


def test_the_coverage_phase_takes_pairs_of_kinds_only_where_they_fit_the_count() -> None:
    """Dtypes and case kinds pairwise when those corners leave a random example within the test's
    count (thorough), else each value in turn: the corners never raise a profile's count."""
    spec = make_spec([Tensor("q", "m d"), Tensor("k", "n d")])
    target = Target(spec=spec, device="cpu", case_options=CaseOptions(
        requires_grad="subsets", layouts=("contiguous", "transposed"), grad_output_kinds=("random", "zeros", "per_row"),
    ))
    one_at_a_time, pairwise = target.coverage_corners(), target.coverage_corners(1000)
    assert len(pairwise) > len(one_at_a_time)
    assert target.coverage_corners(len(pairwise)) == one_at_a_time  # no room left for a random example
    assert target.coverage_corners(len(pairwise) + 1) == pairwise
    requires_grad_by_grad_kind = {(c.choice("requires_grad"), c.choice("grad_output kind")) for c in pairwise}
    assert len(requires_grad_by_grad_kind) == 4 * 3, requires_grad_by_grad_kind  # 4 requires_grad classes of q, k


@pytest.mark.parametrize(("fails_from", "reported"), [(40, 65), (20, 33), (129, 129), (1, 1)])
def test_a_failure_at_a_corner_is_reported_at_the_smallest_failing_size(fails_from: int, reported: int) -> None:
    """Forced sizes do not shrink: the runner retries the failing corner one ladder step smaller at
    a time (1, 17, 33, 65 below 129) and reports the smallest that fails, with that example's
    case and draws; when none does, the corner's own."""
    spec = make_spec([Tensor("x", "n")])
    target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 5}))

    def check(target: Target, data: Any) -> None:
        case = target.draw_case(data)
        target.checked()
        if case.sizes["n"] >= fails_from:
            fail(f"n={case.sizes['n']} is too big")

    with pytest.raises(ContractFailure) as raised:
        target.run(check)
    assert raised.value.summary == f"n={reported} is too big"
    assert target.context is not None and target.context.case is not None
    assert target.context.case.sizes["n"] == reported  # the case the report and repro describe
    assert [value.sizes["n"] for label, value in target.last_draws if label == "case"] == [reported]  # what the repro replays


@pytest.mark.parametrize("found", ["failure", "block"])
def test_a_finding_that_does_not_happen_again_is_reported_as_intermittent(found: str) -> None:
    """A Function that fails once and not when Hypothesis runs the same example again (it reads
    memory it does not own) made Hypothesis raise FlakyFailure, which surfaced as the test's raw
    traceback: the failure stands, told as intermittent; a block stays a block."""
    spec = make_spec([Tensor("x", "n")])
    target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 5}))
    calls: list[int] = []

    def check(target: Target, data: Any) -> None:
        target.draw_case(data)
        target.checked()
        if simplest.running():
            return
        calls.append(1)
        if len(calls) == 1 and found == "failure":
            fail("grad['x'] is wrong once")
        if len(calls) == 1:
            raise Blocked(Defect("reference", "output[0] is wrong once"), None)

    if found == "failure":
        with pytest.raises(ContractFailure) as raised:
            target.run(check)
        assert raised.value.summary == "grad['x'] is wrong once"
        assert "intermittent: it did not fail again when the same example ran a second time" in str(raised.value)
    else:
        with pytest.raises(pytest.skip.Exception) as skipped:
            target.run(check)
        assert str(skipped.value.msg).startswith("blocked by reference: output[0] is wrong once"), skipped.value.msg
    assert len(calls) > 1  # Hypothesis ran the example again


def test_with_room_calls_above_a_frame_that_takes_a_frame_stack_chunk_of_its_own() -> None:
    """CPython maps a frame-stack chunk of at least the frame's size: ~128 KiB of locals leave room
    after it for the deep call chains a test runs, so they stop mapping and unmapping chunks."""
    caller = with_room(lambda: sys._getframe(1))
    assert caller.f_code.co_filename == "<conformance stack room>"
    assert caller.f_code.co_nlocals >= 16_000
    assert with_room(lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(ZeroDivisionError):
        with_room(lambda: 1 / 0)


def test_a_contract_check_runs_with_room_on_the_frame_stack() -> None:
    spec = make_spec([Tensor("x", "n")])
    target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 2}))
    files: list[set[str]] = []

    def check(target: Target, data: Any) -> None:
        target.draw_case(data)
        target.checked()
        frame: FrameType | None = sys._getframe()
        seen = set()
        while frame is not None:
            seen.add(frame.f_code.co_filename)
            frame = frame.f_back
        files.append(seen)

    target.run(check)
    assert files and all("<conformance stack room>" in seen for seen in files)


# ----------------------------------------------------------------------------- writes into lent memory


def test_an_execution_names_the_grad_outputs_and_inputs_the_function_wrote_into() -> None:
    execution = _execution()
    execution.grad_outputs = (torch.zeros(2, 3, dtype=torch.float64).expand(2, 3),)
    execution.grad_outputs_before = (torch.zeros(2, 3, dtype=torch.float64),)
    assert execution.written_in_place(_args()) == []
    execution.args[1][0, 0] = -0.0  # bitwise: -0.0 is a write even though it equals 0.0
    execution.grad_outputs[0].masked_fill_(torch.ones(2, 3, dtype=torch.bool), float("nan"))
    assert execution.written_in_place(_args()) == ["grad_output[0]", "input 'w'"]


# ----------------------------------------------------------------------------- saved tensors' versions


def _cube_saving(save: Any) -> type[torch.autograd.Function]:
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(save(x))
            return x * x * x

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return 3 * x * x * grad_output

    return Cube


@pytest.mark.parametrize(
    ("saved", "save", "silent"),
    [
        ("x", lambda x: x, False),  # backward raises after the write: autograd's version check
        ("x.detach()", lambda x: x.detach(), False),  # shares x's version counter
        ("x.clone()", lambda x: x.clone(), False),  # the values forward saw
        ("x.data", lambda x: x.data, True),  # an alias outside the version counter: reads the write
    ],
)
def test_a_write_between_forward_and_backward_shows_only_an_unversioned_save(saved: str, save: Any, silent: bool) -> None:
    spec = dataclasses.replace(make_spec([Tensor("x", "*batch n")]), fn=_cube_saving(save), reference=lambda x: x ** 3)
    for case in collect_examples(cases(spec, CaseOptions(), device="cpu"), 4):
        found = unversioned_saves(case)
        assert (found == (("x",), ["x"])) if silent else found is None, (saved, case.describe(), found)


# ----------------------------------------------------------------------------- which code the allocation mode watches


class _Plain(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


def _half_written(like: torch.Tensor) -> torch.Tensor:
    out = like.new_empty(like.shape)  # a method: no value leads to it, only its name
    out[: like.shape[0] // 2] = like[: like.shape[0] // 2]
    return out


class _AllocatesInAHelper(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _half_written(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _AllocatesByAnotherName(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _ALLOCATE(x)  # torch.empty_like under a name of the user's

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _AllocatesByString(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return vars(torch)["empty_like"](x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _CallsWhatItIsGiven(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, make: Any) -> torch.Tensor:
        return make(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


_ALLOCATE = torch.empty_like


def _with_out_buffer(fn: Any) -> Any:
    """A decorator whose wrapper allocates the buffer the wrapped function fills."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return fn(ctx, x, torch.empty_like(x))

    return wrapper


class _AllocatesInADecorator(torch.autograd.Function):
    @staticmethod
    @_with_out_buffer
    def forward(ctx: Any, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out[:1] = x[:1]
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


@functools.singledispatch
def _fill(x: object) -> torch.Tensor:
    raise TypeError(x)


@_fill.register
def _(x: torch.Tensor) -> torch.Tensor:
    return _half_written(x)


class _AllocatesInADispatchedHelper(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _fill(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _HalfWriter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _half_written(x)


_LAYERS = torch.nn.Sequential(_HalfWriter())  # a library container of the user's module


class _AllocatesInAModuleOfALibraryContainer(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _LAYERS(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


@functools.cache
def _factor(n: int) -> float:
    return 2.0 * n


class _PlainWithACachedHelper(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * _factor(1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * _factor(1)


@pytest.mark.parametrize(
    ("function", "watched"),
    [(_Plain, False), (_CallsWhatItIsGiven, False), (_PlainWithACachedHelper, False), (_AllocatesInAHelper, True),
     (_AllocatesByAnotherName, True), (_AllocatesByString, True), (_AllocatesInADecorator, True),
     (_AllocatesInADispatchedHelper, True), (_AllocatesInAModuleOfALibraryContainer, True)],
)
def test_the_allocation_mode_is_entered_only_where_the_functions_code_may_allocate(function: type, watched: bool) -> None:
    assert WatchedCode(function).watched is watched


def test_an_argument_that_is_not_plain_data_turns_the_watch_on_for_good() -> None:
    watch = WatchedCode(_CallsWhatItIsGiven)
    assert not watch.called_with([torch.zeros(2), 3, 0.5, "mean", torch.float32, (1, 2), None])
    assert watch.called_with([torch.zeros(2), _half_written])
    assert watch.called_with([torch.zeros(2)])  # the backward of that call may run what forward was given
    assert plain_arguments([torch.zeros(1), [1, (2, 3.0)], slice(None), ...])
    assert not plain_arguments([SimpleNamespace(make=_half_written)])


def test_an_unwatched_evaluation_pays_no_mode_and_a_watched_one_poisons() -> None:
    """The mode is what poisons: off for plain code, on for code that allocates (whose unwritten
    half then reads NaN), and on for plain code handed an allocating callable."""
    policy = AllocationPolicy("poison", 0)
    seen: list[bool] = []

    class Spy(_Plain):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.overrides._is_torch_function_mode_enabled())
            return torch.relu(x) * 2

    probed, _ = probe(Spy, allocations=policy)
    probed.apply(torch.ones(4))
    assert seen == [False]
    probed, recorder = probe(_AllocatesInAHelper, allocations=policy)
    out = probed.apply(torch.ones(4))
    assert recorder.uninitialised_allocations == 1 and out[2:].isnan().all() and not out[:2].isnan().any()
    probed, recorder = probe(_CallsWhatItIsGiven, allocations=policy)
    out = probed.apply(torch.ones(4), _half_written)
    assert recorder.uninitialised_allocations == 1 and out[2:].isnan().all()


class _SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 3


@pytest.mark.parametrize("function", [_Plain, _SetupContextStyle])
def test_a_probe_class_is_made_once_and_each_backward_records_into_its_forwards_evaluation(function: type) -> None:
    x = torch.ones(3, requires_grad=True)
    first, first_record = probe(function)
    kept = first.apply(x)  # differentiated only after another evaluation of the same Function
    second, second_record = probe(function)
    assert second is first
    torch.autograd.grad(second.apply(x).sum(), x)
    assert (len(first_record.calls), len(second_record.calls)) == (0, 1)
    torch.autograd.grad(kept, x, torch.full((3,), 5.0))
    assert (len(first_record.calls), len(second_record.calls)) == (1, 1)
    assert torch.equal(first_record.calls[0].grad_outputs[0], torch.full((3,), 5.0))
    record_into(first, first_record)  # a caller that calls the class again later
    torch.autograd.grad(first.apply(x).sum(), x)
    assert (len(first_record.calls), len(second_record.calls)) == (2, 1)
    forget_probe_classes()
    assert probe(function)[0] is not first


def test_a_probe_class_records_allocations_into_the_evaluation_that_made_them() -> None:
    """One evaluation poisons, the next (same class) runs without a policy: each recorder counts
    its own forward's and backward's allocations only."""
    x = torch.ones(4, requires_grad=True)
    poisoned, poisoning = probe(_AllocatesInAHelper, allocations=AllocationPolicy("poison", 0))
    kept = poisoned.apply(x)
    plain, unpoisoned = probe(_AllocatesInAHelper)
    out = plain.apply(x)
    assert plain is poisoned and kept[2:].isnan().all() and not out.isnan().any()
    assert (poisoning.uninitialised_allocations, unpoisoned.uninitialised_allocations) == (1, 0)


# ----------------------------------------------------------------------------- exact equality before a tolerance


def test_exactly_equal_accepts_only_what_every_tolerance_accepts() -> None:
    x = torch.tensor([1.0, -0.0, 3.0])
    assert exactly_equal(x, x.clone()) and exactly_equal(x, torch.tensor([1.0, 0.0, 3.0]))  # -0.0 == 0.0 for any tolerance
    assert not exactly_equal(x, x + 1e-7)  # close is assert_close's to judge
    nan = torch.tensor([float("nan")])
    assert not exactly_equal(nan, nan.clone())  # equal_nan or not: assert_close's to judge
    assert not exactly_equal(x, x.double())  # check_dtype or not: assert_close's to judge
    assert not exactly_equal(x, x[None])
    meta = torch.zeros(2, device="meta")
    assert not exactly_equal(meta, meta)  # no values to compare: never a shortcut


@torch.library.custom_op("conformance_units::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _scaled_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return _half_written(grad)  # the registered backward runs in Python, where the mode sees it


_scaled.register_autograd(_scaled_backward)


def test_a_custom_ops_registered_backward_is_watched() -> None:
    """The Function the suite builds around a custom op is its own code, which the walk does not
    read: what it runs (the op's registered backward) must be watched all the same."""
    assert WatchedCode(adapt(_scaled).function).watched
    probed, recorder = probe(adapt(_scaled).function, allocations=AllocationPolicy("poison", 0))
    x = torch.ones(4, requires_grad=True)
    (grad,) = torch.autograd.grad(probed.apply(x), x, torch.ones(4))
    assert recorder.uninitialised_allocations == 1 and grad[2:].isnan().all()


# ----------------------------------------------------------------------------- drawing past data.draw


def _drawn(through_recorder: bool) -> list[tuple[int, str]]:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conformance.engine.repro import DrawRecorder

    drawn: list[tuple[int, str]] = []

    @settings(max_examples=30, database=None, derandomize=True)
    @given(st.data())
    def property_(data: st.DataObject) -> None:
        source = DrawRecorder(data) if through_recorder else data
        drawn.append((source.draw(st.integers(0, 1000), label="n"), source.draw(st.text(max_size=3), label="s")))

    property_()
    return drawn


def test_a_draw_recorder_draws_what_data_draw_does_and_a_failing_examples_report_names_each_draw() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conformance.engine.repro import DrawRecorder

    assert _drawn(True) == _drawn(False)

    @settings(max_examples=50, database=None, derandomize=True)
    @given(st.data())
    def failing(data: st.DataObject) -> None:
        assert DrawRecorder(data).draw(st.integers(0, 100), label="n") < 50

    with pytest.raises(AssertionError) as raised:
        failing()
    assert "Draw 1 (n): 50" in "\n".join(getattr(raised.value, "__notes__", [])), raised.value


# ----------------------------------------------------------------------------- numpy's generator, seeded only where it can matter


class _DrawsFromNumpy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * float(np.random.rand())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def test_numpy_is_seeded_only_for_a_function_that_may_draw_from_it() -> None:
    from conformance.engine.seeding import HOOKED, needs_numpy_seeded
    from conformance.spec import Derived, Scalar

    assert HOOKED, "this Hypothesis lacks the internals conformance.engine.seeding uses: numpy is seeded for every test"
    plain = dataclasses.replace(make_spec([Tensor("x", "n")]), fn=_Plain, reference=lambda x: torch.relu(x) * 2)
    assert not needs_numpy_seeded(plain)
    assert needs_numpy_seeded(dataclasses.replace(plain, fn=_DrawsFromNumpy))
    assert needs_numpy_seeded(dataclasses.replace(plain, reference=lambda x: x * float(np.random.rand())))
    assert not needs_numpy_seeded(dataclasses.replace(plain, inputs=(Tensor("x", "n"), Scalar("eps", 1e-5))))
    from hypothesis import strategies as st

    assert needs_numpy_seeded(dataclasses.replace(plain, inputs=(Tensor("x", "n"), Scalar("eps", st.floats(0, 1)))))
    assert needs_numpy_seeded(dataclasses.replace(plain, inputs=(Tensor("x", "n"), Scalar("f", np.random.rand))))
    noisy_table = Derived("t", lambda ctx: torch.from_numpy(np.random.rand(*ctx.shape)), "n")
    assert needs_numpy_seeded(dataclasses.replace(plain, inputs=(Tensor("x", "n"), noisy_table)))
    seeded_table = Derived("t", lambda ctx: torch.rand(ctx.shape, generator=ctx.generator, dtype=torch.float64), "n")
    assert not needs_numpy_seeded(dataclasses.replace(plain, inputs=(Tensor("x", "n"), seeded_table)))


@pytest.mark.parametrize("needed", [True, False])
def test_hypothesis_seeds_numpy_around_each_example_only_where_needed(needed: bool) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conformance.engine.seeding import numpy_seeded_only_if

    seen: list[float] = []

    @settings(max_examples=3, database=None, derandomize=True)
    @given(st.integers())
    def property_(n: int) -> None:
        seen.append(float(np.random.get_state(legacy=False)["state"]["key"][0]))

    saved = np.random.get_state()
    property_()  # Hypothesis registers numpy's generator at a process's first example: have it registered
    seen.clear()
    try:
        np.random.seed(12345)
        ours = float(np.random.get_state(legacy=False)["state"]["key"][0])
        with numpy_seeded_only_if(needed):
            property_()
        assert (ours not in seen) is needed, (ours, seen)  # Hypothesis' seed replaces ours, or ours is left alone
        property_()
        assert ours not in seen[-3:]  # after the block, Hypothesis manages numpy again
    finally:
        np.random.set_state(saved)


# ------------------------------------------------------------------ the simplest example without the engine


def _first_example_of_the_engine(property_: Any) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    settings(max_examples=1, database=None, derandomize=True)(given(data=st.data())(property_))()


def _drawing_property(seen: list[Any]) -> Any:
    import random

    from hypothesis import strategies as st
    from hypothesis.control import current_build_context

    @st.composite
    def pairs(draw: Any) -> tuple[int, str]:
        return draw(st.integers(3, 9)), draw(st.sampled_from(("b", "a")))

    def property_(data: Any) -> None:
        seen.append(data.draw(st.integers(-5, 5)))
        seen.append(data.draw(st.floats(0.5, 2.0)))
        seen.append(data.draw(st.lists(st.booleans(), min_size=1, max_size=3)))
        seen.append(data.draw(pairs()))
        seen.append(random.random())  # Python's generator, seeded as Hypothesis seeds it
        seen.append(current_build_context().is_final)

    return property_


def test_the_simplest_example_without_the_engine_is_the_engines_first() -> None:
    from hypothesis import settings

    from conformance.engine import simplest

    assert simplest.HOOKED, "this Hypothesis lacks the internals conformance.engine.simplest uses: every corner starts an engine"
    by_engine: list[Any] = []
    _first_example_of_the_engine(_drawing_property(by_engine))
    without: list[Any] = []
    assert simplest.passes_simplest(_drawing_property(without), settings(database=None))
    assert without == by_engine and len(without) == 6, (without, by_engine)
    assert not simplest.running()


def test_the_simplest_example_leaves_a_failure_or_a_rejection_to_the_engine_and_lets_a_skip_through() -> None:
    from hypothesis import assume, settings

    from conformance.engine import simplest

    ran: list[bool] = []

    def records(data: Any) -> None:
        ran.append(simplest.running())

    def fails(data: Any) -> None:
        fail("wrong")

    def rejects(data: Any) -> None:
        assume(False)

    def skips(data: Any) -> None:
        pytest.skip("n/a")

    def interrupted(data: Any) -> None:
        raise KeyboardInterrupt

    run_settings = settings(database=None)
    assert simplest.passes_simplest(records, run_settings) and ran == [True]
    assert not simplest.passes_simplest(fails, run_settings)
    assert not simplest.passes_simplest(rejects, run_settings)
    with pytest.raises(pytest.skip.Exception):
        simplest.passes_simplest(skips, run_settings)
    with pytest.raises(KeyboardInterrupt):
        simplest.passes_simplest(interrupted, run_settings)
    from hypothesis import Verbosity

    assert not simplest.passes_simplest(records, settings(run_settings, verbosity=Verbosity.verbose))  # Hypothesis prints
    assert ran == [True] and not simplest.running()


def test_the_simplest_example_has_the_engines_room_for_deep_calls() -> None:
    """The engine runs an example with the recursion limit raised (Dynamo's traces are deep): so
    does the simplest run, or a deep but correct call would fail there and run twice."""
    from hypothesis import settings

    from conformance.engine import simplest

    def depth(n: int) -> int:
        return 0 if n == 0 else 1 + depth(n - 1)

    def deep(data: Any) -> None:
        assert depth(1500) == 1500

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(_stack_depth()) + 300)
    try:
        assert simplest.passes_simplest(deep, settings(database=None))
    finally:
        sys.setrecursionlimit(limit)


def _stack_depth() -> list[Any]:
    import traceback

    return traceback.extract_stack()


def test_a_corners_case_is_drawn_once_for_every_test_of_the_function_that_draws_it_alike() -> None:
    """Two tests with equal options share the simplest case of each corner: the second records it
    among its draws without drawing it; a case with a drawn Scalar that is not plain data is not kept."""
    from hypothesis import strategies as st

    from conformance.spec import Scalar

    def run(spec: Any, kept: dict[Any, Any]) -> list[Any]:
        target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 5}), simplest_cases=kept)
        drawn: list[Any] = []

        def check(target: Target, data: Any) -> None:
            drawn.append(target.draw_case(data))
            target.checked()

        target.run(check)
        assert [value for label, value in target.last_draws if label == "case"] == drawn[-1:]
        return drawn

    spec = make_spec([Tensor("x", "m n"), Scalar("eps", st.sampled_from((1e-5, 1e-6)))])
    kept: dict[Any, Any] = {}
    first = run(spec, kept)
    phases = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 5}))._phases(None)
    assert phases[-1] == (None, 1) and len(phases) > 2  # every run is one example long: each corner's is the simplest
    assert len(kept) == len(phases) - 1 == len(first) - 1  # the random phase's is random: not kept
    second = run(spec, kept)
    assert all(a is b for a, b in zip(first[:-1], second[:-1]))  # the same objects: not drawn again
    assert first[-1] == second[-1]  # the random example: drawn again, the same (same seed)

    for value in (np.zeros(2), [0, 1]):  # an array (its repr rounds), a list (a Function may change it)
        kept = {}
        run(make_spec([Tensor("x", "m n"), Scalar("table", st.just(value))]), kept)
        assert kept == {}


def test_the_budgets_quick_accept_never_accepts_what_the_full_rule_rejects() -> None:
    """compare_budget's common-case shortcut (:func:`numerics._within_plain_budget`) accepts only
    values the full rule accepts, and the full rule decides everything else, so the verdicts are the
    full rule's: the same results with the shortcut on and off, on values near the budget's edge,
    non-finite ones, and truths past float16's range."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conformance.engine import numerics

    values = st.one_of(st.floats(-70000, 70000), st.sampled_from((math.inf, -math.inf, math.nan, 0.0, 65504.0)))

    @settings(max_examples=300, database=None, derandomize=True)
    @given(st.lists(st.tuples(values, st.floats(-1e-2, 1e-2), st.floats(-1e-2, 1e-2)), min_size=1, max_size=6),
           st.sampled_from((torch.float16, torch.bfloat16, torch.float32)), st.sampled_from((0.0, 1.0, 1e3)))
    def agrees(rows: list[tuple[float, float, float]], dtype: torch.dtype, floor_at: float) -> None:
        truth = torch.tensor([t for t, _, _ in rows], dtype=torch.float64)
        actual = (truth + torch.tensor([a for _, a, _ in rows], dtype=torch.float64)).to(dtype)
        baseline = (truth + torch.tensor([b for _, _, b in rows], dtype=torch.float64)).to(dtype)

        def verdict() -> bool:
            return numerics.compare_budget(actual, truth, baseline, dtype, k=2.0, floor_at=floor_at, what="x", where="w") is None

        with_shortcut = verdict()
        quick = numerics._within_plain_budget(actual, truth, baseline, dtype, k=2.0, floor_at=floor_at, steps=numerics.FLOOR_ULPS)
        original = numerics._within_plain_budget
        numerics._within_plain_budget = lambda *args, **kwargs: False  # type: ignore[assignment]
        try:
            assert verdict() == with_shortcut
        finally:
            numerics._within_plain_budget = original
        assert with_shortcut or not quick

    agrees()


def test_an_error_from_the_suites_own_code_is_worded_as_the_suites_not_the_functions() -> None:
    """An error no frame of the user's code raised (here a suite helper misused, as inplace once
    did on a saved None) is reported as the suite's bug, naming where; an error from other code
    keeps the plain wording."""
    def run(check: Any) -> str:
        target = Target(spec=make_spec([Tensor("x", "n")]), device="cpu", options=RunOptions(profile_settings={"max_examples": 2}))
        with pytest.raises(ContractFailure) as caught:
            target.run(check)
        return str(caught.value)

    # A contract's check, as if in conformance/ (its code's file name is there), misusing a helper.
    namespace: dict[str, Any] = {"changed_elements": changed_elements}
    source = "def suite_bug(target, data):\n    changed_elements(None, None)\n"
    exec(compile(source, str(Path(conformance.__file__).parent / "test_a_contract.py"), "exec"), namespace)
    suite_bug = namespace["suite_bug"]

    def own_bug(target: Target, data: Any) -> None:
        raise ValueError("raised here, outside the suite")

    text = run(suite_bug)
    assert "AttributeError raised inside autograd-conformance's own code while checking this contract" in text, text
    assert "conformance/engine/harness.py:" in text and "most likely a bug of the suite" in text
    other = run(own_bug)
    assert "ValueError raised while checking this contract" in other and "own code" not in other, other
    assert "test_engine_units.py" in other  # the frame outside the suite is shown


def test_an_autocast_gradient_failure_names_its_likely_cause() -> None:
    """A gradient of a Function without custom_fwd that fails under autocast most likely mixes a
    statistic saved from bfloat16 scores with float32 recomputation (a new user's trial read the
    failure without that hint); an output's failure or a declared Function's gets no such line."""
    autocast = importlib.import_module("conformance.test_autocast")

    class Undeclared(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

    class Declared(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu")
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

    grad = "max|grad['k'] - reference|=0.1 at (0, 0), but should be <= 0.08 [Attention.backward, ...]"
    output = "max|output[0] - reference|=0.1 at (0, 0), but should be <= 0.08 [Attention.forward, ...]"
    causes = autocast._likely_causes(Undeclared, "cpu", "bfloat16", [], grad)
    assert len(causes) == 1 and "a log-sum-exp" in causes[0] and "custom_fwd(device_type='cpu', cast_inputs=torch.float32)" in causes[0]
    assert autocast._likely_causes(Undeclared, "cpu", "bfloat16", [], output) == []
    assert autocast._likely_causes(Declared, "cpu", "bfloat16", [], grad) == []
    returned = ["grad['x'].dtype=bfloat16 as backward returned it"]
    on_x = "max|grad['x'] - reference|=0.1 at (0, 0), but should be <= 0.08 [Scale.backward, ...]"
    narrow = autocast._likely_causes(Declared, "cpu", "bfloat16", returned, on_x)
    assert narrow == ["Backward returned grad['x'].dtype=bfloat16 as backward returned it: the engine casts it back after the precision is lost."]
    assert autocast._likely_causes(Declared, "cpu", "bfloat16", returned, grad) == []  # another gradient failed


def test_finite_differences_take_a_larger_step_only_where_rounding_hides_the_tolerance() -> None:
    """u * |f| / h: a loss of 1e9 has ~0.1 of rounding noise at h=1e-6, far above gradcheck's
    atol; larger steps, 10x apart, up to where the noise is below it (at most 1e-2). Outputs of
    ordinary size need none."""
    ordinary = torch.tensor([3.0, -40.0], dtype=torch.float64, requires_grad=True) * 1
    assert resolving_steps([ordinary], 1e-5) == ()
    huge = torch.tensor([1.3e9, 2.0], dtype=torch.float64, requires_grad=True) * 1
    steps = resolving_steps([huge, "not a tensor"], 1e-5)
    assert steps[0] == pytest.approx(FD_EPS * 10) and steps[-1] == pytest.approx(LARGEST_STEP)
    assert all(b == pytest.approx(a * 10) for a, b in itertools.pairwise(steps))
    moderate = torch.tensor([2e4], dtype=torch.float64, requires_grad=True) * 1
    assert resolving_steps([moderate], 1e-5) == pytest.approx((1e-5,))
    assert resolving_steps([torch.tensor([1e9], dtype=torch.float64)], 1e-5) == ()  # no gradient flows from it


@pytest.mark.parametrize(("fail_on", "outcome"), [(frozenset({"defect"}), "upstream"), (frozenset({"defect", "advice"}), "failed")])
def test_a_noted_upstream_finding_keeps_later_advice(fail_on: frozenset[str], outcome: str) -> None:
    """compile notes Dynamo's internal error as upstream and goes on; a recompile found later is
    advice. Both are kept: torch's bug is the verdict, unless --advice=fail makes the advice the
    one that fails the run (it shared advice's slot, so the later advice was dropped)."""
    spec = make_spec([Tensor("x", "n")])
    target = Target(spec=spec, device="cpu", options=RunOptions(profile_settings={"max_examples": 1}, fail_on=fail_on))

    def check(target: Target, data: Any) -> None:
        target.draw_case(data)
        upstream_noted("torch's bug: Dynamo failed internally")
        advise("compiled 3 variants for 3 calls")
        target.checked()

    if outcome == "failed":
        with pytest.raises(pytest.fail.Exception, match="compiled 3 variants"):
            target.run(check)
    else:
        target.run(check)
    verdict = RecordedVerdict.of(target.user_properties)
    assert verdict is not None and verdict.outcome.value == outcome, verdict


def test_the_float32_baseline_is_the_reference_in_float32_rounded_once_to_the_tested_dtype() -> None:
    """stability's excuse in half precision: where the reference computed in float32 overflows the
    dtype too (a product past 65504 from float16 inputs), a kernel that accumulates in float32 may."""
    spec = dataclasses.replace(make_spec([Tensor("x", "n")], dtypes=(torch.float64, torch.float16)), reference=lambda x: x * 300.0)
    (case,) = collect_examples(cases(spec, CaseOptions(dtypes=(torch.float16,))), 1)
    x = torch.tensor([1.0, 250.0], dtype=torch.float16, requires_grad=True)
    grad_outputs = {0: torch.full((2,), 300.0, dtype=torch.float16)}
    widened = float32_baseline(spec, case, [x], ["x"], grad_outputs)
    (out,) = widened.outputs
    assert out.dtype == torch.float16 and out[0] == 300 and torch.isinf(out[1])  # 75000 in float32: past float16's range
    grad = widened.grads["x"]
    assert grad is not None and grad.dtype == torch.float16 and torch.isinf(grad).all()  # 300 * 300 = 90000
