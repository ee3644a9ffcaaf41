"""Memory layouts: the same values stored another way (:func:`apply_layout` for inputs,
:func:`apply_grad_layout` for grad_outputs), and the strategy that names them (:func:`layouts`).

Below :mod:`strategies.recipes` (which builds tensors in a layout) and :mod:`strategies.cases`
(which re-exports these names: repro snippets import them from there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies.reuse import sampled

__all__ = ["GRAD_LAYOUTS", "LAYOUTS", "apply_grad_layout", "apply_layout", "layouts"]


LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "expanded", "channels_last", "permuted", "swapped")


def apply_layout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``tensor`` (same shape) in another memory layout.

    ``transposed``: stored with the last two dims swapped; ``sliced``: every other element of a
    twice-as-long last dim; ``offset``: a view with a non-zero storage offset; ``expanded``: a
    stride-0 view (only when every last-dim row is constant, otherwise returned contiguous);
    ``channels_last``: 4-d tensors in channels-last memory format; ``permuted``: stored with
    every dim reversed (differs from ``transposed`` from 3-d on); ``swapped``: stored with dims 1
    and 2 swapped (3-d and up: ``(b, s, h, d)`` memory seen as ``(b, h, s, d)``, the layout every
    Hugging Face attention hands on). Layouts that do not apply to a tensor (``transposed`` on
    1-d, ``channels_last`` off 4-d, ``swapped`` below 3-d) give it contiguous.
    """
    if layout not in LAYOUTS:
        raise InvalidArgument(f"layout={layout!r} must be one of {LAYOUTS}")
    if layout == "contiguous" or tensor.ndim == 0:
        return tensor.contiguous()
    if layout == "transposed":
        if tensor.ndim < 2:
            return tensor.contiguous()
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        wide = torch.zeros((*tensor.shape[:-1], tensor.shape[-1] * 2), dtype=tensor.dtype, device=tensor.device)
        wide[..., ::2] = tensor
        return wide[..., ::2]
    if layout == "offset":
        flat = torch.zeros(tensor.numel() + 3, dtype=tensor.dtype, device=tensor.device)
        flat[3:] = tensor.reshape(-1)
        return flat[3:].view(tensor.shape)
    if layout == "expanded":
        if tensor.shape[-1] > 0 and bool((tensor == tensor[..., :1]).all()):
            # Own compact storage (as a broadcast bias has): storage-level reads cannot see full rows.
            return tensor[..., :1].clone().expand(tensor.shape)
        return tensor.contiguous()
    if layout == "swapped":
        if tensor.ndim < 3:
            return tensor.contiguous()
        return tensor.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "permuted":
        if tensor.ndim < 2:
            return tensor.contiguous()
        order = tuple(reversed(range(tensor.ndim)))
        return tensor.permute(order).contiguous().permute(order)
    if tensor.ndim == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor.contiguous()


def layouts(*, kinds: Sequence[str] = LAYOUTS, ndim: int | None = None, allow_expanded: bool = True) -> st.SearchStrategy[str]:
    """Memory-layout names for :func:`apply_layout`.

    kinds: the layouts to choose from (see :data:`LAYOUTS`).
    ndim: when given, only layouts that really change a tensor of that many dims (``transposed``
    and ``permuted`` need 2+, ``channels_last`` exactly 4, ``sliced``/``offset``/``expanded`` 1+).
    allow_expanded: False drops ``expanded`` (stride-0 inputs are never fed to gradcheck, whose
    finite differences would write through the shared element).
    Shrinks towards the first kind (``contiguous`` by default).
    Example: ``layouts(ndim=4).example() -> 'channels_last'``.
    """
    given = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in given if k not in LAYOUTS]
    if bad:
        raise InvalidArgument(f"kinds={list(given)!r}: {bad} not in {LAYOUTS}")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0):
        raise InvalidArgument(f"ndim={ndim!r} must be an int >= 0 or None")
    chosen = [k for k in given if (allow_expanded or k != "expanded") and (ndim is None or _layout_applies(k, ndim))]
    if not chosen:
        raise InvalidArgument(f"no layout left from kinds={list(given)!r} with ndim={ndim!r}, allow_expanded={allow_expanded!r}")
    return sampled(tuple(chosen))


def _layout_applies(layout: str, ndim: int) -> bool:
    if layout == "contiguous":
        return True
    if layout in ("transposed", "permuted"):
        return ndim >= 2
    if layout == "swapped":
        return ndim >= 3
    if layout == "channels_last":
        return ndim == 4
    return ndim >= 1


GRAD_LAYOUTS = ("as_drawn", "like_output", "swapped", "narrow")


def apply_grad_layout(grad: torch.Tensor, output: torch.Tensor, layout: str) -> torch.Tensor:
    """``grad`` (a grad_output for ``output``) with the same values in another memory layout.

    ``as_drawn``: unchanged; ``like_output``: the output's own strides (what a loss computed
    elementwise from a transposed-view output hands back); ``swapped``: dims 1 and 2 swapped in
    memory (3-d and up, see :func:`apply_layout`); ``narrow``: a slice of a wider buffer along
    the last dim (what ``torch.cat``/``split`` hand to backward). A layout that does not apply
    (``swapped`` below 3-d, ``like_output`` for an overlapping output) leaves ``grad`` unchanged.
    """
    if layout not in GRAD_LAYOUTS:
        raise InvalidArgument(f"layout={layout!r} must be one of {GRAD_LAYOUTS}")
    if layout == "as_drawn" or grad.ndim == 0 or grad.stride() == (0,) * grad.ndim:
        return grad
    if layout == "like_output":
        if not _dense(output):
            return grad
        return torch.empty_strided(grad.shape, output.stride(), dtype=grad.dtype, device=grad.device).copy_(grad)
    if layout == "swapped":
        return apply_layout(grad, "swapped") if grad.ndim >= 3 else grad
    wide = torch.zeros((*grad.shape[:-1], grad.shape[-1] + 3), dtype=grad.dtype, device=grad.device)
    wide[..., 1 : 1 + grad.shape[-1]] = grad
    return wide[..., 1 : 1 + grad.shape[-1]]


def _dense(tensor: torch.Tensor) -> bool:
    """True when ``tensor``'s strides tile its storage exactly (a permutation of a contiguous
    layout): no overlap, no gaps, so an empty tensor can be given the same strides."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(tensor.shape, tensor.stride()) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True
