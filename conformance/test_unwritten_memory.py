"""Contract unwritten_memory: every output and gradient element is written by the Function.

A kernel whose grid skips the last partial block, or whose store mask drops valid elements,
returns a buffer from ``torch.empty`` with holes: on most machines fresh memory is zeros, so
the hole looks like a plausible value and hand-written tests pass. The execution layer fills
every uninitialised allocation the Function makes with NaN in every evaluation (see
:mod:`conformance.engine.memory`) and confirms each NaN against a zero-filled rerun; this contract owns
what that finds (every other contract stops with "blocked by unwritten_memory"), and says n/a for
a Function that allocates nothing uninitialised (pure torch ops write all they return).
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.runner import VARIED_CASES, Target

NOTHING_ALLOCATED = (
    "the Function made no uninitialised allocation (torch.empty, empty_like, new_empty, empty_strided) in "
    "forward or backward on the examples drawn, so nothing it returns can be unwritten memory"
)


def check_unwritten_memory(target: Target, data: st.DataObject) -> None:
    case = target.draw_varied_case(data)
    execution = target.preflight(case)
    if execution.recorder.uninitialised_allocations:
        target.checked()
    else:
        target.not_checked(NOTHING_ALLOCATED)


@contract('unwritten_memory', case=VARIED_CASES)
def test_unwritten_memory(conformance_target: Target) -> None:
    conformance_target.run(check_unwritten_memory)
