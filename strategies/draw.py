"""Drawing: one function per input kind of the spec language, from an input to its recipe.

:func:`draw_recipe` dispatches on the input's class (``functools.singledispatch``); each
registered function draws what that kind varies (seed, broadcast shape, scale, layout, pattern,
mask kind, sentinels, offsets, ...) from the :class:`PartialCase` drawn so far, whose ``options``
are the contract's :class:`~strategies.options.CaseOptions`. A new input kind is one function
registered here (and one recipe class in :mod:`strategies.recipes`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.spec import Spec
from conformance.spec.inputs import AdditiveMask, Derived, Index, Mask, Offsets, Scalar, Shaped, Tensor
from strategies.coverage import (
    BROADCAST_LABEL,
    Corner,
    finite_values,
    layout_label,
    mask_kind_label,
    pattern_label,
    scale_label,
)
from strategies.dims import broadcast_forms
from strategies.options import CaseOptions
from strategies.recipes import (
    AdditiveMaskRecipe,
    DerivedRecipe,
    IndexRecipe,
    MaskRecipe,
    OffsetsRecipe,
    Recipe,
    ScalarRecipe,
    TensorRecipe,
)
from strategies.reuse import just, reused, sampled
from strategies.values import corner_magnitudes, distinct_seed, magnitudes, mask_densities, value_seeds

__all__ = ["SENTINEL_FRACTIONS", "PartialCase", "cornered", "draw_recipe", "drawn_shape", "most_broadcast", "shape_of"]

# Shares of an Index input set to its sentinels: none (shrinks here), some, all.
SENTINEL_FRACTIONS = (0.0, 0.3, 1.0)


def shape_of(spec_input: Any, sizes: Mapping[str, int], batches: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
    """The concrete (unbroadcast) shape of a shaped spec input under drawn sizes."""
    return tuple(spec_input.parsed.concrete(sizes, batches))


@dataclass
class PartialCase:
    """The case drawn so far: what ``Scalar(from_case=...)`` functions are given, and what each
    input kind's drawing function (:func:`draw_recipe`) reads (sizes, batch shapes, options,
    earlier recipes)."""

    spec: Spec
    dtype: torch.dtype
    device: str
    sizes: dict[str, int]
    batches: dict[str, tuple[int, ...]]
    options: CaseOptions = field(default_factory=CaseOptions)
    recipes: dict[str, Recipe] = field(default_factory=dict)

    def _input(self, name: str) -> Any:
        for spec_input in self.spec.inputs:
            if spec_input.name == name:
                return spec_input
        raise KeyError(f"spec {self.spec.name!r} has no input {name!r} (inputs: {[i.name for i in self.spec.inputs]})")

    def shape(self, name: str) -> tuple[int, ...]:
        """Input ``name``'s shape: as drawn (after broadcasting) once drawn, else as declared."""
        if name in self.recipes:
            return tuple(self.recipes[name].shape)
        spec_input = self._input(name)
        if not hasattr(spec_input, "parsed"):
            raise KeyError(f"input {name!r} is a {spec_input.kind}, which has no shape")
        return shape_of(spec_input, self.sizes, self.batches)

    def ndim(self, name: str) -> int:
        """Input ``name``'s number of dims (see :meth:`shape`)."""
        return len(self.shape(name))

    def value(self, name: str) -> Any:
        """The drawn value of an earlier Scalar (or the offsets of an earlier Offsets) input."""
        self._input(name)
        if name not in self.recipes:
            raise KeyError(f"input {name!r} is not drawn yet: list it before the input that reads it")
        recipe = self.recipes[name]
        if isinstance(recipe, ScalarRecipe):
            return recipe.value
        if isinstance(recipe, OffsetsRecipe):
            return recipe.values
        raise KeyError(f"input {name!r} is a {recipe.kind}; value() reads Scalar and Offsets inputs")

    def max_length(self, name: str) -> int:
        """The longest sequence of an earlier Offsets input (flash-attention's ``max_seqlen``)."""
        recipe = self.recipes.get(name)
        if not isinstance(recipe, OffsetsRecipe):
            self._input(name)
            raise KeyError(f"input {name!r} is not an Offsets input drawn before this one")
        return max(recipe.lengths, default=0)


def drawn_shape(spec_input: Shaped, draw: st.DrawFn, case: PartialCase) -> tuple[int, ...]:
    """The input's shape under the drawn sizes; broadcast per its ``broadcast_tokens()`` when the
    contract asks for broadcasting."""
    parsed = spec_input.parsed
    shape = parsed.concrete(case.sizes, case.batches)
    tokens = spec_input.broadcast_tokens()
    if not case.options.broadcast or tokens is None:
        return shape
    allowed = tuple(label in tokens for label in parsed.labels(case.batches))
    if not any(allowed):
        return shape
    level = case.options.corner.choice(BROADCAST_LABEL) if case.options.corner is not None else None
    if level is not None:  # a corner: the declared shape, or its most broadcast form
        return draw(just(most_broadcast(shape, allowed) if level % 2 else shape), label=f"{spec_input.name} broadcast shape")
    return draw(broadcast_forms(shape, allowed=allowed), label=f"{spec_input.name} broadcast shape")


def most_broadcast(shape: tuple[int, ...], allowed: Sequence[bool]) -> tuple[int, ...]:
    """The smallest shape that broadcasts to ``shape``: leading allowed dims dropped, other allowed dims 1."""
    lead = 0
    while lead < len(shape) and allowed[lead]:
        lead += 1
    return tuple(1 if ok else size for size, ok in zip(shape[lead:], allowed[lead:]))


@functools.singledispatch
def draw_recipe(spec_input: Any, draw: st.DrawFn, case: PartialCase) -> Recipe:
    """The recipe of one argument, drawn by the function registered for the input's kind."""
    raise TypeError(f"no drawing function for {type(spec_input).__name__} inputs ({spec_input!r})")


@draw_recipe.register
def _draw_tensor(spec_input: Tensor, draw: st.DrawFn, case: PartialCase) -> Recipe:
    name = spec_input.name
    options = case.options
    seed = distinct_seed(draw(value_seeds(), label=f"{name} seed"), name)
    shape = drawn_shape(spec_input, draw, case)
    cornered_scale = options.extreme and options.corner is not None and options.corner.choice(scale_label(name)) is not None
    scales = corner_magnitudes(dtype=case.dtype) if cornered_scale else magnitudes(dtype=case.dtype, extreme=options.extreme)
    scale = draw(_cornered(scales, scale_label(name), case), label=scale_label(name))
    constant = options.constant_rows and not options.spacing and draw(reused(st.booleans), label=f"{name} constant rows")
    layout = draw(_cornered(sampled(tuple(options.layouts)), layout_label(name), case), label=layout_label(name))
    # Only constant rows can be stored stride-0 with the same values.
    constant = constant or layout == "expanded"
    pattern = "random"
    if tuple(options.value_patterns) != ("random",) and not options.spacing:
        pattern = draw(_cornered(sampled(tuple(options.value_patterns)), pattern_label(name), case), label=pattern_label(name))
        if pattern == "near_zero" and spec_input.domain != "real":
            pattern = "random"
    return TensorRecipe(
        name, shape=shape, seed=seed, domain=spec_input.domain, scale=scale, constant_rows=constant,
        layout=layout, pattern=pattern,
    )


def _draw_mask_of(recipe_class: type[MaskRecipe], spec_input: Mask, draw: st.DrawFn, case: PartialCase) -> Recipe:
    name = spec_input.name
    shape = spec_input.parsed.concrete(case.sizes, case.batches)
    seed = distinct_seed(draw(value_seeds(), label=f"{name} seed"), name)
    kind = draw(_cornered(sampled(tuple(case.options.mask_kinds)), mask_kind_label(name), case), label=mask_kind_label(name))
    density = draw(mask_densities(), label=f"{name} mask density") if kind in ("random", "masked_rows") else 0.7
    return recipe_class(name, shape=shape, seed=seed, mask_kind=kind, density=density)


@draw_recipe.register
def _draw_mask(spec_input: Mask, draw: st.DrawFn, case: PartialCase) -> Recipe:
    return _draw_mask_of(MaskRecipe, spec_input, draw, case)


@draw_recipe.register
def _draw_additive_mask(spec_input: AdditiveMask, draw: st.DrawFn, case: PartialCase) -> Recipe:
    return _draw_mask_of(AdditiveMaskRecipe, spec_input, draw, case)


@draw_recipe.register
def _draw_index(spec_input: Index, draw: st.DrawFn, case: PartialCase) -> Recipe:
    name = spec_input.name
    shape = spec_input.parsed.concrete(case.sizes, case.batches)
    seed = distinct_seed(draw(value_seeds(), label=f"{name} seed"), name)
    high = case.sizes[spec_input.high] if isinstance(spec_input.high, str) else spec_input.high
    fraction = 0.0
    if spec_input.sentinels:
        # A corner asks for sentinels first (shrinking goes to none): ignore_index present, then all.
        fractions = sampled(SENTINEL_FRACTIONS)
        if case.options.corner is not None and case.options.corner.choice(f"{name} sentinel fraction") is not None:
            fractions = sampled((*SENTINEL_FRACTIONS[1:], SENTINEL_FRACTIONS[0]))
        fraction = draw(_cornered(fractions, f"{name} sentinel fraction", case), label=f"{name} sentinel fraction")
    return IndexRecipe(name, shape=shape, seed=seed, high=high, sentinels=tuple(spec_input.sentinels), sentinel_fraction=fraction)


@draw_recipe.register
def _draw_scalar(spec_input: Scalar, draw: st.DrawFn, case: PartialCase) -> Recipe:
    value = spec_input.value
    if spec_input.from_case is not None:
        value = spec_input.from_case(case)
    if isinstance(value, st.SearchStrategy):
        value = draw(_cornered(value, spec_input.name, case), label=spec_input.name)
    return ScalarRecipe(spec_input.name, value=value)


def _cornered(strategy: st.SearchStrategy[Any], label: str, case: PartialCase) -> st.SearchStrategy[Any]:
    return cornered(strategy, label, case.options.corner)


def cornered(strategy: st.SearchStrategy[Any], label: str, corner: Corner | None) -> st.SearchStrategy[Any]:
    """``strategy``, or the value a coverage corner picks from its finite values (by index)."""
    index = corner.choice(label) if corner is not None else None
    values = finite_values(strategy) if index is not None else None
    return just(values[index % len(values)]) if values and index is not None else strategy


@draw_recipe.register
def _draw_offsets(spec_input: Offsets, draw: st.DrawFn, case: PartialCase) -> Recipe:
    name = spec_input.name
    count, total = case.sizes[spec_input.sequences], case.sizes[spec_input.total]
    cuts = [0]
    for index in range(count - 1):
        # Mode 0 (where shrinking goes): the sequence is empty; else any length that fits.
        empty = draw(st.integers(min_value=0, max_value=3), label=f"{name} sequence {index} empty") == 0
        cuts.append(cuts[-1] if empty else draw(st.integers(min_value=cuts[-1], max_value=total), label=f"{name}[{index + 1}]"))
    cuts.append(total)
    return OffsetsRecipe(name, values=tuple(cuts))


@draw_recipe.register
def _draw_derived(spec_input: Derived, draw: st.DrawFn, case: PartialCase) -> Recipe:
    name = spec_input.name
    source = case.recipes.get(spec_input.seed_from) if spec_input.seed_from is not None else None
    if isinstance(source, DerivedRecipe):
        seed = source.seed
    else:
        seed = distinct_seed(draw(value_seeds(), label=f"{name} seed"), name)
    if isinstance(source, DerivedRecipe) and getattr(case.spec.input_named(source.name), "shape", None) == spec_input.shape:
        shape = source.shape  # drawn like its source: tables of one call share their broadcast form
    else:
        shape = drawn_shape(spec_input, draw, case)
    layout = draw(sampled(tuple(case.options.layouts)), label=layout_label(name))
    if layout == "expanded":
        layout = "contiguous"  # computed values: no constant rows to store stride-0
    return DerivedRecipe(
        name, shape=shape, seed=seed, sizes=tuple(sorted(case.sizes.items())),
        requires_grad=spec_input.requires_grad, layout=layout,
    )
