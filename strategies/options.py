"""What :func:`strategies.cases.cases` varies beyond the spec: :class:`CaseOptions`, one frozen,
validated preset per contract. The drawing functions of :mod:`strategies.draw` read the same
object (``case.options``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from hypothesis.errors import InvalidArgument

from strategies.coverage import Corner
from strategies.layouts import LAYOUTS
from strategies.values import GRAD_OUTPUT_KINDS, MASK_KINDS, VALUE_PATTERNS

__all__ = ["REQUIRES_GRAD_MODES", "CaseOptions"]


REQUIRES_GRAD_MODES = ("all", "subsets", "nonempty")


@dataclass(frozen=True)
class CaseOptions:
    """What :func:`cases` varies beyond the spec: one frozen, validated preset per contract.

    dtypes: the dtypes to choose from (None: the spec's that the device supports, see :func:`dtypes_for`).
    max_elements: per-input element budget; larger drawn sizes are halved to fit (:func:`fit_to_budget`).
    min_size / max_size / block_sizes: passed to :func:`strategies.dims.dim_sizes` (min_size=0: zero-size dims).
    extreme: draw value magnitudes up towards the dtype's range.
    requires_grad: ``"all"`` (every differentiable input), ``"subsets"`` (any subset, none
    included) or ``"nonempty"`` (any subset with at least one input).
    layouts: memory layouts to draw per tensor input (see :func:`apply_layout`); an ``expanded``
    input gets constant rows so that it really is stride-0.
    mask_kinds: kinds to draw per Mask input (see :func:`strategies.values.mask_from_seed`).
    constant_rows: sometimes make a tensor's last-dim rows constant (ties, zero variance).
    broadcast: give ``broadcastable=True`` inputs size-1 dims and dropped leading dims.
    grad_output_kinds: kinds to draw for grad_outputs (see :func:`grad_output_from_seed`).
    value_patterns: value patterns per tensor input (``ties``; ``near_zero`` applies to
    ``real``-domain inputs only, others fall back to ``random``).
    max_batch_dims: ``*batch`` groups expand to 0..max_batch_dims dims.
    unique_dims: dims with different names get different sizes.
    spacing: for finite differences (gradcheck): every tensor input's elements at least this far
    apart and from the kinks its spec declares (:func:`strategies.values.spread`); ignores
    ``constant_rows`` and ``value_patterns``, which make ties on purpose.
    corner: a :class:`strategies.coverage.Corner` of the coverage phase: the sizes, ranks, dtype
    and choices it forces replace the drawn ones (the rest is drawn as usual).

    Invalid values raise ``InvalidArgument`` naming the field and echoing the value, when the
    preset is made (at import of the contract that declares it), not when a case is drawn.
    ``options.replace(dtypes=...)`` is a validated copy.
    """

    dtypes: tuple[torch.dtype, ...] | None = None
    max_elements: int = 512
    min_size: int = 1
    max_size: int = 7
    block_sizes: tuple[int, ...] = (16,)
    extreme: bool = False
    requires_grad: str = "all"
    layouts: tuple[str, ...] = ("contiguous",)
    mask_kinds: tuple[str, ...] = ("random", "all_true", "padding")
    constant_rows: bool = False
    broadcast: bool = False
    grad_output_kinds: tuple[str, ...] = ("random",)
    value_patterns: tuple[str, ...] = ("random",)
    max_batch_dims: int = 2
    unique_dims: bool = False
    spacing: float = 0.0
    corner: Corner | None = None

    def __post_init__(self) -> None:
        for name in ("dtypes", "block_sizes", "layouts", "mask_kinds", "grad_output_kinds", "value_patterns"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise InvalidArgument(f"{name}={value!r} is a string; pass a tuple, e.g. {name}=({value!r},)")
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.requires_grad not in REQUIRES_GRAD_MODES:
            raise InvalidArgument(f"requires_grad={self.requires_grad!r} must be one of {REQUIRES_GRAD_MODES}")
        for name, low in (("max_elements", 1), ("min_size", 0), ("max_size", 0), ("max_batch_dims", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgument(f"{name}={value!r} must be an int >= {low}")
        if self.max_size < self.min_size:
            raise InvalidArgument(f"max_size={self.max_size!r} is below min_size={self.min_size!r}")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.block_sizes):
            raise InvalidArgument(f"block_sizes={self.block_sizes!r} must be ints >= 1")
        for given, allowed, what in (
            (self.layouts, LAYOUTS, "layouts"),
            (self.mask_kinds, MASK_KINDS, "mask_kinds"),
            (self.grad_output_kinds, GRAD_OUTPUT_KINDS, "grad_output_kinds"),
            (self.value_patterns, VALUE_PATTERNS, "value_patterns"),
        ):
            bad = [item for item in given if item not in allowed]
            if bad or not given:
                raise InvalidArgument(f"{what}={list(given)!r}: {bad or 'empty'}; choose from {allowed}")
        if self.dtypes is not None:
            if not self.dtypes:
                raise InvalidArgument(f"dtypes={self.dtypes!r} is empty")
            bad_dtypes = [d for d in self.dtypes if not isinstance(d, torch.dtype)]
            if bad_dtypes:
                raise InvalidArgument(f"dtypes={self.dtypes!r}: {bad_dtypes} are not torch.dtype")
        if self.corner is not None and not isinstance(self.corner, Corner):
            raise InvalidArgument(f"corner={self.corner!r} must be a strategies.coverage.Corner or None")
        if not (isinstance(self.spacing, (int, float)) and not isinstance(self.spacing, bool) and self.spacing >= 0):
            raise InvalidArgument(f"spacing={self.spacing!r} must be a number >= 0")

    def replace(self, **changes: Any) -> CaseOptions:
        """A validated copy with ``changes`` (unknown names raise ``InvalidArgument``)."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise InvalidArgument(f"unknown case options {unknown}; choose from {[f.name for f in fields(self)]}")
        return replace(self, **changes)

