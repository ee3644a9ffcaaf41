"""Contract reference: outputs and gradients agree with the spec's reference, in every dtype.

In float64 it is a plain ``torch.testing.assert_close`` against the reference. In float32,
float16 and bfloat16 -- where gradcheck cannot run and fixed tolerances rot -- the error against
a float64 truth must be within k times the reference's own error in the same dtype, plus a
floor of two rounding steps at the call's largest |truth| over outputs and gradients (so an exact reference, whose own error is 0, does not
demand bit-exactness). k is 2 for outputs and 3 for gradients unless the spec overrides it with
``register(..., tolerances={torch.float16: {"grad": 4}})`` (capped by ``spec.MAX_TOLERANCE``).
The reference's own error is the largest of four samples: the case itself and three
neighbouring inputs (one representable step), each against its own float64 truth. Specs with a
``surrogate`` have their gradients compared with the surrogate's. Every example is
checked in every dtype the spec lists, with the same input values and grad_outputs. The policy
and its measurements are in :mod:`conformance.engine.numerics`. Specs declared ``nondeterministic`` are
compared in float64 only, with the implementation and the reference run under one seeded RNG
state (so the reference must draw its randomness the same way, e.g. ``torch.rand_like``).
One defect, one failure: a gradient that differs from the reference's while the outputs agree,
and that finite differences of the same case in float64 also reject, is gradcheck's defect (this
test is blocked by it); a gradient wrong only below float64, or in a spec without float64, is
this contract's. NaN or inf where the truth is finite is stability's; values that differ between
two identical calls, undeclared, are determinism's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import SOME_DTYPE, Requirement, contract
from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import (
    REFERENCE_BLAME,
    Evaluated,
    blocked_by_fake_kernel,
    reference_label,
    reference_raised,
)
from conformance.engine.harness import Execution, random_state
from conformance.engine.numerics import (
    Comparison,
    Spread,
    cheap_budget_first,
    compare_budget,
    compare_finiteness,
    compare_float64,
    compare_plain,
    evaluate_spec,
    float64_tolerance,
    floor_ulps,
    largest_checked,
    multiplier,
    neighbouring_cases,
    plain_leaves,
    strict_float32,
    tie_breaking_cases,
    tie_dim,
    truth_and_baseline,
    upcast,
    without_undefined_nans,
)
from conformance.engine.report import ContractFailure, describe_value, fail
from conformance.engine.runner import Target
from conformance.engine.ties import TieGroups, compare_tie_sums, tie_groups, tie_slot_cases
from conformance.spec import Spec
from strategies.cases import Case, CaseOptions
from strategies.values import MASK_KINDS


def check_dtype(target: Target, case: Case, dtype: torch.dtype) -> bool:
    """Compare the implementation with the truth (and the baseline) for ``case`` in ``dtype``;
    False when there was no tensor to compare."""
    if target.context is not None:
        target.context.use_case(case.with_dtype(dtype))  # the repro rebuilds this dtype
    impl = target.preflight(case, dtype=dtype)
    # A case drawn again is not judged again: the pool served these very results (intact).
    return target.judged_once(impl, "values", lambda: _check_values(target, case, dtype, impl))


def _check_values(target: Target, case: Case, dtype: torch.dtype, impl: Execution) -> bool:
    spec = target.spec
    dtype_name = str(dtype).removeprefix("torch.")
    names = [recipe.name for recipe in case.recipes]
    # The truth is computed from pristine inputs and grad_outputs, rebuilt from the case: a
    # Function that writes into them is the inplace contract's finding, not a wrong value.
    pristine = case.args(dtype=dtype)
    grad_outputs = dict(zip(impl.diff_positions, impl.grad_outputs_before))

    truth, baseline = _truth_and_baseline(spec, case, pristine, names, grad_outputs)
    ties = _drawn_ties(case, pristine)

    def resampled(moved: Iterable[tuple[list[Any], dict[int, torch.Tensor]]]) -> list[tuple[Evaluated, Evaluated]]:
        pairs = []
        for moved_args, moved_grads in moved:
            moved_truth, moved_baseline = _truth_and_baseline(spec, case, moved_args, names, moved_grads)
            pairs.append((moved_baseline, moved_truth))
        return pairs

    def broken_ties() -> list[tuple[Evaluated, Evaluated]]:
        # At a tie the random steps left in place (each input alone moved, neighbouring elements
        # apart, each drawn tie in every order), the truth may jump by as much as the difference.
        tied_at = {names.index(name): groups for name, groups in ties.items()}
        return resampled(tie_breaking_cases(pristine, grad_outputs, None)) + resampled(tie_slot_cases(pristine, grad_outputs, tied_at))

    def judge(full_budget: bool) -> bool:
        if not full_budget or dtype == torch.float64:  # float64's rule has no budget to widen, but at ties
            moved = broken_ties() if full_budget and ties else []
            return _judge_dtype(target, impl, truth, baseline, moved, dtype, final=full_budget, ties=ties)
        judged_truth = _truth_with_terms(spec, case, pristine, names, grad_outputs)
        resamples = resampled(neighbouring_cases(case, pristine, grad_outputs, None, dtype_name))
        if torch.finfo(dtype).bits <= 16 or ties:  # a coarse grid makes ties between drawn values
            try:
                return _judge_dtype(target, impl, judged_truth, baseline, resamples, dtype, final=False, ties=ties)
            except ContractFailure:
                resamples += broken_ties()
        return _judge_dtype(target, impl, judged_truth, baseline, resamples, dtype, final=True, ties=ties)

    return cheap_budget_first(judge)


def _judge_dtype(
    target: Target, impl: Execution, truth: Evaluated, baseline: Evaluated, resamples: list[tuple[Evaluated, Evaluated]], dtype: torch.dtype,
    *, final: bool, ties: Mapping[str, TieGroups],
) -> bool:
    """Fail unless every output and gradient of ``impl`` is within the policy's budget around
    the truth (term bounds and ``resamples`` widen it); False when there was nothing to compare.
    ``final``: the judgement whose failure stands (the full budget's), where a wrong gradient
    that is gradcheck's defect blocks this contract instead (``Target.blocked_by_wrong_gradients``).
    ``ties``: the drawn ties of inputs, by name, whose gradients' sums over each tie are judged
    too (:func:`conformance.engine.ties.compare_tie_sums`)."""
    spec = target.spec
    fn_name = spec.display_name
    dtype_name = str(dtype).removeprefix("torch.")
    names = [recipe.name for recipe in impl.case.recipes]
    grad_source = "surrogate" if spec.surrogate is not None else "reference"
    if len(impl.outputs) != len(truth.outputs):
        fail(
            f"len(reference outputs)={len(truth.outputs)}, but {fn_name}.forward returns {len(impl.outputs)} "
            f"[spec {spec.name!r}, reference={reference_label(spec)}, {dtype_name}]",
            REFERENCE_BLAME,
            compares_values=False,
        )
    # (label, k key, impl, truth, baseline, resampled (baseline, truth) pairs, where, truth's term bound)
    pairs: list[
        tuple[str, str, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], str, torch.Tensor | None]
    ] = []
    tie_sums: list[tuple[str, Any]] = []  # (input name, its gradient's pair) for inputs with drawn ties
    plain: list[tuple[int, Any, Any, Any]] = []  # non-tensor outputs, compared once the call's scale is known
    for position, (got, want, base) in enumerate(zip(impl.outputs, truth.outputs, baseline.outputs)):
        where = f"{fn_name}.forward, {dtype_name}"
        if not isinstance(want, torch.Tensor):
            if plain_leaves(want):
                plain.append((position, got, want, base))
            continue
        if not isinstance(got, torch.Tensor):
            fail(f"output[{position}]={describe_value(got)}, but should be a tensor like the reference [{where}]", compares_values=False)
        if tuple(got.shape) != tuple(want.shape):
            fail(
                f"reference output[{position}].shape={tuple(want.shape)}, but {fn_name}.forward returns "
                f"{tuple(got.shape)} [spec {spec.name!r}, reference={reference_label(spec)}, {dtype_name}]",
                REFERENCE_BLAME,
                compares_values=False,
            )
        if isinstance(base, torch.Tensor) and got.dtype != base.dtype:
            blocked_by_fake_kernel(impl.case.with_dtype(dtype))  # a fake kernel of the reference's dtype: opcheck's finding
            fail(
                f"output[{position}].dtype={got.dtype}, but should be {base.dtype} like the reference's on the same "
                f"inputs [{where}]",
                f"A caller gets another dtype than from the op this Function replaces (memory, and every later "
                f"op's type promotion). If {got.dtype} is by design (a float32 statistic such as a logsumexp), "
                "make reference= return it too.",
                compares_values=False,
            )
        moved = [(b.outputs[position], t.outputs[position]) for b, t in resamples]
        pairs.append((f"output[{position}]", "output", got, want, base, moved, where, truth.output_terms.get(position)))
    for name, got in impl.grads.items():
        arg = impl.args[names.index(name)]
        # A gradient the reference leaves unused (None) is zero; so is a None from the Function.
        want = truth.grads.get(name)
        want = torch.zeros(arg.shape, dtype=torch.float64) if want is None else want
        base = baseline.grads.get(name)
        base = torch.zeros_like(arg) if base is None else base
        got = torch.zeros_like(arg) if got is None else got
        moved = [
            (b.grads[name], t.grads[name])
            for b, t in resamples
            if b.grads.get(name) is not None and t.grads.get(name) is not None
        ]
        where = f"{fn_name}.backward, input {name!r}, {dtype_name}, vs the {grad_source}"
        pairs.append((f"grad[{name!r}]", "grad", got, want, base, moved, where, truth.grad_terms.get(name)))
        if name in ties:  # judged after every element is (the sums are only meaningful then)
            tie_sums.append((name, pairs[-1]))

    # The floor's scale: the largest |truth| of the call (see compare_budget).
    floor_at = max((largest_checked(w, dtype) for _, _, _, w, _, _, _, _ in pairs if w.is_floating_point()), default=0.0)
    for position, got, want, base in plain:
        comparison = compare_plain(
            got, want, base, dtype, k=multiplier(spec, dtype, "output"), what=f"output[{position}]",
            where=f"{fn_name}.forward, {dtype_name}", floor_at=floor_at,
        )
        if comparison is not None:
            fail(comparison.summary, comparison.details)
    tied: int | None = None  # the dim along which an index output broke ties in another order than the reference
    spreads = {f"grad[{name!r}]": groups.spread for name, groups in ties.items()}  # a tie may split a gradient any way
    for what, which, got, want, base, moved, where, terms in pairs:
        spread = spreads.get(what)
        if not want.is_floating_point():
            mismatch = _exact_mismatch(got, want, base, dtype_name, what=what, where=where)
            if mismatch is not None:
                tied = tie_dim(got, want, impl.args)
                if tied is None:
                    fail(mismatch)
            continue
        if which == "grad" and tied is not None and got.ndim > tied:
            # Tied elements swap their gradients (outputs come first): each line along the tied dim as a multiset.
            what += f" (sorted along dim {tied}: the index output broke ties in another order than the reference)"
            got, want, base = (t.sort(dim=tied).values for t in (got, want, base))
            moved = [(b.sort(dim=tied).values, t.sort(dim=tied).values) for b, t in moved]
            terms = None
        comparison = _compare_value(spec, dtype, (what, which, got, want, base, moved, where, terms), floor_at, truth.accumulation, spread)
        if comparison is not None:
            if comparison.nonfinite and final:  # NaN or inf where the truth is finite: stability's defect
                raise Blocked(Defect("stability", comparison.summary, (comparison.details,)), impl.case)
            if which == "grad" and final:
                target.blocked_by_wrong_gradients(impl.case, comparison.summary)
            fail(comparison.summary, comparison.details)
    _judge_tie_sums(target, impl, truth, dtype, [(name, ties[name], pair) for name, pair in tie_sums], floor_at=floor_at, final=final)
    return bool(pairs) or bool(plain)


def _exact_mismatch(got: torch.Tensor, want: torch.Tensor, base: Any, dtype_name: str, *, what: str, where: str) -> str | None:
    """A non-floating output is compared exactly, element by element with the truth's or the
    baseline's (the reference run in the tested dtype: ``round(x / scale)`` may round the other way
    where ``x / scale`` rounds onto a half in bfloat16): None when each element equals one of them."""
    got, want = got.detach().cpu(), want.detach().cpu()
    agree = got == want
    if isinstance(base, torch.Tensor) and tuple(base.shape) == tuple(got.shape) and base.dtype == got.dtype:
        agree |= got == base.detach().cpu()
    if bool(agree.all()):
        return None
    index = tuple(int(i) for i in (~agree).nonzero()[0])
    return (
        f"{what}[{index}]={got[index].item()}, but should be {want[index].item()} like the reference's "
        f"({int((~agree).sum())} of {agree.numel()} elements differ; a non-floating output is compared exactly, with the "
        f"reference in float64 or in {dtype_name}) [{where}]"
    )


def _compare_value(
    spec: Spec, dtype: torch.dtype, pair: Any, floor_at: float, accumulation: int, spread: Spread | None,
) -> Comparison | None:
    """One output's or gradient's ``pair`` (as :func:`_judge_dtype` makes them) against the truth,
    by the float64 rule or the budget of ``dtype`` (``spread``: see :func:`compare_budget`)."""
    what, which, got, want, base, moved, where, terms = pair
    if dtype == torch.float64:
        return compare_finiteness(got, want, dtype, what=what, where=where) or compare_float64(
            got, want, what=what, where=where, spec=spec, resampled=moved, k=multiplier(spec, dtype, which), spread=spread
        )
    return compare_budget(
        got, want, base, dtype, resampled=moved, floor_at=floor_at, terms=terms, accumulation=accumulation,
        k=multiplier(spec, dtype, which), what=what, where=where, steps=floor_ulps(spec, dtype), spread=spread,
    )


def _judge_tie_sums(
    target: Target, impl: Execution, truth: Evaluated, dtype: torch.dtype, judged: list[tuple[str, TieGroups, Any]], *, floor_at: float,
    final: bool,
) -> None:
    """Fail unless each gradient in ``judged`` (its input's name, the groups of its drawn ties, and
    its pair as :func:`_judge_dtype` made it) keeps the reference's sum over every tie."""
    spec = target.spec
    for name, groups, (what, which, got, want, base, moved, where, terms) in judged:
        comparison = compare_tie_sums(
            got, want, base, dtype, groups, resampled=moved, k=multiplier(spec, dtype, which), floor_at=floor_at, terms=terms,
            accumulation=truth.accumulation, steps=floor_ulps(spec, dtype), float64_tolerance=float64_tolerance(spec),
            input_name=name, what=what, where=where,
        )
        if comparison is not None:
            if final:  # gradcheck keeps drawn values apart: it never meets a tie, so this is no gradcheck defect
                target.blocked_by_undeclared_randomness(impl.case)
            fail(comparison.summary, comparison.details)


def _drawn_ties(case: Case, args: Sequence[Any]) -> dict[str, TieGroups]:
    """The ties of each floating input drawn with repeated values (the ``repeats`` pattern), by name."""
    ties = {}
    for recipe, value in zip(case.recipes, args):
        if getattr(recipe, "pattern", None) == "repeats" and isinstance(value, torch.Tensor) and value.requires_grad:
            groups = tie_groups(value)
            if groups is not None:
                ties[recipe.name] = groups
    return ties




def _truth_and_baseline(
    spec: Spec, case: Case, args: list[Any], names: list[str], grad_outputs: dict[int, torch.Tensor], *, terms: bool = False
) -> tuple[Evaluated, Evaluated]:
    """The truth (with its term bounds when ``terms``) and the baseline of :func:`_reference`."""
    __tracebackhide__ = True
    exact, plain = truth_and_baseline(
        spec, case, lambda cast, exact: _reference(spec, [cast(a) for a in args], names, grad_outputs, terms=terms and exact)
    )
    return without_undefined_nans(spec, case, args, names, exact), plain


def _truth_with_terms(spec: Spec, case: Case, args: list[Any], names: list[str], grad_outputs: dict[int, torch.Tensor]) -> Evaluated:
    """The truth of :func:`_truth_and_baseline` with its term bounds (the same values)."""
    __tracebackhide__ = True
    with strict_float32(), random_state(spec, case):
        exact = _reference(spec, [upcast(a) for a in args], names, grad_outputs, terms=True)
    return without_undefined_nans(spec, case, args, names, exact)


def _reference(spec: Spec, args: list[Any], names: list[str], grad_outputs: dict[int, torch.Tensor], *, terms: bool = False) -> Evaluated:
    """The spec's reference (and surrogate) on ``args``; its own errors blame the spec."""
    __tracebackhide__ = True
    try:
        return evaluate_spec(spec, args, names, grad_outputs, terms=terms)
    except Exception as error:
        fail(
            reference_raised(spec, error),
            f"{type(error).__name__}: {error}",
            REFERENCE_BLAME,
            compares_values=False,
        )


def check_reference(target: Target, data: st.DataObject) -> None:
    dtypes = target.dtypes()
    if target.spec.nondeterministic:
        # Random draws differ between dtypes (a float64 truth sees other numbers than a float16
        # run), so values are compared only in float64, under one seeded RNG state.
        dtypes = tuple(d for d in dtypes if d == torch.float64)
    # Ordinary magnitudes do not depend on the dtype: one case, checked in every dtype.
    case = target.draw_case(data, dtypes=dtypes[:1])
    compared = target.per_dtype(dtypes, lambda dtype: check_dtype(target, case, dtype))
    if any(compared):
        target.checked()
    else:
        target.not_checked("the reference returns no tensor to compare with")


def _comparable_randomness(target: Target) -> None:
    if target.spec.nondeterministic and target.device != "cpu":
        target.not_applicable(
            "declared nondeterministic: the float64 truth is computed on the CPU, whose random stream "
            "differs from the device's, so values are compared on the -cpu test id only"
        )
    if target.spec.nondeterministic and torch.float64 not in target.dtypes():
        target.not_applicable(
            "declared nondeterministic without float64: random draws differ between dtypes, so values "
            "can only be compared with the reference in float64 under one seeded RNG state"
        )


@contract(
    "reference",
    # Constant grad_outputs: terms that do not cancel, where a float16 accumulator shows.
    case=CaseOptions(mask_kinds=MASK_KINDS, broadcast=True, value_patterns=("ascending", "random", "repeats"), grad_output_kinds=("random", "constant")),
    requires=[SOME_DTYPE, Requirement("one seeded RNG stream", _comparable_randomness)],
    compares_values=True,
)
def test_reference(conformance_target: Target) -> None:
    conformance_target.run(check_reference)
