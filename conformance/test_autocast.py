"""Contract autocast: under autocast, forward and backward work and agree with the reference run
under the same autocast.

Every Function with floating inputs is run the way a model under ``torch.autocast`` runs it
(bfloat16 on CPU, float16 on CUDA): float32 inputs -- and, in some examples, a subset of them
given in the autocast dtype where the spec lists it (mixed fp32/bf16 inputs, as a model under
autocast passes them) --
go through forward inside ``torch.autocast`` and backward outside it, as ``loss.backward()``
runs. A Function whose author never thought of autocast (no ``torch.amp.custom_fwd``) is the
usual case: its forward's matmuls run in bfloat16 and backward receives mixed dtypes. Checked:

* forward and backward run (a backward that mixes the saved bfloat16 tensors with float32 ones
  raises a dtype mismatch here);
* a gradient backward *returns* narrower than its input's dtype (bfloat16 for a float32 input,
  seen through the probe: the engine casts it back without a word) is advice, not a defect:
  torch's own custom_fwd/custom_bwd example returns one, and native autocast's backward
  computes in bfloat16 too. Its values are judged below like every gradient; where they fail,
  the failure names the narrow return. One bit-equal to the float64 truth rounded to the
  input's dtype (a bfloat16 grad_output passed through, as torch's own add_ does) is no advice;
* outputs and gradients meet the reference policy against the float64 truth, with the budget
  set by the reference itself under the same autocast (its own error in the autocast dtype), for
  a Function that declares ``custom_fwd`` on this device. Without it, forward rounds at the
  autocast dtype where backward reads float32, a mixed schedule that budget does not bound
  (measured: a correct blockwise attention is 3.7 bfloat16 steps off at its terms): the budget
  is then the larger of that error and the reference's own error run in the autocast dtype
  outright, with a floor of sqrt(eps) of the terms (bfloat16: 11 rounding steps), so that only
  what is far outside rounding fails (a branch taken under autocast that forgets a factor of
  0.5 is off by 55% of its terms); where the reference does not run in that dtype, outputs and
  gradients must be finite wherever the truth is finite in it.

n/a for custom ops (the dispatcher casts their inputs before autograd; not checked yet) and for
specs whose dtypes leave out float32.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import Evaluated, forward, gradients, reference_error
from conformance.engine.harness import differentiable_positions, random_state
from conformance.engine.numerics import (
    Comparison,
    Judged,
    checked_positions,
    compare_finiteness,
    evaluate_spec,
    floor_ulps,
    judge_against_truth,
    judged_grads,
    judged_outputs,
    neighbouring_cases,
    reference_truth_and_baseline,
    truth_and_baseline,
    with_resamples,
    with_terms,
    without_undefined_nans,
)
from conformance.engine.numerics import truth as float64_truth
from conformance.engine.probe import Recorder
from conformance.engine.report import advise, describe_value, fail
from conformance.engine.runner import Target
from conformance.engine.triton_interpreter import interpreter_limit, runs_interpreted
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


def _autocast_advice(fn: Any, device: str) -> str:
    if autocast_device(fn) == device:
        return "Decorate backward with torch.amp.custom_bwd(device_type=...) so it runs under forward's autocast state."
    return (
        f"Models run under torch.autocast({device!r}): decorate forward with torch.amp.custom_fwd(device_type={device!r}, "
        "cast_inputs=torch.float32) to run it in float32, or with custom_fwd(device_type=...) and backward with "
        "custom_bwd(...) to run backward under forward's autocast state; or cast grad_output and the saved tensors "
        "to one dtype in backward. A Function never run under autocast can waive this contract with a reason: "
        "register(..., waivers={'autocast': 'why'})."
    )


def _likely_causes(fn: Any, device: str, low_name: str, narrowed: Sequence[str], summary: str) -> list[str]:
    """What a value failure under autocast most likely comes from: a narrow return, or (for a
    gradient of a Function without custom_fwd) a statistic saved from forward's low-precision scores."""
    failing = summary.partition(" [")[0]
    causes = [
        f"Backward returned {line}: the engine casts it back after the precision is lost."
        for line in narrowed if line.partition(".dtype=")[0] in failing
    ]
    if autocast_device(fn) != device and "grad[" in failing:
        causes.append(
            f"Without custom_fwd, forward's matmuls ran in {low_name} and backward reads float32: the usual cause is a "
            f"statistic saved from {low_name} scores (a log-sum-exp, a row max) that backward combines with values it "
            f"recomputes in float32. {_autocast_advice(fn, device)}"
        )
    return causes


def _narrow_loss(got: torch.Tensor, want: torch.Tensor, theirs: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """(error, allowed) of a gradient returned narrower than its input of ``dtype``: its largest
    distance from the float64 truth ``want``, and the larger of the input dtype's rounding of the
    truth and native autocast's own error (``theirs``). Judged where the truth, the gradient and
    native autocast's gradient are finite (one that overflows in float16 bounds nothing; a
    non-finite value is stability's). None where it is the truth rounded to ``dtype``."""
    exact = want.detach().to("cpu", torch.float64)
    theirs = theirs if isinstance(theirs, torch.Tensor) and theirs.shape == got.shape else None
    judged = torch.isfinite(exact) & torch.isfinite(got.detach().to("cpu", torch.float64))
    if theirs is not None:
        judged &= torch.isfinite(theirs.detach().to("cpu", torch.float64))
    rounding = _max_error(exact.to(dtype), exact, judged)
    error = _max_error(got, exact, judged)
    if error == 0.0 or error == rounding:
        return None
    return error, max(rounding, _max_error(theirs, exact, judged) if theirs is not None else 0.0)


def _max_error(value: Any, exact: torch.Tensor, where: torch.Tensor) -> float:
    """Largest |value - exact| over the elements ``where`` holds (inf where value is not finite)."""
    if not isinstance(value, torch.Tensor):
        return float("inf")
    if not bool(where.any()):
        return 0.0
    return float((value.detach().to("cpu", torch.float64) - exact).abs()[where].max())


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
    # Inputs given in the autocast dtype only where the spec lists that dtype: a Function declared
    # for float32/float64 (a numpy forward) is never handed bfloat16 tensors.
    gives_narrow = bool(floating) and _draws_in(target, low)
    mixed: bool = data.draw(st.booleans(), label="mixed dtypes") if gives_narrow else False
    if mixed:
        chosen: set[int] = data.draw(st.sets(st.sampled_from(floating), min_size=1), label=f"inputs given in {low}")
        low_inputs = chosen
    low_name = str(low).removeprefix("torch.")

    def build(case: Case) -> list[Any]:
        return _given_in(case.args(), low_inputs, low)

    if gives_narrow:
        _runs_with_each_input_narrow(target, case, floating, low_inputs)
    args = build(case)
    where = _where(target, case, args, floating)
    ran = _run_under_autocast(target, case, args, where)
    if ran is None:
        return
    outputs, recorder, wrt, found = ran.outputs, ran.recorder, ran.wrt, ran.found
    pristine_grads = ran.pristine_grads
    raw = recorder.last.raw or ()
    narrow = [
        p for p in wrt
        if p < len(raw) and isinstance(raw[p], torch.Tensor) and _loses_precision(raw[p].dtype, args[p].dtype)
    ]
    grads = dict(zip([names[p] for p in wrt], found))

    def narrow_returns(truth: Evaluated | None, native: Evaluated | None, values_note: str) -> list[str]:
        """What backward returned narrower than its input, one line each, with advice about it;
        nothing for one bit-equal to the float64 truth rounded to the input's dtype (a
        pass-through of a bfloat16 grad_output, as torch's own add_ returns for a float32
        ``other``). Fails one further from the truth than 3 x native autocast's own gradient
        (``native``: the reference under the same autocast) or the input dtype's rounding: the
        engine's cast back cannot restore what the narrow return lost."""
        lines = []
        for position in narrow:
            name, dtype = names[position], args[position].dtype
            want, got = truth.grads.get(name) if truth is not None else None, grads[name]
            returned = (f"grad[{name!r}].dtype={str(raw[position].dtype).removeprefix('torch.')} as backward returned it, "
                        f"narrower than {name}'s {str(dtype).removeprefix('torch.')}")
            if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and want.shape == got.shape:
                loss = _narrow_loss(got, want, native.grads.get(name) if native is not None else None, dtype)
                if loss is None:
                    continue
                error, allowed = loss
                if error > 3 * allowed:
                    _also_without_autocast(target, case)
                    fail(
                        f"max|grad[{name!r}] - truth|={error:.6g} with {returned}, but should be <= 3 x {allowed:.6g} (native "
                        f"autocast's own error, or {name}'s dtype's rounding) [{spec.display_name}.backward, {where}]",
                        f"The engine casts it back to {name}'s dtype without a word, after the precision is lost: return "
                        f"grad.to({name}.dtype), or compute it in float32.",
                        f"raw gradients: {', '.join(describe_value(v) for v in raw)}",
                    )
            lines.append(f"{returned} [{spec.display_name}.backward, {where}]")
        if lines:
            advise(
                lines[0],
                *lines[1:],
                f"The engine casts it to the input's dtype without a word; {values_note} Returning grad.to(input.dtype), or "
                "computing it in float32, keeps the input's precision explicit.",
                f"raw gradients: {', '.join(describe_value(v) for v in raw)}",
            )
        return lines

    pristine = build(case)
    def under_autocast(moved: Sequence[Any], moved_grads: Mapping[int, torch.Tensor]) -> tuple[Evaluated, Evaluated]:
        # The baseline: the reference under the same autocast, backward outside it.
        truth, baseline = truth_and_baseline(spec, case, lambda cast, exact: evaluate_spec(
            spec, [cast(a) for a in moved], names, {p: cast(g) for p, g in moved_grads.items()},
            autocast=None if exact else (device, low),
        ))
        return baseline, without_undefined_nans(spec, case, moved, names, truth)

    try:
        baseline, truth = under_autocast(pristine, pristine_grads)
    except Exception as error:
        narrow_returns(None, None, "its values cannot be judged here (the reference does not run under autocast with these inputs).")
        target.not_checked(f"the spec's reference does not run under autocast with these inputs ({type(error).__name__})")
        return
    narrowed = narrow_returns(truth, baseline, (
        "its values are within 3 x native autocast's own error from the truth (whose backward computes in the "
        "autocast dtype too)."
    ))
    values = _judged_outputs(outputs, truth, baseline, where)
    values += judged_grads(grads, truth, baseline, pristine, names, lambda _: where)
    budget = "Budget: the reference's own error under the same autocast."
    finiteness, floor_steps = False, None
    if autocast_device(spec.fn) != device:
        # Undeclared (no custom_fwd here): forward rounds at the autocast dtype where backward reads
        # float32, a mixed schedule no evaluation of the reference reproduces: a value that cancels
        # exactly in any one precision (attention's dQ with one key) does not (measured: a correct
        # blockwise attention 3.7 bfloat16 steps off at its terms, its lse computed in float32). Such
        # a Function fails only what is far outside rounding: off by more than sqrt(eps) of the
        # call's values and its terms, halfway on a log scale between one rounding step and the
        # values themselves (bfloat16: 11 steps, 8.8%), or by more than k x the reference's own
        # error in the autocast dtype outright.
        try:
            with random_state(spec, case):
                outright = evaluate_spec(
                    spec, [_cast_floating(a, low) for a in pristine], names, {p: g.to(low) for p, g in pristine_grads.items()},
                )
        except Exception as error:  # a reference that does not run in the autocast dtype: finiteness only
            outright, finiteness = None, True
            budget = (
                "Values of a Function without custom_fwd are checked for finiteness under autocast: the reference does not "
                f"run in {low_name} to bound its rounding ({type(error).__name__}: {error})."
            )
        if outright is not None:
            wider = _judged_outputs(outputs, truth, outright, where)
            wider += judged_grads(grads, truth, outright, pristine, names, lambda _: where)
            values = _larger_baseline_error(values, wider, low)
            floor_steps = max(floor_ulps(spec, low), round(torch.finfo(low).eps ** -0.5))
            budget = (
                f"Budget (no custom_fwd: forward may round at {low_name} where backward reads float32): the larger of the "
                f"reference's own error under the same autocast and in {low_name} outright, and a floor of {floor_steps} "
                f"rounding steps (sqrt(eps)) at the call's largest value and this value's terms: only what is far outside "
                "rounding fails."
            )
    # Resampled where the inputs move one rounding step (of the autocast dtype where forward may
    # round at it): a data-dependent kink (a support boundary) is no more the Function's than in
    # reference.
    verdict = _first_finding(
        spec, low, values, finiteness=finiteness, floor_steps=floor_steps,
        # The full budget, measured for a value outside the cheap one: the truth's term bounds (a
        # loss of exactly 0 over one class is made of terms of size |w|) and neighbouring inputs.
        terms=lambda: float64_truth(spec, case, pristine, names, pristine_grads, terms=True),
        resample=lambda: [under_autocast(a, g) for a, g in neighbouring_cases(
            case, pristine, pristine_grads, None if floor_steps is None else low, f"autocast {low_name}")],
    )
    if verdict is not None:
        _also_without_autocast(target, case, finiteness=finiteness)
        fail(verdict.summary, verdict.details, *_likely_causes(spec.fn, device, low_name, narrowed, verdict.summary), budget)
    target.checked()


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(dtype).requires_grad_(value.requires_grad)
    return value


def _larger_baseline_error(values: Sequence[Judged], others: Sequence[Judged], dtype: torch.dtype) -> list[Judged]:
    """Each of ``values`` with the baseline of its counterpart in ``others`` (same label) where
    that one is further from the truth."""
    by_label = {other.what: other for other in others}
    chosen = []
    for value in values:
        other = by_label.get(value.what)
        if other is not None and _baseline_error(other, dtype) > _baseline_error(value, dtype):
            value = dataclasses.replace(value, baseline=other.baseline)
        chosen.append(value)
    return chosen


def _baseline_error(value: Judged, dtype: torch.dtype) -> float:
    if value.baseline.shape != value.truth.shape or not value.truth.is_floating_point():
        return 0.0
    truth = value.truth.detach().to("cpu", torch.float64)
    baseline = value.baseline.detach().to("cpu", torch.float64)
    checked = checked_positions(truth, dtype, baseline)
    return float((baseline - truth).abs()[checked].max()) if bool(checked.any()) else 0.0


@dataclasses.dataclass
class _Ran:
    """A forward under autocast and its backward outside it, as loss.backward() runs."""

    outputs: tuple[Any, ...]
    recorder: Recorder
    wrt: list[int]  # positions of the inputs that require grad
    found: tuple[torch.Tensor | None, ...]  # their gradients
    pristine_grads: dict[int, torch.Tensor]  # copies of the grad_outputs (by output position)


def _draws_in(target: Target, dtype: torch.dtype) -> bool:
    """Whether the run gives this Function inputs in ``dtype``: the spec lists it, ``--dtypes`` keeps
    it, and it is not bfloat16 under the Triton interpreter (which computes bfloat16 wrongly)."""
    if dtype not in target.spec.dtypes or (target.options.dtypes is not None and dtype not in target.options.dtypes):
        return False
    return not (dtype == torch.bfloat16 and runs_interpreted(target.spec.op, target.device))


def _given_in(args: Sequence[Any], low_inputs: set[int], low: torch.dtype) -> list[Any]:
    """``args`` with the inputs at ``low_inputs`` given in ``low``."""
    return [a.detach().to(low).requires_grad_(a.requires_grad) if p in low_inputs else a for p, a in enumerate(args)]


def _where(target: Target, case: Case, args: Sequence[Any], floating: Sequence[int]) -> str:
    names = [r.name for r in case.recipes]
    given = ", ".join(f"{names[p]}: {str(args[p].dtype).removeprefix('torch.')}" for p in floating) or "no floating inputs"
    low_name = str(AUTOCAST_DTYPES[target.device]).removeprefix("torch.")
    return f"{target.spec.display_name} under torch.autocast({target.device!r}, dtype={low_name}), inputs {given}"


def _runs_with_each_input_narrow(target: Target, case: Case, floating: Sequence[int], drawn: set[int]) -> None:
    """A model under autocast hands a Function bfloat16 activations beside float32 weights: with
    each floating input alone in the autocast dtype (but the drawn mix, which the example runs
    anyway), forward under autocast and backward must run wherever the reference's forward does
    (every example: a crash on one mix must not wait for the draws to pick it)."""
    low = AUTOCAST_DTYPES[target.device]
    for position in floating:
        if {position} != drawn:
            args = _given_in(case.args(), {position}, low)
            _run_under_autocast(target, case, args, _where(target, case, args, floating), judged=False)


def _run_under_autocast(target: Target, case: Case, args: list[Any], where: str, *, judged: bool = True) -> _Ran | None:
    """Forward on ``args`` under autocast and backward outside it; fail where either raises (a
    forward raising where the reference's does too excepted: :func:`_forward_raised`). None when
    there is nothing more to judge; the reason is recorded for a ``judged`` run."""
    spec, device, low = target.spec, target.device, AUTOCAST_DTYPES[target.device]
    with random_state(spec, case):
        try:
            called = forward(case, args, autocast=(device, low))
        except Exception as error:
            theirs = _forward_raised(target, case, args, error, (device, low), where)
            if judged:
                target.not_checked(f"the spec's reference raises under autocast with these inputs too ({theirs})")
            return None
    outputs = called.outputs
    positions = differentiable_positions(outputs)
    grad_outputs = dict(zip(positions, case.grad_outputs([outputs[p] for p in positions])))
    # The truth's grad_outputs: copies, as a backward that writes into grad_output (inplace's
    # finding) leaves them.
    pristine_grads = {p: g.detach().clone() for p, g in grad_outputs.items()}
    wrt = [p for p, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not positions or not wrt:
        if judged:
            target.preflight(case)  # a forward that returns no tensor is return_count's
            target.not_checked("no output carries a gradient back to an input under autocast")
        return None
    try:
        found = gradients([outputs[p] for p in positions], [args[p] for p in wrt], [grad_outputs[p] for p in positions])
    except Exception as error:
        if interpreter_limit(error) is not None:
            raise
        _also_without_autocast(target, case)
        fail(
            f"backward raised {type(error).__name__} after a forward under autocast, but should run [{where}; backward "
            "called outside the autocast region, as loss.backward() is]",
            f"{type(error).__name__}: {error}",
            _autocast_advice(spec.fn, device),
        )
    return _Ran(outputs, called.recorder, wrt, found, pristine_grads)


def _forward_raised(target: Target, case: Case, args: Sequence[Any], error: Exception, autocast: tuple[str, torch.dtype], where: str) -> str:
    """Forward raised ``error`` under ``autocast``: fail, unless the reference raises on the same
    inputs too (mixed dtypes the wrapped op refuses, as index_add does: the Function behaves as its
    reference; returns what the reference raised) or the Triton interpreter cannot run it."""
    if interpreter_limit(error) is not None:
        raise error  # the interpreter's gap (bfloat16): not run here, never the kernel's failure
    theirs = reference_error(case, args, autocast=autocast)
    if theirs is not None:
        return theirs
    _also_without_autocast(target, case)
    fail(f"forward raised {type(error).__name__} under autocast, but should run [{where}]", f"{type(error).__name__}: {error}",
         _autocast_advice(target.spec.fn, autocast[0]))


def _also_without_autocast(target: Target, case: Case, *, finiteness: bool = False) -> None:
    """Before an autocast finding: raise when the same case in float32 without autocast already
    shows a defect -- a crash or a structural defect (its owner fails, this contract is blocked by
    it) or the same kind of value finding (blocked by reference: non-finite values for a
    ``finiteness`` finding, values outside the reference policy otherwise): one defect, one
    failure. A declared-random spec draws other numbers in float32 and float64, so its values are
    compared as the reference contract compares them: in float64 on the CPU, under one seeded RNG
    state (not at all where float64 is not listed)."""
    spec = target.spec
    names = [r.name for r in case.recipes]
    if spec.nondeterministic:
        if torch.float64 not in target.dtypes() or case.device != "cpu":  # --dtypes may leave it out
            return
        case = dataclasses.replace(case, dtype=torch.float64)
    execution = target.preflight(case)
    grad_outputs = dict(zip(execution.diff_positions, execution.grad_outputs_before))
    pristine = case.args()
    truth, baseline = reference_truth_and_baseline(spec, case, pristine, names, grad_outputs, terms=True)
    where = f"{spec.display_name}, {str(case.dtype).removeprefix('torch.')} without autocast"
    values = _judged_outputs(execution.outputs, truth, baseline, where)
    values += judged_grads(execution.grads, truth, baseline, pristine, names, lambda _: where)
    dtype_name = str(case.dtype).removeprefix("torch.")
    # Resampled as the reference contract resamples this dtype (the same neighbours of a case).
    found = _first_finding(spec, case.dtype, values, finiteness=finiteness, resample=lambda: [
        reference_truth_and_baseline(spec, case, a, names, g)[::-1]
        for a, g in neighbouring_cases(case, pristine, grad_outputs, None, dtype_name)
    ])
    if found is not None:
        if found.what.startswith("grad["):  # every output is right: a wrong gradient may be gradcheck's
            target.blocked_by_wrong_gradients(case, found.summary)
        raise Blocked(Defect("reference", f"{spec.display_name} is wrong without autocast too: not autocast's defect"), case)


def _judged_outputs(outputs: Sequence[Any], truth: Evaluated, baseline: Evaluated, where: str) -> list[Judged]:
    """The floating outputs against the truth and baseline (with the truth's term bounds, when measured)."""
    return [value for value in judged_outputs(outputs, truth, baseline, where) if value.actual.is_floating_point()]


def _first_finding(
    spec: Any, dtype: torch.dtype, values: list[Judged], *, finiteness: bool, floor_steps: int | None = None,
    terms: Callable[[], Evaluated] | None = None,
    resample: Callable[[], Sequence[tuple[Evaluated, Evaluated]]] | None = None,
) -> Comparison | None:
    """The first value outside the budget (or non-finite, with ``finiteness``). A finding is
    judged again with the term bounds of ``terms()`` (the truth under TermMagnitudes) and
    ``resample()``'s (baseline, truth) pairs at neighbouring inputs, which only widen the budget:
    computed only when a value is outside it without them."""
    if not finiteness:
        found = judge_against_truth(spec, dtype, values, floor_steps=floor_steps)
        if found is not None and terms is not None:
            values = with_terms(values, terms())
        if found is not None and resample is not None:
            found = judge_against_truth(spec, dtype, with_resamples(values, resample()), floor_steps=floor_steps)
        elif found is not None and terms is not None:
            found = judge_against_truth(spec, dtype, values, floor_steps=floor_steps)
        return found
    return next(
        (found for v in values if (found := compare_finiteness(v.actual, v.truth, dtype, baseline=v.baseline, what=v.what, where=v.where))),
        None,
    )


def _runs_under_autocast(target: Target) -> None:
    if target.spec.op.kind != "autograd.Function":
        target.not_applicable("custom ops: the dispatcher casts their inputs before autograd (not checked yet)")
    if not target.spec.differentiable_inputs:
        target.not_applicable(f"{target.spec.display_name} declares no differentiable input: under autocast no gradient flows back to check")
    if torch.float32 not in target.dtypes():
        target.not_applicable("autocast casts float32 inputs; the spec's dtypes (or --dtypes) leave out float32")


# Elements kept 4 bfloat16 rounding steps (at 1) apart and from declared kinks: rounded to the
# autocast dtype, a drawn 1.0001 lands on clamp's kink at 1, where no gradient is right.
AUTOCAST_SPACING = 4 * torch.finfo(torch.bfloat16).eps


# At most four examples per test (a cap on the profile's and --max-examples): it runs on every
# Function, and each example evaluates the reference two or three times (measured: the main
# job's autocast tests took ~100 s of its 300 s at the ci profile's 10).
@contract("autocast", max_examples=4, case=CaseOptions(dtypes=(torch.float32,), spacing=AUTOCAST_SPACING), requires=[Requirement("a Function with float32 inputs", _runs_under_autocast)],
          compares_values=True)
def test_autocast(conformance_target: Target) -> None:
    conformance_target.run(check_autocast)
