"""One defect, one failure: which contract owns a defect, and "blocked by" for the others.

Some defects make every later step meaningless: a backward that returns the wrong number of
gradients, or a gradient of the wrong shape, dtype or device, makes the autograd engine raise
(``returned an invalid gradient at index 1``) or silently repair the value (sum it, cast it).
Those are found on the probe's raw record by :func:`structural_defects`, each with the contract
that owns it (``return_count`` or ``grad_meta``). Every contract calls :func:`require_sound` on
its executions: the owner fails with the defect; any other contract stops with :class:`Blocked`,
which the runner turns into one labelled skip line ("blocked by grad_meta: ...") with the case
and the rerun command. A forward or backward that raises for any other reason is the failure of
the contract that ran it, labelled with the case, repro and rerun like every failure.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.engine.harness import Execution
from conformance.engine.probe import BackwardCall
from conformance.engine.report import describe_value, fail
from conformance.engine.triton_interpreter import interpreter_limit
from strategies.cases import Case
from strategies.recipes import FloatingRecipe

__all__ = [
    "CRASH_OWNER",
    "JUDGE_REPAIRED",
    "BackwardError",
    "Blocked",
    "Crash",
    "Defect",
    "ForwardError",
    "as_called",
    "backward_raised",
    "forward_defect",
    "forward_raised",
    "require_sound",
    "structural_defects",
    "unwritten_defect",
]

# Who fails for a forward or backward that raises on valid inputs (the runner asks
# evaluate.crash_owner): layouts when the same values in plain layouts run, needs_input_grad when
# they run with every input requiring grad, else this contract -- a crash on plain inputs leaves
# nothing to count. Every other contract that meets the crash is blocked by its owner.
CRASH_OWNER = "return_count"

# Contracts that judge the gradients the autograd engine passes on, so a gradient whose shape or
# dtype the engine repaired (summed over broadcast dims, cast) does not stop them: grad_meta fails
# for the raw value, and these judge the repaired one (wrong values fail them too).
JUDGE_REPAIRED = ("gradcheck", "reference")

@dataclass(frozen=True)
class Defect:
    """A defect found on backward's raw return value, and the contract that owns it."""

    owner: str
    summary: str
    details: tuple[str, ...] = ()


class Blocked(Exception):
    """This contract cannot check the Function because of a defect another contract owns.

    ``crash``: the Function raised on ``case`` alone (a forward that fails for 1-D inputs, a dtype
    it does not support); the contract goes on with its other examples, and a defect of its own
    on cases that run fails it. Any other block (wrong values, wrong metadata) ends the test: its
    defect shows in many forms, which would be reported again under this contract's name."""

    def __init__(self, defect: Defect, case: Case | None, *, crash: bool = False) -> None:
        self.defect = defect
        self.case = case
        self.crash = crash
        super().__init__(f"blocked by {defect.owner}: {defect.summary}")


class Crash(Exception):
    """The Function raised on ``case``; ``__cause__`` is the original error. The runner fails the
    contract that owns the crash and blocks the others (see :data:`CRASH_OWNER`)."""

    phase = ""

    def __init__(self, message: str, case: Case | None = None) -> None:
        super().__init__(message)
        self.case = case


class ForwardError(Crash):
    """The Function's forward raised."""

    phase = "forward"


def raised(error: BaseException, limit: int = 120) -> str:
    """``error`` in a summary line: its type and its message's first line, cut at ``limit``."""
    text = " ".join(str(error).strip().split("\n", 1)[0].split())
    if not text:
        return type(error).__name__
    return f"{type(error).__name__} ({text[:limit]}{'...' if len(text) > limit else ''})"


def backward_raised(error: BaseException, fn_name: str, *, by_engine: bool = False) -> str:
    """The one-line summary of a backward that raised ``error``."""
    where = "backward (raised by the autograd engine)" if by_engine else "backward"
    return f"backward raised {raised(error)}, but should return gradients [{fn_name}.{where}]"


def forward_raised(error: BaseException, fn_name: str) -> str:
    """The one-line summary of a forward that raised ``error``."""
    return f"forward raised {raised(error)}, but should return outputs [{fn_name}.forward]"


class BackwardError(Crash):
    """The Function's backward (or the autograd engine on what it returned) raised; ``summary``
    is the failure's first line."""

    phase = "backward"

    def __init__(self, message: str, case: Case | None = None, *, summary: str = "") -> None:
        super().__init__(message, case)
        self.summary = summary


def as_called(case: Case, args: Sequence[Any]) -> Case:
    """``case`` with the dtype and requires_grad subset its call really had (a contract may call
    it in another dtype, or with a subset of the inputs requiring grad)."""
    wanted = frozenset(r.name for r, a in zip(case.recipes, args) if isinstance(a, torch.Tensor) and a.requires_grad)
    floating = [
        a.dtype for r, a in zip(case.recipes, args)
        if isinstance(r, FloatingRecipe) and isinstance(a, torch.Tensor) and a.is_floating_point()
    ]
    dtype = floating[0] if floating else case.dtype
    if wanted == case.requires_grad and dtype == case.dtype:
        return case
    return dataclasses.replace(case, requires_grad=wanted, dtype=dtype)


def _broadcast_to(grad: torch.Tensor, arg: torch.Tensor, others: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """The shape ``arg`` was really broadcast to in this call when summing ``grad`` repairs it, else
    None: ``arg``'s shape broadcasts to ``grad``'s, and another input or an output has a shape that
    both broadcast to (``grad``'s itself, or a larger one when backward reduced some of the
    broadcast dims and not all)."""

    def broadcasts(small: tuple[int, ...], large: tuple[int, ...]) -> bool:
        try:
            return bool(torch.broadcast_shapes(small, large) == torch.Size(large))  # type: ignore[no-untyped-call]
        except RuntimeError:
            return False

    shape, own = tuple(grad.shape), tuple(arg.shape)
    if shape == own or len(shape) < len(own) or not broadcasts(own, shape):
        return None
    targets = [tuple(t.shape) for t in others if tuple(t.shape) != own and broadcasts(own, tuple(t.shape))]
    if shape in targets:
        return shape
    return next((target for target in targets if broadcasts(shape, target)), None)


def _missing_entries(raw: Sequence[Any], args: Sequence[Any], names: Sequence[str]) -> str:
    """Which forward inputs have no entry in a backward return that is too short: the ones left
    out where the returned tensors' shapes match the other inputs', in order (a None forgotten
    for an integer input shifts the gradients after it); else the last ones by position."""
    missing = len(names) - len(raw)
    fits = []
    for left_out in itertools.combinations(range(len(names)), missing):
        kept = [i for i in range(len(names)) if i not in left_out]
        if all(
            value is None or (isinstance(value, torch.Tensor) and isinstance(args[i], torch.Tensor) and value.shape == args[i].shape)
            for value, i in zip(raw, kept)
        ):
            fits.append([names[i] for i in left_out])
    if len(fits) == 1 and fits[0] != list(names[len(raw):]):
        return f"the entry for {fits[0]} is missing (the returned gradients match the other inputs' shapes, in order)."
    return f"the gradient for {list(names[len(raw):])} is missing."


def structural_defects(
    case: Case, call: BackwardCall, args: Sequence[Any], outputs: Sequence[Any] = ()
) -> list[Defect]:
    """Return-count and gradient-metadata defects in one backward call's raw return value."""
    if call.raw is None:
        return []
    raw = call.raw
    names = [r.name for r in case.recipes]
    fn_name = case.spec.display_name

    def returned() -> str:  # only where a defect is reported: most calls have none
        return ", ".join(describe_value(v) for v in raw)

    where = f"{fn_name}.backward, forward inputs {names}"
    defects: list[Defect] = []
    if len(raw) < len(names):
        defects.append(Defect(
            "return_count",
            f"len(backward return)={len(raw)}, but should be {len(names)} [{where}]",
            (
                f"backward returned ({returned()}); {_missing_entries(raw, args, names)}",
                "Return one entry per forward input (None where there is no gradient).",
            ),
        ))
        return defects
    extra = [i for i, v in enumerate(raw[len(names):], start=len(names)) if v is not None]
    if extra:
        defects.append(Defect(
            "return_count",
            f"len(backward return)={len(raw)}, but should be {len(names)} [{where}]",
            (
                f"backward returned ({returned()}); entries {extra} go beyond the {len(names)} forward inputs "
                "and are not None.",
            ),
        ))
    for recipe, value in zip(case.recipes, raw):
        if not isinstance(recipe, FloatingRecipe) and value is not None:
            defects.append(Defect(
                "return_count",
                f"grad[{recipe.name!r}]={describe_value(value)}, but should be None [{where}]",
                (
                    f"{recipe.name!r} is {'an' if recipe.kind[:1] in 'aeiou' else 'a'} {recipe.kind} input (not differentiable); backward must return None for it.",
                    f"backward returned ({returned()}).",
                ),
            ))
        elif value is not None and not isinstance(value, torch.Tensor):
            defects.append(Defect(
                "return_count",
                f"grad[{recipe.name!r}]={describe_value(value)}, but should be a Tensor or None [{where}]",
                (f"backward returned ({returned()}).",),
            ))
    if defects:
        return defects
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [o for o in outputs if isinstance(o, torch.Tensor)]
    for recipe, arg, grad in zip(case.recipes, args, raw):
        if not isinstance(grad, torch.Tensor) or not isinstance(arg, torch.Tensor):
            continue
        at = f"{fn_name}.backward, input {recipe.name!r}"
        if tuple(grad.shape) != tuple(arg.shape):
            target = _broadcast_to(grad, arg, [t for t in tensors if t is not arg])
            if target is not None:
                reduced = "was not reduced over" if target == tuple(grad.shape) else "was reduced over only some of"
                hint = (
                    f"{recipe.name!r} {tuple(arg.shape)} broadcasts to {target}, the shape of another input or output "
                    f"in this call, and the gradient {reduced} the broadcast dims: sum it over all of them "
                    "(grad.sum_to_size(input.shape)). The autograd "
                    "engine silently does this for you, which hides the bug from gradcheck."
                )
            elif grad.numel() < arg.numel() or (grad.numel() == arg.numel() and grad.dim() < arg.dim()):
                hint = (
                    f"The gradient has fewer elements or dims than {recipe.name!r}: backward reduced over a dim the "
                    "input has itself (a sum over every dim, or without keepdim=True). Reduce only over the dims "
                    "the input was broadcast across, then reshape to the input's shape."
                )
            else:
                hint = (
                    f"{recipe.name!r} was not broadcast to {tuple(grad.shape)} here, so summing would not make it "
                    "right: backward computed the gradient of another tensor (check the order of the returned "
                    "gradients and the dims it reduces)."
                )
            defects.append(Defect(
                "grad_meta", f"grad[{recipe.name!r}].shape={tuple(grad.shape)}, but should be {tuple(arg.shape)} [{at}]", (hint,)
            ))
        if grad.dtype != arg.dtype:
            defects.append(Defect(
                "grad_meta",
                f"grad[{recipe.name!r}].dtype={grad.dtype}, but should be {arg.dtype} [{at}]",
                (
                    "The autograd engine silently casts it, losing precision or wasting memory; a buffer made "
                    "with torch.zeros(shape) instead of torch.zeros_like(input) is the usual cause.",
                ),
            ))
        if grad.device != arg.device:
            defects.append(Defect("grad_meta", f"grad[{recipe.name!r}].device={grad.device}, but should be {arg.device} [{at}]"))
    return defects


def forward_defect(case: Case, outputs: Sequence[Any]) -> Defect | None:
    """A forward whose return value holds no tensor autograd tracks (a list, dict, None, a
    number, a tuple of those), owned by ``return_count``: nothing can be differentiated, and
    every other contract would find nothing to check."""
    if any(isinstance(o, torch.Tensor) for o in outputs):
        return None
    fn_name = case.spec.display_name
    what = _describe_return(outputs[0]) if len(outputs) == 1 else f"a tuple without a Tensor {_describe_return(tuple(outputs))}"
    return Defect(
        "return_count",
        f"forward returned {what}, but should return a Tensor or a tuple of Tensors [{fn_name}.forward]",
        (
            "autograd tracks only tensors that forward returns directly or as elements of a tuple: tensors "
            "inside a list or dict are not connected to the graph, so no gradient flows back through them "
            "and backward is never called.",
            "Return `y` or `(y, z)`.",
        ),
    )


def _describe_return(value: Any) -> str:
    """``a list [Tensor((3,), float64, cpu), ...]``-style description of a forward's return."""
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        items = ", ".join(describe_value(v) for v in value)
        return f"a {type(value).__name__} [{items}]" if isinstance(value, list) else f"({items})"
    if isinstance(value, dict):
        items = ", ".join(f"{k!r}: {describe_value(v)}" for k, v in value.items())
        return f"a dict {{{items}}}"
    return f"a {type(value).__name__} ({describe_value(value)})"


def read_outside_defect(case: Any, label: str) -> Defect:
    """``label`` (an output or gradient of ``case``) depends on memory outside the Function's
    tensors (:func:`conformance.engine.evaluate.reads_outside`): out_of_bounds' defect."""
    fn_name = case.spec.display_name
    return Defect(
        "out_of_bounds",
        f"{label} changes with the memory around the Function's tensors, but should depend only on what is inside "
        f"them [{fn_name}]",
        (
            "Every input, grad_output and uninitialised allocation sat between canary margins; with other values "
            f"in the margins, {label} changed: the Function reads past the end (or before the start) of a tensor. "
            "Outside the suite it reads whatever lives next door: values that change from call to call, NaN now "
            "and then.",
            "Usual causes: a load without a mask (tl.load(ptr + offs) with offs past n), a load mask that admits one "
            "element too many (offs <= n), a row stride or offset computed for a bigger tensor.",
        ),
    )


def unwritten_defect(execution: Execution) -> Defect:
    """Output or gradient elements read from memory the Function never wrote, owned by
    ``unwritten_memory`` (see :mod:`conformance.engine.memory`); by ``layouts`` where only strided
    inputs or grad_outputs leave them (a path for strided tensors, or a read outside one)."""
    first = execution.unwritten[0]
    fn_name = execution.case.spec.display_name
    phase = "forward" if first.what.startswith("output") else "backward"
    others = "; ".join(u.describe() for u in execution.unwritten[1:])
    if execution.unwritten_read_outside:  # NaN read from a poisoned neighbour: never unwritten
        return read_outside_defect(execution.case, execution.unwritten_read_outside)
    if execution.unwritten_only_strided:
        return Defect(
            "layouts",
            f"{first.what}{list(first.index)}={first.poison} from a poisoned allocation with strided inputs or "
            f"grad_outputs, but not with contiguous ones ({first.count} of {first.total} elements) [{fn_name}.{phase}]",
            (
                "With the same case in contiguous layouts every element is written. Either the Function's path for "
                "strided tensors leaves these elements unwritten, or it copies them from outside a strided or "
                "stride-0 input or grad_output that it reads as contiguous (a kernel that assumes contiguous "
                "memory: call .contiguous() before it).",
                f"Also: {others}." if others else "",
            ),
        )
    return Defect(
        "unwritten_memory",
        f"{first.what}{list(first.index)}={first.poison} from a poisoned allocation, but should be written by "
        f"{fn_name}.{phase} ({first.count} of {first.total} elements never written) [{fn_name}.{phase}]",
        (
            "Every uninitialised buffer the Function allocated (torch.empty, empty_like, new_empty, "
            "empty_strided) was filled with NaN (integers: a sentinel); these elements kept it, and hold a different value when the "
            "same buffers start as zeros -- so they come from memory the Function never wrote. Fresh memory is "
            "often zeros, which hides this on most machines.",
            "Usual causes: a launch grid that skips the last partial block (numel // BLOCK instead of "
            "cdiv(numel, BLOCK)), a store mask that excludes valid elements, a branch that fills only part of "
            "a buffer.",
            f"Also: {others}." if others else "",
            "A Function that deliberately returns uninitialised padding can opt out: "
            "register(..., waivers={'unwritten_memory': 'why'}).",
        ),
    )


def require_sound(contract: str, execution: Execution) -> None:
    """Stop unless ``execution`` ran cleanly: the owner of a structural defect fails with it,
    other contracts are blocked by it; a backward that raised otherwise fails ``contract``."""
    __tracebackhide__ = True
    defect = forward_defect(execution.case, execution.outputs)
    if defect is not None:
        if defect.owner == contract:
            fail(defect.summary, *defect.details, compares_values=False)
        raise Blocked(defect, execution.case)
    repaired_ok = contract in JUDGE_REPAIRED or "grad_meta" in execution.case.spec.waivers
    for call in execution.recorder.calls:
        defects = structural_defects(execution.case, call, execution.args, execution.outputs)
        own = [d for d in defects if d.owner == contract]
        if own:
            fail(own[0].summary, *own[0].details, compares_values=False)
        if repaired_ok and execution.backward_error is None:
            defects = [d for d in defects if d.owner != "grad_meta"]  # the engine repaired them
        if defects:
            raise Blocked(defects[0], execution.case)
    if execution.unwritten:
        defect = unwritten_defect(execution)
        if defect.owner == contract:
            fail(defect.summary, *defect.details)
        raise Blocked(defect, execution.case)
    error = execution.backward_error
    if error is None:
        return
    last = execution.recorder.calls[-1] if execution.recorder.calls else None
    inside = last is not None and last.error is not None
    cause = last.error if last is not None and last.error is not None else error
    limit = interpreter_limit(cause)
    if limit is not None:
        raise limit  # not the Function's defect: the runner counts the example as not checked here
    summary = backward_raised(cause, execution.case.spec.display_name, by_engine=not inside)
    raise BackwardError(f"{type(cause).__name__}: {cause}", as_called(execution.case, execution.args), summary=summary) from cause
