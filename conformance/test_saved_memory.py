"""Contract saved_memory: forward keeps for backward no more than the spec promises.

A flash attention exists to not keep the N x N probabilities (only the row log-sum-exp); a
checkpointed op promises to keep only its inputs. ``register(..., saves=...)`` states the
promise: ``"inputs"``, ``"inputs_and_outputs"``, or a callable of the input tensors by name
returning the bytes allowed beyond the inputs and outputs. After forward, everything the
Function holds for backward -- ``ctx.save_for_backward`` tensors and tensors stored on ``ctx`` --
is measured by storage (a saved slice keeps its whole base alive; inputs' and outputs' storages
are free where the promise says so), and the total compared with the promise. n/a without a
promise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import execute
from conformance.engine.harness import Execution, random_state
from conformance.engine.held import on_ctx, reachable
from conformance.engine.memory import SavedStorage, saved_storages
from conformance.engine.report import fail
from conformance.engine.runner import Target

NO_PROMISE = (
    "the spec makes no promise about what forward keeps for backward; declare one with register(..., "
    "saves='inputs' | 'inputs_and_outputs' | callable(inputs by name) -> bytes beyond inputs and outputs)"
)


def _kept(ctx: object) -> list[tuple[str, torch.Tensor]]:
    kept = [(f"save_for_backward[{i}]", t) for i, t in enumerate(ctx.saved_tensors)]  # type: ignore[attr-defined]
    kept.extend((path, t) for path, t in reachable(on_ctx(ctx)) if isinstance(t, torch.Tensor))
    return kept


def _describe(storages: Sequence[SavedStorage]) -> str:
    largest = sorted(storages, key=lambda s: s.nbytes, reverse=True)[:5]
    return "; ".join(f"{s.where}: {s.shape} {str(s.dtype).removeprefix('torch.')}, {s.nbytes} bytes" for s in largest)


def check_saved_memory(target: Target, data: st.DataObject) -> None:
    spec = target.spec
    case = target.draw_case(data)
    measured: dict[str, list[SavedStorage]] = {}

    def measure(execution: Execution) -> None:
        if not execution.diff_positions:
            return
        ctx = execution.outputs[execution.diff_positions[0]].grad_fn
        # What forward received: a declared in-place input is the clone it was given.
        inputs = [a for a in execution.passed if isinstance(a, torch.Tensor)]
        outputs = [o for o in execution.outputs if isinstance(o, torch.Tensor)]
        free = inputs if spec.saves == "inputs" else inputs + outputs
        measured["extra"] = list(saved_storages(_kept(ctx), free=free, canaries=execution.recorder.canaries))

    with random_state(spec, case):
        execution = execute(case, backward=False, after_forward=measure)
    require_sound(target.contract, execution)
    if "extra" not in measured:
        target.not_checked("no output of forward requires grad in the examples drawn, so nothing is kept for backward")
        return
    extra = measured["extra"]
    kept = sum(s.nbytes for s in extra)
    if callable(spec.saves):
        named = {r.name: a for r, a in zip(case.recipes, execution.args) if isinstance(a, torch.Tensor)}
        allowed = int(spec.saves(named))
        promise = f"saves=<callable> allows the inputs, the outputs and {allowed} bytes more"
    else:
        allowed = 0
        promise = f"saves={spec.saves!r} allows " + ("the inputs only" if spec.saves == "inputs" else "the inputs and outputs only")
    target.checked()
    if kept > allowed:
        fail(
            f"saved_bytes={kept}, but should be <= {allowed} [{spec.display_name}.forward]",
            f"The promise: {promise}. forward keeps besides those: {_describe(extra)}.",
            "Sizes are of whole storages: a saved view keeps its base alive. Save only what the promise allows "
            "(e.g. the log-sum-exp per row, not the probabilities) and recompute the rest in backward, or correct "
            "the promise.",
        )


def _promise(target: Target) -> None:
    if target.spec.saves is None:
        target.not_applicable(NO_PROMISE)


@contract("saved_memory", requires=[Requirement("a saves= promise", _promise)])
def test_saved_memory(conformance_target: Target) -> None:
    conformance_target.run(check_saved_memory)
