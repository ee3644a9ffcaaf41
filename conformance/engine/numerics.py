"""Numerical judgement shared by the contracts: the truth and the baseline of an evaluation
(:func:`truth_and_baseline`, the one place both are made), the reference policy that compares a
result with them (:func:`compare_budget`, :func:`judge_against_truth`), and the budget for the
same kernels reordered (:data:`REORDERING`: reruns, requires_grad subsets, unused outputs,
memory layouts).

Policy (see README, "Numerical tolerance policy"):

* **Truth** is the spec's ``reference`` (or ``surrogate`` for gradients of surrogate-gradient
  specs) evaluated in float64 on the CPU with TF32 off, on the *same input values* the
  implementation received (built in the tested dtype, then upcast exactly) and the same
  grad_outputs (upcast).
* **Baseline** is the same reference evaluated in the tested dtype on the tested device: how
  wrong plain PyTorch is in that precision.
* float64 passes ``torch.testing.assert_close`` against the truth (the reference in float64
  itself: no reference error to scale), for every contract that compares with it.
* Low precision passes iff ``max|impl - truth| <= k * max|baseline - truth| + floor`` per output
  and per gradient, ``floor = FLOOR_ULPS`` rounding steps of the tested dtype at ``max|truth|``.
  The floor keeps an exact reference (baseline error 0) from demanding bit-exactness.
* The baseline error is sampled more than once (``reference``): the reference in the tested
  dtype on the case's inputs and on neighbouring inputs (each element moved by at most one
  representable step), each against its own float64 truth; the largest counts. One sample of
  rounding noise is unreliable for a few-element result whose terms cancel.
* Budgets only grow with what they are given (the term bounds, the resampled reference errors
  and sensitivities, the reference's noise in ``layouts``). So a contract judges first with the
  budget its plain truth and baseline give, and measures the rest only for a value that budget
  rejects (:func:`cheap_budget_first`): the verdict is the same, and a passing example does not
  pay for the resamples.
* A position is *checked* where the truth is finite and representable in the tested dtype
  (rounding it to the dtype gives a finite number) and the baseline is finite. A value the dtype
  cannot hold (a float16 square of 300) may overflow in any correct implementation, and where
  plain PyTorch overflows in the same dtype (``x @ w`` whose products pass bfloat16's range
  although the sum does not) the dtype is at fault; neither is checked. Where the truth is NaN
  or +-inf the implementation must give the same non-finite value -- except when the tested
  dtype is float64 itself, whose truth has no headroom (its NaN may be its own overflow).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from conformance.engine.defects import Blocked, Defect, raised, read_outside_defect
from conformance.engine.evaluate import (
    Autocast,
    Evaluated,
    evaluate,
    evaluate_with_terms,
    execute,
    forward,
    fresh,
    gradients,
    reads_outside,
)
from conformance.engine.global_state import rng_states, set_backend_flags, set_rng_states
from conformance.engine.harness import Execution, as_tuple, differentiable_positions, random_state
from conformance.engine.report import ContractFailure, finiteness_report, mismatch_report
from conformance.spec import DEFAULT_TOLERANCES, Spec
from conformance.spec.spec import FLOAT64_TOLERANCE_KEYS
from strategies.cases import Case
from strategies.recipes import TensorRecipe

__all__ = [
    "FLOOR_ULPS",
    "REORDERING",
    "RESAMPLE_PAIRS",
    "BudgetParts",
    "Comparison",
    "Judged",
    "Reordering",
    "Spread",
    "at_ordinary_magnitudes",
    "baseline",
    "budget_parts",
    "cheap_budget_first",
    "checked_positions",
    "compare_budget",
    "compare_finiteness",
    "compare_float64",
    "compare_plain",
    "evaluate_spec",
    "exactly_equal",
    "float32_baseline",
    "float64_tolerance",
    "judge_against_truth",
    "judged_grads",
    "judged_outputs",
    "largest_checked",
    "largest_magnitude",
    "layout_tolerance",
    "multiplier",
    "neighbouring_cases",
    "neighbours",
    "plain_leaves",
    "reference_has_no_answer",
    "reordering_tolerance",
    "rounding_floor",
    "stepped",
    "strict_float32",
    "tie_breaking_cases",
    "truth",
    "truth_and_baseline",
    "truth_movement",
    "truth_outputs",
    "ulp",
    "upcast",
    "with_resamples",
    "without_undefined_nans",
]

T = TypeVar("T")
# Maps a per-element sensitivity to the one a comparison allows (compare_budget's ``spread``).
Spread = Callable[[torch.Tensor], torch.Tensor]

FLOOR_ULPS = 2  # rounding steps of the tested dtype at max|truth| added to the budget
FLOAT32_UNIT = 2.0**-24  # float32's unit roundoff: a correct kernel accumulates in float32, in any order
FLOAT64_ATOL, FLOAT64_RTOL = 1e-7, 1e-7  # torch.testing.assert_close's float64 defaults: compare_float64's rule


def cheap_budget_first(judge: Callable[[bool], T]) -> T:
    """``judge(False)``: the judgement with the budget of the plain truth and baseline; if it
    fails (raises :class:`ContractFailure` or returns a :class:`Comparison`), ``judge(True)``:
    the same judgement with the full budget (term bounds, resamples, reference noise), whose
    result stands. Every budget is monotone in those measurements (:func:`compare_budget`,
    :func:`compare_finiteness`, :func:`layout_tolerance`), so a value within the cheap budget is
    within the full one: the verdict is the full judgement's, at the cost of the cheap one
    whenever it passes."""
    __tracebackhide__ = True
    try:
        found = judge(False)
    except ContractFailure:
        return judge(True)
    return judge(True) if isinstance(found, Comparison) else found


@contextmanager
def strict_float32() -> Iterator[None]:
    """TF32 off (matmul and cuDNN) and 'highest' matmul precision; restored afterwards."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    set_backend_flags((matmul, "allow_tf32", False), (cudnn, "allow_tf32", False))
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        set_backend_flags((matmul, "allow_tf32", saved[0]), (cudnn, "allow_tf32", saved[1]))
        torch.set_float32_matmul_precision(saved[2])


def ulp(value: float, dtype: torch.dtype) -> float:
    """One rounding step (unit in the last place) of ``dtype`` at magnitude ``value``.

    ``eps * 2**floor(log2(|value|))``, i.e. the spacing of the binade holding ``value``; below
    the smallest normal number it is the subnormal spacing ``eps * tiny``.
    """
    finfo = torch.finfo(dtype)
    magnitude = abs(float(value))
    if not math.isfinite(magnitude):
        magnitude = float(finfo.max)
    magnitude = max(magnitude, float(finfo.tiny))
    return float(finfo.eps) * 2.0 ** math.floor(math.log2(magnitude))


def rounding_floor(truth: torch.Tensor, dtype: torch.dtype, checked: torch.Tensor, steps: int = FLOOR_ULPS) -> float:
    """``steps`` rounding steps of ``dtype`` at the largest checked ``|truth|``."""
    values = truth[checked].abs()
    peak = float(values.max()) if values.numel() else 0.0
    return steps * ulp(peak, dtype)


def multiplier(spec: Spec, dtype: torch.dtype, which: str) -> float:
    """k for ``which`` ("output" or "grad") in ``dtype``: the spec's override, else the default."""
    return float(spec.tolerances.get(dtype, {}).get(which, DEFAULT_TOLERANCES[which]))


def floor_ulps(spec: Spec, dtype: torch.dtype) -> int:
    """The floor's rounding steps in ``dtype``: the spec's ``floor_ulps``, else :data:`FLOOR_ULPS`."""
    return int(spec.tolerances.get(dtype, {}).get("floor_ulps", FLOOR_ULPS))


def upcast(value: Any) -> Any:
    """A float64 CPU leaf copy of a floating tensor (keeping requires_grad); others moved to CPU."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.detach().to(device="cpu", dtype=torch.float64).requires_grad_(value.requires_grad)
        return value.detach().cpu()
    return value


def evaluate_spec(
    spec: Spec,
    args: Sequence[Any],
    names: Sequence[str],
    grad_outputs: Mapping[int, torch.Tensor],
    *,
    terms: bool = False,
    autocast: Autocast | None = None,
) -> Evaluated:
    """The spec's reference outputs, and gradients from its surrogate when it declares one
    (else from the reference), on fresh leaf copies of ``args``, forward inside ``autocast``
    when given; with ``terms``, also each result's term bound (for the truth, in float64)."""

    def run(func: Callable[..., Any], values: list[Any]) -> Evaluated:
        if terms and autocast is None:  # term bounds are the float64 truth's, never under autocast
            return evaluate_with_terms(func, values, names, grad_outputs)
        return evaluate(func, values, names, grad_outputs, autocast=autocast)

    first = run(spec.reference, [fresh(a) for a in args])
    if spec.surrogate is None:
        return first
    second = run(spec.surrogate, [fresh(a) for a in args])
    return Evaluated(first.outputs, second.grads, first.output_terms, second.grad_terms, max(first.accumulation, second.accumulation))


def blocked_by_wrong_values(execution: Execution) -> None:
    """One defect, one failure, for a contract that meets wrong values as something else (gradcheck:
    a wrong Jacobian) and consults the spec's reference on ``execution``'s case only then: raise
    ``Blocked`` by stability where an output or gradient is NaN or inf where the float64 truth is
    finite, or not the truth's NaN/inf (:func:`compare_finiteness` in the case's dtype); else by
    reference where forward's outputs are outside the reference contract's rule (a wrong forward
    is a wrong Jacobian too). Nothing is blocked where the reference itself raises."""
    case = execution.case
    spec = case.spec
    names = [recipe.name for recipe in case.recipes]
    try:
        truth, baseline = reference_truth_and_baseline(
            spec, case, case.args(), names, dict(zip(execution.diff_positions, execution.grad_outputs_before))
        )
    except Exception:  # the reference's own error is the reference contract's to report
        return
    where = f"{spec.display_name}, {str(case.dtype).removeprefix('torch.')}"
    outputs = judged_outputs(execution.outputs, truth, baseline, f"{where}, forward")
    grads = judged_grads(execution.grads, truth, baseline, case.args(), names, lambda name: f"{where}, backward, input {name!r}")
    for value in outputs + grads:
        if tuple(value.actual.shape) != tuple(value.truth.shape) or not value.actual.is_floating_point():
            continue
        found = compare_finiteness(value.actual, value.truth, case.dtype, baseline=value.baseline, what=value.what, where=value.where)
        if found is not None:
            raise Blocked(Defect("stability", found.summary, (found.details,)), case)
    wrong = judge_against_truth(spec, case.dtype, outputs)
    if wrong is not None:
        raise Blocked(Defect("reference", f"{wrong.summary}: forward is already wrong on this case", (wrong.details,)), case)


def truth_and_baseline(spec: Spec, case: Case, run: Callable[[Callable[[Any], Any], bool], T]) -> tuple[T, T]:
    """The truth and the baseline of one evaluation of the reference: ``run(cast, is_truth)``,
    first with ``cast=upcast`` (float64 CPU leaf copies) under :func:`strict_float32` (the truth),
    then with the values as they are (the baseline: plain PyTorch in the tested dtype), each under
    the case's RNG state (:func:`conformance.engine.harness.random_state`)."""
    with strict_float32(), random_state(spec, case):
        exact = run(upcast, True)
    with random_state(spec, case):
        baseline = run(_same, False)
    return exact, baseline


def _same(value: Any) -> Any:
    return value


def truth(
    spec: Spec, case: Case, args: Sequence[Any], names: Sequence[str], grad_outputs: Mapping[int, torch.Tensor],
    *, terms: bool = False,
) -> Evaluated:
    """The spec's reference (and surrogate) in float64 on the CPU, TF32 off, on ``args`` upcast
    (:func:`without_undefined_nans`)."""
    with strict_float32(), random_state(spec, case):
        exact = evaluate_spec(spec, [upcast(a) for a in args], names, grad_outputs, terms=terms)
    return without_undefined_nans(spec, case, args, names, exact)


def truth_outputs(spec: Spec, case: Case, args: Sequence[Any]) -> tuple[Any, ...]:
    """The spec's reference outputs in float64 on the CPU, TF32 off, on ``args`` upcast (no gradients)."""
    with strict_float32(), random_state(spec, case), torch.no_grad():
        return as_tuple(spec.reference(*[upcast(a) for a in args]))


def at_ordinary_magnitudes(case: Case) -> Case:
    """``case`` with every tensor's magnitude scale at most 1 (the same shapes, masks and seeds)."""
    return dataclasses.replace(case, recipes=tuple(
        dataclasses.replace(r, scale=min(r.scale, 1.0)) if isinstance(r, TensorRecipe) else r for r in case.recipes
    ))


def reference_has_no_answer(case: Case) -> str | None:
    """Why the spec's reference has no answer on ``case``, or None when it has one: it raises, or an
    output is not finite for want of range or precision -- plain PyTorch's in the case's dtype
    where the float64 truth is finite (a float32 Cholesky of a a^T + n I whose n I is below
    rounding), or the float64 truth's own where it is finite at ordinary magnitudes (the same at
    1e100). A Function that raises there, as torch.linalg.cholesky does, says so too. A masked
    row's -inf is -inf in every dtype and at every magnitude: an answer, by definition."""
    spec = case.spec
    args = case.args()
    try:
        with random_state(spec, case), torch.no_grad():
            plain = as_tuple(spec.reference(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args]))
        exact = truth_outputs(spec, case, args)
        ordinary = at_ordinary_magnitudes(case)
        at_ordinary = truth_outputs(spec, ordinary, ordinary.args()) if ordinary != case else exact
    except Exception as error:
        return f"it raises {raised(error)}"
    dtype = str(case.dtype).removeprefix("torch.")
    for position, values in enumerate(zip(plain, exact, at_ordinary)):
        if not all(isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == values[1].shape for v in values):
            continue
        own, truth64, small = (v.detach().cpu() for v in values)
        if bool((torch.isfinite(truth64) & ~torch.isfinite(own)).any()):
            return f"its output[{position}] in {dtype} is not finite where the float64 truth is"
        if bool((~torch.isfinite(truth64) & torch.isfinite(small)).any()):
            return f"its float64 output[{position}] is not finite here, though finite at ordinary magnitudes"
    return None


def without_undefined_nans(spec: Spec, case: Case, args: Sequence[Any], names: Sequence[str], evaluated: Evaluated) -> Evaluated:
    """``evaluated`` (a float64 truth on ``args``) with each NaN gradient element that no output
    depends on set to 0: moving those elements of the input (all at once) leaves every output of
    the reference as it was, bit for bit and free of NaN, so the derivative there is 0, and the
    reference's NaN is its backward's arithmetic (``-inf - -inf`` at a masked position of a
    log-cumsum-exp)."""
    grads, changed = dict(evaluated.grads), False
    for name, grad in evaluated.grads.items():
        if not (isinstance(grad, torch.Tensor) and bool(torch.isnan(grad).any())) or name not in names:
            continue
        position = list(names).index(name)
        value = args[position]
        if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.shape == grad.shape):
            continue
        nans = torch.isnan(grad).to(value.device)
        base = upcast(value).detach()
        moved = list(args)
        moved[position] = torch.where(nans, base + 1 + base.abs(), base)  # no fixed point, a -inf stays
        before, after = truth_outputs(spec, case, args), truth_outputs(spec, case, moved)
        if len(before) == len(after) and all(_same_values(a, b) for a, b in zip(before, after)):
            grads[name], changed = torch.where(nans.to(grad.device), torch.zeros((), dtype=grad.dtype, device=grad.device), grad), True
    return dataclasses.replace(evaluated, grads=grads) if changed else evaluated


def _same_values(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool((a == b).all())  # a NaN output proves nothing: never the same
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)


def baseline(
    spec: Spec, case: Case, args: Sequence[Any], names: Sequence[str], grad_outputs: Mapping[int, torch.Tensor]
) -> Evaluated:
    """The baseline of :func:`truth_and_baseline` alone: the spec's reference (and surrogate) on
    ``args`` as they are, under the case's RNG state."""
    with random_state(spec, case):
        return evaluate_spec(spec, list(args), names, grad_outputs)


def float32_baseline(
    spec: Spec, case: Case, args: Sequence[Any], names: Sequence[str], grad_outputs: Mapping[int, torch.Tensor]
) -> Evaluated:
    """The spec's reference (and surrogate) computed in float32 from ``args`` (half precision
    inputs) and rounded once to the case's dtype: what a kernel that accumulates in float32
    gives at best, as the docs ask kernels to compute. Where even this overflows the dtype (an
    exploding recurrence's gradient past float16's 65504), so may a correct kernel."""

    def widened(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.detach().to(torch.float32).requires_grad_(value.requires_grad)
        return value

    with random_state(spec, case):
        wide = evaluate_spec(spec, [widened(a) for a in args], names, grad_outputs)

    def narrowed(value: Any) -> Any:
        return value.detach().to(case.dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return Evaluated(tuple(narrowed(o) for o in wide.outputs), {n: narrowed(g) for n, g in wide.grads.items()})


def reference_truth_and_baseline(
    spec: Spec, case: Case, args: Sequence[Any], names: Sequence[str], grad_outputs: Mapping[int, torch.Tensor],
    *, terms: bool = False,
) -> tuple[Evaluated, Evaluated]:
    """:func:`truth_and_baseline` of the spec's reference (surrogate for gradients) on ``args``
    and ``grad_outputs``; with ``terms``, the truth's term bounds too (:func:`without_undefined_nans`)."""
    exact, plain = truth_and_baseline(
        spec, case, lambda cast, exact: evaluate_spec(spec, [cast(a) for a in args], names, grad_outputs, terms=terms and exact)
    )
    return without_undefined_nans(spec, case, args, names, exact), plain


def checked_positions(
    truth: torch.Tensor, dtype: torch.dtype, baseline: torch.Tensor | None = None
) -> torch.Tensor:
    """Where ``truth`` is finite and representable in ``dtype`` (rounds to a finite value) and,
    when given, the ``baseline`` (the reference evaluated in ``dtype``) is finite too: where plain
    PyTorch overflows in this dtype (an intermediate ``x * w`` past float16's range although
    the sum is in range), the dtype, not the implementation, is at fault."""
    finite = torch.isfinite(truth)
    if dtype != torch.float64:
        finite = finite & torch.isfinite(truth.to(dtype))
    if baseline is not None and baseline.shape == truth.shape:
        finite = finite & torch.isfinite(baseline.detach().to("cpu", torch.float64))
    return finite


def largest_checked(truth: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest ``|truth|`` where :func:`checked_positions` holds (0.0 where it holds nowhere):
    the scale of a call's floor (see :func:`compare_budget`)."""
    truth = truth.detach()
    if truth.numel() == 0:
        return 0.0
    return float(torch.where(checked_positions(truth, dtype), truth.abs(), 0.0).max())


@dataclasses.dataclass
class Comparison:
    """A failed comparison: the summary line and the assert_close-style details. ``nonfinite``:
    NaN or inf where the truth has none, or not the truth's (:func:`compare_finiteness`): the
    stability contract's defect wherever another contract meets it."""

    summary: str
    details: str
    nonfinite: bool = False
    what: str = ""  # the value's label (``grad['x']``), where the comparison names one


def same_bits(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """The determinism contract's equality: bitwise, except that NaN equals NaN and -0.0 equals 0.0."""
    if exactly_equal(actual, expected):
        return True
    try:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def undeclared_randomness(case: Case) -> Defect | None:
    """The determinism contract's defect on ``case``, or None: two calls with identical inputs, one
    after the other (torch's global RNG left alone), whose outputs or gradients differ, of a Function
    not declared ``nondeterministic`` -- or out_of_bounds' defect when the Function reads memory
    outside its tensors (:func:`read_outside`), whose values may differ between calls or not. One defect, one failure: a contract whose comparison of values
    fails on such a Function meets that defect, not one of its own (the runner asks, on failure).
    Values that differ only where an input or grad_output is strided or stride-0 (see
    :func:`_reads_outside_strided_tensors`) are read from memory outside the tensor (a kernel that
    assumes contiguous memory): the layouts contract's defect. For a Function declared
    ``nondeterministic`` (every evaluation replays one RNG state), a backward that differs from
    itself through one graph (it draws its own numbers) is the inplace contract's defect."""
    if case.spec.nondeterministic:
        return _random_backward_differs(case)
    outside = read_outside(case)  # what lies past a tensor's end: other values on another call, or the same garbage
    if outside is not None:
        return outside
    differs = _differs_from_itself(case)
    if differs is None:
        return None
    if not _reads_outside_strided_tensors(case):
        return Defect(
            "determinism", f"{differs} differs between two calls with identical inputs [{case.spec.display_name}]",
            ("Declare nondeterministic=True if the Function is random by design (dropout, noise, sampling).",),
        )
    return Defect(
        "layouts",
        f"{differs} differs between two calls with identical strided inputs or grad_outputs, but not with contiguous ones "
        f"[{case.spec.display_name}]",
        ("The Function reads memory outside a tensor it gets in a strided or stride-0 layout (a kernel that assumes "
         "contiguous memory): call .contiguous() on inputs and grad_outputs before it.",),
    )


# A declared-random Function whose second backward through one graph differs: the likely cause.
RANDOM_BACKWARD_CAUSE = (
    "The spec declares nondeterministic=True, so every evaluation replays one RNG state and forward's draws "
    "are the reference's too: a backward that draws its own numbers (a new dropout mask) differentiates "
    "another sample than forward returned. Save forward's sample, or its RNG state and redraw under "
    "torch.random.fork_rng (as torch.utils.checkpoint does)."
)


def _random_backward_differs(case: Case) -> Defect | None:
    """inplace's defect when a second backward through one graph of ``case`` differs from the first."""
    differs = second_backward_differs(case)
    if differs is None:
        return None
    return Defect(
        "inplace",
        f"{differs} on the second backward != first backward [{case.spec.display_name}.backward, retain_graph=True]",
        (RANDOM_BACKWARD_CAUSE,),
    )


def second_backward_differs(case: Case) -> str | None:
    """The first gradient (``grad['x']``) that a second backward through the same graph of
    ``case`` (``retain_graph=True``) gives otherwise than the first, beyond a reordering of the
    same sums (:func:`rerun_mismatch`); None when they agree, or when a call raises (a crash's owner
    judges that)."""
    leaves = case.args()
    names = [r.name for r in case.recipes]
    wrt = [(n, leaf) for n, leaf in zip(names, leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    try:
        outputs = forward(case, leaves).outputs
        diff_outputs = [outputs[p] for p in differentiable_positions(outputs)]
        if not diff_outputs or not wrt:
            return None
        grad_outputs = case.grad_outputs(diff_outputs)
        tensors = [leaf for _, leaf in wrt]
        first = [g.detach().clone() if g is not None else None for g in gradients(diff_outputs, tensors, grad_outputs, retain_graph=True)]
        second = gradients(diff_outputs, tensors, grad_outputs)
    except Exception:
        return None
    for (name, _), one, two in zip(wrt, first, second, strict=True):
        if (one is None) != (two is None) or (one is not None and two is not None and rerun_mismatch(two, one, case.dtype) is not None):
            return f"grad[{name!r}]"
    return None


def rerun_mismatch(second: torch.Tensor, first: torch.Tensor, dtype: torch.dtype) -> str | None:
    """How a rerun of the same kernels that gave ``first`` differs in giving ``second``
    (``assert_close``'s report), or None where they are equal or differ only as a reordering of
    the same sums does (atomics); a clobbered buffer is O(1)."""
    if exactly_equal(second, first):
        return None
    rtol, atol = reordering_tolerance(dtype, first)
    try:
        torch.testing.assert_close(second.detach(), first, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as error:
        return str(error)
    return None


def read_outside(case: Case) -> Defect | None:
    """out_of_bounds' defect when ``case`` reads memory outside its tensors
    (:func:`conformance.engine.evaluate.reads_outside`) in contiguous layouts too; a strided tensor
    read as if it were contiguous is left to layouts (see :func:`undeclared_randomness`)."""
    # In contiguous layouts: a Function that copies a strided input first (.contiguous()) reads
    # past the copy, outside every margin, so its strided case shows only values that differ.
    label = reads_outside(case.in_contiguous_layouts())
    return None if label is None else read_outside_defect(case, label)


def blocked_by_reads_outside(case: Case) -> None:
    """Raise ``Blocked`` by out_of_bounds when ``case`` reads outside its tensors (:func:`read_outside`)."""
    defect = read_outside(case)
    if defect is not None:
        raise Blocked(defect, case)


def _reads_outside_strided_tensors(case: Case) -> bool:
    """Whether ``case``'s values differ between calls because of its strided layouts: they still
    differ when both calls start from the same RNG state (not random draws), while the same case in
    contiguous layouts gives the same values every time (also from successive RNG states, twice).
    Randomness that shows on some calls only (a draw that sometimes adds noise) stays determinism's."""
    plain = case.in_contiguous_layouts()
    if plain is case or _differs_from_itself(case, same_rng=True) is None:
        return False
    return all(_differs_from_itself(plain, same_rng=same) is None for same in (True, False, False))


def _differs_from_itself(case: Case, *, same_rng: bool = False) -> str | None:
    """What differs between two calls of ``case`` ("outputs[0]", "grad['x']"), or None;
    ``same_rng``: both calls start from the same states of torch's generators."""
    try:
        before = rng_states() if same_rng else None
        first = execute(case)
        if before is not None:
            after = rng_states()
            set_rng_states(before)
        second = execute(case)
        if before is not None:
            set_rng_states(after)
    except Exception:  # a call that raises is judged by whoever owns the crash
        return None
    pairs = [(f"outputs[{i}]", a, b) for i, (a, b) in enumerate(zip(first.outputs, second.outputs))]
    pairs += [(f"grad[{name!r}]", first.grads.get(name), second.grads.get(name)) for name in first.grads]
    for what, a, b in pairs:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and not same_bits(b, a):
            return what
    return None


def exactly_equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same shape, dtype, device and values (a NaN equals nothing): what every tolerance accepts,
    told in one torch call before a tolerance is computed and ``assert_close`` runs (~0.1 ms)."""
    if not (
        actual.shape == expected.shape and actual.dtype == expected.dtype and actual.device == expected.device
        and actual.layout == expected.layout == torch.strided and not actual.is_meta
    ):
        return False
    try:
        return torch.equal(actual.detach(), expected.detach())
    except (RuntimeError, NotImplementedError):  # a tensor type without aten::equal: assert_close's to judge
        return False


def float64_tolerance(spec: Spec) -> tuple[float, float] | None:
    """``(rtol, atol)`` the spec declares for float64 (``tolerances={torch.float64: {"rtol": ..,
    "atol": ..}}``, results approximate by design; an unnamed one is assert_close's default), or None."""
    declared = spec.tolerances.get(torch.float64, {})
    if not any(key in declared for key in FLOAT64_TOLERANCE_KEYS):
        return None
    return float(declared.get("rtol", 1e-7)), float(declared.get("atol", 1e-7))  # assert_close's float64 defaults


def compare_float64(
    actual: torch.Tensor, truth: torch.Tensor, *, what: str, where: str, spec: Spec | None = None,
    resampled: Sequence[tuple[torch.Tensor, torch.Tensor]] = (), k: float = 1.0, spread: Spread | None = None,
) -> Comparison | None:
    """The reference contract's float64 rule: ``torch.testing.assert_close`` with its defaults
    (the truth is the reference in float64 itself, so there is no reference error to scale), or
    with the tolerance ``spec`` declares for float64. ``resampled`` ((baseline, truth) pairs at
    inputs whose ties are broken, :func:`tie_breaking_cases`): where the truth jumps between
    them (a tied maximum's gradient), ``k`` times that jump is allowed on top, per element (after
    ``spread``, as in :func:`compare_budget`)."""
    if exactly_equal(actual.cpu(), truth.cpu()):
        return None
    declared = float64_tolerance(spec) if spec is not None else None
    rtol, atol = declared if declared is not None else (None, None)
    try:
        torch.testing.assert_close(
            actual.detach().cpu(), truth.detach().cpu(), rtol=rtol, atol=atol, equal_nan=True, check_dtype=False, check_stride=False
        )
    except AssertionError as error:
        rule = f"torch.testing.assert_close(rtol={rtol:g}, atol={atol:g}) as declared" if declared else "torch.testing.assert_close"
        if resampled:
            return _compare_float64_moved(actual, truth, resampled, k=k, spread=spread, tolerance=declared, rule=rule, what=what, where=where)
        return Comparison(f"{what} != reference [{where}, {rule}]", str(error))
    return None


def _compare_float64_moved(
    actual: torch.Tensor, truth: torch.Tensor, resampled: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
    k: float, spread: Spread | None, tolerance: tuple[float, float] | None, rule: str, what: str, where: str,
) -> Comparison | None:
    """:func:`compare_float64` with ``k`` times how far the truth moves over ``resampled`` allowed per element."""
    rtol, atol = tolerance if tolerance is not None else (FLOAT64_RTOL, FLOAT64_ATOL)
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    moved = truth_movement(truth64, resampled)
    moved = spread(moved) if spread is not None else moved
    both = torch.isfinite(actual64) & torch.isfinite(truth64)
    allowed = atol + rtol * truth64.abs() + k * moved
    excess = torch.where(both, (actual64 - truth64).abs() - allowed, torch.full_like(truth64, -math.inf))
    if bool((torch.isfinite(actual64) != torch.isfinite(truth64)).any()) or float(excess.max()) > 0:
        index = _index_of_max(excess)
        worst, local = float((actual64 - truth64).abs()[index]), float(moved[index])
        summary = (
            f"|{what} - reference|={worst:.6g} at {index}, but should be <= {rule}'s tolerance + {k:g} x {local:.6g} "
            f"(how far the truth moves there where ties between inputs break) = {float(allowed[index]):.6g} [{where}]"
        )
        return Comparison(summary, mismatch_report(actual64, truth64, allowed=float(allowed[index])))
    return None


def truth_movement(truth: torch.Tensor, resampled: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Per element, how far the float64 truth of each ``(baseline, truth)`` pair in ``resampled``
    is from ``truth`` (0 where none has its shape, and where either is not finite)."""
    truth64 = truth.detach().to("cpu", torch.float64)
    moved = torch.zeros_like(truth64)
    for _, other in resampled:
        other64 = other.detach().to("cpu", torch.float64)
        if other64.shape == truth64.shape:
            moved = torch.maximum(moved, _moved(truth64, other64))
    return moved


def _moved(truth64: torch.Tensor, other64: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``|other64 - truth64|`` (0 outside ``where``, and where either is not finite)."""
    moved = (other64 - truth64).abs()
    if where is not None:
        moved = torch.where(where, moved, torch.zeros_like(moved))
    return torch.nan_to_num(moved, nan=0.0, posinf=0.0)


PLAIN = (bool, int, float, str)  # the non-tensor values compare_plain compares


def plain_leaves(value: Any) -> bool:
    """Whether ``value`` holds a value :func:`compare_plain` compares (a number, a flag, a string,
    at any depth of tuples and lists)."""
    if isinstance(value, (tuple, list)):
        return any(plain_leaves(item) for item in value)
    return isinstance(value, PLAIN)


def compare_plain(
    actual: Any, truth: Any, baseline: Any, dtype: torch.dtype, *, k: float, what: str, where: str, floor_at: float = 0.0
) -> Comparison | None:
    """A non-tensor output (a count, a flag, a Python float from ``.item()``, a tuple of them)
    against the truth's: equal to the truth or to the baseline (the reference run in ``dtype``:
    a count of elements above a threshold may move with rounding); a float within ``k`` times the
    baseline's error plus :data:`FLOOR_ULPS` rounding steps of ``dtype`` at the larger of ``|truth|``
    and ``floor_at`` (the call's largest value, as for tensors); in float64 at least
    :func:`compare_float64`'s tolerance (a statistic computed in float32 passes). A reference's
    None, and values of other types (an object for the caller), are not compared."""
    if isinstance(truth, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(truth):
            return Comparison(f"{what}={actual!r}, but should be {truth!r} like the reference [{where}]", "")
        bases = baseline if isinstance(baseline, (tuple, list)) and len(baseline) == len(truth) else truth
        for i, (got, want, base) in enumerate(zip(actual, truth, bases)):
            found = compare_plain(got, want, base, dtype, k=k, what=f"{what}[{i}]", where=where, floor_at=floor_at)
            if found is not None:
                return found
        return None
    if not isinstance(truth, PLAIN):
        return None
    if not isinstance(actual, PLAIN):
        kind = "a tensor" if isinstance(actual, torch.Tensor) else f"a {type(actual).__name__}"
        return Comparison(f"{what}={kind}, but should be {truth!r} ({type(truth).__name__}) like the reference's [{where}]", "")
    if actual == truth or actual == baseline or (isinstance(truth, float) and math.isnan(truth) and actual != actual):
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (actual, truth))
    if isinstance(truth, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool) and _finite(truth) and _finite(actual):
        error = abs(baseline - truth) if isinstance(baseline, (int, float)) and _finite(baseline) else 0.0
        scale = max(abs(truth), floor_at)
        allowed = k * error + FLOOR_ULPS * ulp(scale, dtype if dtype.is_floating_point else torch.float64)
        if dtype == torch.float64:  # the float64 rule's own tolerance (torch.testing's defaults): a float32 statistic passes
            allowed = max(allowed, FLOAT64_ATOL + FLOAT64_RTOL * abs(truth))
        if abs(actual - truth) <= allowed:
            return None
    return Comparison(
        f"{what}={actual!r}, but should be {truth!r} [{where}, a non-tensor output: equal to the reference's"
        f"{'' if not numbers or not isinstance(truth, float) else ', or within its own error'}]",
        f"The reference in {str(dtype).removeprefix('torch.')} gives {baseline!r}.",
    )


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _nonfinite_mismatch(
    actual: torch.Tensor, truth: torch.Tensor, checked: torch.Tensor, baseline: torch.Tensor | None
) -> torch.Tensor:
    """Positions where the truth is checked but ``actual`` is not finite, the truth is NaN/inf and
    ``actual`` is finite, or ``actual`` is another non-finite value than the truth's -- unless
    plain PyTorch in the tested dtype (``baseline``) is another one there too: past float64's
    range the truth's own inf or NaN is an artifact as often as a definition (a float32 cumprod
    of 1e30s gives NaN where the float64 truth has -inf; a new user's correct one failed on that).
    A NaN where the truth and the baseline agree on -inf (a fully masked row's max-shift) fails."""
    bad_checked = checked & ~torch.isfinite(actual)
    nonfinite = ~torch.isfinite(truth)
    bad_finite = nonfinite & torch.isfinite(actual)
    other_kind = nonfinite & ~torch.isfinite(actual) & ~_same_value(actual, truth)
    if baseline is not None and baseline.shape == truth.shape:
        plain = baseline.detach().to("cpu", torch.float64)
        other_kind &= ~(~torch.isfinite(plain) & ~_same_value(plain, truth))
    return bad_checked | bad_finite | other_kind


def _same_value(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise equal, NaN equal to NaN."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _shown(actual: torch.Tensor, truth: torch.Tensor, checked: torch.Tensor) -> torch.Tensor:
    """``actual`` with unchecked representable-overflow positions replaced by the truth, so the
    mismatch report counts only what the contract checks."""
    ignored = ~checked & torch.isfinite(truth)
    return torch.where(ignored, truth, actual)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def compare_finiteness(
    actual: torch.Tensor,
    truth: torch.Tensor,
    dtype: torch.dtype,
    *,
    baseline: torch.Tensor | None = None,
    what: str,
    where: str,
    nonfinite_truth_excused: bool = False,
    overflowed: torch.Tensor | None = None,
) -> Comparison | None:
    """Non-finite values must sit exactly where the truth has them: finite wherever
    :func:`checked_positions` holds, the same NaN/+-inf where the truth is NaN/+-inf, unless
    ``baseline`` (plain PyTorch in ``dtype``) is another non-finite value there too, or
    ``nonfinite_truth_excused`` (any value where the truth is NaN); any non-finite value where
    ``overflowed`` (the truth's NaN/inf is float64's own overflow: the order of the arithmetic
    picks which one, sum(x * inf) is NaN where sum(x) * inf is -inf)."""
    if bool(torch.isfinite(actual).all()) and bool(torch.isfinite(truth).all()):
        return None  # the common case, with nothing non-finite to place (a tenth of the ops below)
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    checked = checked_positions(truth64, dtype, baseline)
    bad = _nonfinite_mismatch(actual64, truth64, checked, baseline)
    if dtype == torch.float64:
        # A float64 truth has no headroom over a float64 input: its NaN/inf is as likely its own
        # overflow (a variance of 1e300-sized values) as a definition. Only finiteness counts.
        bad = checked & ~torch.isfinite(actual64)
    elif nonfinite_truth_excused:
        bad &= ~torch.isnan(truth64)  # a formula's 0/0 at a row of zeros is no definition
    if overflowed is not None and overflowed.shape == bad.shape:
        bad &= ~(overflowed.to(bad.device) & ~torch.isfinite(actual64))
    if not bool(bad.any()):
        return None
    index = _first(bad)
    got, want = float(actual64[index]), float(truth64[index])
    count = int(bad.sum())
    if math.isfinite(want):
        summary = (
            f"{what}[{', '.join(map(str, index))}]={got}, but should be finite (float64 reference: {want:.6g}); "
            f"{count} of {bad.numel()} values non-finite where the reference is finite [{where}]"
        )
    else:
        summary = (
            f"{what}[{', '.join(map(str, index))}]={got}, but should be {want} like the float64 reference; "
            f"{count} of {bad.numel()} non-finite positions differ [{where}]"
        )
    details = finiteness_report(actual64, truth64, bad)
    return Comparison(summary, details, nonfinite=True)


@dataclasses.dataclass(frozen=True)
class BudgetParts:
    """What :func:`compare_budget`'s budget is made of, per value: where it checks, the
    reference's own error (on the case, and the largest over the case and ``resampled``), how far
    the truth moves per element (the sensitivity), the terms' largest bound and the floor (with
    its float32-accumulation share)."""

    checked: torch.Tensor
    baseline_error: float
    reference_error: float
    sensitivity: torch.Tensor
    terms_at: float
    accumulated: float
    floor: float


def budget_parts(
    truth: torch.Tensor, baseline: torch.Tensor, dtype: torch.dtype, *, resampled: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
    floor_at: float = 0.0, terms: torch.Tensor | None = None, accumulation: int = 0, steps: int = FLOOR_ULPS,
) -> BudgetParts:
    """The parts of :func:`compare_budget`'s budget for ``truth`` (see there)."""
    truth64 = truth.detach().to("cpu", torch.float64)
    baseline64 = baseline.detach().to("cpu", torch.float64)
    checked = checked_positions(truth64, dtype, baseline64)
    baseline_error = float(torch.where(checked, (baseline64 - truth64).abs(), torch.zeros_like(truth64)).max()) if truth64.numel() else 0.0
    reference_error = baseline_error
    # How far the float64 truth moves when the inputs move one rounding step (a condition
    # estimate, per element): any backward-stable algorithm may be that far off, however exact
    # the reference happens to be there (ill-conditioned cancellation, a step Jacobian whose
    # support moves, argmax ties).
    sensitivity = torch.zeros_like(truth64)
    for other, other_truth in resampled:
        other64 = other.detach().to("cpu", torch.float64)
        other_truth64 = other_truth.detach().to("cpu", torch.float64)
        if other64.shape == other_truth64.shape:
            ok = checked_positions(other_truth64, dtype, other64)
            diff = torch.where(ok, (other64 - other_truth64).abs(), torch.zeros_like(other_truth64))
            reference_error = max(reference_error, float(diff.max()) if diff.numel() else 0.0)
            if other_truth64.shape == truth64.shape:
                sensitivity = torch.maximum(sensitivity, _moved(truth64, other_truth64, checked & ok))
    terms_at = 0.0
    if terms is not None and terms.shape == truth64.shape:
        bounded = terms.detach().to("cpu", torch.float64)[checked]
        bounded = bounded[torch.isfinite(bounded)]
        terms_at = float(bounded.max()) if bounded.numel() else 0.0
    floor = max(rounding_floor(truth64, dtype, checked, steps), steps * ulp(max(floor_at, terms_at), dtype))
    accumulated = accumulation * FLOAT32_UNIT * terms_at
    return BudgetParts(checked, baseline_error, reference_error, sensitivity, terms_at, accumulated, floor + accumulated)


def compare_budget(
    actual: torch.Tensor,
    truth: torch.Tensor,
    baseline: torch.Tensor,
    dtype: torch.dtype,
    *,
    resampled: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
    floor_at: float = 0.0,
    terms: torch.Tensor | None = None,
    accumulation: int = 0,
    k: float,
    what: str,
    where: str,
    steps: int = FLOOR_ULPS,
    spread: Spread | None = None,
) -> Comparison | None:
    """``|actual - truth| <= k * max(reference_error, sensitivity) + floor`` at every checked
    position, after the non-finite positions match.

    ``sensitivity`` (per position, from ``resampled``): how far the float64 truth moves when the
    inputs move one rounding step of ``dtype`` -- a condition estimate. A backward-stable
    reformulation may be that far off where the reference happens to be exact (cancellation, a
    step Jacobian whose support moves with rounding, argmax ties); a missing scale or a wrong
    index is far beyond it. ``spread`` maps the per-element sensitivity before it is used (drawn
    ties: each tied element gets the largest of its group, which may split a gradient any way).

    ``reference_error`` is the largest of ``max|baseline - truth|`` (the reference run in
    ``dtype``) and the same error for each ``(baseline, truth)`` pair in ``resampled`` (the
    reference on neighbouring inputs, see :func:`neighbours`). One low-precision evaluation is a
    single sample of the rounding noise; for a few-element result whose terms cancel it can be far
    below what any other correct evaluation order gives (measured: a float32 scalar gradient
    summed over 60 terms, baseline error 0.14 ulp, a correct implementation 4 ulps).

    The floor is ``steps`` (default ``FLOOR_ULPS``; a spec's ``floor_ulps``) rounding steps at the larger of ``max|truth|`` and ``floor_at`` (the
    contract passes the largest |truth| over all outputs and gradients of the call): a result
    that is exactly 0 by cancellation (attention's grad_q with one key) is computed from terms as
    large as the call's other values, and a correct kernel leaves rounding noise of their size --
    and at the largest of ``terms`` (the truth's running error bound, :mod:`conformance.engine.terms`):
    a result made of larger terms that cancel (attention's dK with one key, a LayerNorm of a
    constant row) is computed by any other evaluation order with noise of the terms' size.

    Any float32 summation order is right too: a kernel that adds ``n`` terms one after the other
    (a loop over row blocks) may be ``(n - 1)`` float32 rounding steps of them off, which shows
    where they do not cancel (a constant grad_output). So ``accumulation`` (the longest chain of
    additions behind the truth, :mod:`conformance.engine.terms`) times float32's unit roundoff
    at the largest of ``terms`` is allowed on top: beyond a float16 rounding step only for
    thousands of terms, where a float16 accumulator is off by a step per term.
    """
    if _within_plain_budget(actual, truth, baseline, dtype, k=k, floor_at=floor_at, steps=steps):
        return None
    mismatch = compare_finiteness(actual, truth, dtype, baseline=baseline, what=what, where=where)
    if mismatch is not None:
        return mismatch
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    parts = budget_parts(truth64, baseline, dtype, resampled=resampled, floor_at=floor_at, terms=terms, accumulation=accumulation, steps=steps)
    checked = parts.checked
    if not bool(checked.any()):
        return None
    error = torch.where(checked, (actual64 - truth64).abs(), torch.zeros_like(truth64))
    baseline_error, reference_error = parts.baseline_error, parts.reference_error
    sensitivity = spread(parts.sensitivity) if spread is not None else parts.sensitivity
    terms_at, accumulated, floor = parts.terms_at, parts.accumulated, parts.floor
    scale = torch.clamp(sensitivity, min=reference_error)
    excess = torch.where(checked, error - (k * scale + floor), torch.full_like(error, -math.inf))
    if float(excess.max()) <= 0:
        return None
    index = _index_of_max(excess)
    worst, local = float(error[index]), float(scale[index])
    allowed = k * local + floor
    peak = float(truth64[checked].abs().max())
    dtype_name = str(dtype).removeprefix("torch.")
    own = (
        f"how far the float64 truth moves at {index} when the inputs move one rounding step in {dtype_name}"
        if local > reference_error else f"reference's own error in {dtype_name}"
    )
    summary = (
        f"max|{what} - reference|={worst:.6g} at {index}, but should be <= {k:g} x {local:.6g} "
        f"({own}) + {floor:.3g} ({steps} ulps at "
        f"{max(floor_at, terms_at, peak):.3g}, the largest of the call's max|reference| and the terms this value is "
        f"computed from{_accumulated_text(accumulated, accumulation)}) = {allowed:.6g} [{where}]"
    )
    details = mismatch_report(_shown(actual64, truth64, checked), truth64, allowed=allowed, baseline=baseline_error)
    if local > reference_error:  # budgets differ by element: the summary's is the furthest outside its own
        details += (
            f"\nThe summary's element {index} is the one furthest outside its own budget (per element: how far the "
            "truth moves there); the greatest difference above may sit where the truth moves more. "
            f"Allowed at {index}: {allowed:.6g}."
        )
    if resampled:
        details += (
            f"\nReference's own error, largest over {1 + len(resampled)} evaluations in "
            f"{str(dtype).removeprefix('torch.')} (neighbouring inputs): {reference_error:.6g}"
        )
    return Comparison(summary, details, what=what)


def _accumulated_text(accumulated: float, accumulation: int) -> str:
    if not accumulated:
        return ""
    return f", with {accumulated:.3g} for float32 sums of up to {accumulation + 1} terms in any order"


def _within_plain_budget(
    actual: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, dtype: torch.dtype, *, k: float, floor_at: float, steps: int,
) -> bool:
    """Whether :func:`compare_budget` accepts ``actual``, decided in a dozen ops for the common
    case: every value finite, the truth representable in ``dtype`` (so every position is checked),
    and ``max|actual - truth| <= k * max|baseline - truth| + steps ulps at max(max|truth|, floor_at)``.
    That budget is the full one without the resamples and term bounds, which only raise it, so a
    value within it is within the full budget; False means "not decided here", never a failure."""
    if actual.shape != truth.shape or baseline.shape != truth.shape or truth.numel() == 0:
        return False
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    baseline64 = baseline.detach().to("cpu", torch.float64)
    peak = float(truth64.abs().max())
    if not peak <= float(torch.finfo(dtype).max) or not bool(torch.isfinite(actual64 + baseline64).all()):
        return False  # a non-finite value or an unrepresentable truth: the full rule places them
    error = float((actual64 - truth64).abs().max())
    reference_error = float((baseline64 - truth64).abs().max())
    return error <= k * reference_error + steps * ulp(max(peak, floor_at), dtype)


def neighbours(value: Any, generator: torch.Generator, step_dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Two copies of a floating tensor, mirrored: each element moved to a random neighbour (one
    rounding step of ``step_dtype``, default its own dtype, down, none, or up) in the first and
    the opposite way in the second; other values, and infinite elements, are returned unchanged.

    Evaluating the reference in the tested dtype on such inputs gives more samples of its
    rounding error on the same problem. The mirror matters where the case sits on a kink of the
    truth (a support boundary, a tie, landed on exactly by a coarse dtype's grid): the truth jumps
    on one side only, and a mirrored pair sees both sides unless the step leaves the kink's
    margin unchanged.
    """
    if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
        return value, value
    # On the generator's device, whatever a Function left as the default device.
    step = (torch.randint(0, 3, value.shape, generator=generator, device=generator.device) - 1).to(value.device)
    return stepped(value, step, step_dtype)


def stepped(value: torch.Tensor, step: torch.Tensor, step_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``value`` with each element moved ``step`` (-1, 0 or 1) rounding steps of ``step_dtype``
    (default its own), and the mirror image; infinite elements stay."""
    base = value.detach()
    finite = torch.isfinite(base)  # an infinity (a -inf mask) stays what it is
    if step_dtype is None or step_dtype == base.dtype:
        up = torch.where(finite, torch.nextafter(base, torch.full_like(base, math.inf)), base)
        down = torch.where(finite, torch.nextafter(base, torch.full_like(base, -math.inf)), base)
    else:  # one step of a coarser grid, none where the grid overflows (an input above float16's max)
        grid = base.to(step_dtype)
        up_step = (torch.nextafter(grid, torch.full_like(grid, math.inf)) - grid).to(base.dtype)
        down_step = (torch.nextafter(grid, torch.full_like(grid, -math.inf)) - grid).to(base.dtype)
        up = torch.where(finite & torch.isfinite(up_step), base + up_step, base)
        down = torch.where(finite & torch.isfinite(down_step), base + down_step, base)
    moved = torch.where(step > 0, up, torch.where(step < 0, down, base))
    mirrored = torch.where(step < 0, up, torch.where(step > 0, down, base))
    return moved.clone().requires_grad_(value.requires_grad), mirrored.clone().requires_grad_(value.requires_grad)


# Mirrored pairs of neighbouring inputs per example and dtype (4 evaluations): the reference's
# own error sampled on them, and how far the truth moves (the sensitivity).
RESAMPLE_PAIRS = 2


def neighbouring_cases(
    case: Case, args: Sequence[Any], grad_outputs: Mapping[int, torch.Tensor], step_dtype: torch.dtype | None,
    label: str, *, pairs: int = RESAMPLE_PAIRS,
) -> Iterator[tuple[list[Any], dict[int, torch.Tensor]]]:
    """``pairs`` mirrored pairs of (args, grad_outputs), each moved by :func:`neighbours` (one
    rounding step of ``step_dtype``; None: each value's own dtype), seeded by the case and ``label``."""
    key = repr((case.grad_seed, [getattr(r, "seed", 0) for r in case.recipes], label))
    generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    for _ in range(pairs):
        arg_pairs = [neighbours(a, generator, step_dtype) for a in args]
        grad_pairs = {p: neighbours(g, generator, step_dtype) for p, g in grad_outputs.items()}
        for side in (0, 1):
            yield [pair[side] for pair in arg_pairs], {p: pair[side] for p, pair in grad_pairs.items()}


def tie_breaking_cases(
    args: Sequence[Any], grad_outputs: Mapping[int, torch.Tensor], step_dtype: torch.dtype | None,
) -> Iterator[tuple[list[Any], dict[int, torch.Tensor]]]:
    """Neighbouring inputs that break every tie between two inputs and between neighbouring
    elements of one: each floating input alone moved one rounding step up and down (x against a
    clamp bound, a margin's x - y), then moved up at even and down at odd flat positions and the
    mirror image (a running max's equal neighbours). The random steps of :func:`neighbouring_cases`
    leave a tie in place wherever two tied elements happen to move alike, and a coarse dtype's grid
    makes many ties (an ascending row against bounds in bfloat16): at a tie no gradient is right
    or wrong, and these show how far the truth jumps there."""
    for position, value in enumerate(args):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel()):
            continue
        parity = 1 - 2 * (torch.arange(value.numel(), device=value.device) % 2).reshape(value.shape)
        for step in (torch.ones_like(parity), parity):
            for moved in stepped(value, step, step_dtype):
                yield [moved if k == position else a for k, a in enumerate(args)], dict(grad_outputs)


def with_resamples(values: Sequence[Judged], resamples: Sequence[tuple[Evaluated, Evaluated]]) -> list[Judged]:
    """``values`` with the (baseline, truth) of each resample (:func:`neighbouring_cases`) under the same label."""
    labelled = [(_by_label(baseline), _by_label(truth)) for baseline, truth in resamples]
    judged = []
    for value in values:
        found = []
        for baseline, truth in labelled:
            b, t = baseline.get(value.what), truth.get(value.what)
            if isinstance(b, torch.Tensor) and isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(value.truth.shape):
                found.append((b, t))
        judged.append(dataclasses.replace(value, resampled=tuple(found)))
    return judged


def with_terms(values: Sequence[Judged], truth: Evaluated) -> list[Judged]:
    """``values`` with the term bounds (and chain of additions) of ``truth``, the same truth
    evaluated under :class:`TermMagnitudes`, under the same label (a value without one keeps its own)."""
    terms = {
        **{f"output[{position}]": bound for position, bound in truth.output_terms.items()},
        **{f"grad[{name!r}]": bound for name, bound in truth.grad_terms.items()},
    }
    return [
        dataclasses.replace(value, terms=bound, accumulation=truth.accumulation)
        if isinstance(bound := terms.get(value.what), torch.Tensor) and tuple(bound.shape) == tuple(value.truth.shape) else value
        for value in values
    ]


def _by_label(evaluated: Evaluated) -> dict[str, Any]:
    """Each output and gradient of ``evaluated`` under its :class:`Judged` label."""
    return {
        **{f"output[{position}]": output for position, output in enumerate(evaluated.outputs)},
        **{f"grad[{name!r}]": grad for name, grad in evaluated.grads.items()},
    }


def _index_of_max(values: torch.Tensor) -> tuple[int, ...]:
    flat = int(values.reshape(-1).argmax())
    index = []
    for size in reversed(values.shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


@dataclasses.dataclass(frozen=True)
class Judged:
    """One value a contract compares with the float64 truth: its label (``output[0]``,
    ``grad['x']``, ``tangent[0]``), which multiplier applies (``"output"``/``"grad"``), the value,
    the truth, the baseline (the reference in the tested dtype) and where it came from."""

    what: str
    which: str
    actual: torch.Tensor
    truth: torch.Tensor
    baseline: torch.Tensor
    where: str
    terms: torch.Tensor | None = None
    accumulation: int = 0  # the truth's longest chain of additions (compare_budget)
    # (baseline, truth) at neighbouring inputs (neighbouring_cases): the reference's own error
    # sampled there and how far the truth moves (compare_budget's ``resampled``)
    resampled: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()


def judge_against_truth(
    spec: Spec, dtype: torch.dtype, values: Sequence[Judged], *, floor_steps: int | None = None
) -> Comparison | None:
    """The first of ``values`` outside the reference policy (see the module docstring), or None;
    ``floor_steps``: the floor's rounding steps instead of the spec's (:func:`floor_ulps`).

    Shapes must match the truth's; the floor's scale is the largest |truth| of all of them (see
    :func:`compare_budget`). This is the reference contract's rule, for contracts that compare
    something else than plain eager results with the truth (compiled results, tangents, vmapped
    outputs, results under autocast)."""
    floor_at = max((largest_checked(value.truth.detach().to("cpu", torch.float64), dtype) for value in values), default=0.0)
    for value in values:
        if tuple(value.actual.shape) != tuple(value.truth.shape):
            return Comparison(
                f"{value.what}.shape={tuple(value.actual.shape)}, but should be {tuple(value.truth.shape)} like the "
                f"reference's [{value.where}]",
                "",
            )
        if not value.truth.is_floating_point():
            if not torch.equal(value.actual.detach().cpu(), value.truth.detach().cpu()):
                return Comparison(f"{value.what} differs from the reference (not floating point: compared exactly) [{value.where}]", "")
            continue
        if dtype == torch.float64:
            comparison = compare_float64(value.actual, value.truth, what=value.what, where=value.where, spec=spec)
            if comparison is not None:
                return comparison
            continue
        comparison = compare_budget(
            value.actual, value.truth, value.baseline, dtype, resampled=value.resampled, floor_at=floor_at, terms=value.terms,
            accumulation=value.accumulation, k=multiplier(spec, dtype, value.which), what=value.what, where=value.where,
            steps=floor_ulps(spec, dtype) if floor_steps is None else floor_steps,
        )
        if comparison is not None:
            return comparison
    return None


def judged_outputs(outputs: Sequence[Any], truth: Evaluated, baseline: Evaluated, where: str) -> list[Judged]:
    """Each tensor output against the truth's and the baseline's at its position (with the
    truth's term bounds, when measured); positions where any of the three is not a tensor are left out."""
    return [
        Judged(f"output[{position}]", "output", got, want, base, where, truth.output_terms.get(position), truth.accumulation)
        for position, (got, want, base) in enumerate(zip(outputs, truth.outputs, baseline.outputs))
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and isinstance(base, torch.Tensor)
    ]


def judged_grads(
    found: Mapping[str, torch.Tensor | None], truth: Evaluated, baseline: Evaluated, args: Sequence[Any],
    names: Sequence[str], where: Callable[[str], str],
) -> list[Judged]:
    """Each gradient in ``found`` against the truth's and the baseline's; a missing gradient (the
    Function's, the reference's or the baseline's) is zero, as the reference contract counts it."""
    values = []
    for name, got in found.items():
        arg = args[list(names).index(name)]
        want, base = truth.grads.get(name), baseline.grads.get(name)
        values.append(Judged(
            f"grad[{name!r}]", "grad", torch.zeros_like(arg) if got is None else got,
            torch.zeros(arg.shape, dtype=torch.float64) if want is None else want,
            torch.zeros_like(arg) if base is None else base, where(name), truth.grad_terms.get(name), truth.accumulation,
        ))
    return values


# ----------------------------------------------------------------------------- the same kernels, reordered


@dataclasses.dataclass(frozen=True)
class Reordering:
    """How far two evaluations of the same computation may differ in one dtype when only the order
    of accumulation can differ.

    ``relative``: relative to max|expected| (scaled by it): a rerun of the same graph (inplace), a
    backward through other requires_grad subsets (needs_input_grad) or with zero grad_outputs
    for unused outputs (undefined_grads) -- a few hundred rounding steps of reordering, nothing a
    real bug produces. ``steps``: rounding steps of the dtype at the largest magnitude involved,
    for the same values in another memory layout (layouts): two summation orders of the same
    terms differ by a few steps of the terms' magnitude, a layout bug by O(1). float64 and
    float32 results pass through chains of reductions whose roundings add up (a correct
    BatchNorm's zero gradient differed by 17 float64 steps between two layouts, measured);
    float16/bfloat16 round an fp32 accumulation once per op.
    """

    relative: float
    steps: int


REORDERING: dict[torch.dtype, Reordering] = {
    torch.float64: Reordering(1e-7, 256),
    torch.float32: Reordering(1e-4, 32),
    torch.float16: Reordering(1e-2, 16),
    torch.bfloat16: Reordering(5e-2, 16),
}
OTHER_DTYPES = Reordering(1e-4, 16)


def largest_magnitude(tensors: Iterable[Any]) -> float:
    """The largest finite |value| among the floating tensors in ``tensors`` (0 without any)."""
    largest = 0.0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
            finite = tensor.detach()[torch.isfinite(tensor.detach())]
            if finite.numel():
                largest = max(largest, float(finite.abs().max()))
    return largest


def reordering_tolerance(dtype: torch.dtype, expected: torch.Tensor) -> tuple[float, float]:
    """``(rtol, atol)`` for the same computation reordered in ``dtype``: :attr:`Reordering.relative`,
    and the same relative to max|expected| (finite values; 1 when all are 0)."""
    rtol = REORDERING.get(dtype, OTHER_DTYPES).relative
    finite = expected.detach()[torch.isfinite(expected.detach())]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return rtol, rtol * (scale if scale > 0.0 else 1.0)


def layout_tolerance(expected: torch.Tensor, scale: float, noise: float = 0.0) -> tuple[float, float]:
    """``(rtol, atol)`` for the same values in another memory layout: :attr:`Reordering.steps`
    rounding steps relative to each element, and at the larger of ``scale`` (the magnitudes of
    the inputs, and grad_outputs for gradients) and max|expected| -- or at ``noise`` (the
    reference's own rounding error in this dtype) when larger. Exact for non-floating results."""
    if not expected.is_floating_point():
        return 0.0, 0.0  # indices, masks: exactly equal
    finfo = torch.finfo(expected.dtype)
    steps = REORDERING.get(expected.dtype, OTHER_DTYPES).steps
    atol = steps * max(finfo.eps * max(scale, largest_magnitude([expected])), noise) + finfo.tiny
    return steps * finfo.eps, atol


def tie_dim(got: torch.Tensor, want: torch.Tensor, values: Sequence[Any]) -> int | None:
    """The dim along which two different integer index outputs pick equal values from one of the
    floating tensors in ``values`` (ties: ``argsort``, ``topk`` and ``max(dim)`` may break them in
    any order), else None.

    ``got`` indexes a tensor ``x`` along dim d when it has ``x``'s shape except along d (any size
    there, 1 for a ``keepdim`` reduction) or ``x``'s shape without d (a reduction's indices), and
    every entry is a valid index there; then ``x.gather(d, got) == x.gather(d, want)`` everywhere
    is a tie order, not a different answer."""
    if got.shape != want.shape or got.dtype != want.dtype or got.is_floating_point() or got.dtype == torch.bool:
        return None
    a, b = got.detach().cpu().long(), want.detach().cpu().long()
    for x in values:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim == 0 or x.ndim not in (a.ndim, a.ndim + 1):
            continue
        x = x.detach().cpu()
        for dim in range(x.ndim):
            along_a, along_b = (a, b) if x.ndim == a.ndim else (a.unsqueeze(dim), b.unsqueeze(dim))
            if any(n != m for k, (n, m) in enumerate(zip(along_a.shape, x.shape)) if k != dim):
                continue
            size = x.shape[dim]
            if bool(((along_a < 0) | (along_a >= size) | (along_b < 0) | (along_b >= size)).any()):
                continue
            if torch.equal(x.gather(dim, along_a), x.gather(dim, along_b)):
                return dim
    return None
