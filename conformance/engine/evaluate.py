"""Every call the suite makes of a target or of a reference: forward, backward, double backward
and transformed calls (autocast, forward-mode AD, torch.func, torch.compile).

This is the one module that calls ``Function.apply``, ``torch.autograd.grad`` and
``torch.autograd.backward``; the contracts only judge what it returns. Every call of the
Function goes through :func:`forward` (or :func:`execute`, forward then backward with the record
the contracts inspect), with these options:

* how the Function is called: ``"probe"`` (a recording subclass, :func:`conformance.engine.probe.probe`),
  ``"guarded"`` (records nothing, so it keeps nothing alive) -- both under the allocation policy
  of every evaluation (:func:`conformance.engine.harness.allocation_policy`) -- or as its users
  call it (:func:`user_call`: ``spec.op.call`` under :func:`conformance.engine.harness.user_allocations`);
* the allocation policy (``allocations``; the spec's by default);
* which inputs require grad (``requires_grad`` in :func:`execute`, or the arguments given);
* the grad_outputs (chosen by the caller, or drawn from the case) and which outputs they are for;
* ``create_graph`` / ``retain_graph`` (:func:`gradients`);
* an autocast region around forward (``autocast=(device_type, dtype)``), backward outside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.autograd.forward_ad as fwAD

from conformance.engine.defects import CRASH_OWNER, Blocked, Defect, ForwardError, as_called, raised
from conformance.engine.global_state import RngStates, kept_flags, rng_states, set_rng_states
from conformance.engine.harness import (
    Execution,
    allocation_policy,
    as_tuple,
    changed_elements,
    differentiable_positions,
    fixed_rng,
    forward_args,
    random_state,
    user_allocations,
)
from conformance.engine.memory import AllocationPolicy, padded_copy, poison_candidates, unwritten_elements
from conformance.engine.probe import BackwardCall, Recorder, guarded, probe, record_into
from conformance.engine.terms import TermMagnitudes
from conformance.engine.torch_text import modified_no_grad_view, modified_saved_tensor, writes_overlapping_memory
from conformance.spec import Spec
from conformance.spec.targets import CustomOpAdapter
from strategies.cases import Case
from strategies.recipes import FloatingRecipe

__all__ = [
    "REFERENCE_BLAME",
    "Autocast",
    "Evaluated",
    "Forward",
    "backward_every_leaf",
    "blocked_by_fake_kernel",
    "blocked_by_undeclared_writes",
    "blocked_by_unversioned_saves",
    "crash_owner",
    "evaluate",
    "evaluate_with_terms",
    "execute",
    "forward",
    "forward_mode",
    "function_of_tensors",
    "gradients",
    "gradients_after_writes",
    "gradients_through_outputs",
    "input_writes",
    "outputs_and_grads",
    "raised_in_reference",
    "recorded_function_of_tensors",
    "reference_double_backward",
    "reference_error",
    "reference_jvp",
    "reference_label",
    "reference_of_tensors",
    "reference_raised",
    "run_reference",
    "unversioned_saves",
    "user_call",
    "user_evaluate",
    "vjp_call",
    "vmap_call",
    "writable_inputs",
]

Autocast = tuple[str, torch.dtype]  # (device_type, dtype) of a torch.autocast region around forward
How = Literal["probe", "guarded"]


# ----------------------------------------------------------------------------- primitives


def _autocast(autocast: Autocast | None) -> contextlib.AbstractContextManager[Any]:
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=autocast[0], dtype=autocast[1])


def _apply(function: type[torch.autograd.Function], passed: Sequence[Any]) -> tuple[Any, ...]:
    """The only ``Function.apply`` of the suite."""
    return as_tuple(function.apply(*passed))  # type: ignore[no-untyped-call]  # torch does not annotate it


def gradients(
    outputs: Sequence[torch.Tensor],
    wrt: Sequence[torch.Tensor],
    grad_outputs: Sequence[torch.Tensor] | None,
    *,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad`` of ``outputs`` with respect to ``wrt`` (unused inputs get None):
    the only place the suite calls it."""
    return tuple(torch.autograd.grad(
        list(outputs), list(wrt), grad_outputs, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
    ))


def backward_every_leaf(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor]) -> None:
    """``torch.autograd.backward`` (what ``loss.backward()`` does): a pass that reaches every leaf.

    Not :func:`gradients`: through a ``@once_differentiable`` backward, ``torch.autograd.grad(...,
    inputs=...)`` prunes the error node and silently returns None, while this raises -- what a
    gradient-penalty training step sees. Gradients accumulate into the leaves' ``.grad``.
    """
    torch.autograd.backward(list(outputs), list(grad_outputs))


# ----------------------------------------------------------------------------- the Function


@dataclass
class Forward:
    """One forward of the Function: its outputs and the probe's record (empty unless probed)."""

    outputs: tuple[Any, ...]
    recorder: Recorder
    passed: list[Any]


def forward(
    case: Case,
    args: Sequence[Any],
    *,
    how: How = "probe",
    fn: type[torch.autograd.Function] | None = None,
    allocations: AllocationPolicy | None = None,
    autocast: Autocast | None = None,
    passed: Sequence[Any] | None = None,
) -> Forward:
    """Forward of ``fn`` (the spec's Function) on ``args`` (the leaves), called ``how``, under
    ``allocations`` (the spec's policy by default) and ``autocast``. Forward receives ``passed``
    (default :func:`conformance.engine.harness.forward_args`: declared in-place inputs cloned)."""
    policy = allocation_policy(case.spec) if allocations is None else allocations
    target = fn or case.spec.fn
    if how == "guarded":
        function, recorder = guarded(target, policy), Recorder()
    else:
        function, recorder = probe(target, allocations=policy)
    given = forward_args(case, args) if passed is None else list(passed)
    with _autocast(autocast):
        outputs = _apply(function, given)
    return Forward(outputs, recorder, given)


def execute(
    case: Case,
    *,
    dtype: torch.dtype | None = None,
    device: str | None = None,
    requires_grad: frozenset[str] | set[str] | None = None,
    backward: bool = True,
    fn: type[torch.autograd.Function] | None = None,
    grad_outputs: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] | None = None,
    retain_graph: bool = False,
    after_forward: Callable[[Execution], None] | None = None,
    after_backward: Callable[[Execution], None] | None = None,
    guard_inputs: bool = False,
    canary: float | None = None,
    attribute: bool = True,
) -> Execution:
    """Forward through a probed copy of the Function; then backward unless told not to.

    Backward goes through ``torch.autograd.grad`` with respect to every input that requires grad,
    so the engine's own checks still run; its errors are kept in ``backward_error`` (see
    :func:`conformance.engine.defects.require_sound`) because the raw record usually explains them. A forward that
    raises is re-raised as :class:`ForwardError`, which the runner reports as the contract's
    failure with the case. Every call builds fresh inputs from the case's recipes, so a Function
    that writes into its inputs cannot change what another evaluation sees. ``after_forward`` is
    called between forward and backward, ``after_backward`` after a backward that returned (the
    global_state contract looks at torch's state there); torch's global flags are put back when
    the call returns (:func:`conformance.engine.global_state.kept_flags`).

    The Function's own uninitialised allocations are poisoned (:func:`allocation_policy`); when
    an output or gradient then holds NaN, the case runs again with zero-filled allocations and
    the elements that were NaN only with poison go into ``unwritten``. Each such allocation sits
    inside a canary-margined buffer (``recorder.canaries``); ``guard_inputs`` puts the tensor
    inputs and grad_outputs inside such buffers too; ``canary``: another value for their floating
    margins. With ``attribute``, unwritten elements are traced to where they came from
    (``unwritten_read_outside``, ``unwritten_only_strided``).
    """
    policy = allocation_policy(case.spec)
    if canary is not None:
        policy = dataclasses.replace(policy, canary=canary)
    options = _Options(dtype, device, requires_grad, backward, fn, grad_outputs, retain_graph)

    def run(allocations: AllocationPolicy, *, first: bool) -> Execution:
        with kept_flags():  # a Function that leaks global state is global_state's finding only
            hooks = (after_forward, after_backward) if first else (None, None)
            return _execute(case, options, hooks, allocations, guard_inputs and first)

    rng_before = rng_states()
    execution = run(policy, first=True)
    if policy.fill == "poison" and execution.recorder.uninitialised_allocations and poison_candidates(execution.observed()):
        zeros = AllocationPolicy("zeros", policy.margin, keep_canaries=False)
        execution.unwritten = _confirm_unwritten(execution, rng_before, lambda: run(zeros, first=False))
        plain = case.in_contiguous_layouts()
        if execution.unwritten and attribute:  # whatever grad_outputs the caller made: the read is forward's or backward's
            rng_after = rng_states()
            try:  # read from outside a tensor -- in contiguous layouts too; strided only is layouts' (below)
                execution.unwritten_read_outside = reads_outside(plain)
            finally:
                set_rng_states(rng_after)
        if execution.unwritten and attribute and plain is not case and grad_outputs is None and not execution.unwritten_read_outside:
            rng_after = rng_states()
            try:
                in_plain_layouts = execute(
                    plain, dtype=dtype, device=device, requires_grad=requires_grad, backward=backward, fn=fn,
                    retain_graph=retain_graph,
                )
                execution.unwritten_only_strided = not in_plain_layouts.unwritten
            except Exception:  # the plain case fails otherwise: that says nothing about the strided one's memory
                pass
            finally:
                set_rng_states(rng_after)
    return execution


@dataclass(frozen=True)
class _Options:
    dtype: torch.dtype | None
    device: str | None
    requires_grad: frozenset[str] | set[str] | None
    backward: bool
    fn: type[torch.autograd.Function] | None
    grad_outputs: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] | None
    retain_graph: bool


Hooks = tuple[Callable[[Execution], None] | None, Callable[[Execution], None] | None]


def _confirm_unwritten(execution: Execution, rng_before: RngStates, rerun: Callable[[], Execution]) -> list[Any]:
    """The same evaluation with zero-filled allocations (the generators as they were, so random
    draws match): elements poisoned in the first run but not with zeros were never written."""
    rng_after = rng_states()
    set_rng_states(rng_before)
    try:
        zeroed = rerun()
    except Exception:  # a second run that fails proves nothing either way
        return []
    finally:
        set_rng_states(rng_after)
    return unwritten_elements(execution.observed(), dict(zeroed.observed()))


def _execute(case: Case, options: _Options, hooks: Hooks, policy: AllocationPolicy, guard_inputs: bool) -> Execution:
    probed, recorder = probe(options.fn or case.spec.fn, allocations=policy)
    args = case.args(dtype=options.dtype, device=options.device, requires_grad=options.requires_grad)
    if guard_inputs:
        args = [
            _between_canaries(arg, policy.margin, f"input {recipe.name!r}", recorder, policy.canary)
            for recipe, arg in zip(case.recipes, args)
        ]
    passed = forward_args(case, args)
    try:
        outputs = _apply(probed, passed)
    except Exception as error:
        raise ForwardError(f"{type(error).__name__}: {error}", as_called(case, args)) from error
    execution = Execution(case=case, args=args, outputs=outputs, recorder=recorder, passed=passed)
    execution.diff_positions = differentiable_positions(outputs)
    after_forward, after_backward = hooks
    if after_forward is not None:
        after_forward(execution)
    if not options.backward:
        return execution
    wrt = [arg for arg in args if isinstance(arg, torch.Tensor) and arg.requires_grad]
    diff_outputs = [outputs[p] for p in execution.diff_positions]
    if not wrt or not diff_outputs:
        return execution
    make = options.grad_outputs or (lambda outs: case.grad_outputs(outs))
    execution.grad_outputs = tuple(make(diff_outputs))
    if guard_inputs:
        execution.grad_outputs = tuple(
            _between_canaries(g, policy.margin, f"grad_output[{i}]", recorder, policy.canary)
            for i, g in enumerate(execution.grad_outputs)
        )
    execution.grad_outputs_before = tuple(g.detach().clone() for g in execution.grad_outputs)
    try:
        grads = gradients(diff_outputs, wrt, execution.grad_outputs, retain_graph=options.retain_graph)
    except Exception as error:  # the contracts explain engine errors from the raw record
        execution.backward_error = error
        return execution
    execution.grads = dict(zip(execution.wrt_names, grads))
    if after_backward is not None:
        after_backward(execution)
    return execution


# Another floating canary than memory.CANARY, exact from float16 down to float8_e4m3fn.
OTHER_CANARY = -416.0


def reads_outside(case: Case, first: Execution | None = None, rng_before: RngStates | None = None) -> str | None:
    """The first output or gradient of ``case`` (its label) that depends on memory outside the
    Function's tensors: with every input, grad_output and uninitialised allocation between canary
    margins, it changes when the margins hold another canary, and not when they hold the same one
    again (a random Function's draws differ either way) -- a load past the end of a row, an
    unmasked tail. Every run starts from one RNG state: ``rng_before``, where ``first`` (such an
    evaluation, made from it) is given. None when nothing changes, when the Function is random by
    design, or when the case does not run."""
    if case.spec.nondeterministic:
        return None
    rng_after = rng_states()
    given = first is not None and rng_before is not None
    start = rng_before if given and rng_before is not None else rng_after

    def guarded_run(canary: float | None) -> Execution:
        set_rng_states(start)
        return execute(case, guard_inputs=True, canary=canary, attribute=False)

    try:
        first = first if given and first is not None else guarded_run(None)
        label = _first_change(first, guarded_run(OTHER_CANARY))
        if label is None or _first_change(first, guarded_run(None)) is not None:
            return None
        return label
    except Exception:
        return None
    finally:
        set_rng_states(rng_after)


def _first_change(one: Execution, other: Execution) -> str | None:
    """The label of the first output or gradient whose bits differ between two evaluations."""
    theirs = dict(other.observed())
    for label, tensor in one.observed():
        again = theirs.get(label)
        if isinstance(tensor, torch.Tensor) and isinstance(again, torch.Tensor) and changed_elements(tensor, again):
            return label
    return None


def _between_canaries(value: Any, margin: int, label: str, recorder: Recorder, canary: float | None = None) -> Any:
    """``value`` moved into a canary-margined buffer (tensors only; the canaries go to ``recorder``)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy, canaries = padded_copy(value, margin, label, canary)
    if canaries is not None:
        recorder.canaries.append(canaries)
    return copy


def crash_owner(case: Case, contract: str, error: BaseException | None = None) -> str:
    """The contract that owns a crash ``contract`` met on ``case`` (the call as it was made: its
    dtype and requires_grad subset), raising ``error``. See :data:`conformance.engine.defects.CRASH_OWNER`:
    ``layouts`` when the same values in plain layouts (contiguous inputs and grad_outputs) run --
    ``inplace`` instead when torch refused to write into an expanded tensor, which only the
    Function's in-place write into its input or grad_output makes; ``inplace`` when autograd
    found a saved tensor written since it was saved, or refused an in-place write into a view
    made under no_grad, while one plain call runs (a backward that writes into what it saved fails
    when the contract runs the graph again, or when gradcheck's next call perturbs that input
    through such a view: inplace's finding); ``contract`` itself when they run and nothing about the layouts differed (what the
    contract did to the call raised) -- ``undefined_grads`` instead when backward raises with only one
    of several outputs used (gradcheck differentiates one output at a time);
    ``needs_input_grad`` when the plain call runs with every differentiable input requiring grad;
    else ``return_count`` (a crash on plain inputs)."""
    plain = dataclasses.replace(
        case,
        recipes=tuple(dataclasses.replace(r, layout="contiguous") if isinstance(r, FloatingRecipe) else r for r in case.recipes),
        grad_layout="as_drawn",
    )
    if _runs_cleanly(plain):
        if error is not None and (modified_saved_tensor(error) or modified_no_grad_view(error)):
            return "inplace"
        strided_grads = case.grad_kind in ("noncontiguous", "expanded") or case.grad_layout != "as_drawn"
        if not (plain != case or strided_grads):
            # gradcheck differentiates one output at a time: the others' grad_outputs are undefined
            return "undefined_grads" if _raises_with_one_output_used(plain) else contract
        return "inplace" if error is not None and writes_overlapping_memory(error) else "layouts"
    differentiable = frozenset(r.name for r in case.recipes if r.differentiable)
    if case.requires_grad != differentiable and _runs_cleanly(dataclasses.replace(plain, requires_grad=differentiable)):
        return "needs_input_grad"
    return CRASH_OWNER


def input_writes(case: Case) -> tuple[list[str], list[str]]:
    """(the inputs forward writes in place though the spec does not declare them in ``mutates``,
    the inputs backward writes in place), by values or version counter, from one forward and its
    backward: the inplace contract's findings. A forward write makes whatever a compiler or
    transform does with the call undefined; a backward write changes what a second backward,
    gradgradcheck's or finite differences' next call reads. Both empty when forward raises (that
    is a crash's owner's); a backward that raised after writing has written."""
    leaves = case.args()
    passed = forward_args(case, leaves)
    names = [recipe.name for recipe in case.recipes]

    def watch(args: Sequence[Any], skip: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
        return [(n, a, a.detach().clone(), a._version) for n, a in zip(names, args) if isinstance(a, torch.Tensor) and n not in skip]

    def written(watched: list[tuple[str, torch.Tensor, torch.Tensor, int]]) -> list[str]:
        return [name for name, arg, before, version in watched if arg._version != version or changed_elements(arg, before)]

    by_forward = watch(passed, set(case.spec.mutates))
    by_backward: list[tuple[str, torch.Tensor, torch.Tensor, int]] = []
    with random_state(case.spec, case):
        try:
            outputs = forward(case, leaves, how="guarded", passed=passed).outputs
        except Exception:
            return [], []
        forward_written, by_backward = written(by_forward), watch(leaves)
        positions = differentiable_positions(outputs)
        wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
        if positions and wrt:
            differentiable = [outputs[p] for p in positions]
            try:
                gradients(differentiable, wrt, case.grad_outputs(differentiable))
            except Exception:
                pass
    return forward_written, written(by_backward)


def blocked_by_undeclared_writes(case: Case) -> None:
    """Raise ``Blocked`` by inplace when forward writes into an input the spec does not declare,
    or backward into any input (:func:`input_writes`): for a contract whose finding (a compiled
    difference, finite differences that moved, a double backward that meets a saved tensor
    written) such a write can explain."""
    by_forward, by_backward = input_writes(case)
    if by_forward:
        raise Blocked(Defect("inplace", f"input {by_forward[0]!r} was modified in place by forward, undeclared"), case)
    if by_backward:
        raise Blocked(Defect("inplace", f"input {by_backward[0]!r} was modified in place by backward"), case)


def blocked_by_fake_kernel(case: Case) -> None:
    """Raise ``Blocked`` by opcheck when the case's Function is a custom op whose fake kernel
    disagrees with its real one on ``case`` (opcheck's ``test_faketensor``): for a contract whose
    finding (a compiled difference, an output dtype) that disagreement can explain."""
    op = case.spec.op
    if not isinstance(op, CustomOpAdapter):
        return
    error = op.opcheck(case.args(requires_grad=set()), ("test_faketensor",))["test_faketensor"]
    if error is not None:
        first = " ".join(str(error).split())[:200]
        raise Blocked(Defect("opcheck", f"test_faketensor failed ({type(error).__name__}: {first})"), case)


def gradients_after_writes(case: Case, written: Sequence[str]) -> dict[str, torch.Tensor | None] | None:
    """Forward of ``case``, then the inputs named ``written`` written in place as a caller may
    write them between forward and backward (``x.mul_(2).add_(1)`` under no_grad: new values, and
    the version counter moves; an input sharing memory with an output is left alone), then
    backward with the case's grad_outputs: the gradients by input name, or None when backward
    raised (autograd's check of the saved tensors' versions, as ``ctx.save_for_backward(x)``
    makes it, or any other error). With ``written`` empty: the same calls' plain gradients."""
    leaves = case.args()
    with fixed_rng(case.grad_seed, case.device):  # Functions drawing random numbers draw the same ones
        outputs = forward(case, leaves, how="guarded").outputs
    diff = [outputs[p] for p in differentiable_positions(outputs)]
    wrt = [(recipe.name, a) for recipe, a in zip(case.recipes, leaves) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not diff or not wrt:
        return {}
    grad_outputs = case.grad_outputs(diff)
    outputs_memory = {o.untyped_storage().data_ptr() for o in outputs if isinstance(o, torch.Tensor)}
    with torch.no_grad():
        for recipe, leaf in zip(case.recipes, leaves):
            if recipe.name in written and leaf.untyped_storage().data_ptr() not in outputs_memory:
                try:
                    leaf.mul_(2).add_(1)
                except RuntimeError:  # memory torch refuses to write (overlapping elements)
                    continue
    try:
        grads = gradients(diff, [a for _, a in wrt], grad_outputs)
    except Exception:
        return None
    return dict(zip([name for name, _ in wrt], grads))


def writable_inputs(case: Case) -> list[str]:
    """The floating-point tensor inputs of ``case`` a caller could write in place: not empty, and
    no two elements in one memory location (an expanded input: torch refuses the write)."""
    return [
        recipe.name
        for recipe, leaf in zip(case.recipes, case.args())
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()) and leaf.numel()
        and all(stride != 0 or size == 1 for stride, size in zip(leaf.stride(), leaf.shape))
    ]


def unversioned_saves(case: Case) -> tuple[tuple[str, ...], list[str]] | None:
    """When writing inputs in place between forward and backward silently changes the gradients
    (backward read what forward saved outside autograd's version counter: ``x.data``): the
    inputs written (the first one whose write alone changes them, else all) and the gradients
    that changed. None when backward raises or the gradients stay as they were."""
    if case.spec.nondeterministic:
        return None
    names = writable_inputs(case)
    after = gradients_after_writes(case, names) if names else None
    plain = gradients_after_writes(case, ()) if after is not None else None
    if after is None or plain is None:
        return None

    def moved(grads: Mapping[str, torch.Tensor | None]) -> list[str]:
        return [
            name for name, now in grads.items()
            if isinstance(now, torch.Tensor) and isinstance(before := plain.get(name), torch.Tensor)
            and changed_elements(now, before)
        ]

    changed = moved(after)
    if not changed:
        return None
    for _ in range(2):  # gradients that differ from call to call anyway, even rarely, are determinism's finding
        again = gradients_after_writes(case, ())
        if again is None or moved(again):
            return None
    for name in names if len(names) > 1 else ():
        alone = gradients_after_writes(case, (name,))
        moved_alone = moved(alone) if alone is not None else []
        if moved_alone:
            return (name,), moved_alone
    return tuple(names), changed


def blocked_by_unversioned_saves(case: Case) -> None:
    """Raise ``Blocked`` by saved_tensors when backward reads inputs forward saved outside
    autograd's version counter (:func:`unversioned_saves`): for a contract whose finding (second
    derivatives through a detached save) that can explain."""
    found = unversioned_saves(case)
    if found is not None:
        written, changed = found
        raise Blocked(Defect(
            "saved_tensors",
            f"grad[{changed[0]!r}] changed silently after {', '.join(map(repr, written))} was written in place after forward",
        ), case)


def gradients_through_outputs(
    case: Case, used: tuple[int, ...], *, zeros_for_unused: bool
) -> tuple[list[torch.Tensor | None], BackwardCall | None, BaseException | None]:
    """Forward, then backward through the ``used`` output positions only (the others' grad_outputs
    undefined), or through all with zeros for the others: the gradients, the probe's record of the
    backward call, and the error backward raised (gradients empty then)."""
    leaves = case.args()
    with fixed_rng(case.grad_seed, case.device):  # Functions drawing random numbers draw the same ones
        called = forward(case, leaves)
    outputs, recorder = called.outputs, called.recorder
    positions = differentiable_positions(outputs)
    wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    diff = [outputs[p] for p in positions]
    grad_outputs = case.grad_outputs(diff)
    if zeros_for_unused:
        chosen = diff
        chosen_grads = [g if p in used else torch.zeros_like(g) for p, g in zip(positions, grad_outputs)]
    else:
        chosen = [outputs[p] for p in used]
        chosen_grads = [g for p, g in zip(positions, grad_outputs) if p in used]
    try:
        grads: list[torch.Tensor | None] = list(gradients(chosen, wrt, chosen_grads))
    except Exception as error:  # explained from the probe's record by the caller
        return [], recorder.calls[-1] if recorder.calls else None, error
    return grads, recorder.calls[-1] if recorder.calls else None, None


def _raises_with_one_output_used(case: Case) -> bool:
    """Whether backward raises when only one of two or more differentiable outputs is used (the
    others' grad_outputs undefined: None under ``ctx.set_materialize_grads(False)``)."""
    try:
        with fixed_rng(case.grad_seed, case.device):
            positions = differentiable_positions(forward(case, case.args(), how="guarded").outputs)
        return len(positions) >= 2 and any(
            gradients_through_outputs(case, (p,), zeros_for_unused=False)[2] is not None for p in positions
        )
    except Exception:
        return False


def _runs_cleanly(case: Case) -> bool:
    """Whether forward and backward of ``case`` run without raising, grad_outputs made contiguous."""
    try:
        with random_state(case.spec, case):
            execution = execute(case, grad_outputs=lambda outs: tuple(g.contiguous() for g in case.grad_outputs(outs)))
    except Exception:
        return False
    return execution.backward_error is None


def recorded_function_of_tensors(
    case: Case, args: Sequence[Any], wrt_positions: Sequence[int], fn: type[torch.autograd.Function] | None = None
) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Recorder]:
    """:func:`function_of_tensors` and the recorder of its probe (every backward call it made)."""
    # gradgradcheck's diagnosis calls it hundreds of times: nothing looks at its canaries, so none are kept.
    allocations = dataclasses.replace(allocation_policy(case.spec), keep_canaries=False)
    function, recorder = probe(fn or case.spec.fn, shield=True, allocations=allocations)
    return _of_tensors(function, case, args, wrt_positions, recorder), recorder


def _of_tensors(
    function: type[torch.autograd.Function], case: Case, args: Sequence[Any], wrt_positions: Sequence[int],
    recorder: Recorder | None = None,
) -> Callable[..., tuple[torch.Tensor, ...]]:
    def call(*wrt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if recorder is not None:  # the probe class is shared: other evaluations may have used it since
            record_into(function, recorder)
        full = list(args)
        # Clones (their gradient flows back to gradcheck's tensors): a forward or backward that
        # writes into its inputs must not move the very points gradcheck perturbs. Such writes
        # are the inplace contract's finding, not a wrong derivative.
        for position, tensor in zip(wrt_positions, wrt):
            full[position] = tensor.clone()
        with random_state(case.spec, case), kept_flags():
            outputs = _apply(function, forward_args(case, full))
        # Only outputs that can carry a gradient: torch's gradcheck takes finite differences of
        # every output it is given before it drops the non-differentiable ones, and two bool masks
        # cannot be subtracted. An infinite entry (a masked position's -inf, which moving an input
        # leaves -inf) has no derivative to check, and its difference is NaN: it counts as 0.
        return tuple(
            _infinities_as_zeros(o) for o in outputs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())
        )

    return call


def _infinities_as_zeros(output: torch.Tensor) -> torch.Tensor:
    if output.is_complex() or not bool(torch.isinf(output).any()):
        return output
    return torch.where(torch.isinf(output), torch.zeros((), dtype=output.dtype, device=output.device), output)


def function_of_tensors(
    case: Case, args: Sequence[Any], wrt_positions: Sequence[int], fn: type[torch.autograd.Function] | None = None
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``fn`` as a function of the tensors at ``wrt_positions`` (the others fixed), for gradcheck
    and gradgradcheck: declared in-place inputs are cloned, a declared-nondeterministic spec gets
    the same random numbers in every call (so finite differences are meaningful), and Python
    values and integer or bool tensors among the outputs are dropped (gradcheck reads
    ``.requires_grad`` on every output, and differences every one), and infinite entries count as 0. Unrecorded: gradcheck's
    hundreds of backward calls would each keep copies of their grad_outputs and saved tensors."""
    return _of_tensors(guarded(fn or case.spec.fn, allocation_policy(case.spec), shield=True), case, args, wrt_positions)


def reference_of_tensors(case: Case, args: Sequence[Any], wrt_positions: Sequence[int]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The spec's reference as a function of the tensors at ``wrt_positions`` (the others fixed),
    with the floating outputs :func:`function_of_tensors` keeps of the Function's: plain torch,
    whose derivatives finite differences can be asked about on the same points."""

    def call(*wrt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(args)
        for position, tensor in zip(wrt_positions, wrt):
            full[position] = tensor
        with random_state(case.spec, case):
            outputs = as_tuple(case.spec.reference(*full))
        return tuple(o for o in outputs if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))

    return call


# ----------------------------------------------------------------------------- plain functions


@dataclass
class Evaluated:
    """Outputs and input gradients of one evaluation (of the impl, the truth or the baseline).

    ``terms`` (truth only, see :mod:`conformance.engine.terms`): per output position / gradient name,
    the running error bound of each value in rounding units -- how large the terms are that it
    was computed from; ``accumulation``: the longest chain of additions behind any of them
    (:attr:`conformance.engine.terms.TermMagnitudes.accumulation`).
    """

    outputs: tuple[Any, ...]
    grads: dict[str, torch.Tensor | None]
    output_terms: dict[int, torch.Tensor] = field(default_factory=dict)
    grad_terms: dict[str, torch.Tensor] = field(default_factory=dict)
    accumulation: int = 0


def evaluate(
    func: Callable[..., Any],
    args: Sequence[Any],
    names: Sequence[str],
    grad_outputs: Mapping[int, torch.Tensor],
    *,
    autocast: Autocast | None = None,
) -> Evaluated:
    """Run ``func(*args)`` (inside ``autocast`` when given) and backpropagate ``grad_outputs`` (by
    output position) outside it.

    Gradients are taken with respect to every tensor argument that requires grad; each
    grad_output is cast to its output's dtype and device first.
    """
    with _autocast(autocast):
        outputs = as_tuple(func(*args))
    wrt = [(name, a) for name, a in zip(names, args) if isinstance(a, torch.Tensor) and a.requires_grad]
    positions = [p for p in differentiable_positions(outputs) if p in grad_outputs]
    if not wrt or not positions:
        return Evaluated(outputs, {})
    grads = gradients(
        [outputs[p] for p in positions],
        [a for _, a in wrt],
        [grad_outputs[p].detach().to(device=outputs[p].device, dtype=outputs[p].dtype) for p in positions],
    )
    return Evaluated(outputs, {name: grad for (name, _), grad in zip(wrt, grads)})


def evaluate_with_terms(
    func: Callable[..., Any],
    args: Sequence[Any],
    names: Sequence[str],
    grad_outputs: Mapping[int, torch.Tensor],
) -> Evaluated:
    """:func:`evaluate` under :class:`TermMagnitudes`, with each result's term bound; a
    reference the measurement cannot follow is evaluated plainly (bounds = |result|)."""
    mode = TermMagnitudes()
    try:
        with mode:
            result = evaluate(func, args, names, grad_outputs)
    except Exception:
        return evaluate(func, [fresh(a) for a in args], names, grad_outputs)
    result.output_terms = {
        position: mode.of(out).detach() for position, out in enumerate(result.outputs)
        if isinstance(out, torch.Tensor) and out.is_floating_point()
    }
    result.grad_terms = {name: mode.of(grad).detach() for name, grad in result.grads.items() if grad is not None}
    result.accumulation = mode.accumulation
    return result


REFERENCE_BLAME = (
    "The spec's reference must compute what the Function computes, output for output, with the same "
    "shapes: if the Function is right, fix reference= in register(...)."
)


def reference_label(spec: Spec) -> str:
    """``reference=`` as register() was given it: the function's name, and where a Python one is
    defined (a lambda has no other name)."""
    fn = spec.reference
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    code = getattr(fn, "__code__", None)
    return f"{name} ({Path(code.co_filename).name}:{code.co_firstlineno})" if code is not None else str(name)


def reference_raised(spec: Spec, error: BaseException) -> str:
    """The one summary of a spec's reference that raised on a case (the spec's error)."""
    return (
        f"the spec's reference raised {type(error).__name__}, but should run on this case "
        f"[spec {spec.name!r}, reference={reference_label(spec)}]"
    )


def raised_in_reference(spec: Spec, error: BaseException) -> bool:
    """Whether ``error`` was raised inside the spec's reference or surrogate (a frame of their
    own code on its traceback): the spec's finding, not the Function's."""
    codes = {getattr(fn, "__code__", None) for fn in (spec.reference, spec.surrogate)} - {None}
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def reference_error(case: Case, args: Sequence[Any] | None = None, *, autocast: Autocast | None = None) -> str | None:
    """What the spec's reference raises on ``args`` (default: the case's own), under ``autocast``
    when given, as :func:`conformance.engine.defects.raised` words it; None when it runs. A case on
    which the Function raises where its reference raises too (a singular matrix for an inverse,
    mixed dtypes for index_add) is outside the op's domain, not a crash of the Function."""
    spec = case.spec
    values = case.args() if args is None else args
    try:
        with kept_flags(), random_state(spec, case), _autocast(autocast), torch.no_grad():
            spec.reference(*[fresh(a) for a in values])
    except Exception as error:
        return raised(error)
    return None


def fresh(value: Any) -> Any:
    """A fresh leaf copy of a tensor (keeping requires_grad); other values unchanged."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def outputs_and_grads(
    func: Callable[..., Any], case: Case, grad_outputs: dict[int, torch.Tensor] | None
) -> tuple[Evaluated, dict[int, torch.Tensor]]:
    """Outputs and gradients of ``func`` (the target as users call it, or a compiled version) on
    fresh inputs from ``case``, under its RNG state; grad_outputs are drawn from the case when
    not given (and returned, for the next call), and passed as they are."""
    args = case.args()
    names = [r.name for r in case.recipes]
    with random_state(case.spec, case):
        outputs = as_tuple(func(*forward_args(case, args)))
        if grad_outputs is None:
            positions = differentiable_positions(outputs)
            grad_outputs = dict(zip(positions, case.grad_outputs([outputs[p] for p in positions])))
        wrt = [(n, a) for n, a in zip(names, args) if isinstance(a, torch.Tensor) and a.requires_grad]
        positions = [p for p in differentiable_positions(outputs) if p in grad_outputs]
        grads: dict[str, torch.Tensor | None] = {}
        if wrt and positions:
            found = gradients([outputs[p] for p in positions], [a for _, a in wrt], [grad_outputs[p] for p in positions])
            grads = {n: g for (n, _), g in zip(wrt, found)}
        elif wrt and grad_outputs:
            grads = {n: None for n, _ in wrt}  # outputs detached from the graph: no gradient reaches any input
    return Evaluated(outputs, grads), grad_outputs


def run_reference(
    func: Callable[..., Any],
    case: Case,
    *,
    dtype: torch.dtype,
    device: str,
    requires_grad: frozenset[str] | set[str] | None = None,
    grad_outputs_from: Sequence[torch.Tensor] | None = None,
) -> tuple[tuple[Any, ...], dict[str, torch.Tensor | None]]:
    """Outputs and input gradients of a plain differentiable function (reference/surrogate)."""
    args = case.args(dtype=dtype, device=device, requires_grad=requires_grad)
    outputs = as_tuple(func(*args))
    positions = differentiable_positions(outputs)
    wrt_names = [r.name for r, a in zip(case.recipes, args) if isinstance(a, torch.Tensor) and a.requires_grad]
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not positions or not wrt:
        return outputs, {}
    diff_outputs = [outputs[p] for p in positions]
    if grad_outputs_from is not None:
        grad_outs = tuple(g.detach().to(device=device, dtype=o.dtype) for g, o in zip(grad_outputs_from, diff_outputs))
    else:
        grad_outs = tuple(case.grad_outputs(diff_outputs))
    grads = gradients(diff_outputs, wrt, grad_outs)
    return outputs, dict(zip(wrt_names, grads))


# ----------------------------------------------------------------------------- as users call it


def user_call(case: Case, args: Sequence[Any] | None = None, *, grad: bool = True) -> tuple[Any, ...]:
    """The target called as its users call it (``spec.op.call``) on ``args`` (fresh ones from the
    case, built inside, when None; declared in-place inputs cloned), under the allocation policy
    of every evaluation; without ``grad``, under ``torch.no_grad()``."""
    with contextlib.ExitStack() as stack:
        if not grad:
            stack.enter_context(torch.no_grad())
        stack.enter_context(user_allocations(case))
        return as_tuple(case.spec.op.call(*forward_args(case, case.args() if args is None else args)))


def user_evaluate(case: Case, names: Sequence[str], grad_outputs: Mapping[int, torch.Tensor]) -> Evaluated:
    """:func:`evaluate` of the target as users call it, on fresh inputs from the case, forward and
    backward under the allocation policy of every evaluation."""
    with user_allocations(case):
        return evaluate(lambda *a: case.spec.op.call(*forward_args(case, a)), case.args(), names, grad_outputs)


def forward_mode(
    call: Callable[..., Any], case: Case, args: list[Any], tangents: Mapping[int, torch.Tensor]
) -> tuple[tuple[Any, ...], list[torch.Tensor | None]]:
    """Primal outputs and their tangents (None: none came back) of ``call`` on dual inputs
    (forward-mode AD), under the case's RNG state and the allocation policy."""
    with fwAD.dual_level(), random_state(case.spec, case):
        duals = [fwAD.make_dual(a, tangents[i]) if i in tangents else a for i, a in enumerate(args)]  # type: ignore[no-untyped-call]
        with user_allocations(case):
            outputs = as_tuple(call(*forward_args(case, duals)))
        unpacked = [fwAD.unpack_dual(o) if isinstance(o, torch.Tensor) else None for o in outputs]  # type: ignore[no-untyped-call]
        primals = tuple(u.primal.detach().clone() if u is not None else o for u, o in zip(unpacked, outputs))
        found = [u.tangent.detach().clone() if u is not None and u.tangent is not None else None for u in unpacked]
    return primals, found


def reference_jvp(case: Case, args: Sequence[Any], tangents: Mapping[int, torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """``torch.func.jvp`` at ``args`` along ``tangents`` of the spec's surrogate when it declares
    one (its derivatives are the declared ones), else of its reference (the caller sets the RNG
    state); per output, None where it is no floating tensor: an integer index has no tangent, as
    ``torch.sort``'s own has none."""
    func = case.spec.surrogate or case.spec.reference
    positions = sorted(tangents)
    floating: list[bool] = []

    def of_differentiable(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(args)
        for position, value in zip(positions, values):
            full[position] = value
        outputs = as_tuple(func(*full))
        floating[:] = [isinstance(o, torch.Tensor) and o.is_floating_point() for o in outputs]
        return tuple(o for o, kept in zip(outputs, floating) if kept)

    found = iter(torch.func.jvp(of_differentiable, tuple(args[p] for p in positions), tuple(tangents[p] for p in positions))[1])
    return tuple(next(found) if kept else None for kept in floating)


def reference_double_backward(
    case: Case, args: Sequence[Any], positions: Sequence[int], grad_outputs: Sequence[torch.Tensor], summed: Sequence[int],
    weights: Sequence[torch.Tensor],
) -> tuple[torch.Tensor | None, ...]:
    """What double backward gives for the spec's surrogate when it declares one, else its reference
    (the caller sets the RNG state): the derivative with respect to each ``args[p]`` (``p`` in
    ``positions``) of the first-order gradients ``summed`` (indices into ``positions``) of
    ``<outputs, grad_outputs>``, weighted by ``weights`` and summed; None where nothing depends on it."""
    func = case.spec.surrogate or case.spec.reference
    full = list(args)
    leaves = [args[p].detach().requires_grad_(True) for p in positions]
    for position, leaf in zip(positions, leaves):
        full[position] = leaf
    outputs = [o for o in as_tuple(func(*full)) if isinstance(o, torch.Tensor) and o.requires_grad]
    if len(outputs) != len(grad_outputs):
        raise ValueError(f"the reference has {len(outputs)} differentiable outputs, the Function {len(grad_outputs)}")
    firsts = torch.autograd.grad(outputs, leaves, list(grad_outputs), create_graph=True, allow_unused=True)
    attached = [(firsts[i] * w).sum() for i, w in zip(summed, weights) if firsts[i] is not None and firsts[i].requires_grad]
    if not attached:
        return tuple(None for _ in leaves)
    return tuple(torch.autograd.grad(torch.stack(attached).sum(), leaves, allow_unused=True))


def vmap_call(case: Case, in_dims: Sequence[int | None], batched: Sequence[Any]) -> tuple[Any, ...]:
    """``torch.func.vmap`` of the target (as users call it) over ``batched``, under the case's
    RNG state and the allocation policy."""
    with random_state(case.spec, case), user_allocations(case):
        return as_tuple(torch.func.vmap(case.spec.op.call, in_dims=tuple(in_dims))(*batched))


def vjp_call(
    case: Case, args: Sequence[Any], wrt: Sequence[int], floating: Sequence[int], grad_outputs: Mapping[int, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """``torch.func.vjp`` of the target (as users call it) with respect to the inputs at ``wrt``,
    pulled back along ``grad_outputs`` of the ``floating`` outputs."""
    spec = case.spec

    def of_differentiable(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(args)
        for position, value in zip(wrt, values):
            full[position] = value
        out = as_tuple(spec.op.call(*forward_args(case, full)))
        return tuple(out[p] for p in floating)

    with random_state(spec, case), user_allocations(case):
        vjp_fn = torch.func.vjp(of_differentiable, *(args[p].detach() for p in wrt))[1]
        return tuple(vjp_fn(tuple(grad_outputs[p] for p in floating)))

