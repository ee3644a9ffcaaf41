"""Contract unneeded_grads: backward returns None for inputs that need no gradient.

The efficiency half of ``ctx.needs_input_grad`` (the correctness half is the needs_input_grad
contract): for every requires_grad subset, a differentiable input whose ``needs_input_grad`` is
False gets None. The engine silently drops such a gradient, so computing it is invisible wasted
work -- unless one fused kernel computes every gradient in a single pass anyway (dq, dk and dv of
a flash attention backward). A spec says so with ``register(..., waivers={"unneeded_grads":
"dq, dk, dv come from one fused kernel"})``; the test is then skipped with that reason and the
report's matrix shows it as waived.

A gradient returned for a tensor input the spec declares ``requires_grad=False`` (a frozen bias)
is dropped the same way, unchecked: advice here too, never a defect.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.runner import Target
from conformance.engine.subsets import run_subsets


def check_unneeded_grads(target: Target, data: st.DataObject) -> None:
    run_subsets(target, data, efficiency=True)


@contract("unneeded_grads", compares_values=True)
def test_unneeded_grads(conformance_target: Target) -> None:
    conformance_target.run(check_unneeded_grads)
