"""What an evaluation of a case is made of: its record (:class:`Execution`), the arguments forward
receives, the allocation policy and the RNG state every evaluation runs under.

The calls themselves (forward, backward, double backward, transformed calls) are made in
:mod:`conformance.engine.evaluate` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.engine.memory import MARGIN, AllocationPolicy, Allocations, Unwritten, WatchedCode
from conformance.engine.probe import Recorder
from conformance.spec import Spec
from strategies.cases import Case
from strategies.recipes import ScalarRecipe

__all__ = [
    "UNWRITTEN_CONTRACT",
    "Execution",
    "allocation_policy",
    "as_tuple",
    "changed_elements",
    "differentiable_positions",
    "fixed_rng",
    "forward_args",
    "random_state",
    "user_allocations",
    "why_no_backward",
]


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def changed_elements(now: torch.Tensor, before: torch.Tensor) -> int:
    """How many elements differ bitwise (so NaN == NaN, and 0.0 != -0.0)."""
    if tuple(now.shape) != tuple(before.shape) or now.dtype != before.dtype:
        return max(now.numel(), before.numel(), 1)
    a, b = now.detach().contiguous(), before.detach().to(now.device).contiguous()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        bits = _BITS[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return int((a != b).sum())


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
    # Unwritten elements that the same case in contiguous layouts does not have (layouts' finding:
    # a strided-only path leaves them, or the Function read them from outside a strided tensor).
    unwritten_only_strided: bool = False
    # Where the unwritten elements came from memory outside the Function's tensors: the first
    # output or gradient that changes with the canaries around them (evaluate.reads_outside).
    unwritten_read_outside: str | None = None
    # What contracts concluded from this evaluation (Target.judged_once), shared by every record
    # of it the pool hands out; None for an evaluation the pool does not keep.
    judgements: dict[tuple[str, Hashable], Any] | None = None

    def observed(self) -> list[tuple[str, torch.Tensor | None]]:
        """The tensors a caller gets: forward's outputs and the input gradients, labelled."""
        labelled: list[tuple[str, torch.Tensor | None]] = [
            (f"output[{i}]", o) for i, o in enumerate(self.outputs) if isinstance(o, torch.Tensor)
        ]
        labelled.extend((f"grad[{name!r}]", grad) for name, grad in self.grads.items())
        return labelled

    def written_in_place(self, inputs_as_made: Sequence[Any]) -> list[str]:
        """The grad_outputs and inputs whose values the Function changed, compared bitwise with
        the private copies and with ``inputs_as_made`` (the case's inputs made afresh)."""
        written = [
            f"grad_output[{i}]"
            for i, (now, before) in enumerate(zip(self.grad_outputs, self.grad_outputs_before))
            if changed_elements(now, before)
        ]
        written += [
            f"input {recipe.name!r}"
            for recipe, now, before in zip(self.case.recipes, self.args, inputs_as_made)
            if isinstance(now, torch.Tensor) and isinstance(before, torch.Tensor) and changed_elements(now, before)
        ]
        return written

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


def user_allocations(case: Case) -> Allocations:
    """The allocation policy of every evaluation, as a context for contracts that call the target
    themselves, as its users do (forward AD, torch.func): a store past the end of a buffer lands
    in a canary margin instead of corrupting the process (out_of_bounds reports it, through the
    probe; these canaries are not kept), and what is never written stays poisoned. Entered only
    where it could see something (:class:`conformance.engine.memory.WatchedCode`)."""
    spec = case.spec
    scalars = [recipe.value for recipe in case.recipes if isinstance(recipe, ScalarRecipe)]
    watched = WatchedCode(spec.op.function).called_with(scalars)
    return Allocations(dataclasses.replace(allocation_policy(spec), keep_canaries=False), phase="the Function", watched=watched)


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
        torch.default_generator.manual_seed(seed)
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
