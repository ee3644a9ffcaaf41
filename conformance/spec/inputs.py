"""The input kinds of the spec language: what a Function takes, as frozen data.

One class per kind (:class:`Tensor`, :class:`Mask`, :class:`AdditiveMask`, :class:`Index`,
:class:`Scalar`, :class:`Offsets`, :class:`Derived`). They only say what the user knows (names,
symbolic shapes, value domains); each kind's validator is in :mod:`conformance.spec.validation`
and its drawing in ``strategies.draw``. A new input kind is one class here, one validator, one
drawing function and one recipe class (``strategies.recipes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import torch

from conformance.spec.shapes import ShapeSpec, parse_shape

__all__ = [
    "DOMAINS",
    "INPUT_KINDS",
    "NO_VALUE",
    "AdditiveMask",
    "Derived",
    "Domain",
    "Index",
    "InputSpec",
    "Mask",
    "Offsets",
    "Scalar",
    "Shaped",
    "Tensor",
]

DOMAINS = ("real", "positive", "nonzero", "unit")
Domain = Union[str, tuple[float, float]]

# A Scalar given no value (it must then have from_case=).
NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "<no value>"})()


class Shaped:
    """Shared by inputs with a symbolic shape: parsing, the dims they use, per-dim broadcasting."""

    name: str
    shape: str

    @property
    def parsed(self) -> ShapeSpec:
        """The shape, parsed (once per distinct shape string: :func:`parse_shape` caches)."""
        return parse_shape(self.shape)

    def dims_used(self) -> tuple[str, ...]:
        return self.parsed.names

    @property
    def differentiable(self) -> bool:
        return False

    def broadcast_tokens(self) -> frozenset[str] | None:
        """The shape tokens that may broadcast (``*batch`` for the batch dims); None: none."""
        return None


@dataclass(frozen=True)
class Tensor(Shaped):
    """A floating-point tensor argument.

    ``shape``: symbolic dims, e.g. ``"*batch n d"`` (``"d:even"``: d a multiple of 2;
    ``"2*f"``: twice f); ``requires_grad=False`` for a tensor that never requires grad;
    ``domain``: ``"real"``, ``"positive"``, ``"nonzero"`` (bounded away from zero), ``"unit"``
    (open 0..1) or a ``(low, high)`` interval; ``broadcastable=True`` lets the suite drop leading
    dims and set dims to 1 (numpy broadcasting against the others); ``broadcast="b"`` allows
    that for the named dims only (``"*batch"``: the batch dims); ``kinks``: values where the op
    is not differentiable elementwise (``clamp``'s bounds, a threshold), as numbers or names of
    Scalar inputs (``"-name"`` for minus its value): the finite-difference contracts keep every
    element well away from them, as they keep the elements of a tensor apart from each other
    (ties of ``max``/``sort``) for every spec.
    """

    name: str
    shape: str
    requires_grad: bool = True
    domain: Domain = "real"
    broadcastable: bool = False
    kinks: tuple[float | str, ...] = ()
    broadcast: str | None = None

    kind = "tensor"

    @property
    def differentiable(self) -> bool:
        return self.requires_grad

    def broadcast_tokens(self) -> frozenset[str] | None:
        if self.broadcastable:
            parsed = self.parsed
            return frozenset({f"*{parsed.batch}"} if parsed.batch else set()) | {str(d) for d in parsed.dims}
        return frozenset(self.broadcast.split()) if self.broadcast else None


@dataclass(frozen=True)
class Mask(Shaped):
    """A boolean tensor argument (never requires grad); ``True`` means "keep"."""

    name: str
    shape: str

    kind = "mask"


@dataclass(frozen=True)
class AdditiveMask(Mask):
    """A float mask added to scores, in the case dtype: 0 where kept, ``-inf`` where masked
    (never requires grad). Drawn like :class:`Mask` (random, causal, padding, rows fully
    masked): a Function must define what a row with no kept key gives, as its reference does."""

    kind = "additive_mask"


@dataclass(frozen=True)
class Index(Shaped):
    """An int64 tensor argument with values in ``[0, high)``; ``high`` is a dim name or int.

    ``sentinels``: special values the op must treat apart (cross-entropy's ``ignore_index=-100``):
    the suite sets none, some or all of the elements to them.
    """

    name: str
    shape: str
    high: str | int
    sentinels: tuple[int, ...] = ()

    kind = "index"

    def dims_used(self) -> tuple[str, ...]:
        return self.parsed.names + ((self.high,) if isinstance(self.high, str) else ())


@dataclass(frozen=True)
class Scalar:
    """A non-tensor argument: a constant, a Hypothesis strategy drawn per example, or
    ``from_case=lambda case: ...`` -- a value or strategy built from the case drawn so far
    (``case.sizes``, ``case.shape("x")``, ``case.ndim("x")``, ``case.value("name")`` of an
    earlier Scalar or Offsets input, ``case.max_length("cu_seqlens")``), e.g. a ``dim`` in
    ``[-ndim, ndim)`` of the drawn rank."""

    name: str
    value: Any = NO_VALUE
    from_case: Callable[[Any], Any] | None = None

    kind = "scalar"

    def dims_used(self) -> tuple[str, ...]:
        return ()

    @property
    def differentiable(self) -> bool:
        return False


@dataclass(frozen=True)
class Offsets:
    """Cumulative offsets of packed variable-length sequences (flash-attention's ``cu_seqlens``):
    an int32 tensor ``[0, c1, ..., total]`` of ``sequences + 1`` entries, non-decreasing, so
    zero-length sequences occur; ``total`` is the packed dim of the other inputs (``"t h d"``).
    Each sequence's length is drawn; shrinks towards one sequence holding everything."""

    name: str
    sequences: str
    total: str

    kind = "offsets"

    def dims_used(self) -> tuple[str, ...]:
        return (self.sequences, self.total)

    @property
    def differentiable(self) -> bool:
        return False


@dataclass(frozen=True)
class Derived(Shaped):
    """A tensor computed from the drawn case by ``fn(ctx)`` -- inputs with value preconditions:
    rotary ``cos``/``sin`` tables from positions, positive-definite matrices, probabilities.

    ``fn`` gets a :class:`strategies.recipes.DerivedContext` (``ctx.shape``: this input's drawn
    shape, after broadcasting; ``ctx.sizes``; ``ctx.generator``: a CPU generator seeded for this
    call; ``ctx.inputs``: the earlier inputs as CPU float64) and returns a floating tensor of
    ``ctx.shape``, best computed in float64: the suite casts it -- or an integer or bool tensor,
    kept as it is: indices with a precondition (``torch.randperm(n, generator=ctx.generator)``,
    a permutation, where :class:`Index` would draw repeats). ``seed_from="cos"`` reuses an
    earlier Derived input's seed (so ``sin`` sees the same positions as ``cos``) and, when both
    declare the same shape, its drawn (broadcast) shape.
    ``requires_grad=True`` makes it a differentiable input; ``broadcast`` as for :class:`Tensor`.
    """

    name: str
    fn: Callable[[Any], torch.Tensor]
    shape: str
    requires_grad: bool = False
    broadcast: str | None = None
    seed_from: str | None = None

    kind = "derived"

    @property
    def differentiable(self) -> bool:
        return self.requires_grad

    def broadcast_tokens(self) -> frozenset[str] | None:
        return frozenset(self.broadcast.split()) if self.broadcast else None


InputSpec = Union[Tensor, Mask, AdditiveMask, Index, Scalar, Offsets, Derived]
INPUT_KINDS = (Tensor, Mask, Index, Scalar, Offsets, Derived)
