"""Contract out_of_bounds: forward and backward write only inside the tensors they write, and
read only inside the tensors they read.

An unmasked tail store (``mask=offs <= n``, a grid rounded up without a mask) lands in the
neighbouring buffer without any error on CPU, under the Triton interpreter, and usually on CUDA.
Here every tensor input and grad_output, and every uninitialised buffer the Function allocates,
sits inside a larger buffer whose margins (:data:`MARGIN` elements each side) hold canary values
(:mod:`conformance.engine.memory`); a changed canary after forward or after backward is a failure that
says whose margin and how far past its end.

Reads likewise: an unmasked load past the end of a row reads the neighbour's memory, which
changes from call to call (other contracts then see values that differ from themselves, or NaN
from a poisoned neighbour: they are blocked by this contract). The same case runs again with
other values in every margin; an output or gradient that changes read outside its tensors. A
strided tensor read as if it were contiguous is the layouts contract's finding.

What it cannot see: a write more than ``MARGIN`` elements away, into memory that is not a
margin (a crash or silent corruption elsewhere); writes into the gaps of a non-contiguous
tensor's own span; buffers torch allocates inside a native op.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import Blocked, Defect, read_outside_defect, require_sound
from conformance.engine.evaluate import execute, reads_outside
from conformance.engine.global_state import rng_states
from conformance.engine.harness import Execution, random_state
from conformance.engine.memory import MARGIN
from conformance.engine.numerics import read_outside
from conformance.engine.report import fail
from conformance.engine.runner import VARIED_CASES, Target


def _damage(execution: Execution) -> list[str]:
    return [found for found in (c.damage() for c in execution.recorder.canaries) if found]


def check_out_of_bounds(target: Target, data: st.DataObject) -> None:
    case = target.draw_varied_case(data)
    after_forward: list[str] = []

    def look_after_forward(execution: Execution) -> None:
        after_forward.extend(_damage(execution))

    with random_state(case.spec, case):
        rng_before = rng_states()
        execution = execute(case, guard_inputs=True, after_forward=look_after_forward)
    fn_name = case.spec.display_name
    phase, found = "forward", after_forward
    if not found:
        phase, found = "backward", _damage(execution)
    if found:
        fail(
            f"{found[0]}, but should write only inside it [{fn_name}.{phase}]",
            f"Also: {'; '.join(found[1:])}." if found[1:] else "",
            f"Every input, grad_output and uninitialised allocation of the Function sat inside a buffer with "
            f"{MARGIN} canary elements either side; {phase} changed some of them. On a GPU such a write corrupts "
            "whatever tensor happens to live next door, silently.",
            "Usual causes: a store mask that admits one element too many (offs <= n), a launch grid rounded up "
            "without a mask on the store, strides or an offset computed for a bigger tensor.",
        )
    require_sound(target.contract, execution)
    read = reads_outside(case, execution, rng_before)
    if read is not None:
        # Judged in contiguous layouts, as every contract's read is (numerics.read_outside).
        defect = read_outside_defect(case, read) if case.in_contiguous_layouts() is case else read_outside(case)
        if defect is None:  # a strided tensor read as contiguous
            raise Blocked(Defect(
                "layouts", f"{read} changes with the memory around strided inputs or grad_outputs, but not with contiguous ones "
                f"[{fn_name}]",
                ("The Function reads a strided or stride-0 tensor as if it were contiguous: call .contiguous() before the kernel.",),
            ), case)
        fail(defect.summary, *defect.details)
    target.checked()


@contract('out_of_bounds', case=VARIED_CASES)
def test_out_of_bounds(conformance_target: Target) -> None:
    conformance_target.run(check_out_of_bounds)
