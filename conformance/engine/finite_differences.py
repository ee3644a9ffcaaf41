"""Finite-difference settings shared by the gradcheck, gradgradcheck and forward_ad contracts
(and the benchmarks that price them), and the location of a Jacobian mismatch for their reports."""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import gradients, run_reference
from conformance.engine.harness import fixed_rng
from conformance.engine.torch_text import gradcheck_not_reentrant, without_slow_mode_jacobians
from strategies.cases import Case

__all__ = [
    "FAST_ATOL",
    "FAST_RTOL",
    "FD_EPS",
    "FD_SPACING",
    "GRADCHECK_FAST_MODE_ELEMENTS",
    "LOCATED_JACOBIAN_CALLS",
    "NONDET_TOL",
    "SLOW_ATOL",
    "SLOW_RTOL",
    "SURROGATE_ATOL",
    "SURROGATE_RTOL",
    "FirstDerivatives",
    "JacobianMismatch",
    "blocked_by_wrong_surrogate_gradients",
    "check_first_derivatives",
    "jacobian_mismatch",
    "resolving_steps",
    "surrogate_mismatch",
    "unresolvable_outputs",
]

# The finite-difference step of gradcheck/gradgradcheck (torch's default), and how far apart the
# values drawn for them are kept -- from each other and from declared kinks: 100 steps, so that
# no central difference (which moves an element, or the difference of two, by at most 2 steps in
# fast mode) straddles a tie or a kink (see strategies.values.spread).
FD_EPS = 1e-6
FD_SPACING = 100 * FD_EPS

# Declared-nondeterministic backward: allowed difference between two backward calls (float64),
# for gradcheck's and gradgradcheck's reentrancy check.
NONDET_TOL = 1e-10

# gradcheck (and forward_ad's float64 gradcheck) uses fast mode above this many input plus output
# elements. Fast mode scales atol by sum(u) * sum(v), so the default atol=1e-5 lets a backward
# that is 5% off pass on a few thousand elements (measured: tests/test_gradcheck_tolerance.py):
# it gets FAST_ATOL instead.
GRADCHECK_FAST_MODE_ELEMENTS = 256
SLOW_ATOL, SLOW_RTOL = 1e-5, 1e-3
FAST_ATOL, FAST_RTOL = 1e-8, 1e-3


_FULL_PRECISION = (torch.float64, torch.complex128)


def unresolvable_outputs(outputs: Sequence[Any]) -> str | None:
    """Why finite differences in float64 cannot check these outputs of a float64 call, or None.

    A differentiable output of lower precision (a Function that returns float32 whatever its
    input's dtype) rounds away a step of ``FD_EPS``: the central difference of ``x.float()`` at a
    float64 ``x`` is 0.9984 where the derivative is 1; so does a float64 output holding float32
    values (forward computes in float32 and casts back), where gradcheck's report would blame
    backward for "a constant factor". Its gradients are the reference contract's to judge,
    against the float64 truth."""
    coarse = []
    for position, output in enumerate(outputs):
        if not (isinstance(output, torch.Tensor) and output.requires_grad):
            continue
        if output.dtype not in _FULL_PRECISION:
            coarse.append(f"output[{position}] is {str(output.dtype).removeprefix('torch.')}")
        elif _float32_values(output):
            coarse.append(f"output[{position}] holds float32 values (forward computes in float32 and casts back)")
    if not coarse:
        return None
    return (
        f"{', '.join(coarse)} for float64 inputs: finite differences (eps={FD_EPS:g}) cannot resolve a "
        "lower-precision output; the reference contract compares the gradients with the float64 truth"
    )


def _float32_values(output: torch.Tensor) -> bool:
    """Whether a float64 output is float32 arithmetic cast back: every element a float32 number,
    and one of them neither an integer nor a bfloat16 number (a float64 computation on the
    suite's full-precision inputs gives such a value with probability ~2^-29 per element; zeros,
    signs, counts and halves are left alone)."""
    if output.dtype != torch.float64 or not output.numel():
        return False
    values = output.detach()
    finite = values[torch.isfinite(values)]
    if not finite.numel() or not bool((finite == finite.float().double()).all()):
        return False
    fine = (finite != finite.round()) & (finite != finite.bfloat16().double())
    return bool(fine.any())


# A failing gradcheck's report locates the worst Jacobian entry of an (output, input) pair that
# takes at most this many calls (a backward per output element, two forwards per input element;
# torch's own slow-mode message costs as many): a row of 257 elements takes 771.
LOCATED_JACOBIAN_CALLS = 1024


@dataclass(frozen=True)
class JacobianMismatch:
    """Where an analytical Jacobian (from backward) differs from the central differences: the
    entry furthest outside ``atol + rtol * |numerical|``, how many are outside, and a pattern."""

    output: int
    input: int
    at_output: tuple[int, ...]
    at_input: tuple[int, ...]
    analytical: float
    numerical: float
    count: int
    total: int
    pattern: str
    row: str  # the worst entry's row (d output[...] / d input), both ways, near its column

    def entry(self, output_name: str, input_name: str) -> str:
        out_at = f"[{', '.join(map(str, self.at_output))}]" if self.at_output else ""
        in_at = f"[{', '.join(map(str, self.at_input))}]" if self.at_input else ""
        differ = f"{self.count} of {self.total} entries differ"
        if not math.isfinite(self.numerical):
            return (
                f"d {output_name}{out_at} / d {input_name}{in_at}={self.analytical:.6g}, and the numerical derivative "
                f"is {self.numerical:.6g}: {output_name} is not finite near these inputs; {differ}"
            )
        return (
            f"d {output_name}{out_at} / d {input_name}{in_at}={self.analytical:.6g}, but should be "
            f"{self.numerical:.6g} (numerical); {differ}"
        )

    def details(self, output_name: str, input_name: str, check: str, *, with_pattern: bool = True) -> tuple[str, ...]:
        """The report's lines after its summary: the pattern (unless a named cause says more), the
        worst entry's row, and where the full Jacobians are."""
        return (
            *((self.pattern,) if self.pattern and with_pattern else ()),
            f"The worst entry's row: {self.row}.",
            f"Rows are the elements of {output_name}, columns those of {input_name}, flattened; {check}(fn, inputs, "
            "eps=1e-6) prints both Jacobians in full.",
        )


# Central differences at a step h carry the rounding of the two calls, about u * |f| / h per entry
# (u: float64's unit roundoff); a call's own arithmetic adds more, hence the safety factor.
_ROUNDOFF = torch.finfo(torch.float64).eps / 2
ROUNDING_SAFETY = 16
LARGEST_STEP = 1e-2


def resolving_steps(outputs: Sequence[Any], atol: float) -> tuple[float, ...]:
    """Larger finite-difference steps, 10x apart up to LARGEST_STEP, for outputs so large that
    central differences at FD_EPS cannot resolve ``atol``: their rounding alone exceeds it (a loss
    of 1e9 has ~0.1 of noise at 1e-6, where gradcheck then blames a correct backward by "a
    constant factor"). Empty where FD_EPS resolves them. A mismatch found at FD_EPS is checked
    again at these steps only: a correct backward passes at one, a derivative wrong by more than
    that noise fails at all of them (and the first report stands)."""
    floating = [o for o in _differentiable(outputs) if o.is_floating_point() and o.numel()]
    largest = max((float(o.detach().abs().max()) for o in floating), default=0.0)
    noise = ROUNDING_SAFETY * _ROUNDOFF * largest / FD_EPS
    if not math.isfinite(noise) or noise <= atol:
        return ()
    steps, step = [], FD_EPS
    while step * 10 <= LARGEST_STEP * (1 + 1e-9) and ROUNDING_SAFETY * _ROUNDOFF * largest / step > atol:
        step *= 10
        steps.append(step)
    return tuple(steps)


@dataclass(frozen=True)
class FirstDerivatives:
    """The gradcheck contract's verdict on one case's first derivatives: its settings and what
    torch.autograd.gradcheck raised (None: right)."""

    fast: bool
    atol: float
    rtol: float
    nondet_tol: float
    error: GradcheckError | None


def check_first_derivatives(
    call: Callable[..., Sequence[Any]], wrt: Sequence[torch.Tensor], outputs: Sequence[Any], *, fast: bool,
    nondeterministic: bool, brief: bool,
) -> FirstDerivatives:
    """``torch.autograd.gradcheck`` in float64 by the gradcheck contract's rules (shared with
    gradgradcheck, which blames gradcheck only where they fail): fast mode when ``fast`` or past
    GRADCHECK_FAST_MODE_ELEMENTS; two backward calls that differ by rounding only judged at
    NONDET_TOL (the determinism contract's finding); outputs so large that central differences are
    mostly rounding checked again at :func:`resolving_steps`, and any mismatch once more at a step
    ten times smaller (a stiff function's curvature). ``brief``: without torch's slow-mode
    recomputation for its message."""
    wrt = tuple(wrt)
    numel = sum(t.numel() for t in wrt) + sum(o.numel() for o in outputs if isinstance(o, torch.Tensor))
    fast = fast or numel > GRADCHECK_FAST_MODE_ELEMENTS
    atol, rtol = (FAST_ATOL, FAST_RTOL) if fast else (SLOW_ATOL, SLOW_RTOL)
    nondet_tol = NONDET_TOL if nondeterministic else 0.0
    error = _gradcheck_error(call, wrt, atol, rtol, fast, nondet_tol, brief=brief)
    if error is not None and nondet_tol == 0.0 and gradcheck_not_reentrant(str(error)):
        nondet_tol = NONDET_TOL
        error = _gradcheck_error(call, wrt, atol, rtol, fast, nondet_tol, brief=brief)
    if error is not None and not gradcheck_not_reentrant(str(error)):
        # A stiff function (an RNN over many steps) curves too fast for central differences at
        # FD_EPS (measured: -125.18 at 1e-6, -124.986 at 1e-7, analytical -124.983): one step
        # FD_EPS / 10 as well, where a wrong derivative still differs.
        steps = (*resolving_steps(outputs, atol), FD_EPS / 10)
        if any(_gradcheck_error(call, wrt, atol, rtol, fast, nondet_tol, brief=True, eps=step) is None for step in steps):
            error = None
    return FirstDerivatives(fast, atol, rtol, nondet_tol, error)


def blocked_by_wrong_first_derivatives(
    case: Case, call: Callable[..., Sequence[Any]], wrt: Sequence[torch.Tensor], *, found: str = ""
) -> None:
    """One defect, one failure: raise ``Blocked`` by gradcheck where backward is wrong on ``case``
    by the gradcheck contract's own rules (:func:`check_first_derivatives`, float64): a contract
    that finds the same wrong gradient another way (finite differences of it, a reference's
    gradient) finds gradcheck's defect. Not for a surrogate spec, whose backward is not forward's
    derivative; nothing is blocked where that check cannot run here (``wrt`` not float64, outputs
    finite differences cannot resolve (:func:`unresolvable_outputs`), torch's check itself raising). A gradcheck test that misses it on its own examples passes, and the
    session then turns the blocked test into the defect's failure (``report_unowned_defects``).
    ``found``: what the caller found, named in the blocked line."""
    spec = case.spec
    if spec.surrogate is not None or not wrt or any(t.dtype != torch.float64 for t in wrt):
        return
    inputs = tuple(t.detach().clone().requires_grad_() for t in wrt)
    try:
        with fixed_rng(zlib.crc32(repr((case.grad_seed, "first derivatives")).encode()), case.device):
            outputs = call(*inputs)
            if unresolvable_outputs(outputs) is not None:
                return
            checked = check_first_derivatives(
                call, inputs, outputs, fast=spec.fast_gradcheck, nondeterministic=spec.nondeterministic, brief=True
            )
    except Exception:  # torch's check itself raised (an undefined grad_output backward cannot take): not gradcheck's verdict
        return
    if checked.error is not None:
        first = next((line.strip() for line in str(checked.error).splitlines() if line.strip()), "")
        where = f"torch.autograd.gradcheck, float64, {'fast' if checked.fast else 'slow'} mode, atol={checked.atol}, rtol={checked.rtol}"
        summary = f"{found}; finite differences in float64 reject it too" if found else "first derivatives are already wrong on this case"
        raise Blocked(Defect("gradcheck", summary, (f"{first} [{where}]",)), case)


# gradcheck's rule for a surrogate spec: its float64 gradient against the surrogate's autograd gradient.
SURROGATE_ATOL, SURROGATE_RTOL = 1e-7, 1e-5


def surrogate_mismatch(grads: Mapping[str, torch.Tensor | None], expected: Mapping[str, torch.Tensor | None]) -> tuple[str, str] | None:
    """(summary, details) of the first of ``grads`` (float64) that differs from the surrogate's
    (``expected``) by gradcheck's rule for a surrogate spec, or None; a None gradient and zeros
    are the same gradient (an input the output ignores may get either)."""
    for name, grad in grads.items():
        want = expected.get(name)
        if want is None or grad is None:
            other = grad if want is None else want
            if other is not None and bool(other.ne(0).any()):
                got, should = ("None", "the surrogate's nonzero gradient") if grad is None else ("a nonzero tensor", "zero (the surrogate's is None)")
                return f"grad[{name!r}]={got}, but should be {should} [float64, autograd gradient of the declared surrogate]", ""
            continue
        if grad.shape == want.shape and grad.dtype == want.dtype and torch.equal(grad.detach(), want.detach()):
            continue
        try:
            torch.testing.assert_close(grad, want, atol=SURROGATE_ATOL, rtol=SURROGATE_RTOL)
        except AssertionError as error:
            return f"grad[{name!r}] != autograd gradient of the declared surrogate [float64]", str(error)
    return None


def blocked_by_wrong_surrogate_gradients(
    case: Case, grads: Mapping[str, torch.Tensor | None], grad_outputs: Sequence[torch.Tensor], *, found: str = "",
) -> None:
    """One defect, one failure for a surrogate spec: raise ``Blocked`` by gradcheck where
    ``grads`` (the Function's, on the float64 ``case`` with ``grad_outputs``) differ from the
    surrogate's by gradcheck's own rule (:func:`surrogate_mismatch`)."""
    surrogate = case.spec.surrogate
    if surrogate is None:
        return
    try:
        _, expected = run_reference(surrogate, case, dtype=torch.float64, device=case.device, grad_outputs_from=grad_outputs)
    except Exception:  # the surrogate's own error is the spec's, reported where it is run
        return
    mismatch = surrogate_mismatch(grads, expected)
    if mismatch is not None:
        summary = f"{found}; the float64 gradient differs from the surrogate's too" if found else "gradients already differ from the surrogate's on this case"
        raise Blocked(Defect("gradcheck", summary, (mismatch[0],)), case)


def _gradcheck_error(
    call: Callable[..., Sequence[Any]], wrt: tuple[torch.Tensor, ...], atol: float, rtol: float, fast: bool, nondet_tol: float,
    *, brief: bool, eps: float = FD_EPS,
) -> GradcheckError | None:
    try:
        with without_slow_mode_jacobians() if brief and fast else contextlib.nullcontext():
            torch.autograd.gradcheck(call, wrt, eps=eps, atol=atol, rtol=rtol, fast_mode=fast, nondet_tol=nondet_tol)
    except GradcheckError as error:
        return error
    return None


def jacobian_mismatch(
    call: Callable[..., Sequence[Any]], wrt: Sequence[torch.Tensor], *, atol: float, rtol: float,
    pair: tuple[int, int] | None = None,
) -> JacobianMismatch | None:
    """The first (output, input) pair -- ``pair`` when given, as torch's message named it -- whose
    analytical Jacobian (one backward per output element, like gradcheck's slow mode) differs from
    central differences at ``FD_EPS``, located; None when none differs here or a pair is too large
    (``LOCATED_JACOBIAN_CALLS``) or complex. Only for a failure's report: it calls ``call``
    twice per input element."""
    if any(t.is_complex() for t in wrt):
        return None
    try:
        return _first_located(call, wrt, atol, rtol, pair)
    except Exception:  # a Function that cannot repeat its backward this way: torch's own message is reported
        return None


def _first_located(
    call: Callable[..., Sequence[Any]], wrt: Sequence[torch.Tensor], atol: float, rtol: float, pair: tuple[int, int] | None
) -> JacobianMismatch | None:
    inputs = [t.detach().clone().requires_grad_() for t in wrt]
    outputs = _differentiable(call(*inputs))
    pairs = [pair] if pair is not None else [(o, i) for o in range(len(outputs)) for i in range(len(inputs))]
    for output_index, input_index in pairs:
        if output_index >= len(outputs) or input_index >= len(inputs):
            continue
        output, source = outputs[output_index], inputs[input_index]
        if output.is_complex() or output.numel() + 2 * source.numel() > LOCATED_JACOBIAN_CALLS:
            continue
        analytical = _analytical_jacobian(output, source)
        numerical = _numerical_jacobian(call, wrt, output_index, input_index)
        found = _located(analytical, numerical, output, source, output_index, input_index, atol, rtol)
        if found is not None:
            return found
    return None


def _differentiable(outputs: Sequence[Any]) -> list[torch.Tensor]:
    """The outputs torch's gradcheck numbers ("output 0"): the tensors that require grad."""
    return [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]


def _analytical_jacobian(output: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    rows = torch.zeros(output.numel(), source.numel(), dtype=torch.float64)
    for k in range(output.numel()):
        one_hot = torch.zeros(output.numel(), dtype=output.dtype, device=output.device)
        one_hot[k] = 1
        (grad,) = gradients([output], [source], [one_hot.view_as(output)], retain_graph=True)
        if grad is not None:
            rows[k] = grad.detach().reshape(-1).to("cpu", torch.float64)
    return rows


def _numerical_jacobian(call: Callable[..., Sequence[Any]], wrt: Sequence[torch.Tensor], output_index: int, input_index: int) -> torch.Tensor:
    # Grad mode stays on and the inputs require grad, as for the analytical side: a function of
    # first derivatives (gradgradcheck's) runs backward inside, and the same outputs require grad.
    def output_at(moved: torch.Tensor) -> torch.Tensor:
        args = [t.detach().requires_grad_() for t in wrt]
        args[input_index] = moved.requires_grad_()
        return _differentiable(call(*args))[output_index].detach().reshape(-1).to("cpu", torch.float64)

    base = wrt[input_index].detach()
    columns = []
    for j in range(base.numel()):
        plus, minus = base.clone(), base.clone()
        plus.view(-1)[j] += FD_EPS
        minus.view(-1)[j] -= FD_EPS
        columns.append((output_at(plus) - output_at(minus)) / (2 * FD_EPS))
    return torch.stack(columns, dim=1)


def _located(
    analytical: torch.Tensor, numerical: torch.Tensor, output: torch.Tensor, source: torch.Tensor,
    output_index: int, input_index: int, atol: float, rtol: float,
) -> JacobianMismatch | None:
    excess = (analytical - numerical).abs() - (atol + rtol * numerical.abs())
    excess = torch.where(excess.isnan(), torch.inf, excess)  # a NaN differs from everything, as in gradcheck
    outside = excess > 0
    if not bool(outside.any()):
        return None
    k, j = divmod(int(excess.reshape(-1).argmax()), source.numel())
    return JacobianMismatch(
        output=output_index, input=input_index,
        at_output=_unravel(k, output.shape), at_input=_unravel(j, source.shape),
        analytical=float(analytical[k, j]), numerical=float(numerical[k, j]),
        count=int(outside.sum()), total=outside.numel(),
        pattern=_pattern(analytical[outside], numerical[outside], atol),
        row=_row(analytical[k], numerical[k], j),
    )


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))) if len(shape) else ()


def _pattern(analytical: torch.Tensor, numerical: torch.Tensor, atol: float) -> str:
    """What the differing entries have in common, when it is one of the shapes a backward bug takes."""
    if not bool(numerical.isfinite().all()):
        return "the numerical derivatives are not all finite: forward returns inf or NaN near these inputs"
    if not bool(analytical.isfinite().all()):
        return "backward gives non-finite derivatives where the numerical ones are finite"
    if bool((numerical.abs() <= atol).all()):
        return "at every differing entry the numerical derivative is 0: backward gives gradient to elements the output does not depend on"
    if bool((analytical.abs() <= atol).all()):
        return "at every differing entry the analytical derivative is 0: backward leaves out elements the output depends on"
    both = (analytical.abs() > atol) & (numerical.abs() > atol)
    if not bool(both.all()):
        return ""
    ratio, gap = analytical / numerical, analytical - numerical
    same_ratio = float((ratio - ratio[0]).abs().max()) <= 1e-3 * abs(float(ratio[0]))
    same_gap = float((gap - gap[0]).abs().max()) <= 1e-3 * abs(float(gap[0]))
    # Where every differing entry has the same numerical value, a constant ratio and a constant
    # difference are the same observation: it cannot tell a factor from a term.
    distinct = float((numerical - numerical[0]).abs().max()) > 1e-3 * abs(float(numerical[0]))
    if same_ratio and distinct:
        return f"analytical = {float(ratio[0]):.6g} x numerical at every differing entry: a missing or extra factor"
    if same_gap and distinct:
        return f"analytical - numerical = {float(gap[0]):.6g} at every differing entry: a missing or extra term"
    if same_ratio:
        return (
            f"analytical = {float(ratio[0]):.6g} x numerical (analytical - numerical = {float(gap[0]):.6g}) at every "
            "differing entry, each the same derivative: a missing or extra factor or term"
        )
    return ""


def _row(analytical: torch.Tensor, numerical: torch.Tensor, column: int, width: int = 8) -> str:
    start = max(0, min(column - width // 2, analytical.numel() - width))
    stop = min(analytical.numel(), start + width)
    where = f"columns {start}-{stop - 1} of {analytical.numel()}" if stop - start < analytical.numel() else "all columns"
    return f"({where}) analytical [{_values(analytical[start:stop])}], numerical [{_values(numerical[start:stop])}]"


def _values(row: torch.Tensor) -> str:
    return ", ".join(f"{float(v):.4g}" for v in row)
