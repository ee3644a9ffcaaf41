"""Contract gradgradcheck: second derivatives are right, or double backward refuses to run.

* ``double_backward=True`` (the default): ``torch.autograd.gradgradcheck`` in float64 on generated
  shapes -- the derivative of backward (with respect to the inputs and to grad_output) against
  finite differences of backward. Above ``FAST_MODE_ELEMENTS`` it uses fast mode with
  ``FAST_ATOL``: fast mode scales atol by sum(u) * sum(v), so the default atol=1e-5 would let a
  visibly wrong second derivative through (see test_gradcheck.py).
* ``double_backward=False``: differentiating the gradient should RAISE, which is what
  ``@once_differentiable`` does (or backward itself under ``create_graph=True``, where it runs
  without). A gradient that silently detaches (backward under ``no_grad``,
  ``.detach()``; also tried at grad_output all ones, what ``loss.backward()`` passes, where a fast
  path may return a gradient computed in forward) or a double backward that silently runs with
  wrong numbers (gradgradcheck in float64; without float64, against the reference's double
  backward by the reference contract's rule) fails: a gradient penalty built on it trains with a
  wrong or missing term and nobody is told. A double backward that runs and is right is advice: declare it, or add
  ``@once_differentiable``.

Surrogate (straight-through) specs are checked exactly like the others. gradgradcheck never
looks at the forward's true derivative: it differentiates backward itself, i.e. the surrogate
gradient, numerically. The gradcheck contract ties first derivatives to the surrogate; together
they tie second derivatives to the surrogate's second derivative.

Functions declared ``nondeterministic=True`` are called with torch's RNG re-seeded identically
before every forward, so finite differences compare calls that drew the same noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

from conformance.engine.contract import Requirement, contract
from conformance.engine.defects import Blocked, Crash
from conformance.engine.evaluate import (
    backward_every_leaf,
    blocked_by_undeclared_writes,
    blocked_by_unversioned_saves,
    function_of_tensors,
    gradients,
    recorded_function_of_tensors,
    reference_double_backward,
    reference_of_tensors,
)
from conformance.engine.finite_differences import (
    FD_EPS,
    FD_SPACING,
    NONDET_TOL,
    blocked_by_wrong_first_derivatives,
    jacobian_mismatch,
    unresolvable_outputs,
)
from conformance.engine.harness import fixed_rng
from conformance.engine.numerics import Judged, judge_against_truth, neighbouring_cases, truth_and_baseline
from conformance.engine.probe import Recorder
from conformance.engine.report import ContractFailure, advise, fail, suite_frame, user_frames
from conformance.engine.runner import Target
from conformance.engine.torch_text import (
    is_once_differentiable_node,
    jacobian_pair,
    raised_by_once_differentiable,
    without_slow_mode_jacobians,
)
from conformance.engine.triton_interpreter import InterpreterLimit, interpreter_limit
from strategies.cases import Case, CaseOptions

FAST_MODE_ELEMENTS = 24  # slow mode costs ~3 double-backward passes per element: keep it for tiny cases
SLOW_ATOL, SLOW_RTOL = 1e-5, 1e-3
FAST_ATOL, FAST_RTOL = 1e-8, 1e-3
# Per-input element budget: gradgradcheck's slow mode costs two forward+backward passes per
# element of every input *and* grad_output, so keep cases small.
MAX_ELEMENTS = 48

CAUSE_DETACHED = (
    "backward's result does not depend on {wrt} through the autograd graph. Usual causes: a tensor "
    "computed in forward and saved with ctx.save_for_backward (forward runs without a graph, so it "
    "is a constant to double backward: recompute it in backward from the saved inputs, or return "
    "it as an output), or .detach()/.data/.item()/numpy/a no_grad block inside backward."
)
CAUSE_NOT_ATTACHED = (
    "grad[{name!r}] is not attached to the autograd graph even with create_graph=True: backward "
    "ran under torch.no_grad(), detached its result, or computed it outside autograd (numpy, "
    ".data, a raw kernel)."
)
CAUSE_ONCE = (
    "backward is decorated with @once_differentiable, but the spec declares double_backward=True. "
    "Note that torch.autograd.grad(..., inputs=...) silently returns None through a "
    "@once_differentiable backward instead of raising; only .backward() raises."
)
CAUSE_RAISED = (
    "The plain forward and backward of this case ran; what raised is what gradgradcheck adds: backward "
    "under create_graph=True (autograd records backward's own operations), their derivative, or forward "
    "at inputs moved by finite differences. Usually backward is not twice differentiable (an in-place op "
    "in backward on a tensor autograd saved, an op with no derivative): make it differentiable, or declare "
    "double_backward=False and decorate backward with @torch.autograd.function.once_differentiable, so "
    "that double backward raises a clear error."
)
ADVICE_FALSE = (
    "A Function that is not twice differentiable should decorate backward with "
    "torch.autograd.function.once_differentiable, so that double backward raises."
)


def _diff_outputs(outputs: Sequence[Any]) -> list[torch.Tensor]:
    return [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]


def _first_grads(
    call: Any, case: Case, wrt: Sequence[torch.Tensor], *, ones: bool = False
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """grad_outputs (requiring grad, as gradgradcheck makes them; all ones with ``ones``, as
    ``loss.backward()`` passes) and the create_graph grads."""
    outputs = _diff_outputs(call(*wrt))
    drawn = [torch.ones_like(o) for o in outputs] if ones else case.grad_outputs(outputs, dtype=case.dtype)
    grad_outputs = tuple(g.detach().requires_grad_(True) for g in drawn)
    grads = gradients(outputs, wrt, grad_outputs, create_graph=True)
    return grad_outputs, grads


def check_gradgradcheck(target: Target, data: st.DataObject) -> None:
    # "Must raise" needs no numerics: without float64 it runs in the spec's first dtype.
    dtype = torch.float64 if torch.float64 in target.dtypes() else target.dtypes()[0]
    # Finite differences of backward: elements apart from each other and from declared kinks.
    case = target.draw_case(data, target.case_options.replace(spacing=FD_SPACING), dtypes=(dtype,))
    args = case.args(dtype=dtype)
    wrt_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    execution = target.preflight(case, dtype=dtype)
    if not target.backward_ran(execution):
        return
    names = [case.recipes[i].name for i in wrt_positions]
    call = function_of_tensors(case, args, wrt_positions)
    wrt = tuple(args[i] for i in wrt_positions)
    if target.spec.double_backward:
        unresolvable = unresolvable_outputs(execution.outputs)
        if unresolvable is not None:
            target.not_checked(unresolvable)
            return
        # A case drawn again is not checked again: the pool served these very results (intact),
        # and the Function is deterministic and draws from no generator, or it would not be kept.
        unjudged = target.judged_once(
            execution, "second derivatives", lambda: _check_twice_differentiable(target, case, call, args, wrt_positions, names)
        )
        if unjudged is not None:
            target.not_checked(unjudged)
            return
        target.checked()
    else:
        _check_refuses_double_backward(target, case, call, wrt, names)


def _check_twice_differentiable(
    target: Target, case: Case, call: Any, args: list[Any], wrt_positions: list[int], names: list[str]
) -> str | None:
    """Fail unless gradgradcheck passes on ``case``; None when judged, else why it could not be
    (finite differences cannot resolve this case: the reference fails the same check)."""
    wrt = tuple(args[i] for i in wrt_positions)
    outputs = _diff_outputs(call(*wrt))
    grad_outputs = tuple(g.detach().requires_grad_(True) for g in case.grad_outputs(outputs, dtype=torch.float64))
    numel = sum(t.numel() for t in wrt) + sum(g.numel() for g in grad_outputs)
    fast = numel > FAST_MODE_ELEMENTS
    atol, rtol = (FAST_ATOL, FAST_RTOL) if fast else (SLOW_ATOL, SLOW_RTOL)
    mode = f"torch.autograd.gradgradcheck, float64, {'fast' if fast else 'slow'} mode, atol={atol}, rtol={rtol}"

    def run_gradgradcheck(fast_mode: bool) -> None:
        # Fast mode draws its projection vectors from gradcheck's own generator (deterministic);
        # the fixed RNG state only keeps an op's own random draws (declared nondeterminism) repeatable.
        with fixed_rng(zlib.crc32(repr((case.grad_seed, names)).encode()), case.device):
            torch.autograd.gradgradcheck(
                call, wrt, grad_outputs, eps=FD_EPS,
                atol=FAST_ATOL if fast_mode else SLOW_ATOL, rtol=FAST_RTOL if fast_mode else SLOW_RTOL,
                fast_mode=fast_mode,
                # Undefined (None) grad_outputs are the undefined_grads contract's business.
                check_undefined_grad=False,
                nondet_tol=NONDET_TOL if target.spec.nondeterministic else 0.0,
            )

    try:
        try:
            # On a fast-mode mismatch slow mode runs below anyway: torch's own slow-mode
            # recomputation, for a message this contract does not report, is skipped.
            with without_slow_mode_jacobians() if fast else contextlib.nullcontext():
                run_gradgradcheck(fast)
        except GradcheckError:
            if not fast:
                raise
            # Fast mode moves every input at once along a random direction, so its finite
            # difference can cross a kink of an intermediate (relu of x @ w.T near 0) that no
            # drawn input is near. Slow mode checks the same property element by element:
            # its verdict is the one that counts (a wrong derivative fails it too).
            fast = False
            mode = mode.replace("fast mode", "slow mode (fast mode failed first)").replace(
                f"atol={atol}, rtol={rtol}", f"atol={SLOW_ATOL}, rtol={SLOW_RTOL}")
            run_gradgradcheck(False)
    except GradcheckError as error:
        blocked_by_undeclared_writes(case)  # finite differences of a Function that writes into its input
        blocked_by_unversioned_saves(case)  # a save of x.data: second derivatives through a detached tensor
        target.blocked_by_undeclared_randomness(case)  # second derivatives of values that differ from themselves
        blocked_by_wrong_first_derivatives(case, call, wrt)
        if _reference_fails_too(case, args, wrt_positions, grad_outputs, fast=fast):
            return UNRESOLVABLE_SECOND_DERIVATIVES
        message = str(error).strip()
    except RuntimeError as error:
        if raised_by_once_differentiable(error):
            fail(f"double backward raised, but the spec declares double_backward=True [{mode}]", CAUSE_ONCE, str(error))
        if interpreter_limit(error) is not None:
            raise  # the Triton interpreter's limit: the runner leaves such an example unchecked
        blocked_by_undeclared_writes(case)  # a saved input written by backward: autograd refuses the double backward
        target.blocked_if_owned_elsewhere(error)  # a crash in its own code another contract owns (a saved tensor written)
        fail(
            f"gradgradcheck raised {type(error).__name__}, but the spec declares double_backward=True [{mode}]",
            CAUSE_RAISED, f"{type(error).__name__}: {error}", user_frames(error),
        )
    else:
        return None
    # Which gradient, with respect to which input or grad_output, and why (when we can tell).
    wrt_labels = [repr(n) for n in names] + [f"grad_output[{i}]" for i in range(len(grad_outputs))]
    match = jacobian_pair(message)
    # The same call, recorded: the saved tensors tell a constant computed in forward.
    probed_call, recorder = recorded_function_of_tensors(case, list(args), wrt_positions)
    cause = _diagnose(probed_call, recorder, case, wrt, names, wrt_labels, match, args)
    # The reported example names the worst entry instead of printing both Jacobians.
    atol, rtol = (FAST_ATOL, FAST_RTOL) if fast else (SLOW_ATOL, SLOW_RTOL)
    located = (
        jacobian_mismatch(_first_derivatives(call, len(wrt)), (*wrt, *grad_outputs), atol=atol, rtol=rtol, pair=match)
        if target.reporting() else None
    )
    if located is not None:
        match = (located.output, located.input)
    if match is None:
        fail(f"second derivatives analytical != numerical [{mode}]", cause, message)
    output, against = match
    present = [n for n, g in zip(names, _first_grads(call, case, wrt)[1]) if g is not None]
    grad_name = present[output] if output < len(present) else f"#{output}"
    summary = f"d(grad[{grad_name!r}])/d({wrt_labels[against]}) analytical != numerical"
    if located is None:
        fail(f"{summary} [{mode}]", cause, message)
    plain_labels = [*names, *(f"grad_output[{i}]" for i in range(len(grad_outputs)))]
    fail(
        f"{summary}: {located.entry(f'grad[{grad_name!r}]', plain_labels[against])} [{mode}]",
        *((cause,) if cause else ()),
        # The pattern's words are for first derivatives; a named cause explains second ones better.
        *located.details(f"grad[{grad_name!r}]", wrt_labels[against], "torch.autograd.gradgradcheck", with_pattern=not cause),
    )


UNRESOLVABLE_SECOND_DERIVATIVES = (
    "finite differences in float64 cannot resolve this case's second derivatives: gradgradcheck of the "
    "spec's reference fails on the same points too (first derivatives so large that an eps=1e-6 step of a "
    "grad_output is lost in their rounding)"
)


def _reference_fails_too(
    case: Case, args: Sequence[Any], wrt_positions: list[int], grad_outputs: tuple[torch.Tensor, ...], *, fast: bool
) -> bool:
    """Whether torch.autograd.gradgradcheck of the spec's reference (plain torch, its derivatives
    torch's) fails at the same points, grad_outputs and settings: the case is beyond finite
    differences, not the Function's second derivatives wrong. Never for a surrogate spec."""
    if case.spec.surrogate is not None:
        return False
    reference = reference_of_tensors(case, args, wrt_positions)
    wrt = tuple(args[i].detach().clone().requires_grad_(True) for i in wrt_positions)
    try:
        torch.autograd.gradgradcheck(
            reference, wrt, tuple(g.detach().clone().requires_grad_(True) for g in grad_outputs), eps=FD_EPS,
            atol=FAST_ATOL if fast else SLOW_ATOL, rtol=FAST_RTOL if fast else SLOW_RTOL, fast_mode=fast,
            check_undefined_grad=False,
        )
    except GradcheckError:
        return True
    except Exception:  # a reference that cannot run double backward excuses nothing
        return False
    return False


def _first_derivatives(call: Any, count: int) -> Any:
    """The function whose Jacobian gradgradcheck checks: the first ``count`` tensors are the
    inputs, the rest grad_outputs; it returns the input gradients that are not None."""

    def first(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs, grad_outputs = tensors[:count], tensors[count:]
        outputs = _diff_outputs(call(*inputs))
        grads = gradients(outputs, inputs, grad_outputs, create_graph=True)
        return tuple(g for g in grads if g is not None)

    return first


def _diagnose(
    call: Any,
    recorder: Recorder,
    case: Case,
    wrt: tuple[torch.Tensor, ...],
    names: list[str],
    wrt_labels: list[str],
    match: tuple[int, int] | None,
    args: Sequence[Any] = (),
) -> str:
    """A sentence naming the likely cause of a gradgradcheck failure, or ''."""
    grad_outputs, grads = _first_grads(call, case, wrt)
    for grad in grads:
        if grad is not None and is_once_differentiable_node(grad.grad_fn):
            return CAUSE_ONCE
    for name, grad in zip(names, grads):
        if grad is not None and not grad.requires_grad:
            return CAUSE_NOT_ATTACHED.format(name=name)
    # Saved inputs and outputs come back from ctx.saved_tensors attached to the graph under
    # create_graph=True; a floating-point intermediate computed in forward comes back as a
    # constant, so double backward cannot differentiate through it.
    if recorder.calls:
        constants = [
            f"saved_tensors[{k}] {tuple(t.shape)} {t.dtype}"
            for k, t in enumerate(recorder.last.saved_tensors)
            if t is not None and t.is_floating_point() and not t.requires_grad and not any(_same_data(t, a) for a in args)
        ]
        if constants:
            return (
                f"{', '.join(constants)} carries no graph back to the inputs: it was computed in forward "
                "and saved with ctx.save_for_backward, so double backward treats it as a constant. "
                "Recompute it in backward from the saved inputs (or return it as an output), or declare "
                "double_backward=False and decorate backward with @once_differentiable."
            )
    if match is None:
        return ""
    present = [g for g in grads if g is not None]
    output, against = match
    if output >= len(present):
        return ""
    variables = list(wrt) + list(grad_outputs)
    # Positive, uneven weights: a plain sum could cancel to zero on its own.
    weights = torch.rand(present[output].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    second = gradients([present[output]], [variables[against]], [(weights + 0.5).to(present[output].device)])[0]
    if second is None or not bool(second.ne(0).any()):
        what = "None" if second is None else "identically zero"
        return f"The analytical second derivative is {what}: " + CAUSE_DETACHED.format(wrt=wrt_labels[against])
    return ""


def _same_data(saved: torch.Tensor, arg: Any) -> bool:
    """True when ``saved`` is the input ``arg`` (inputs that need no grad are constants anyway)."""
    return isinstance(arg, torch.Tensor) and saved.data_ptr() == arg.data_ptr() and saved.shape == arg.shape


def _check_refuses_double_backward(
    target: Target, case: Case, call: Any, wrt: tuple[torch.Tensor, ...], names: list[str]
) -> None:
    try:
        grad_outputs, grads = _first_grads(call, case, wrt)
    except (ContractFailure, Blocked, Crash, InterpreterLimit, torch.OutOfMemoryError):
        raise
    except Exception as error:
        if interpreter_limit(error) or suite_frame(error):
            raise  # the interpreter's gap, or the suite's own error: no refusal of the Function's
        # Backward itself refusing to build a graph (``assert not grad.requires_grad``, a raise under
        # grad mode, as revtorch does) is a refusal too, where the same backward runs without
        # create_graph; a backward that raises either way is a crash, for its owner.
        outputs = _diff_outputs(call(*wrt))
        gradients(outputs, wrt, case.grad_outputs(outputs, dtype=case.dtype))
        target.checked()
        return  # refused, as declared
    for name, grad in zip(names, grads):
        # An identically zero gradient is trivially right to every order.
        if grad is not None and not grad.requires_grad and bool(grad.ne(0).any()):
            fail(
                f"grad[{name!r}].requires_grad=False under create_graph=True, but double backward should "
                "raise [spec declares double_backward=False]",
                CAUSE_NOT_ATTACHED.format(name=name)
                + " A loss built from this gradient (a gradient penalty) silently gets no gradient from it.",
                ADVICE_FALSE,
            )
    if not all(bool(g.eq(1).all()) for g in grad_outputs):
        _detached_at_ones(call, case, wrt, names)
    attached = [g for g in grads if g is not None and g.requires_grad]
    if not attached:
        target.not_checked(
            "every first-order gradient is None or identically zero without a graph (a constant gradient "
            "is right to every order), so there is no double backward to refuse"
        )
        return
    # .backward() (not autograd.grad(..., inputs=...)): through a @once_differentiable backward
    # only a pass that reaches every leaf raises; autograd.grad prunes the error node and
    # returns None. .backward() is what a gradient-penalty training step does.
    # Positive, uneven weights: a plain sum of a normalisation's gradient is 0 whatever its inputs.
    weights = [_uneven_weights(g, k) for k, g in enumerate(attached)]
    for leaf in wrt:
        leaf.grad = None
    try:
        backward_every_leaf(attached, weights)
    except RuntimeError:
        target.checked()
        return  # refused, as declared
    # It ran: only silently wrong numbers are a defect; right ones are advice to declare them.
    outputs = _diff_outputs(call(*wrt))
    if case.dtype != torch.float64 or unresolvable_outputs(outputs) is not None:
        # No gradgradcheck without float64, nor where finite differences cannot resolve the outputs
        # (forward computes in float32 and casts back: its "numerical" derivatives are rounding noise).
        summed = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        _judge_against_reference(
            target, case, [leaf.grad for leaf in wrt], names, [g.detach() for g in grad_outputs], summed, weights,
        )
        return
    fd_grad_outputs = tuple(g.detach().requires_grad_(True) for g in case.grad_outputs(outputs, dtype=torch.float64))
    message = _gradgradcheck_error(call, case, wrt, fd_grad_outputs, nondeterministic=target.spec.nondeterministic)
    if message is not None:
        fail(
            "double backward runs and is silently WRONG, but the spec declares double_backward=False "
            "[torch.autograd.gradgradcheck, float64]",
            "A gradient penalty built on these gradients trains with wrong second derivatives, and nobody is told.",
            message,
            ADVICE_FALSE,
        )
    target.checked()
    advise(
        "double backward runs and gradgradcheck finds it right on this example, but the spec declares "
        "double_backward=False [torch.autograd.gradgradcheck, float64]",
        "Declare double_backward=True so it is checked on every example, or decorate backward with "
        "@once_differentiable so that it raises (a right double backward found on one example may be "
        "wrong on others).",
    )


def _detached_at_ones(call: Any, case: Case, wrt: tuple[torch.Tensor, ...], names: list[str]) -> None:
    """The same check at grad_output all ones, what ``loss.backward(create_graph=True)`` passes: a
    fast path for ``grad_output == 1`` that returns a gradient computed in forward has no graph."""
    try:
        ones, grads = _first_grads(call, case, wrt, ones=True)
    except (ContractFailure, Blocked, Crash, InterpreterLimit, torch.OutOfMemoryError):
        raise
    except Exception as error:
        if interpreter_limit(error) or suite_frame(error):
            raise
        return  # a refusal at ones is a refusal: nothing silent
    for index, (name, grad) in enumerate(zip(names, grads)):
        if grad is not None and not grad.requires_grad and bool(grad.ne(0).any()) and _reference_gradient_varies(
            case, index, [g.detach() for g in ones], grad,
        ):
            fail(
                f"grad[{name!r}].requires_grad=False under create_graph=True with grad_output all ones (what "
                "loss.backward() passes), but double backward should raise [spec declares double_backward=False]",
                CAUSE_NOT_ATTACHED.format(name=name) + " With other grad_outputs it is attached: a fast path for "
                "grad_output == 1 (returning a gradient computed in forward) has no graph, so a gradient penalty "
                "built on loss.backward(create_graph=True) silently gets no gradient from it.",
                ADVICE_FALSE,
            )


def _reference_gradient_varies(case: Case, index: int, ones: list[torch.Tensor], grad: torch.Tensor) -> bool:
    """Whether the reference's ``index``-th gradient at grad_output ``ones`` depends on the inputs
    (its weighted sum has a nonzero derivative); False where it is a constant (a mean's), which a
    gradient without graph gets right, or where the reference cannot tell."""
    args = case.args(dtype=case.dtype)
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    try:
        second, _ = truth_and_baseline(case.spec, case, lambda cast, is_truth: reference_double_backward(
            case, [cast(a) for a in args], positions, [cast(g) for g in ones], [index], [cast(_uneven_weights(grad, 0))],
        ) if is_truth else ())
    except Exception:  # a reference that is not twice differentiable cannot tell
        return False
    return any(s is not None and bool(s.ne(0).any()) for s in second)


def _uneven_weights(grad: torch.Tensor, index: int) -> torch.Tensor:
    """Weights in [0.5, 1.5) for the ``index``-th gradient, the same on every run."""
    generator = torch.Generator().manual_seed(index)
    return (torch.rand(grad.shape, generator=generator, dtype=torch.float64) + 0.5).to(grad.device, grad.dtype)


def _judge_against_reference(
    target: Target, case: Case, found: list[torch.Tensor | None], names: list[str], grad_outputs: list[torch.Tensor],
    summed: list[int], weights: list[torch.Tensor],
) -> None:
    """Without gradgradcheck (no float64, or float32 values inside), the double backward that ran
    (``weights`` on the gradients ``summed``) against the reference's own, by the reference
    contract's rule: wrong numbers fail; right ones, or no reference double backward to compare
    with, are advice."""
    spec = target.spec
    args = case.args(dtype=case.dtype)  # pristine: the Function may have written into its inputs
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    dtype_name = str(case.dtype).removeprefix("torch.")
    def second_derivatives(at: list[Any], outs: list[torch.Tensor]) -> tuple[Any, Any]:
        return truth_and_baseline(spec, case, lambda cast, _: reference_double_backward(
            case, [cast(a) for a in at], positions, [cast(g) for g in outs], summed, [cast(w) for w in weights],
        ))

    try:
        truth, plain = second_derivatives(args, grad_outputs)
    except Exception as error:  # a reference that is not twice differentiable has nothing to compare with
        target.checked()
        advise(
            "double backward runs, but the spec declares double_backward=False; its numbers are not checked "
            f"(gradgradcheck cannot run here, and the reference's double backward raised {type(error).__name__})",
            ADVICE_FALSE,
        )
        return
    where = f"{spec.display_name}, double backward, {dtype_name}, vs the reference's double backward"
    values = [
        Judged(f"d(weighted sum of the gradients)/d{name!r}", "grad", got if got is not None else torch.zeros_like(want), want,
               base if base is not None else torch.zeros_like(want), where)
        for name, got, want, base in zip(names, found, truth, plain) if want is not None
    ]
    wrong = judge_against_truth(spec, case.dtype, values)
    if wrong is not None:
        # The full budget, as the reference contract measures it: the reference's own error at
        # neighbouring inputs (a fused backward differentiated rounds differently from the reference's).
        moved = [
            second_derivatives(moved_args, [moved_grads[i] for i in range(len(grad_outputs))])
            for moved_args, moved_grads in neighbouring_cases(case, args, dict(enumerate(grad_outputs)), None, dtype_name)
        ]
        values = [
            dataclasses.replace(value, resampled=tuple(
                (b[k], t[k]) for t, b in moved if t[k] is not None and b[k] is not None
            ))
            for k, value in zip([k for k, want in enumerate(truth) if want is not None], values)
        ]
        wrong = judge_against_truth(spec, case.dtype, values)
    if wrong is not None:
        fail(
            f"double backward runs and is silently WRONG, but the spec declares double_backward=False [{where}]",
            "A gradient penalty built on these gradients trains with wrong second derivatives, and nobody is told.",
            wrong.summary, wrong.details, ADVICE_FALSE,
        )
    target.checked()
    advise(
        "double backward runs and matches the reference's on this example, but the spec declares "
        f"double_backward=False [{where}]",
        "Declare double_backward=True so it is checked on every example, or decorate backward with "
        "@once_differentiable so that it raises.",
    )


def _gradgradcheck_error(
    call: Any, case: Case, wrt: tuple[torch.Tensor, ...], grad_outputs: tuple[torch.Tensor, ...], *, nondeterministic: bool
) -> str | None:
    """gradgradcheck's message when the second derivatives are wrong on this case, else None:
    fast mode first where the case is large, with slow mode's verdict the one that counts."""
    numel = sum(t.numel() for t in wrt) + sum(g.numel() for g in grad_outputs)
    modes = [True, False] if numel > FAST_MODE_ELEMENTS else [False]
    message = None
    for fast_mode in modes:
        with fixed_rng(zlib.crc32(repr((case.grad_seed, len(wrt))).encode()), case.device):
            try:
                torch.autograd.gradgradcheck(
                    call, wrt, grad_outputs, eps=FD_EPS,
                    atol=FAST_ATOL if fast_mode else SLOW_ATOL, rtol=FAST_RTOL if fast_mode else SLOW_RTOL,
                    fast_mode=fast_mode, check_undefined_grad=False,
                    nondet_tol=NONDET_TOL if nondeterministic else 0.0,
                )
            except (GradcheckError, RuntimeError) as error:
                message = str(error).strip()
                continue
            return None
    return message


def _float64_if_differentiable(target: Target) -> None:
    if target.spec.double_backward:
        target.require_float64("gradgradcheck needs float64")


@contract(
    "gradgradcheck",
    case=CaseOptions(max_elements=MAX_ELEMENTS),
    requires=[Requirement("float64 for a twice-differentiable Function", _float64_if_differentiable)],
    compares_values=True,
)
def test_gradgradcheck(conformance_target: Target) -> None:
    conformance_target.run(check_gradgradcheck)
