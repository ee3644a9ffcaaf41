"""Contract devices: CPU and CUDA agree, and results stay on the input's device.

Runs on the ``-cuda`` test id of each Function (the plugin skips it, with a reason, when CUDA is
not available). The ``-cpu`` id has nothing to compare against and is skipped with a reason that
points at the ``-cuda`` id: the CPU-only properties (gradients on the input's device) are
grad_meta's.

Each case runs on CUDA and on the CPU with the same values and grad_outputs, with TF32 and
reduced-precision reductions off (they are CUDA-only approximations, not the Function's). Outputs
and gradients must come back on the device of the inputs, and agree:

* float64 when the spec lists it: within ``FLOAT64_ROUNDING_STEPS`` rounding steps (1.5e-11
  relative) of the call's largest value (inputs, grad_outputs, outputs and gradients: a value
  that cancels carries its terms' rounding). Reduction order and libm differences stay far
  below it; a kernel that silently computes in float32 (errors ~1e-7) does not.
* otherwise (a low-precision-only kernel) the budget comes from the dtype and the CPU's own
  accuracy: ``(k + 1) * max|cpu - reference_float64| + 2`` rounding steps at the largest
  magnitude, with the reference contract's k (2 for outputs, 3 for gradients, or the spec's
  override). If CUDA is within k times the CPU's error of the exact answer, the triangle
  inequality puts it within (k + 1) times of the CPU result.

Functions declared ``nondeterministic=True`` draw from different RNG streams on the two devices,
so only shapes, dtypes and devices are compared for them.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import execute, run_reference
from conformance.engine.global_state import exact_cuda_math
from conformance.engine.harness import Execution
from conformance.engine.numerics import largest_magnitude
from conformance.engine.report import fail, mismatch_report
from conformance.engine.runner import Target
from conformance.spec import DEFAULT_TOLERANCES

FLOAT64_ROUNDING_STEPS = 2**16
FLOOR_ROUNDING_STEPS = 2

SKIP_CPU = "devices compares cpu against cuda; it runs on the -cuda test id"


def _largest(tensor: torch.Tensor) -> float:
    finite = tensor.detach().double()[torch.isfinite(tensor.detach())]
    return float(finite.abs().max()) if finite.numel() else 0.0


def check_devices(target: Target, data: st.DataObject) -> None:
    spec = target.spec
    wanted = (torch.float64,) if torch.float64 in target.dtypes() else None
    case = target.draw_case(data, dtypes=wanted) if wanted else target.draw_case(data)
    dtype = case.dtype
    with exact_cuda_math():
        on_cuda = execute(case, device=case.device)
        require_sound(target.contract, on_cuda)
        grad_outputs = tuple(g.detach().cpu() for g in on_cuda.grad_outputs)
        on_cpu = execute(case, device="cpu", grad_outputs=lambda outs: grad_outputs)
        require_sound(target.contract, on_cpu)
    fn_name = spec.display_name
    _check_placement(on_cuda, fn_name)
    _check_placement(on_cpu, fn_name)

    reference: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    if dtype != torch.float64 and not spec.nondeterministic:
        reference = run_reference(spec.reference, case, dtype=torch.float64, device="cpu", grad_outputs_from=grad_outputs)

    # A value that cancels (RMSNorm's dx at n=1: terms near 1, the result 1e-4) carries the
    # rounding of the terms it is computed from: float64 steps are counted at the call's largest
    # value (inputs, grad_outputs, outputs, gradients), not at the value's own magnitude.
    call_scale = largest_magnitude([*on_cpu.args, *grad_outputs, *on_cpu.outputs, *on_cpu.grads.values()])

    def budget(cpu: torch.Tensor, expected64: Any, kind: str) -> float:
        step = torch.finfo(dtype).eps * _largest(cpu)
        if dtype == torch.float64:
            return FLOAT64_ROUNDING_STEPS * torch.finfo(dtype).eps * max(_largest(cpu), call_scale)
        k = spec.tolerances.get(dtype, {}).get(kind, DEFAULT_TOLERANCES[kind])
        own = 0.0
        if isinstance(expected64, torch.Tensor) and expected64.shape == cpu.shape:
            diff = (cpu.double() - expected64.double()).abs()
            finite = diff[torch.isfinite(diff)]
            own = float(finite.max()) if finite.numel() else 0.0
        return (k + 1) * own + FLOOR_ROUNDING_STEPS * step

    for position, (got, want) in enumerate(zip(on_cuda.outputs, on_cpu.outputs)):
        expected64 = reference[0][position] if reference and position < len(reference[0]) else None
        _compare(spec, got, want, f"outputs[{position}]", f"{fn_name}.forward", lambda c, e=expected64: budget(c, e, "output"))
    for name, want in on_cpu.grads.items():
        got = on_cuda.grads.get(name)
        if (got is None) != (want is None):
            fail(f"grad[{name!r}] is {'None' if got is None else 'a tensor'} on cuda, but {'None' if want is None else 'a tensor'} on cpu")
        if got is not None and want is not None:
            expected64 = reference[1].get(name) if reference else None
            _compare(spec, got, want, f"grad[{name!r}]", f"{fn_name}.backward", lambda c, e=expected64: budget(c, e, "grad"))
    target.checked()


def _check_placement(execution: Execution, fn_name: str) -> None:
    device = torch.device(_input_device(execution))
    for position, out in enumerate(execution.outputs):
        if isinstance(out, torch.Tensor) and out.device.type != device.type:
            fail(f"outputs[{position}].device={out.device}, but should be {device} [{fn_name}.forward]")
    for recipe, arg in zip(execution.case.recipes, execution.args):
        grad = execution.grads.get(recipe.name)
        if isinstance(grad, torch.Tensor) and isinstance(arg, torch.Tensor) and grad.device != arg.device:
            fail(f"grad[{recipe.name!r}].device={grad.device}, but should be {arg.device} [{fn_name}.backward]")


def _input_device(execution: Execution) -> str:
    for arg in execution.args:
        if isinstance(arg, torch.Tensor):
            return str(arg.device)
    return execution.case.device


def _compare(spec: Any, got: Any, want: Any, what: str, where: str, allowed_for: Any) -> None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return
    got_cpu = got.detach().cpu()
    if got_cpu.shape != want.shape or got_cpu.dtype != want.dtype:
        fail(f"{what} is {tuple(got_cpu.shape)} {got_cpu.dtype} on cuda, but {tuple(want.shape)} {want.dtype} on cpu [{where}]")
    if spec.nondeterministic:
        return
    allowed = allowed_for(want)
    diff = (got_cpu.double() - want.double()).abs()
    same_nonfinite = (got_cpu.double() == want.double()) | (torch.isnan(got_cpu) & torch.isnan(want))
    finite = torch.isfinite(got_cpu) & torch.isfinite(want)
    bad = (finite & (diff > allowed)) | (~finite & ~same_nonfinite)
    if bool(bad.any()):
        fail(
            f"{what} on cuda != {what} on cpu [{where}, {want.dtype}]",
            mismatch_report(got_cpu, want, allowed=allowed),
        )


def _cuda_with_cpu_twin(target: Target) -> None:
    if target.device == "cpu":
        target.not_applicable(SKIP_CPU)
    if not torch.cuda.is_available():
        target.not_run_here("CUDA is not available on this machine (torch.cuda.is_available() is False)")
    if "cpu" not in target.spec.devices:
        target.not_applicable(
            f"{target.spec.name!r} declares devices={target.spec.devices}: there is no "
            "CPU result to compare with (the reference contract checks it against a float64 CPU truth)"
        )


@contract("devices", requires=[Requirement("a CUDA test id of a Function that also runs on the CPU", _cuda_with_cpu_twin)])
def test_devices(conformance_target: Target) -> None:
    conformance_target.run(check_devices)
