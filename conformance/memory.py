"""Memory the Function should not touch or keep: poisoned allocations, canaries, saved bytes.

A fresh CPU page is zeros, so a kernel that never writes part of its output looks right on a
lucky machine, and an unmasked tail store lands in a neighbour's buffer without an error. Three
mechanisms make those visible; the execution layer (:mod:`conformance.harness`) applies them
through the probe, around the user's own forward and backward only:

* :class:`Allocations` is a ``TorchFunctionMode`` that sees every allocation the Function's
  Python code makes (``torch.empty``, ``empty_like``, ``new_empty``, ``empty_strided``, also
  those of a Triton kernel's Python wrapper; not those inside a C++ extension). With
  ``fill="poison"`` it fills them with NaN (floats) or :data:`INT_POISON` (integers); an element the Function never wrote then stays NaN.
  :func:`unwritten_elements` confirms it against a second run whose allocations hold zeros (what
  a lucky machine gives): NaN with poison but not with zeros means the value came from memory
  the Function never wrote. A NaN in both runs is the Function's own (0/0), never reported here.
* Each such allocation is also a view into a larger buffer whose margins (:data:`MARGIN`
  elements) hold :data:`CANARY` values -- in every evaluation, so an unmasked tail store lands
  in a margin instead of corrupting the process's heap -- and :func:`padded_copy` builds inputs
  and grad_outputs the same way; :meth:`CanaryBuffer.damage` reports a changed margin as an
  out-of-bounds write (the out_of_bounds contract looks; the others do not).
* :func:`saved_storages` lists what a Function keeps for backward (``save_for_backward`` and
  tensors on ``ctx``), by storage: a saved slice keeps its whole base alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

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
    "padded_copy",
    "poison_candidates",
    "saved_storages",
    "unwritten_elements",
]

AllocationFill = Literal["poison", "zeros"]
# Canary elements either side of every buffer the Function allocates uninitialised (and of the
# inputs and grad_outputs in the out_of_bounds contract): more than a rounded-up grid of 1024-wide
# programs overshoots by, so such a store lands in a margin, not in the allocator's bookkeeping.
MARGIN = 1024


@dataclass(frozen=True)
class AllocationPolicy:
    """What happens to the Function's uninitialised allocations: ``fill`` (None: left as torch
    gives them) and canary margins of ``margin`` elements (0: none)."""

    fill: AllocationFill | None = "poison"
    margin: int = MARGIN
    keep_canaries: bool = True  # False: the margins protect the heap but nobody checks them

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
INT_POISON = 0x5A5A  # clipped to the dtype's largest value for int8/uint8; bools get True
CANARY = 1234.5  # representable (or rounded identically each time) in every float dtype
INT_CANARY = 0x3C


def _poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return min(INT_POISON, torch.iinfo(dtype).max)


def _canary_value(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return CANARY
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
    """A tensor placed ``margin`` elements into a buffer whose margins hold canaries."""

    label: str  # e.g. "grad_output[0]" or "a buffer from torch.empty_like(3,) in forward"
    buffer: torch.Tensor
    margin: int
    span: int
    expected_before: torch.Tensor = field(init=False)
    expected_after: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.expected_before = self.buffer[: self.margin].clone()
        self.expected_after = self.buffer[self.margin + self.span :].clone()

    def damage(self) -> str | None:
        """``"wrote 3 elements past the end of grad_output[0] (at +0, +1, +2)"``, or None."""
        before = self.buffer[: self.margin]
        after = self.buffer[self.margin + self.span :]
        changed_after = _changed(after, self.expected_after)
        changed_before = _changed(before, self.expected_before)
        parts = []
        if changed_after:
            offsets = ", ".join(f"+{i}" for i in changed_after[:5])
            parts.append(
                f"wrote {len(changed_after)} element(s) past the end of {self.label} (element offsets after its last "
                f"element: {offsets}{', ...' if len(changed_after) > 5 else ''})"
            )
        if changed_before:
            offsets = ", ".join(f"-{self.margin - i}" for i in changed_before[:5])
            parts.append(
                f"wrote {len(changed_before)} element(s) before the start of {self.label} (element offsets before "
                f"its first element: {offsets}{', ...' if len(changed_before) > 5 else ''})"
            )
        return "; ".join(parts) or None


def _changed(now: torch.Tensor, expected: torch.Tensor) -> list[int]:
    # Bitwise: a NaN written over a canary is a change, a canary rewritten with itself is not.
    now_bits = now.detach().cpu().contiguous().view(torch.uint8).view(now.numel(), -1)
    expected_bits = expected.detach().cpu().contiguous().view(torch.uint8).view(expected.numel(), -1)
    return torch.nonzero((now_bits != expected_bits).any(dim=1)).flatten().tolist()


def _padded(like: torch.Tensor, margin: int, label: str) -> tuple[torch.Tensor, CanaryBuffer]:
    """An uninitialised tensor with ``like``'s size, strides, dtype and device, placed inside a
    canary-margined buffer."""
    span = _span(like.shape, like.stride())
    buffer = torch.empty(span + 2 * margin, dtype=like.dtype, device=like.device)
    buffer.fill_(_canary_value(like.dtype))
    view = buffer.as_strided(like.shape, like.stride(), margin)
    return view, CanaryBuffer(label, buffer, margin, span)


def padded_copy(tensor: torch.Tensor, margin: int, label: str) -> tuple[torch.Tensor, CanaryBuffer]:
    """A copy of ``tensor`` (same values, size, strides; a leaf with its requires_grad) that lives
    inside a buffer with ``margin`` canary elements either side."""
    view, canaries = _padded(tensor, margin, label)
    with torch.no_grad():
        view.copy_(tensor)
    view.requires_grad_(tensor.requires_grad)
    return view, canaries


class Allocations(TorchFunctionMode):
    """Fills (``fill="poison"`` or ``"zeros"``; None: leaves) every uninitialised allocation made
    while active, and with ``canary_margin > 0`` places each inside a canary-margined buffer
    (kept in ``canaries`` for :meth:`CanaryBuffer.damage`)."""

    def __init__(
        self, fill: AllocationFill | None = "poison", *, canary_margin: int = 0, phase: str = "", keep: bool = True
    ) -> None:
        super().__init__()
        self.fill = fill
        self.keep = keep  # False: the margined buffers are not kept (nothing outlives its tensor)
        self.allocations = 0
        self.canary_margin = canary_margin
        self.phase = phase
        self.canaries: list[CanaryBuffer] = []

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = UNINITIALISED.get(func)
        if name is None or not isinstance(out, torch.Tensor) or out.is_meta or (kwargs and "out" in kwargs):
            return out
        self.allocations += 1
        requires_grad = out.requires_grad
        if self.canary_margin:
            label = f"a buffer from {name}{tuple(out.shape)} in {self.phase or 'the Function'}"
            out, canaries = _padded(out, self.canary_margin, label)
            if self.keep:
                self.canaries.append(canaries)
        if out.numel() and self.fill is not None:
            with torch.no_grad():
                out.fill_(_poison_value(out.dtype) if self.fill == "poison" else 0)
        return out.requires_grad_() if requires_grad and not out.requires_grad else out


@dataclass(frozen=True)
class Unwritten:
    """Elements of one output or gradient that came from memory the Function never wrote."""

    what: str  # "output[0]" or "grad['x']"
    count: int
    total: int
    index: tuple[int, ...]  # of the first one

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
            found.append(Unwritten(what, count, tensor.numel(), first))
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
