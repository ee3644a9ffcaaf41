"""What a ctx holds: one search, at any depth, for the tensors and tensor-memory views on it.

``ctx.x = x`` is the plain case; the same tensor kept as ``ctx.cache = ((x, shape), ...)``, in a
dict, a dataclass, a namedtuple or a small object of the user's, or as a numpy array or
memoryview over the tensor's memory (``x.detach().numpy()``), escapes save_for_backward just the
same. :func:`reachable` walks the containers and yields each tensor and buffer with the Python
path that reaches it (``ctx.cache[0][1][0]``); :func:`held_on` describes what a ctx holds with
the memory each item lies in, so a check can tell a view of an input or output from a private
copy (:func:`owner_of`). The probe records it per backward call, saved_memory measures the
tensors; both use this one walk.

Not searched: functions, classes, modules and other callables (``nn.Module`` included; what they
hold is their owner's), another Function's ctx, numpy object arrays; private (``_``) attributes
of the ctx itself. The walk visits at most :data:`NODE_LIMIT` values per ctx attribute, each
container once.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch

__all__ = ["NODE_LIMIT", "Held", "Span", "held_on", "on_ctx", "owner_of", "reachable", "storage_span"]

# Values visited per ctx attribute: enough for any real cache, and a bound on the time an
# attribute holding a long Python list (of ints, say) can cost every backward call (~10 ms).
NODE_LIMIT = 10_000

_SCALARS = (str, bytes, int, float, complex, bool, type(None), np.generic, torch.dtype, torch.device, torch.layout)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_OPAQUE = (type, types.ModuleType, torch.nn.Module, torch._C._FunctionBase)


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, stop)`` of memory, on the host (``"cpu"``) or on a device (``"cuda"``)."""

    memory: str
    start: int
    stop: int

    def overlaps(self, other: Span) -> bool:
        return self.memory == other.memory and self.start < other.stop and other.start < self.stop


@dataclass(frozen=True)
class Held:
    """One tensor or buffer a ctx holds (described; the object itself is not kept)."""

    path: str  # a Python expression that reaches it: "ctx.cache[0][1][0]"
    kind: str  # "tensor", "numpy" (an ndarray), "memoryview", "storage", or a buffer's type name
    description: str  # "(3,) torch.float64"
    span: Span | None  # the memory it lies in (a tensor: its whole storage); None when unknown

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"


def storage_span(tensor: torch.Tensor) -> Span | None:
    """The bytes of ``tensor``'s whole storage (a view's base included); None without one."""
    try:
        storage = tensor.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
    except Exception:  # sparse, nested, fake and wrapper-subclass tensors have no plain storage
        return None
    if not start or not size:
        return None
    return Span(tensor.device.type, start, start + size)


def _interface_span(interface: Any, memory: str) -> Span | None:
    """The bytes an ``__array_interface__`` / ``__cuda_array_interface__`` dict addresses."""
    if not isinstance(interface, dict) or not isinstance(interface.get("data"), tuple):
        return None
    pointer, shape = interface["data"][0], tuple(interface.get("shape", ()))
    itemsize = np.dtype(interface["typestr"]).itemsize
    if not pointer or any(n == 0 for n in shape):
        return None
    strides = interface.get("strides") or tuple(
        int(np.prod(shape[k + 1 :], dtype=np.int64)) * itemsize for k in range(len(shape))
    )
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return Span(memory, int(pointer) + low, int(pointer) + high + itemsize)


def _buffer(value: Any) -> tuple[str, str, Span | None] | None:
    """``(kind, description, span)`` when ``value`` exposes memory (an array interface or the
    buffer protocol), else None."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return None
        return "numpy", f"{value.shape} {value.dtype}", _interface_span(value.__array_interface__, "cpu")
    try:
        if isinstance(value, torch.UntypedStorage):  # x.untyped_storage(): the tensor's memory itself
            start, size = value.data_ptr(), value.nbytes()
            return "storage", f"{size} bytes", Span(value.device.type, start, start + size) if start and size else None
        if hasattr(type(value), "__cuda_array_interface__"):  # cupy, numba device arrays: device memory
            interface = value.__cuda_array_interface__
            return type(value).__name__, f"{tuple(interface.get('shape', ()))}", _interface_span(interface, "cuda")
        if hasattr(type(value), "__array_interface__"):
            interface = value.__array_interface__
            return type(value).__name__, f"{tuple(interface.get('shape', ()))}", _interface_span(interface, "cpu")
        if isinstance(value, memoryview):
            return "memoryview", f"{value.shape} {value.format}", _interface_span(np.asarray(value).__array_interface__, "cpu")
        with memoryview(value) as view:  # ctypes arrays, array.array, mmap, ...
            as_array = np.asarray(view)
            try:
                return type(value).__name__, f"{view.shape} {view.format}", _interface_span(as_array.__array_interface__, "cpu")
            finally:
                del as_array
    except Exception:  # not a buffer, or one numpy cannot read: nothing to compare
        return None


def _children(value: Any, path: str, room: int) -> list[tuple[str, Any]]:
    """The values directly inside ``value`` (at most ``room`` of them) with their paths; empty for
    a leaf."""
    fields = getattr(type(value), "_fields", None)
    if isinstance(value, tuple) and isinstance(fields, tuple):  # a namedtuple
        return [(f"{path}.{name}", item) for name, item in zip(fields, value)]
    if isinstance(value, (list, tuple)):
        return [(f"{path}[{i}]", item) for i, item in enumerate(islice(value, room))]
    if isinstance(value, dict):
        items = list(islice(value.items(), room))
        keys = [(f"list({path})[{i}]", key) for i, (key, _) in enumerate(items) if not isinstance(key, _SCALARS)]
        return keys + [(f"{path}[{_key(key)}]", item) for key, item in items]
    if isinstance(value, (set, frozenset)):
        return [(f"list({path})[{i}]", item) for i, item in enumerate(islice(value, room))]
    if isinstance(value, _OPAQUE) or callable(value):
        return []
    if dataclasses.is_dataclass(value):
        return [(f"{path}.{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [(f"{path}.{name}", item) for name, item in islice(attributes.items(), room) if not name.startswith("__")]
    return []


def _key(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


def reachable(roots: Sequence[tuple[str, Any]], *, limit: int = NODE_LIMIT) -> Iterator[tuple[str, Any]]:
    """Each tensor and buffer in ``roots`` (``(path, value)``) and in whatever containers they
    hold, depth first in order, with its path. Each container is entered once (cycles end); each
    root gets ``limit`` visits, so one huge attribute cannot hide a tensor in the next."""
    entered: set[int] = set()
    for root in roots:
        stack, visited = [root], 0
        while stack and visited < limit:
            path, value = stack.pop()
            visited += 1
            if isinstance(value, torch.Tensor):
                yield path, value
                continue
            if isinstance(value, _SCALARS) or id(value) in entered:
                continue
            entered.add(id(value))
            if not isinstance(value, _CONTAINERS) and _buffer(value) is not None:
                yield path, value
                continue
            try:
                children = _children(value, path, limit - visited)
            except Exception:  # an object whose attributes raise: the probe must not fail on the user's ctx
                continue
            stack.extend(reversed(children))


def on_ctx(ctx: Any) -> list[tuple[str, Any]]:
    """The ctx's own public attributes, as roots for :func:`reachable`."""
    return [(f"ctx.{name}", value) for name, value in vars(ctx).items() if not name.startswith("_")]


def held_on(ctx: Any, *, limit: int = NODE_LIMIT) -> list[Held]:
    """Every tensor and buffer ``ctx`` holds, described, with the memory it lies in."""
    held = []
    for path, value in reachable(on_ctx(ctx), limit=limit):
        if isinstance(value, torch.Tensor):
            held.append(Held(path, "tensor", f"{tuple(value.shape)} {value.dtype}", storage_span(value)))
            continue
        kind, description, span = _buffer(value) or (type(value).__name__, "", None)
        held.append(Held(path, kind, description, span))
    return held


def owner_of(span: Span | None, owners: Sequence[tuple[str, Any]]) -> str | None:
    """The label of the first of ``owners`` (``(label, tensor)``) whose storage ``span`` lies in."""
    if span is None:
        return None
    for label, tensor in owners:
        if isinstance(tensor, torch.Tensor):
            storage = storage_span(tensor)
            if storage is not None and storage.overlaps(span):
                return label
    return None
