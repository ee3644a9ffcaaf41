"""Where backward's gradients come from: the aten ops it ran, traced with a dispatch mode.

A gradient that an input did not need is wasted work only when the ops that produced it are not
also needed by the gradients that were needed. By-products cost nothing extra: a scan whose
gradient for one input is the reverse scan the needed gradient is built from, two channel
slices of one convolution, a view of a needed intermediate. :func:`extra_ops` names the ops only
the unneeded gradients needed; it cannot see inside an opaque kernel (Triton, a C extension),
whose gradients it reports as written by code it cannot see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conformance.engine.overlap import byte_span, shares_memory

__all__ = ["BackwardOps", "ExtraWork", "extra_ops"]


@dataclass(frozen=True)
class _Op:
    name: str  # e.g. "aten.mm.default"
    parents: tuple[int, ...]  # indices of the ops that last wrote its tensor inputs (-1: none seen)
    kind: str  # "compute", "alloc" (a new uninitialised or constant tensor) or "free" (a view, a copy)


class BackwardOps(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is untyped
    """Records every aten op while ``recording`` (turned on between forward and backward) and,
    for each tensor, the op that last wrote it (in-place and out= writes included)."""

    def __init__(self, *, recording: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recording = recording
        self.ops: list[_Op] = []
        self._writer: dict[int, int] = {}  # id(tensor) -> op index
        # storage -> (op index, tensor written) of each in-place or out= write: a gradient written
        # slice by slice into a view of a shared buffer depends on those writes
        self._writes: dict[Any, list[tuple[int, torch.Tensor]]] = {}
        self._alive: list[torch.Tensor] = []  # keeps ids from being reused

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self.recording:
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        written = [a for a, spec in zip(args, func._schema.arguments) if spec.is_write and isinstance(a, torch.Tensor)]
        index = len(self.ops)
        name = func.overloadpacket.__name__
        kind = "alloc" if name in _ALLOCATIONS or not inputs else "free" if func.is_view or name in _FREE else "compute"
        self.ops.append(_Op(str(func), tuple(p for t in inputs for p in self._writers_of(t)), kind))
        for tensor in [*outputs, *written]:
            self._writer[id(tensor)] = index
        for tensor in written:
            span = byte_span(tensor)
            if span is not None:
                self._writes.setdefault(span[0], []).append((index, tensor))
        self._alive.extend(inputs + outputs)
        return out

    def _writers_of(self, tensor: torch.Tensor) -> list[int]:
        """The op that made ``tensor`` and the writes into the bytes it spans since."""
        writers = [self._writer.get(id(tensor), -1)]
        span = byte_span(tensor) if self._writes else None
        if span is not None:
            writers += [index for index, written in self._writes.get(span[0], ()) if shares_memory(written, tensor)]
        return writers

    def ancestors(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """Indices of every op a tensor's value depends on (through the ops recorded)."""
        todo = [index for t in tensors for index in self._writers_of(t)]
        seen: set[int] = set()
        while todo:
            index = todo.pop()
            if index < 0 or index in seen:
                continue
            seen.add(index)
            todo.extend(self.ops[index].parents)
        return seen


# Ops that move or alias data without arithmetic worth calling work, and ops that allocate.
# set_ points a tensor at a storage (how the Triton interpreter hands back a kernel's results).
_FREE = frozenset({"clone", "contiguous", "_to_copy", "copy_", "detach", "alias", "lift_fresh", "set_"})
_ALLOCATIONS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "zero_", "fill_", "full", "full_like", "ones", "ones_like", "new_ones", "new_full",
})


@dataclass(frozen=True)
class ExtraWork:
    """What the unneeded gradients cost beyond the needed ones: ``ops`` (aten op name -> count),
    or ``opaque`` when no arithmetic op produced them (a kernel the dispatcher cannot see)."""

    ops: dict[str, int]
    opaque: bool = False

    def describe(self) -> str:
        if self.opaque:
            return (
                "no aten op computed it: a new buffer, zeros or written by code the dispatcher cannot see "
                "(a Triton or C++ kernel)"
            )
        return ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(self.ops.items()))


def extra_ops(recorded: BackwardOps, needed: Sequence[torch.Tensor], unneeded: Sequence[torch.Tensor]) -> ExtraWork | None:
    """The work only the ``unneeded`` gradients needed; None when they are by-products of the
    needed ones (every arithmetic op behind them is also behind a needed gradient)."""
    behind_needed = recorded.ancestors(needed)
    behind_unneeded = recorded.ancestors(unneeded)
    kinds = {recorded.ops[i].kind for i in behind_unneeded}
    if "alloc" in kinds and "compute" not in kinds:
        return ExtraWork({}, opaque=True)  # a buffer filled by a kernel the dispatcher cannot see
    extra = [recorded.ops[i].name for i in sorted(behind_unneeded - behind_needed) if recorded.ops[i].kind == "compute"]
    if not extra:
        return None
    return ExtraWork(dict(Counter(extra)))
