"""Contract autocast: under autocast, backward returns each gradient in its input's dtype, and
forward and backward work and agree with the reference run under the same autocast.

For a Function whose forward is decorated with ``torch.amp.custom_fwd(device_type=...)`` (it
declares autocast support), on that device: float32 inputs -- and, in some examples, a subset of
them given in the autocast dtype (mixed fp32/bf16 inputs, as a model under autocast passes
them) -- go through forward inside ``torch.autocast`` (bfloat16 on CPU, float16 on CUDA) and
backward outside it, as ``loss.backward()`` runs. Checked:

* forward and backward run (a backward that needs autocast but lacks ``custom_bwd`` raises a
  dtype mismatch here);
* no gradient backward *returns* is less precise than its input's dtype: the engine silently
  casts a bfloat16 gradient of a float32 input back (pytorch #87979), after the precision is
  gone, so only the raw return shows it (seen through the probe); a more precise one (float32
  for a bfloat16 input, from ``cast_inputs=torch.float32``) is fine;
* outputs and gradients meet the reference policy against the float64 truth, with the budget
  set by the reference itself under the same autocast (its own error in the autocast dtype).

n/a for a Function without ``custom_fwd`` (autocast is not part of its promise) and for custom
ops (the dispatcher casts their inputs before autograd; not checked yet).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.evaluate import evaluate, forward, gradients
from conformance.engine.harness import differentiable_positions, random_state
from conformance.engine.numerics import Judged, judge_against_truth, judged_grads, truth_and_baseline
from conformance.engine.report import describe_value, fail
from conformance.engine.runner import Target
from strategies.cases import Case, CaseOptions
from strategies.recipes import FloatingRecipe

AUTOCAST_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16}


def autocast_device(fn: Any) -> str | None:
    """The ``device_type`` of ``torch.amp.custom_fwd`` on ``fn.forward``, or None."""
    forward = getattr(fn, "forward", None)
    code = getattr(forward, "__code__", None)
    if forward is None or code is None or code.co_name != "decorate_fwd" or "autocast_mode" not in code.co_filename:
        return None
    device = inspect.getclosurevars(forward).nonlocals.get("device_type")
    return device if isinstance(device, str) else None


def _loses_precision(returned: torch.dtype, wanted: torch.dtype) -> bool:
    """A gradient returned in ``returned`` for an input of dtype ``wanted`` holds less than the
    input can: fewer mantissa bits or less range. (A float32 gradient of a bfloat16 input, from a
    ``cast_inputs=torch.float32`` forward, loses nothing the engine's cast would not.)"""
    if not (returned.is_floating_point and wanted.is_floating_point):
        return returned != wanted
    got, want = torch.finfo(returned), torch.finfo(wanted)
    return got.eps > want.eps or got.max < want.max


def check_autocast(target: Target, data: st.DataObject) -> None:
    spec = target.spec
    device = target.device
    low = AUTOCAST_DTYPES[device]
    case = target.draw_case(data)
    names = [r.name for r in case.recipes]
    differentiable = {i.name for i in spec.differentiable_inputs}
    floating = [p for p, r in enumerate(case.recipes) if isinstance(r, FloatingRecipe) and r.name in differentiable]
    low_inputs: set[int] = set()
    mixed: bool = data.draw(st.booleans(), label="mixed dtypes") if floating else False
    if mixed:
        chosen: set[int] = data.draw(st.sets(st.sampled_from(floating), min_size=1), label=f"inputs given in {low}")
        low_inputs = chosen
    low_name = str(low).removeprefix("torch.")

    def build(case: Case) -> list[Any]:
        built = case.args()
        return [a.detach().to(low).requires_grad_(a.requires_grad) if p in low_inputs else a for p, a in enumerate(built)]

    args = build(case)
    given = ", ".join(f"{names[p]}: {str(args[p].dtype).removeprefix('torch.')}" for p in floating) or "no floating inputs"
    where = f"{spec.display_name} under torch.autocast({device!r}, dtype={low_name}), inputs {given}"
    with random_state(spec, case):
        try:
            called = forward(case, args, autocast=(device, low))
        except Exception as error:
            fail(f"forward raised {type(error).__name__} under autocast, but should run [{where}]", f"{type(error).__name__}: {error}")
    outputs, recorder = called.outputs, called.recorder
    positions = differentiable_positions(outputs)
    grad_outputs = dict(zip(positions, case.grad_outputs([outputs[p] for p in positions])))
    wrt = [p for p, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not positions or not wrt:
        target.not_checked("no output carries a gradient back to an input under autocast")
        return
    try:
        found = gradients([outputs[p] for p in positions], [args[p] for p in wrt], [grad_outputs[p] for p in positions])
    except Exception as error:
        fail(
            f"backward raised {type(error).__name__} after a forward under autocast, but should run [{where}; backward "
            "called outside the autocast region, as loss.backward() is]",
            f"{type(error).__name__}: {error}",
            "Decorate backward with torch.amp.custom_bwd(device_type=...) so it runs under forward's autocast state.",
        )
    raw = recorder.last.raw or ()
    for position in wrt:
        value = raw[position] if position < len(raw) else None
        if isinstance(value, torch.Tensor) and _loses_precision(value.dtype, args[position].dtype):
            fail(
                f"grad[{names[position]!r}].dtype={str(value.dtype).removeprefix('torch.')} as backward returned it, but should be "
                f"{str(args[position].dtype).removeprefix('torch.')} ({names[position]}'s dtype) or wider [{spec.display_name}.backward, {where}]",
                "The engine casts it back to the input's dtype without a word, after the precision is lost: return "
                f"grad.to({names[position]}.dtype) (pytorch #87979).",
                f"raw gradients: {', '.join(describe_value(v) for v in raw)}",
            )
    grads = dict(zip([names[p] for p in wrt], found))
    pristine = build(case)
    try:
        # The baseline: the reference under the same autocast, backward outside it.
        truth, baseline = truth_and_baseline(spec, case, lambda cast, exact: evaluate(
            spec.reference, [cast(a) for a in pristine], names, {p: cast(g) for p, g in grad_outputs.items()},
            autocast=None if exact else (device, low),
        ))
    except Exception as error:
        target.not_checked(f"the spec's reference does not run under autocast with these inputs ({type(error).__name__})")
        return
    values = [
        Judged(f"output[{p}]", "output", o, truth.outputs[p], baseline.outputs[p], where)
        for p, o in enumerate(outputs)
        if isinstance(o, torch.Tensor) and o.is_floating_point() and p < len(truth.outputs) and isinstance(baseline.outputs[p], torch.Tensor)
    ]
    values += judged_grads(grads, truth, baseline, pristine, names, lambda _: where)
    verdict = judge_against_truth(spec, low, values)
    if verdict is not None:
        fail(verdict.summary, verdict.details, "Budget: the reference's own error under the same autocast.")
    target.checked()


def _declares_autocast(target: Target) -> None:
    if target.spec.op.kind != "autograd.Function":
        target.not_applicable("custom ops: the dispatcher casts their inputs before autograd (not checked yet)")
    device = autocast_device(target.spec.fn)
    if device is None:
        target.not_applicable(
            f"{target.spec.display_name}.forward is not decorated with torch.amp.custom_fwd: autocast is not part of its promise"
        )
    if device != target.device:
        target.not_applicable(f"custom_fwd(device_type={device!r}) declares autocast on {device} only")
    if torch.float32 not in target.dtypes():
        target.not_applicable("autocast casts float32 inputs; the spec's dtypes (or --dtypes) leave out float32")


@contract("autocast", case=CaseOptions(dtypes=(torch.float32,)), requires=[Requirement("custom_fwd on this device", _declares_autocast)])
def test_autocast(conformance_target: Target) -> None:
    conformance_target.run(check_autocast)
