"""Contract stability: no NaN/Inf in outputs or gradients where the float64 reference is finite.

Each example checks, in every dtype the spec lists, three families of inputs where NaN/Inf in
backward are most often reported:

* ``extreme``: one tensor input's magnitude drawn up towards the dtype's range (large logits;
  at most 1e100 in float64), the others ordinary; every mask kind (incl. fully masked rows);
* ``degenerate``: the same case with every tensor's last-dim rows constant (ties, zero
  variance) and every mask fully masking a row;
* ``single``: every named dim of size 1, or the smallest its dim rules allow (``f`` even and
  ``<= n``: ``n = f = 2``) (seqlen 1, single-element reductions; batch dims are still drawn),
  extreme magnitudes.

The truth is the spec's reference (surrogate for gradients of surrogate specs) in float64 on the
CPU, evaluated on the very input values the implementation got (built in the tested dtype and
upcast), rebuilt pristine from the case: a Function that overwrites its inputs or grad_outputs is
not judged against its own clobbered values. Where the truth is finite and representable in the tested dtype, outputs and gradients
must be finite; where it is NaN or +-inf, they must be the same. A truth the dtype cannot hold
(float16 300**2) is not checked: a correct op may overflow there; nor is a position where the
reference itself, run in the tested dtype, is not finite (plain PyTorch overflows there too). Ops undefined on part of the
real line declare their domain (``Tensor(..., domain="positive")``) rather than being exempted.

Finite is not enough where the value is wrong: a float16 accumulator that overflows to inf makes
``rsqrt(sum of squares)`` a finite 0, and every output of the row 0 where the truth is of order 1.
So in every dtype but float64, the ``extreme`` family's outputs and gradients are also judged by
the reference contract's rule (:func:`conformance.engine.numerics.judge_against_truth`: within k
times plain PyTorch's own error in that dtype, plus a floor), at the positions where plain
PyTorch (the reference run in the tested dtype) is finite. When the same case at ordinary
magnitudes is outside that rule too, the defect is the reference contract's, and this one is
blocked by it. float64 has no baseline to measure a budget against, and the ``degenerate`` and
``single`` families are judged for finiteness only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import SOME_DTYPE, contract
from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import Evaluated
from conformance.engine.harness import Execution
from conformance.engine.numerics import (
    Comparison,
    Judged,
    at_ordinary_magnitudes,
    baseline,
    cheap_budget_first,
    compare_finiteness,
    float32_baseline,
    judge_against_truth,
    judged_grads,
    judged_outputs,
    neighbouring_cases,
    reference_truth_and_baseline,
    truth,
    with_resamples,
)
from conformance.engine.report import fail
from conformance.engine.runner import Target
from conformance.spec import Spec
from strategies.cases import Case, CaseOptions, resolve_kinks
from strategies.recipes import MaskRecipe, ScalarRecipe, TensorRecipe
from strategies.reuse import sampled
from strategies.values import MASK_KINDS

FAMILIES = ("extreme", "degenerate", "single")


def degenerate(case: Case) -> Case:
    """``case`` with constant last-dim rows in every tensor (a third of them 0 and a third tiny,
    ``near_zero``, where the input's domain is the real line and 0 is not one of its kinks, Scalar
    names resolved to this case's values) and a fully masked row in every mask."""
    scalars = {r.name: r.value for r in case.recipes if isinstance(r, ScalarRecipe)}
    recipes = tuple(
        replace(r, constant_rows=True, pattern="near_zero" if _zeros_allowed(r, spec_input, scalars) else r.pattern)
        if isinstance(r, TensorRecipe)
        else replace(r, mask_kind="masked_rows") if isinstance(r, MaskRecipe)
        else r
        for r, spec_input in zip(case.recipes, case.spec.inputs, strict=True)
    )
    return replace(case, recipes=recipes, notes={**case.notes, "family": "degenerate"})


def _zeros_allowed(recipe: TensorRecipe, spec_input: Any, scalars: dict[str, Any]) -> bool:
    """Exact zeros are legal values of a real-line input, except at a declared kink (where no
    gradient is right or wrong)."""
    return recipe.domain == "real" and not recipe.spacing and 0.0 not in resolve_kinks(spec_input, scalars)


def _has_zero_rows(case: Case) -> bool:
    return any(isinstance(r, TensorRecipe) and r.pattern == "near_zero" for r in case.recipes)


def check_case(target: Target, case: Case, family: str) -> bool:
    """Outputs and gradients of ``case`` are finite wherever the float64 truth is (in range);
    False when it had no floating-point output or gradient to compare."""
    if target.context is not None:
        target.context.use_case(case)
    impl = target.preflight(case)  # declared random: every evaluation draws the same numbers
    # A case drawn again (the simplest examples' single-element cases, most often) was judged
    # on these very tensors already.
    return target.judged_once(impl, family, lambda: _judge_family(target, case, family, impl))


def _judge_family(target: Target, case: Case, family: str, impl: Execution) -> bool:
    spec = target.spec
    dtype = case.dtype
    dtype_name = str(dtype).removeprefix("torch.")
    scales = "magnitude scales " + ", ".join(f"{r.name}~{r.scale:g}" for r in case.recipes if isinstance(r, TensorRecipe))
    names = [recipe.name for recipe in case.recipes]
    # The truth comes from pristine inputs and grad_outputs, rebuilt from the case: a Function that
    # writes into them (inplace's finding) must not be judged against its own clobbered values.
    grad_outputs = dict(zip(impl.diff_positions, impl.grad_outputs_before))
    args = case.args()
    exact = truth(spec, case, args, names, grad_outputs)

    context = f"{dtype_name}, {_family_text(case, family, scales)}"
    judges_values = family == "extreme" and dtype != torch.float64 and not spec.nondeterministic
    # The baseline: where plain PyTorch (the reference in this dtype) overflows too, the dtype is
    # at fault. For finiteness it only excuses positions, so it is evaluated for a failing value
    # only; the value rule measures its budget against it.
    plain = baseline(spec, case, args, names, grad_outputs) if judges_values else None

    # At a row of zeros a formula reference is often 0/0 where a guarded kernel is finite (x / |x|
    # against x / max(|x|, eps)): there only a non-finite value where the truth is finite counts.
    excused = family == "degenerate" and _has_zero_rows(case)

    ordinary: list[Evaluated] = []
    widest: list[Evaluated] = []

    def overflowed(key: int | str) -> torch.Tensor | None:
        """Where output ``key`` (a position) or grad ``key`` (a name) may be NaN or inf: where
        the truth is only because float64 overflowed (finite at ordinary magnitudes: a masked
        row's -inf is -inf there too, a definition; exp(925) is not), and in half precision where
        the reference computed in float32 is too (:func:`float32_baseline`: a recurrence whose
        true gradient is a few % below float16's largest value, 1e4 times ill-conditioned)."""
        if not ordinary:
            moved = at_ordinary_magnitudes(case)
            ordinary.append(truth(spec, moved, moved.args(), names, grad_outputs))
        at_extreme, at_ordinary = _value_of(exact, key), _value_of(ordinary[0], key)
        if at_extreme is None or at_ordinary is None or at_extreme.shape != at_ordinary.shape:
            return None
        where = ~torch.isfinite(at_extreme.detach().cpu()) & torch.isfinite(at_ordinary.detach().cpu())
        if torch.finfo(dtype).bits == 16:
            if not widest:
                try:
                    widest.append(float32_baseline(spec, case, args, names, grad_outputs))
                except Exception:  # a reference that refuses float32 excuses nothing
                    widest.append(Evaluated((), {}))
            at_float32 = _value_of(widest[0], key)
            if at_float32 is not None and at_float32.shape == where.shape:
                where |= ~torch.isfinite(at_float32.detach().cpu())
        return where

    def judge(full_budget: bool) -> bool:
        return _judge_case(spec, impl, dtype, exact, plain if plain is not None or not full_budget else
                           baseline(spec, case, args, names, grad_outputs), context, nonfinite_truth_excused=excused,
                           overflowed=overflowed)

    compared = cheap_budget_first(judge)
    if compared and plain is not None:
        found = _outside_reference_rule(spec, case, impl, exact, plain, args, names, grad_outputs, context)
        if found is not None and not found.nonfinite:  # finiteness is judged above (float64's overflow excused)
            _unless_wrong_at_ordinary_magnitudes(target, case)
            # A gradient wrong here in float64 too (finite differences, or the declared surrogate): gradcheck's.
            target.blocked_by_wrong_gradients(case, found.summary)
            fail(found.summary, found.details)
    return compared


def _value_of(evaluated: Evaluated, key: int | str) -> torch.Tensor | None:
    """Output ``key`` (a position) or the gradient of input ``key`` (a name), when a tensor."""
    if isinstance(key, int):
        value = evaluated.outputs[key] if key < len(evaluated.outputs) else None
    else:
        value = evaluated.grads.get(key)
    return value if isinstance(value, torch.Tensor) else None


def _family_text(case: Case, family: str, scales: str) -> str:
    """The family's inputs in the failure's words: a reader sees the case's shapes and scales,
    not that its rows were made constant."""
    if family == "degenerate":
        masked = any(isinstance(r, MaskRecipe) for r in case.recipes)
        zeros = [r.name for r in case.recipes if isinstance(r, TensorRecipe) and r.pattern == "near_zero"]
        return f"degenerate inputs ({scales}): every row constant along the last dim" + (
            f" (about a third of the rows of {', '.join(zeros)} exactly 0, a third ~1e-3)" if zeros else ""
        ) + (", each mask with a fully masked row" if masked else "")
    if family == "single":
        return f"smallest inputs ({scales}): each named dim at its smallest legal size, batch dims drawn"
    return f"{family} inputs ({scales})"


def _judged(impl: Execution, exact: Evaluated, plain: Evaluated, args: list[Any], names: list[str], context: str) -> list[Judged]:
    """The floating outputs and the gradients whose shapes match the truth's (the reference contract
    reports other shapes and non-floating outputs)."""
    fn_name = impl.case.spec.display_name
    values = judged_outputs(impl.outputs, exact, plain, f"{fn_name}.forward, {context}")
    values += judged_grads(
        {name: got for name, got in impl.grads.items() if got is not None and exact.grads.get(name) is not None},
        exact, plain, args, names, lambda name: f"{fn_name}.backward, input {name!r}, {context}",
    )
    return [v for v in values if v.truth.is_floating_point() and tuple(v.actual.shape) == tuple(v.truth.shape)]


def _outside_reference_rule(
    spec: Spec, case: Case, impl: Execution, exact: Evaluated, plain: Evaluated, args: list[Any], names: list[str],
    grad_outputs: dict[int, torch.Tensor], context: str,
) -> Comparison | None:
    """The first output or gradient outside the reference contract's rule, or None. As there, the
    full budget (the truth's term bounds, the reference's own error at neighbouring inputs) is
    measured only for a value outside the cheap one."""
    found = judge_against_truth(spec, case.dtype, _judged(impl, exact, plain, args, names, context))
    if found is None:
        return None
    exact = truth(spec, case, args, names, grad_outputs, terms=True)
    dtype_name = str(case.dtype).removeprefix("torch.")
    resamples = [
        reference_truth_and_baseline(spec, case, moved_args, names, moved_grads)[::-1]
        for moved_args, moved_grads in neighbouring_cases(case, args, grad_outputs, None, dtype_name)
    ]
    return judge_against_truth(spec, case.dtype, with_resamples(_judged(impl, exact, plain, args, names, context), resamples))


def _unless_wrong_at_ordinary_magnitudes(target: Target, case: Case) -> None:
    """Blocked by reference when ``case`` with ordinary magnitudes (every scale at most 1) is
    outside the reference rule too: the values are wrong everywhere, which is the reference
    contract's defect, not a stability one."""
    ordinary = at_ordinary_magnitudes(case)
    spec = target.spec
    impl = target.preflight(ordinary)
    args = ordinary.args()
    names = [recipe.name for recipe in ordinary.recipes]
    grad_outputs = dict(zip(impl.diff_positions, impl.grad_outputs_before))
    exact, plain = reference_truth_and_baseline(spec, ordinary, args, names, grad_outputs)
    context = f"{str(ordinary.dtype).removeprefix('torch.')}, ordinary magnitudes"
    found = _outside_reference_rule(spec, ordinary, impl, exact, plain, args, names, grad_outputs, context)
    if found is not None and not found.nonfinite:  # NaN or inf at ordinary magnitudes: this contract's own
        if found.what.startswith("grad["):  # every output is right: a wrong gradient may be gradcheck's
            target.blocked_by_wrong_gradients(ordinary, found.summary)
        raise Blocked(Defect(
            "reference", f"{spec.display_name} is outside the reference rule at ordinary magnitudes too: {found.summary}", (found.details,),
        ), ordinary)


def _judge_case(
    spec: Spec, impl: Execution, dtype: torch.dtype, exact: Evaluated, plain: Evaluated | None, context: str,
    *, nonfinite_truth_excused: bool = False, overflowed: Callable[[int | str], torch.Tensor | None] | None = None,
) -> bool:
    """Fail unless ``impl``'s outputs and gradients are finite where ``exact`` is (and the
    baseline ``plain``, when given, is), and, unless ``nonfinite_truth_excused``, non-finite as
    the truth is where it is not -- any non-finite value where the truth is only float64's
    overflow (``overflowed``: output position or gradient name -> where; asked for a failing
    value only); False when there was nothing to compare."""
    fn_name = spec.display_name
    # (key, got, truth, baseline, what, where) of every floating output and gradient the truth has
    values: list[tuple[int | str, torch.Tensor, torch.Tensor, Any, str, str]] = []
    for position, (got, want) in enumerate(zip(impl.outputs, exact.outputs)):
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and want.is_floating_point()):
            continue
        if got.shape != want.shape:
            continue  # the reference contract reports shape mismatches
        base = plain.outputs[position] if plain is not None and position < len(plain.outputs) else None
        values.append((position, got, want, base, f"output[{position}]", f"{fn_name}.forward, {context}"))
    for name, grad in impl.grads.items():
        want = exact.grads.get(name)
        if grad is None or want is None or grad.shape != want.shape:
            continue
        base = plain.grads.get(name) if plain is not None else None
        values.append((name, grad, want, base, f"grad[{name!r}]", f"{fn_name}.backward, input {name!r}, {context}"))
    for key, got, want, base, what, where in values:
        baseline_values = base if isinstance(base, torch.Tensor) else None
        found = compare_finiteness(
            got, want, dtype, baseline=baseline_values, what=what, where=where, nonfinite_truth_excused=nonfinite_truth_excused
        )
        if found is not None and overflowed is not None:
            found = compare_finiteness(
                got, want, dtype, baseline=baseline_values, what=what, where=where,
                nonfinite_truth_excused=nonfinite_truth_excused, overflowed=overflowed(key),
            )
        if found is not None:
            fail(found.summary, found.details)
    return bool(values)


# float64 is its own truth (no headroom): past ~cbrt(max) a product of a few inputs overflows in
# the truth and in a correct implementation alike, each in its own arbitrary way.
FLOAT64_MAX_SCALE = 1e100


def one_extreme(case: Case, data: st.DataObject) -> Case:
    """Keep the extreme magnitude of one tensor input (drawn); the others get ordinary ones.

    Two extreme inputs multiplied (``x @ w`` at 1e10 and 1e30) overflow in every implementation
    in that dtype, which says nothing about the op's stability; one large input (large logits)
    is what users report.
    """
    tensors = [i for i, r in enumerate(case.recipes) if isinstance(r, TensorRecipe)]
    if not tensors:
        return case
    keep = data.draw(sampled(tuple(tensors)), label="extreme input")
    limit = FLOAT64_MAX_SCALE if case.dtype == torch.float64 else math.inf
    recipes = tuple(
        replace(r, scale=min(r.scale, limit) if i == keep else min(r.scale, 1.0))
        if isinstance(r, TensorRecipe) and r.scale > 1.0
        else r
        for i, r in enumerate(case.recipes)
    )
    return replace(case, recipes=recipes)


EXTREME_CASES = CaseOptions(extreme=True, mask_kinds=MASK_KINDS)
SINGLE_ELEMENT_CASES = EXTREME_CASES.replace(min_size=1, max_size=1, block_sizes=())


def check_stability(target: Target, data: st.DataObject) -> None:
    def check_dtype(dtype: torch.dtype) -> None:
        # Extreme magnitudes depend on the dtype's range: draw a case per dtype, each at the
        # example's coverage corner (its sizes, and its ordinary or extreme scales).
        extreme = one_extreme(target.draw_case(data, dtypes=(dtype,), cornered=True), data)
        compared = check_case(target, extreme, "extreme")
        compared = check_case(target, degenerate(extreme), "degenerate") or compared
        single = target.draw_case(data, SINGLE_ELEMENT_CASES, dtypes=(dtype,))
        compared = check_case(target, one_extreme(single, data), "single") or compared
        if compared:
            target.checked()
        else:
            target.not_checked(
                "no floating-point output or gradient: finiteness says nothing about integer or boolean results"
            )

    target.per_dtype(target.dtypes(), check_dtype)


@contract("stability", case=EXTREME_CASES, requires=[SOME_DTYPE], compares_values=True)
def test_stability(conformance_target: Target) -> None:
    conformance_target.run(check_stability)
