"""Contract return_count: backward returns one entry per forward input, None for non-tensors.

Forward's own return value is checked first: a list, dict, None or number holds no tensor
autograd tracks (:func:`conformance.engine.defects.forward_defect`). Trailing extra Nones are tolerated (the engine tolerates them too); anything else is a defect
the engine would report as an opaque "incorrect number of gradients" or let through. The checks
live in :func:`conformance.engine.defects.structural_defects`, shared with every contract that must
stop ("blocked by return_count") when the count is wrong.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound, structural_defects
from conformance.engine.report import fail
from conformance.engine.runner import Target


def check_return_count(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    execution = target.execution(case)
    for call in execution.recorder.calls:
        defects = structural_defects(case, call, execution.args, execution.outputs)
        own = [d for d in defects if d.owner == target.contract]
        if own:
            fail(own[0].summary, *own[0].details)
        if defects:
            target.checked()
            return  # the count is right; the gradients' metadata is grad_meta's finding
    require_sound(target.contract, execution)  # also forward's return value (forward_defect)
    if target.backward_ran(execution):
        target.checked()


@contract("return_count")
def test_return_count(conformance_target: Target) -> None:
    conformance_target.run(check_return_count)
