"""Whether two tensors share memory, element by element: views of one buffer that interleave (the
columns of a packed ``(n, 2)`` buffer, ``dkv.unbind(1)``) span overlapping bytes without sharing an
element, and only a shared element lets a write into one reach the other."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["byte_span", "shares_memory"]

# Above this many elements the exact test costs more than it is worth: the byte spans decide.
_EXACT_LIMIT = 1 << 20


def byte_span(tensor: torch.Tensor) -> tuple[Any, int, int] | None:
    """(storage key, first byte, one past the last byte) that ``tensor`` can touch; None without
    elements or storage."""
    if tensor.numel() == 0 or tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    try:
        key = (str(tensor.device), tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensors without storage (some subclasses)
        return None
    size = tensor.element_size()
    low = sum(min(0, (int(n) - 1) * int(s)) for n, s in zip(tensor.shape, tensor.stride()))
    high = sum(max(0, (int(n) - 1) * int(s)) for n, s in zip(tensor.shape, tensor.stride()))
    start = tensor.data_ptr()
    return key, start + low * size, start + (high + 1) * size


def shares_memory(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` have an element in common (by byte span alone for very
    large tensors or different element sizes: erring towards sharing)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    span_a, span_b = byte_span(a), byte_span(b)
    if span_a is None or span_b is None or span_a[0] != span_b[0]:
        return False
    if not (span_a[1] < span_b[2] and span_b[1] < span_a[2]):
        return False
    if a.element_size() != b.element_size() or max(a.numel(), b.numel()) > _EXACT_LIMIT:
        return True
    return bool(torch.isin(_element_addresses(a), _element_addresses(b)).any())


def _element_addresses(tensor: torch.Tensor) -> torch.Tensor:
    """The byte address of each element of ``tensor``, flattened."""
    addresses = torch.tensor(tensor.data_ptr(), dtype=torch.int64)
    for size, stride in zip(tensor.shape, tensor.stride()):
        steps = torch.arange(int(size), dtype=torch.int64) * int(stride) * tensor.element_size()
        addresses = addresses.unsqueeze(-1) + steps
    return addresses.reshape(-1)
