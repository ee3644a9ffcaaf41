"""Memory the Function should not touch or keep: poisoned allocations, canaries, saved bytes.

A fresh CPU page is zeros, so a kernel that never writes part of its output looks right on a
lucky machine, and an unmasked tail store lands in a neighbour's buffer without an error. Three
mechanisms make those visible; the execution layer (:mod:`conformance.engine.harness`) applies them
through the probe, around the user's own forward and backward only:

* :class:`Allocations` is a ``TorchFunctionMode`` that sees every allocation the Function's
  Python code makes (``torch.empty``, ``empty_like``, ``new_empty``, ``empty_strided``, also
  those of a Triton kernel's Python wrapper; not those inside a C++ extension). With
  ``fill="poison"`` it fills them with NaN (floats) or :data:`INT_POISON` (integers); an element the Function never wrote then stays NaN.
  It is entered only around code that may make such a call (:class:`WatchedCode`).
  :func:`unwritten_elements` confirms it against a second run whose allocations hold zeros (what
  a lucky machine gives): NaN with poison but not with zeros means the value came from memory
  the Function never wrote. A NaN in both runs is the Function's own (0/0), never reported here.
* Each such allocation's storage also extends :data:`MARGIN` elements of :data:`CANARY` values
  past its end -- in every evaluation, so an unmasked tail store lands in a margin instead of
  corrupting the process's heap -- and :func:`padded_copy` puts inputs and grad_outputs between
  such margins; :meth:`CanaryBuffer.damage` reports a changed margin as an
  out-of-bounds write (the out_of_bounds contract looks; the others do not).
* :func:`saved_storages` lists what a Function keeps for backward (``save_for_backward`` and
  tensors on ``ctx``), by storage: a saved slice keeps its whole base alive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.autograd.function import FunctionCtx
from torch.overrides import TorchFunctionMode

from conformance.engine.code_reach import reaches_once

__all__ = [
    "CANARY",
    "INT_POISON",
    "MARGIN",
    "AllocationFill",
    "AllocationPolicy",
    "Allocations",
    "CanaryBuffer",
    "SavedStorage",
    "Unwritten",
    "WatchedCode",
    "padded_copy",
    "plain_arguments",
    "poison_candidates",
    "saved_storages",
    "unwritten_elements",
]

AllocationFill = Literal["poison", "zeros"]
# Canary elements past the end of every buffer the Function allocates uninitialised (and either
# side of the inputs and grad_outputs in the out_of_bounds contract): more than a grid rounded up
# to 4096-wide blocks overshoots by, so such a store lands in a margin, not in the allocator's
# bookkeeping. Costs 4096 elements of memory and one fill per allocation.
MARGIN = 4096


@dataclass(frozen=True)
class AllocationPolicy:
    """What happens to the Function's uninitialised allocations: ``fill`` (None: not filled,
    though with a margin the memory then holds canary values) and ``margin`` canary elements
    past each one's end (0: none)."""

    fill: AllocationFill | None = "poison"
    margin: int = MARGIN
    keep_canaries: bool = True  # False: the margins protect the heap but nobody checks them
    # The floating canary (None: CANARY); another one tells a read from outside a tensor
    # (the results change with it) from a read inside (they do not).
    canary: float | None = None

# Calls that return memory nobody initialised (zeros/ones/full initialise theirs and are left
# alone), as the Function's Python code makes them: torch-function level, where a mode costs
# ~3 us per torch call (a dispatch mode costs ~14 us per aten op, 13% of the main job).
UNINITIALISED = {
    torch.empty: "torch.empty",
    torch.empty_like: "torch.empty_like",
    torch.empty_strided: "torch.empty_strided",
    torch.Tensor.new_empty: "Tensor.new_empty",
    torch.Tensor.new_empty_strided: "Tensor.new_empty_strided",
}
if hasattr(torch, "empty_permuted"):
    UNINITIALISED[torch.empty_permuted] = "torch.empty_permuted"
# The names under which Python code reaches them (``torch.empty``, ``x.new_empty``).
ALLOCATOR_NAMES = frozenset(name.rpartition(".")[2] for name in UNINITIALISED.values())
FUNCTION_METHODS = ("forward", "setup_context", "backward", "vjp", "jvp", "vmap")
INT_POISON = 0x5A5A  # clipped to the dtype's largest value for int8/uint8; bools get True
CANARY = 1234.5  # halved to fit a float8 dtype; compared bitwise with what was stored, so rounding is fine
INT_CANARY = 0x3C


def _poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return min(INT_POISON, torch.iinfo(dtype).max)


def _canary_value(dtype: torch.dtype, canary: float | None = None) -> float | int | bool:
    if dtype.is_complex:
        return CANARY if canary is None else canary
    if dtype.is_floating_point:
        chosen = CANARY if canary is None else canary
        return math.copysign(min(abs(chosen), torch.finfo(dtype).max / 2), chosen)  # float8_e4m3fn's largest value is 448
    if dtype == torch.bool:
        return True
    return INT_CANARY


def _span(size: Sequence[int], stride: Sequence[int]) -> int:
    """Elements of storage a tensor of ``size``/``stride`` reaches from its offset (0 if empty)."""
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(size, stride))


@dataclass
class CanaryBuffer:
    """A tensor placed ``before`` elements into a buffer of canaries that extends ``after``
    elements past its last one."""

    label: str  # e.g. "grad_output[0]" or "a buffer from torch.empty_like(3,) in forward"
    buffer: torch.Tensor  # the whole storage, flat
    before: int
    span: int
    after: int
    expected_before: torch.Tensor = field(init=False)
    expected_after: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.expected_before = self.buffer[: self.before].clone()
        self.expected_after = self.buffer[self.before + self.span :].clone()

    def damage(self) -> str | None:
        """``"wrote 3 element(s) past the end of grad_output[0] (...: +0, +1, +2)"``, or None."""
        if self.buffer.untyped_storage().nbytes() < self.buffer.numel() * self.buffer.element_size():
            return None  # the Function freed or shrank the storage (untyped_storage().resize_(0))
        changed_before = _changed(self.buffer[: self.before], self.expected_before)
        changed_after = _changed(self.buffer[self.before + self.span :], self.expected_after)
        parts = []
        if changed_after:
            offsets = ", ".join(f"+{i}" for i in changed_after[:5])
            parts.append(
                f"wrote {len(changed_after)} element(s) past the end of {self.label} (element offsets after its last "
                f"element: {offsets}{', ...' if len(changed_after) > 5 else ''})"
            )
        if changed_before:
            offsets = ", ".join(f"-{self.before - i}" for i in changed_before[:5])
            parts.append(
                f"wrote {len(changed_before)} element(s) before the start of {self.label} (element offsets before "
                f"its first element: {offsets}{', ...' if len(changed_before) > 5 else ''})"
            )
        return "; ".join(parts) or None


def _changed(now: torch.Tensor, expected: torch.Tensor) -> list[int]:
    # Bitwise: a NaN written over a canary is a change, a canary rewritten with itself is not.
    if not expected.numel():
        return []
    now_bits = now.detach().cpu().contiguous().view(torch.uint8).view(now.numel(), -1)
    expected_bits = expected.detach().cpu().contiguous().view(torch.uint8).view(expected.numel(), -1)
    if torch.equal(now_bits, expected_bits):  # the usual answer, in one call
        return []
    return torch.nonzero((now_bits != expected_bits).any(dim=1)).flatten().tolist()


def _marginable(tensor: torch.Tensor) -> bool:
    """Plain strided memory with elements (what a margin can surround and a fill can set)."""
    return (
        tensor.layout == torch.strided and not tensor.is_quantized and not tensor.is_nested
        and not tensor.is_meta and tensor.numel() > 0
        # A torch.func wrapper (vmap's batched tensor) has no storage of its own to extend.
        and not torch._C._functorch.is_functorch_wrapped_tensor(tensor)
    )


def _margined(
    like: torch.Tensor, before: int, after: int, label: str, canary: float | None = None
) -> tuple[torch.Tensor, CanaryBuffer] | None:
    """An uninitialised tensor with ``like``'s size, strides, dtype and device whose storage
    holds ``before`` canaries ahead of it and ``after`` past its last element -- its own
    tensor (``set_`` on the storage), not a view, so in-place use and ``as_strided`` offsets
    behave as on a fresh allocation. None for a dtype whose canary cannot be stored."""
    span = _span(like.shape, like.stride())
    buffer = torch.empty(before + span + after, dtype=like.dtype, device=like.device)
    try:
        buffer.fill_(_canary_value(like.dtype, canary))
    except (RuntimeError, TypeError):
        return None
    tensor = torch.empty(0, dtype=like.dtype, device=like.device)
    tensor.set_(buffer.untyped_storage(), before, like.shape, like.stride())
    return tensor, CanaryBuffer(label, buffer, before, span, after)


def padded_copy(
    tensor: torch.Tensor, margin: int, label: str, canary: float | None = None
) -> tuple[torch.Tensor, CanaryBuffer | None]:
    """A copy of ``tensor`` (same values, size, strides; a leaf with its requires_grad) that lives
    between ``margin`` canary elements (``canary``, floating dtypes) either side; ``tensor`` itself,
    with no canaries, when it cannot be (overlapping stride-0 memory, a layout other than strided,
    no elements)."""
    overlapping = any(st == 0 and n > 1 for n, st in zip(tensor.shape, tensor.stride()))
    made = None if overlapping or not _marginable(tensor) else _margined(tensor, margin, margin, label, canary)
    if made is None:
        return tensor, None
    copy, canaries = made
    with torch.no_grad():
        copy.copy_(tensor)
    copy.requires_grad_(tensor.requires_grad)
    return copy, canaries


def _is_allocator(value: Any) -> bool:
    return any(value is allocator for allocator in UNINITIALISED)


def _plain_argument(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain_argument(item) for item in value)
    # ``FunctionCtx``: the ctx a forward or jvp of the Function itself receives.
    plain = (torch.Tensor, bool, int, float, complex, str, slice, torch.dtype, torch.device, torch.layout, torch.memory_format, FunctionCtx)
    return value is None or value is Ellipsis or isinstance(value, plain)


def plain_arguments(args: Iterable[Any]) -> bool:
    """Whether ``args`` are data only (tensors, numbers, strings, dtypes, tuples of them): no
    callable or object whose code, run by the Function, could allocate."""
    return all(_plain_argument(arg) for arg in args)


class WatchedCode:
    """Whether :class:`Allocations` must be entered around a Function's code at all. The mode
    sees only calls made from Python frames outside any torch call (inside one it is popped), so
    when the Function's own code -- ``forward``, ``setup_context``, ``backward``, ``jvp``,
    ``vmap`` and the user's helpers they reach, read to their end by
    :mod:`conformance.engine.code_reach` -- names none of ``UNINITIALISED`` and its arguments are
    plain data, it would see nothing of the Function's own; entering it costs ~1 us on every torch
    call made (2% of the main job). Once a call passes anything else (a callable: its code is not
    read), it is entered from then on. What torch's own Python helpers allocate
    (``torch.nn.grad.conv1d_input`` calls ``new_empty``) is torch's, not the Function's: such a
    Function's unwritten_memory verdict is n/a, where the mode used to poison those buffers too."""

    __slots__ = ("initially", "watched")

    def __init__(self, function: type) -> None:
        self.initially = _made_by_the_suite(function) or (
            reaches_once(function, lambda: _methods(function), _is_allocator, ALLOCATOR_NAMES) is not False
        )
        self.watched = self.initially

    def anew(self) -> WatchedCode:
        """A watch of the same code as before any call (for another evaluation), without reading it again."""
        fresh = object.__new__(WatchedCode)
        fresh.initially = fresh.watched = self.initially
        return fresh

    def called_with(self, args: Iterable[Any]) -> bool:
        """Whether to watch a call on ``args`` (and every later one)."""
        if not self.watched and not plain_arguments(args):
            self.watched = True
        return self.watched


def _made_by_the_suite(function: type) -> bool:
    """A Function the suite built around a custom op (:mod:`conformance.spec.targets`): its methods
    call the op's registered backward and setup_context, which the walk (never reading the suite's
    own code) would not see."""
    return any(str(getattr(method, "__module__", "")).split(".")[0] == "conformance" for method in _methods(function))


def _methods(function: type) -> list[Callable[..., Any]]:
    return [method for name in FUNCTION_METHODS if (method := getattr(function, name, None)) is not None]


class Allocations(TorchFunctionMode):
    """While active, every uninitialised allocation (``UNINITIALISED``) is, as ``policy`` says,
    filled (poison, zeros, or left as torch gives it) and given ``policy.margin`` canary elements
    past its end in the same storage (kept in ``canaries`` for :meth:`CanaryBuffer.damage` when
    ``policy.keep_canaries``). The tensor keeps storage offset 0 and is not a view. Unless
    ``watched``, entering it does nothing (:class:`WatchedCode` says it could see nothing)."""

    def __init__(self, policy: AllocationPolicy | None = None, *, phase: str = "", watched: bool = True) -> None:
        super().__init__()
        self.policy = policy or AllocationPolicy()
        self.phase = phase
        self.watched = watched
        self.allocations = 0
        self.canaries: list[CanaryBuffer] = []

    def __enter__(self) -> Allocations:
        if self.watched:
            super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watched:
            super().__exit__(*exc)  # type: ignore[no-untyped-call]

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = UNINITIALISED.get(func)
        if name is None or not isinstance(out, torch.Tensor) or (kwargs and kwargs.get("out") is not None):
            return out
        if not _marginable(out):  # torch.empty(0) grown by a later out= or resize_ is the Function's own business
            return out
        self.allocations += 1
        requires_grad = out.requires_grad
        if self.policy.margin:
            label = f"a buffer from {name}{tuple(out.shape)} in {self.phase or 'the Function'}"
            made = _margined(out, 0, self.policy.margin, label, self.policy.canary)
            if made is not None:
                out, canaries = made
                if self.policy.keep_canaries:
                    self.canaries.append(canaries)
        if self.policy.fill is not None:
            with torch.no_grad():
                try:
                    out.fill_(_poison_value(out.dtype) if self.policy.fill == "poison" else 0)
                except (RuntimeError, TypeError):  # a dtype without the poison value: left as it is
                    pass
        return out.requires_grad_() if requires_grad and not out.requires_grad else out


@dataclass(frozen=True)
class Unwritten:
    """Elements of one output or gradient that came from memory the Function never wrote."""

    what: str  # "output[0]" or "grad['x']"
    count: int
    total: int
    index: tuple[int, ...]  # of the first one
    poison: str  # the value it kept: "NaN", or the integer/bool poison

    def describe(self) -> str:
        return f"{self.what} has {self.count} of {self.total} element(s) never written (first at index {list(self.index)})"


def _poisoned_mask(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return torch.isnan(tensor)
    return tensor == _poison_value(tensor.dtype)


def poison_candidates(tensors: Iterable[tuple[str, torch.Tensor | None]]) -> bool:
    """True when any tensor holds a value poisoned allocations could have left (cheap test
    that decides whether the zero-filled confirmation run is needed)."""
    return any(t is not None and t.numel() and bool(_poisoned_mask(t.detach()).any()) for _, t in tensors)


def unwritten_elements(
    poisoned: Iterable[tuple[str, torch.Tensor | None]], zeroed: Mapping[str, torch.Tensor | None]
) -> list[Unwritten]:
    """Elements poisoned in the first run that hold something else when allocations were zeros."""
    found = []
    for what, tensor in poisoned:
        other = zeroed.get(what)
        if tensor is None or other is None or tensor.shape != other.shape or not tensor.numel():
            continue
        mask = _poisoned_mask(tensor.detach()) & ~_poisoned_mask(other.detach())
        count = int(mask.sum())
        if count:
            first = tuple(int(i) for i in torch.nonzero(mask)[0].tolist())
            poison = _poison_value(tensor.dtype)
            found.append(Unwritten(what, count, tensor.numel(), first, "NaN" if isinstance(poison, float) else repr(poison)))
    return found


@dataclass(frozen=True)
class SavedStorage:
    """One storage a Function keeps alive for backward, and how it is kept."""

    where: str  # "save_for_backward[1]" or "ctx.probs"
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # of the whole storage (a saved view keeps its base alive)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr())


def saved_storages(
    kept: Iterable[tuple[str, torch.Tensor]], *, free: Iterable[torch.Tensor] = (), canaries: Iterable[CanaryBuffer] = ()
) -> Iterator[SavedStorage]:
    """The storages of ``kept`` (``(where, tensor)``: what a Function holds for backward) that are
    not among ``free`` (the inputs' and outputs' storages), each once; a buffer among
    ``canaries`` counts without its margins (the suite added those)."""
    seen = {_storage_key(t) for t in free}
    unpadded = {_storage_key(c.buffer): c.span * c.buffer.element_size() for c in canaries}
    for where, tensor in kept:
        if tensor is None or not isinstance(tensor, torch.Tensor):
            continue
        key = _storage_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        nbytes = unpadded.get(key, tensor.untyped_storage().nbytes())
        yield SavedStorage(where, tuple(tensor.shape), tensor.dtype, nbytes)
