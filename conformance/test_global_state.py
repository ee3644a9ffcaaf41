"""Contract global_state: a Function leaves torch's global state as it found it.

Forward and backward each start from the suite's pinned state (:mod:`conformance.engine.global_state`:
grad mode on, default dtype float32, default device CPU, deterministic algorithms and anomaly
mode off, torch's backend precision flags, autocast off, the thread count); after each, every
one of those must still hold its pinned value. A leak changes every op the caller runs next: a
default dtype of float64 doubles memory and changes every result, deterministic algorithms make
later ops raise on CUDA, anomaly mode slows every backward tenfold, a "meta" default device
makes every later tensor empty. (Grad mode and inference mode set inside forward or backward
are put back by autograd itself, so those two can only leak from outside a Function.)

The RNG is different: a Function that draws random numbers (dropout) advances torch's
generators, which is legitimate -- whether it should draw at all is the determinism contract's
question (``nondeterministic=True``). What is never legitimate is *overwriting* the generator
state: ``torch.manual_seed(...)`` or ``torch.set_rng_state(saved)`` in forward or backward
without restoring it (``torch.random.fork_rng`` does) makes the caller's random numbers repeat
(the same dropout mask every step). Forward and backward therefore run three times: twice from
one RNG state and once from another. Drawing is a function of the state before, so an
overwritten state shows as the same state after both starts (reseeded), a different one after
the same start (reseeded from entropy, ``torch.seed()``), or backward ending where forward began
(rewound: the caller's next draws repeat forward's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import execute
from conformance.engine.global_state import RngStates, Snapshot, differences, pin, rng_states, seed_all, snapshot
from conformance.engine.harness import Execution
from conformance.engine.report import fail
from conformance.engine.runner import Target
from strategies.cases import Case

# The RNG seeds of the runs (any two distinct values; the runner pins and restores the RNG).
SEEDS = (20241, 20242)

ADVICE = (
    "Change global state only inside a context manager that restores it (torch.random.fork_rng(), "
    "torch.autograd.set_grad_enabled(...) as a `with` block, or save and restore the value), or pass "
    "what you need explicitly (dtype=, device=)."
)


@dataclass(frozen=True)
class _Run:
    """torch's state when forward started, after forward, and after backward (None: no backward)."""

    start: RngStates
    after_forward: Snapshot
    after_backward: Snapshot | None


def _run(target: Target, case: Case, seed: int) -> _Run:
    """Forward and backward from the pinned state with the RNG seeded with ``seed``; the flags
    are pinned again between them, so each is judged on its own."""
    seed_all(seed)
    start = rng_states()
    seen: dict[str, Snapshot] = {}

    def after_forward(_: Execution) -> None:
        seen["forward"] = snapshot()
        pin(target.pinned, rng=False)

    def after_backward(execution: Execution) -> None:
        if execution.recorder.calls:
            seen["backward"] = snapshot()

    execution = execute(case, after_forward=after_forward, after_backward=after_backward)
    require_sound(target.contract, execution)
    return _Run(start, seen["forward"], seen.get("backward"))


def _show(value: Any) -> str:
    if isinstance(value, torch.device):
        return repr(str(value))
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def _check_flags(target: Target, state: Snapshot, phase: str) -> None:
    changed = differences(state, target.pinned)
    if not changed:
        return
    name, now, pinned = changed[0]
    others = ", ".join(f"{n}={_show(v)}" for n, v, _ in changed[1:])
    fail(
        f"{name}={_show(now)} after {phase}, but should be {_show(pinned)} [{target.spec.display_name}.{phase}]",
        f"{phase} changed torch's global state and left it changed: every op the caller runs after this "
        "call sees it.",
        f"Also changed: {others}." if others else "",
        ADVICE,
    )


def _check_rng(target: Target, first: _Run, again: _Run, other: _Run) -> None:
    fn_name = target.spec.display_name
    forward_drew = not first.after_forward.rng.same_as(first.start)
    if forward_drew and first.after_forward.rng.same_as(other.after_forward.rng):
        fail(
            f"torch's RNG state after forward is the same whatever it was before, but should only advance "
            f"[{fn_name}.forward, seeds {SEEDS[0]} and {SEEDS[1]}]",
            "forward overwrote the global generator (torch.manual_seed or torch.set_rng_state): every random "
            "number the caller draws after this call repeats from call to call (the same dropout mask every step).",
            ADVICE,
        )
    if not first.after_forward.rng.same_as(again.after_forward.rng):
        fail(
            f"torch's RNG state after forward differs between two calls from the same state, but should "
            f"depend only on it [{fn_name}.forward, seed {SEEDS[0]} twice]",
            "forward reseeded the global generator from outside torch (torch.seed(), a time-based seed): the "
            "caller's random numbers are no longer reproducible from its own torch.manual_seed.",
            ADVICE,
        )
    if first.after_backward is None or again.after_backward is None or other.after_backward is None:
        return
    backward_drew = not first.after_backward.rng.same_as(first.after_forward.rng)
    if backward_drew and forward_drew and first.after_backward.rng.same_as(first.start):
        fail(
            f"torch's RNG state after backward is the state forward started from, but should not go back "
            f"[{fn_name}.backward]",
            "backward restored the generator state saved before forward's random draws (torch.set_rng_state "
            "without torch.random.fork_rng): the caller's next random numbers repeat the ones forward drew.",
            ADVICE,
        )
    if backward_drew and first.after_backward.rng.same_as(other.after_backward.rng):
        fail(
            f"torch's RNG state after backward is the same whatever it was before, but should only advance "
            f"[{fn_name}.backward, seeds {SEEDS[0]} and {SEEDS[1]}]",
            "backward overwrote the global generator (torch.manual_seed or torch.set_rng_state): every random "
            "number the caller draws after it repeats from step to step.",
            ADVICE,
        )
    if not first.after_backward.rng.same_as(again.after_backward.rng):
        fail(
            f"torch's RNG state after backward differs between two calls from the same state, but should "
            f"depend only on it [{fn_name}.backward, seed {SEEDS[0]} twice]",
            "backward reseeded the global generator from outside torch (torch.seed(), a time-based seed).",
            ADVICE,
        )


def check_global_state(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    first = _run(target, case, SEEDS[0])
    _check_flags(target, first.after_forward, "forward")
    if first.after_backward is not None:
        _check_flags(target, first.after_backward, "backward")
    _check_rng(target, first, _run(target, case, SEEDS[0]), _run(target, case, SEEDS[1]))
    target.checked()  # forward's effect at least; backward's too when it ran


@contract("global_state")
def test_global_state(conformance_target: Target) -> None:
    conformance_target.run(check_global_state)
