"""Contract opcheck: a torch.library custom op passes ``torch.library.opcheck`` on generated cases.

opcheck runs the op's registrations against each other on the drawn inputs: its schema (does the
op mutate or alias what the schema says), its autograd registration, its fake kernel (shapes,
dtypes and strides the same as the real kernel's) and AOT dispatch with dynamic shapes (what
``torch.compile`` traces). Each sub-check is reported by name. opcheck does not check gradient
*values* -- a 3x-wrong registered backward passes it (measured) -- which the reference and
gradcheck contracts do on the same op. n/a for an autograd.Function, which has no schema, fake
kernel or registration to check (the compile contract checks that it traces).
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.report import fail
from conformance.engine.runner import Target
from conformance.spec.targets import CustomOpAdapter


def first_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).strip().split("\n")[0].split())
    return f"{type(error).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


ADVICE = {
    "test_schema": "the kernel mutates or aliases an input its schema does not declare (mutates_args=...)",
    "test_autograd_registration": "the op's autograd is not registered the way the dispatcher needs (use register_autograd)",
    "test_faketensor": "the register_fake kernel must return outputs with the real kernel's shapes, dtypes and strides",
    "test_aot_dispatch_dynamic": "tracing the op with fake inputs and dynamic shapes fails or disagrees with eager (fake kernel, "
    "setup_context or backward that only works on real tensors)",
}


def check_opcheck(target: Target, data: st.DataObject) -> None:
    op = target.spec.op
    assert isinstance(op, CustomOpAdapter)
    case = target.draw_case(data)
    # A defect eager already shows (a gradient of the wrong shape fails test_aot_dispatch_dynamic
    # too) is its owner's: opcheck is blocked by it.
    target.preflight(case)
    results = op.opcheck(case.args())
    failed = {name: error for name, error in results.items() if error is not None}
    if failed:
        name, error = next(iter(failed.items()))
        fail(
            f"torch.library.opcheck {name} failed: {first_line(error)}, but every sub-check should pass "
            f"[{target.spec.display_name}, {str(case.dtype).removeprefix('torch.')}]",
            "sub-checks: " + "; ".join(f"{n}: {'FAILED' if e is not None else 'passed'}" for n, e in results.items()),
            *(f"{n}: {ADVICE[n]}\n  {type(e).__name__}: {str(e).strip()[:2000]}" for n, e in failed.items()),
        )
    target.checked()


def _custom_op(target: Target) -> None:
    if target.spec.op.kind != "custom op":
        target.not_applicable(
            "torch.library.opcheck checks torch.library custom ops (schema, fake kernel, registrations); "
            f"{target.spec.display_name} is an autograd.Function (the compile contract checks that it traces)"
        )


@contract("opcheck", requires=[Requirement("a torch.library custom op", _custom_op)], compares_values=True)
def test_opcheck(conformance_target: Target) -> None:
    conformance_target.run(check_opcheck)
