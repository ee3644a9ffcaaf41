"""Contract grad_meta: each raw gradient has exactly its input's shape, dtype and device.

Checked on what backward returned, before the engine sums an expandable shape (an unreduced
broadcast gradient) or casts a dtype -- both of which gradcheck lets through. The checks live in
:func:`conformance.engine.defects.structural_defects`, shared with every contract that must stop
("blocked by grad_meta") when a gradient's metadata is wrong. The "sum it over the broadcast
dims" advice is given only when the input really was broadcast to the gradient's shape in the
failing call.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound
from conformance.engine.runner import Target
from strategies.cases import CaseOptions


def check_grad_meta(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    execution = target.execution(case)
    require_sound(target.contract, execution)
    if target.backward_ran(execution):
        target.checked()


@contract('grad_meta', case=CaseOptions(broadcast=True))
def test_grad_meta(conformance_target: Target) -> None:
    conformance_target.run(check_grad_meta)
