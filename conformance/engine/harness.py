"""Running a case: forward through the probe, backward with generated grad_outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from conformance.engine.defects import ForwardError, require_sound
from conformance.engine.global_state import RngStates, kept_flags, rng_states, set_rng_states
from conformance.engine.memory import (
    MARGIN,
    AllocationPolicy,
    Allocations,
    Unwritten,
    padded_copy,
    poison_candidates,
    unwritten_elements,
)
from conformance.engine.probe import Recorder, probe
from strategies.cases import Case

if TYPE_CHECKING:
    from conformance.spec import Spec

__all__ = [
    "FD_EPS",
    "FD_SPACING",
    "NONDET_TOL",
    "Execution",
    "as_tuple",
    "differentiable_positions",
    "execute",
    "fixed_rng",
    "forward_args",
    "function_of_tensors",
    "preflight",
    "random_state",
    "run_reference",
    "why_no_backward",
]


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def differentiable_positions(outputs: Sequence[Any]) -> list[int]:
    """Positions of outputs that carry a gradient (floating point, attached to the graph)."""
    return [
        position
        for position, out in enumerate(outputs)
        if isinstance(out, torch.Tensor) and out.requires_grad and (out.is_floating_point() or out.is_complex())
    ]


def forward_args(case: Case, args: Sequence[Any]) -> list[Any]:
    """``args`` as passed to forward: inputs the spec declares in ``mutates`` become clones.

    A leaf that requires grad cannot be modified in place (autograd refuses ``mark_dirty`` on
    it), and the caller's tensors must keep their values; ``x.clone()`` is a non-leaf whose
    gradient flows back to the leaf, exactly how an in-place op is used inside a model.
    """
    mutated = set(case.spec.mutates)
    return [
        arg.clone() if recipe.name in mutated and isinstance(arg, torch.Tensor) else arg
        for recipe, arg in zip(case.recipes, args)
    ]


@dataclass
class Execution:
    """One forward (and optionally backward) of a case, with everything the contracts inspect."""

    case: Case
    args: list[Any]
    outputs: tuple[Any, ...]
    recorder: Recorder
    diff_positions: list[int] = field(default_factory=list)
    grad_outputs: tuple[torch.Tensor, ...] = ()
    # Private copies taken before backward ran: what a comparison must use, since a defective
    # backward may write into the grad_outputs it was given (the inplace contract's finding).
    grad_outputs_before: tuple[torch.Tensor, ...] = ()
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    backward_error: BaseException | None = None
    passed: list[Any] = field(default_factory=list)  # what forward received (declared in-place inputs cloned)
    # Output/gradient elements that came from memory the Function never wrote (poisoned
    # allocations, confirmed by a zero-filled rerun): the unwritten_memory contract's finding.
    unwritten: list[Unwritten] = field(default_factory=list)

    def observed(self) -> list[tuple[str, torch.Tensor | None]]:
        """The tensors a caller gets: forward's outputs and the input gradients, labelled."""
        labelled: list[tuple[str, torch.Tensor | None]] = [
            (f"output[{i}]", o) for i, o in enumerate(self.outputs) if isinstance(o, torch.Tensor)
        ]
        labelled.extend((f"grad[{name!r}]", grad) for name, grad in self.grads.items())
        return labelled

    @property
    def wrt_names(self) -> list[str]:
        return [
            recipe.name
            for recipe, arg in zip(self.case.recipes, self.args)
            if isinstance(arg, torch.Tensor) and arg.requires_grad
        ]


UNWRITTEN_CONTRACT = "unwritten_memory"


def allocation_policy(spec: Spec) -> AllocationPolicy:
    """What every evaluation does to the Function's own uninitialised allocations: canary
    margins always; poisoned unless the spec waives unwritten_memory (then left unfilled)."""
    return AllocationPolicy(None if UNWRITTEN_CONTRACT in spec.waivers else "poison", MARGIN)


def user_allocations(spec: Spec) -> Allocations:
    """The allocation policy of every evaluation, as a context for contracts that call the target
    themselves, as its users do (forward AD, torch.func): a store past the end of a buffer lands
    in a canary margin instead of corrupting the process (out_of_bounds reports it, through the
    probe; these canaries are not kept), and what is never written stays poisoned."""
    return Allocations(dataclasses.replace(allocation_policy(spec), keep_canaries=False), phase="the Function")


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
    inputs and grad_outputs inside such buffers too.
    """
    policy = allocation_policy(case.spec)

    def run(allocations: AllocationPolicy, *, first: bool) -> Execution:
        with kept_flags():  # a Function that leaks global state is global_state's finding only
            return _execute(
                case, dtype, device, requires_grad, backward, fn, grad_outputs, retain_graph,
                after_forward if first else None, after_backward if first else None, allocations, guard_inputs and first,
            )

    rng_before = rng_states()
    execution = run(policy, first=True)
    if policy.fill == "poison" and execution.recorder.uninitialised_allocations and poison_candidates(execution.observed()):
        zeros = AllocationPolicy("zeros", policy.margin, keep_canaries=False)
        execution.unwritten = _confirm_unwritten(execution, rng_before, lambda: run(zeros, first=False))
    return execution


def _confirm_unwritten(execution: Execution, rng_before: RngStates, rerun: Callable[[], Execution]) -> list[Unwritten]:
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


def _execute(
    case: Case,
    dtype: torch.dtype | None,
    device: str | None,
    requires_grad: frozenset[str] | set[str] | None,
    backward: bool,
    fn: type[torch.autograd.Function] | None,
    grad_outputs: Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]] | None,
    retain_graph: bool,
    after_forward: Callable[[Execution], None] | None,
    after_backward: Callable[[Execution], None] | None,
    policy: AllocationPolicy,
    guard_inputs: bool,
) -> Execution:
    probed, recorder = probe(fn or case.spec.fn, allocations=policy)
    args = case.args(dtype=dtype, device=device, requires_grad=requires_grad)
    if guard_inputs:
        args = [_between_canaries(arg, policy.margin, f"input {recipe.name!r}", recorder) for recipe, arg in zip(case.recipes, args)]
    passed = forward_args(case, args)
    try:
        outputs = as_tuple(probed.apply(*passed))
    except Exception as error:
        raise ForwardError(f"{type(error).__name__}: {error}") from error
    execution = Execution(case=case, args=args, outputs=outputs, recorder=recorder, passed=passed)
    execution.diff_positions = differentiable_positions(outputs)
    if after_forward is not None:
        after_forward(execution)
    if not backward:
        return execution
    wrt = [arg for arg in args if isinstance(arg, torch.Tensor) and arg.requires_grad]
    diff_outputs = [outputs[p] for p in execution.diff_positions]
    if not wrt or not diff_outputs:
        return execution
    make = grad_outputs or (lambda outs: case.grad_outputs(outs))
    execution.grad_outputs = tuple(make(diff_outputs))
    if guard_inputs:
        execution.grad_outputs = tuple(
            _between_canaries(g, policy.margin, f"grad_output[{i}]", recorder) for i, g in enumerate(execution.grad_outputs)
        )
    execution.grad_outputs_before = tuple(g.detach().clone() for g in execution.grad_outputs)
    try:
        grads = torch.autograd.grad(
            diff_outputs, wrt, execution.grad_outputs, allow_unused=True, retain_graph=retain_graph
        )
    except Exception as error:  # the contracts explain engine errors from the raw record
        execution.backward_error = error
        return execution
    execution.grads = dict(zip(execution.wrt_names, grads))
    if after_backward is not None:
        after_backward(execution)
    return execution


def _between_canaries(value: Any, margin: int, label: str, recorder: Recorder) -> Any:
    """``value`` moved into a canary-margined buffer (tensors only; the canaries go to ``recorder``)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy, canaries = padded_copy(value, margin, label)
    if canaries is not None:
        recorder.canaries.append(canaries)
    return copy


def why_no_backward(execution: Execution) -> str:
    """Why ``execution`` recorded no backward call: the reason a contract that inspects
    backward gives for an example it could not check (see ``Target.not_checked``)."""
    spec = execution.case.spec
    if not spec.differentiable_inputs:
        return (
            f"{spec.name!r} declares no differentiable input (only Index/Mask/Scalar inputs or Tensors "
            "with requires_grad=False), so backward never runs"
        )
    if not execution.wrt_names:
        return "no input required grad in the examples drawn"
    if not execution.diff_positions:
        return (
            "no output of forward requires grad (integer or boolean outputs, or all marked "
            "non-differentiable), so backward never runs"
        )
    return "backward was not called"


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
        grad_outs = case.grad_outputs(diff_outputs)
    grads = torch.autograd.grad(diff_outputs, wrt, grad_outs, allow_unused=True)
    return outputs, dict(zip(wrt_names, grads))


@contextlib.contextmanager
def fixed_rng(seed: int, device: str | torch.device = "cpu") -> Iterator[None]:
    """torch's global RNG forked and seeded with ``seed`` (CPU, plus the current CUDA device
    when ``device`` is CUDA), restored afterwards.

    Used to give a Function declared ``nondeterministic=True`` the same random numbers on every
    call where a contract must compare calls (gradcheck's repeated forwards, layouts). Never used
    by the determinism contract, which must see undeclared randomness.
    """
    cuda = torch.device(device).type == "cuda"
    devices = [torch.cuda.current_device()] if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)
        yield


def random_state(spec: Spec, case: Case) -> contextlib.AbstractContextManager[None]:
    """One seeded RNG state for each evaluation of a declared-nondeterministic spec, so the
    implementation and a reference that draws its randomness the same way see the same numbers
    (a no-op for deterministic specs, whose hidden randomness must stay visible)."""
    if not spec.nondeterministic:
        return contextlib.nullcontext()
    return fixed_rng(zlib.crc32(repr(("random_state", case.grad_seed)).encode()), case.device)


# The finite-difference step of gradcheck/gradgradcheck (torch's default), and how far apart the
# values drawn for them are kept -- from each other and from declared kinks: 100 steps, so that
# no central difference (which moves an element, or the difference of two, by at most 2 steps in
# fast mode) straddles a tie or a kink (see strategies.values.spread).
FD_EPS = 1e-6
FD_SPACING = 100 * FD_EPS

# Declared-nondeterministic backward: allowed difference between two backward calls (float64),
# for gradcheck's and gradgradcheck's reentrancy check.
NONDET_TOL = 1e-10


def function_of_tensors(
    case: Case, args: Sequence[Any], wrt_positions: Sequence[int], fn: type[torch.autograd.Function] | None = None
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``fn`` as a function of the tensors at ``wrt_positions`` (the others fixed), for gradcheck
    and gradgradcheck: declared in-place inputs are cloned, a declared-nondeterministic spec gets
    the same random numbers in every call (so finite differences are meaningful), and Python
    values among the outputs are dropped (gradcheck reads ``.requires_grad`` on every output)."""
    # gradcheck calls it hundreds of times: nothing looks at its canaries, so none are kept.
    allocations = dataclasses.replace(allocation_policy(case.spec), keep_canaries=False)
    function = probe(fn or case.spec.fn, shield=True, allocations=allocations)[0]

    def call(*wrt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(args)
        # Clones (their gradient flows back to gradcheck's tensors): a forward or backward that
        # writes into its inputs must not move the very points gradcheck perturbs. Such writes
        # are the inplace contract's finding, not a wrong derivative.
        for position, tensor in zip(wrt_positions, wrt):
            full[position] = tensor.clone()
        with random_state(case.spec, case), kept_flags():
            outputs = as_tuple(function.apply(*forward_args(case, full)))
        return tuple(o for o in outputs if isinstance(o, torch.Tensor))

    return call


def preflight(contract: str, case: Case, *, dtype: torch.dtype | None = None) -> Execution:
    """Forward and backward of ``case`` through the probe, stopping (failure or "blocked by")
    on a crash or a structural defect; for contracts that then drive the Function themselves."""
    __tracebackhide__ = True
    with random_state(case.spec, case):
        execution = execute(case, dtype=dtype)
    require_sound(contract, execution)
    return execution
