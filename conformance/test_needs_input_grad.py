"""Contract needs_input_grad: backward is right for every requires_grad subset.

For each subset of the differentiable inputs (the drawn one first; every subset when there are
at most ``EXHAUSTIVE_INPUTS`` of them, so a swapped index is found on any seed):

* with no input requiring grad, forward still works and returns outputs without grad;
* every needed gradient is returned (not None) and equals the one the same backward returns
  when every input requires grad (same inputs, same dtype, same grad_outputs, same RNG seed);

The efficiency half -- None for a differentiable input that merely does not require grad in
this call, instead of a gradient the engine silently drops -- is the separate contract
``unneeded_grads`` (test_unneeded_grads.py), which a spec can waive with a stated reason (a
fused kernel that computes every gradient in one pass). Both run the same subsets through
:func:`conformance.engine.subsets.run_subsets`. Checked on what backward returned (the probe's raw record), not on what the
engine passes on.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.runner import Target
from conformance.engine.subsets import run_subsets
from strategies.cases import CaseOptions

__all__ = ["check_needs_input_grad", "test_needs_input_grad"]


def check_needs_input_grad(target: Target, data: st.DataObject) -> None:
    run_subsets(target, data, efficiency=False)


@contract('needs_input_grad', case=CaseOptions(requires_grad="subsets"), compares_values=True)
def test_needs_input_grad(conformance_target: Target) -> None:
    conformance_target.run(check_needs_input_grad)
