"""Whole calls of a registered Function: concrete sizes, values, dtype and requires_grad.

A :class:`Case` is a *recipe*, not tensors: every contract asks it for fresh leaf tensors
(in any dtype/device, with any requires_grad subset), so runs never share state, and a failure
can print a snippet that rebuilds exactly the same inputs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.spec import Spec
from conformance.spec.dims import DimBounds, dim_bounds
from conformance.spec.inputs import AdditiveMask, Mask, Tensor
from strategies.coverage import (
    BROADCAST_LABEL,
    GRAD_KIND_LABEL,
    REQUIRES_GRAD_LABEL,
    finite_values,
    layout_label,
    mask_kind_label,
    pattern_label,
    scale_label,
)
from strategies.dims import DimRule, batch_shapes, broadcast_forms, dim_sizes
from strategies.draw import PartialCase, cornered, draw_recipe, shape_of
from strategies.inputs import device_supports, dtypes_for, requires_grad_classes, requires_grad_subsets
from strategies.layouts import GRAD_LAYOUTS, LAYOUTS, apply_grad_layout, apply_layout, layouts
from strategies.options import CaseOptions
from strategies.recipes import FloatingRecipe, Recipe, ScalarRecipe, TensorRecipe
from strategies.reuse import just, sampled
from strategies.values import distinct_seed, grad_output_from_seed, magnitudes, value_seeds

__all__ = [
    "GRAD_LAYOUTS",
    "LAYOUTS",
    "Case",
    "CaseOptions",
    "PartialCase",
    "apply_grad_layout",
    "apply_layout",
    "broadcast_forms",
    "case_kinds",
    "cases",
    "fit_to_budget",
    "layouts",
    "shape_of",
]


@dataclass(frozen=True, repr=False)
class Case:
    """One concrete call of a spec: every argument's recipe plus dtype, device and requires_grad."""

    spec: Spec
    device: str
    dtype: torch.dtype
    sizes: dict[str, int]
    batches: dict[str, tuple[int, ...]]
    recipes: tuple[Recipe, ...]
    requires_grad: frozenset[str]
    grad_seed: int = 0
    grad_scale: float = 1.0
    grad_kind: str = "random"
    grad_layout: str = "as_drawn"
    notes: dict[str, Any] = field(default_factory=dict)

    def args(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: str | None = None,
        requires_grad: frozenset[str] | set[str] | None = None,
    ) -> list[Any]:
        """Fresh positional arguments (new leaf tensors every call)."""
        dtype = dtype or self.dtype
        device = device or self.device
        wanted = self.requires_grad if requires_grad is None else requires_grad
        built: dict[str, Any] = {}
        for recipe, spec_input in zip(self.recipes, self.spec.inputs, strict=True):
            value = recipe.build(dtype, device, spec_input=spec_input, earlier=built)
            if recipe.differentiable and recipe.name in wanted:
                # A leaf that requires grad, keeping the recipe's layout (requires_grad_ on a view
                # of a non-leaf buffer would not make a leaf).
                value = value.detach().requires_grad_(True)
            built[recipe.name] = value
        return list(built.values())

    def grad_outputs(self, outputs: Sequence[torch.Tensor], *, dtype: torch.dtype | None = None, device: str | None = None) -> tuple[torch.Tensor, ...]:
        """One grad_output per given output, from ``grad_seed`` (same values for every dtype),
        in the memory layout ``grad_layout`` (see :func:`apply_grad_layout`)."""
        return tuple(
            apply_grad_layout(
                grad_output_from_seed(
                    tuple(out.shape), dtype or out.dtype, seed=self.grad_seed + position, kind=self.grad_kind,
                    scale=self.grad_scale, device=device or str(out.device),
                ),
                out,
                self.grad_layout,
            )
            for position, out in enumerate(outputs)
        )

    def __repr__(self) -> str:
        return f"Case({self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def with_dtype(self, dtype: torch.dtype) -> Case:
        return replace(self, dtype=dtype)

    def in_contiguous_layouts(self) -> Case:
        """This case with contiguous inputs and grad_outputs (a strided or stride-0 grad_output
        kind becomes random values, laid out contiguously); itself when it has no other layout."""
        plain = replace(
            self,
            recipes=tuple(replace(r, layout="contiguous") if isinstance(r, FloatingRecipe) else r for r in self.recipes),
            grad_layout="as_drawn",
            grad_kind="random" if self.grad_kind in ("noncontiguous", "expanded") else self.grad_kind,
        )
        return self if plain == self else plain

    def describe(self) -> str:
        parts = [recipe.describe() + (", requires_grad" if recipe.name in self.requires_grad else "") for recipe in self.recipes]
        if self.grad_layout != "as_drawn":
            parts.append(f"grad_outputs: {self.grad_kind}, layout={self.grad_layout}")
        config = getattr(self.spec, "autotune_config", "")
        if config:
            parts.append(config)
        return f"{self.dtype} on {self.device}; " + "; ".join(parts)

    def repro(self) -> str:
        """A runnable snippet that rebuilds the inputs and calls forward and backward."""
        lines = [
            "import torch",
            "from strategies.values import tensor_from_seed, mask_from_seed, additive_mask_from_seed, index_from_seed, grad_output_from_seed",
            "from strategies.cases import apply_layout",
            "from strategies.recipes import derived_from_seed",
        ]
        op = self.spec.op
        module = sys.modules.get(op.module)
        source_file = getattr(module, "__file__", None) or self.spec.source_file
        imports, callee = op.repro_import(source_file or "")
        lines.extend(imports)
        names: list[str] = []
        for recipe, spec_input in zip(self.recipes, self.spec.inputs, strict=True):
            source = recipe.source(self.dtype, self.device, spec_input=spec_input, earlier=tuple(names))
            if "spec.input_named(" in source and not any(line.startswith("spec = registered_spec(") for line in lines):
                lines.append("from conformance.spec import registered_spec")
                lines.append(f"spec = registered_spec({self.spec.name!r})")
            if recipe.name in self.requires_grad:
                source += ".detach().requires_grad_()"
            lines.append(f"{recipe.name} = {source}")
            names.append(recipe.name)
        lines.append(f"out = {callee}({', '.join(names)})")
        lines.append("outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor) and o.requires_grad]")
        grads = (
            f"grad_output_from_seed(tuple(o.shape), o.dtype, seed={self.grad_seed} + i, "
            f"kind={self.grad_kind!r}, scale={self.grad_scale!r}, device={self.device!r})"
        )
        if self.grad_layout != "as_drawn":
            lines[2] = "from strategies.cases import apply_layout, apply_grad_layout"
            grads = f"apply_grad_layout({grads}, o, {self.grad_layout!r})"
        lines.append(f"grads = [{grads} for i, o in enumerate(outs)]")
        lines.append("torch.autograd.backward(outs, grads)")
        return "\n".join(lines)


def resolve_kinks(spec_input: Any, scalars: dict[str, Any]) -> tuple[float, ...]:
    """A Tensor input's declared kinks as numbers: Scalar names (``"-name"``: minus it) replaced
    by this call's values (the spec validated the names; a drawn non-number is an error)."""
    resolved = []
    for kink in getattr(spec_input, "kinks", ()):
        if isinstance(kink, str):
            value = scalars[kink.removeprefix("-")]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgument(f"kink {kink!r} of {spec_input.name!r}: the Scalar's value {value!r} is not a finite number")
            resolved.append(-float(value) if kink.startswith("-") else float(value))
        else:
            resolved.append(float(kink))
    return tuple(resolved)


def fit_to_budget(
    spec: Spec,
    sizes: dict[str, int],
    batches: dict[str, tuple[int, ...]],
    max_elements: int,
    *,
    min_size: int = 1,
) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Halve the largest dims until every input has at most ``max_elements`` elements, keeping
    each dim legal under the spec's dim rules (multiples, bounds, ``at_most``): a dim never goes
    below its smallest legal size (which, for a dim another is at most, leaves that one a legal
    size), and the dims bounded by a halved one are refitted under it.

    Deterministic, so shrinking the drawn sizes still shrinks the result.
    """
    sizes = dict(sizes)
    grown: dict[str, list[int]] = {k: list(v) for k, v in batches.items()}
    rules: dict[str, DimRule] = dict(getattr(spec, "dim_rules", {}))
    names = tuple(dict.fromkeys([*sizes, *rules, *(r.at_most for r in rules.values() if r.at_most is not None)]))
    bounds = dim_bounds(names, rules, run_min=min_size)
    shaped = [i for i in spec.inputs if hasattr(i, "parsed")]
    for _ in range(200):
        numels = [(_numel(shape_of(i, sizes, grown)), i) for i in shaped]
        if not numels:
            break
        largest_numel, largest = max(numels, key=lambda pair: pair[0])
        if largest_numel <= max_elements:
            break
        parsed = largest.parsed
        candidates: list[tuple[int, str, Any]] = []
        for name in dict.fromkeys(parsed.names):
            if _halved(bounds[name], sizes, name, rules) < sizes[name]:
                candidates.append((sizes[name], "dim", name))
        if parsed.batch:
            candidates += [(s, "batch", (parsed.batch, j)) for j, s in enumerate(grown[parsed.batch]) if s > 1]
        if not candidates:
            break  # only literal or minimal dims left: the spec itself is larger than the budget
        size, where, key = max(candidates, key=lambda c: c[0])
        if where == "dim":
            sizes[key] = _halved(bounds[key], sizes, key, rules)
            for name, bound in bounds.items():  # dims bounded by the one just halved, in order
                at_most = rules[name].at_most if name in rules else None
                if name in sizes and at_most is not None and at_most in sizes:
                    sizes[name] = bound.fit(sizes[name], limit=sizes[at_most])
        else:
            grown[key[0]][key[1]] = (size + 1) // 2
    return sizes, {k: tuple(v) for k, v in grown.items()}


def _halved(bound: DimBounds, sizes: dict[str, int], name: str, rules: dict[str, DimRule]) -> int:
    """Half of ``sizes[name]``, made legal (a multiple, within its bounds and its ``at_most`` dim)."""
    at_most = rules[name].at_most if name in rules else None
    return bound.fit((sizes[name] + 1) // 2, limit=sizes.get(at_most) if at_most is not None else None)


def _batch_shape(draw: st.DrawFn, name: str, options: CaseOptions) -> tuple[int, ...]:
    """A ``*batch`` group's shape: a corner's (its whole shape, or its rank with sides of 2), else drawn."""
    shape = options.corner.batch_shape(name) if options.corner is not None else None
    if shape is not None:
        return shape[: options.max_batch_dims]
    rank = options.corner.batch_rank(name) if options.corner is not None else None
    if rank is not None:
        return (2,) * min(rank, options.max_batch_dims)
    return draw(batch_shapes(max_dims=options.max_batch_dims), label=f"*{name}")


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for s in shape:
        total *= s
    return total


def case_kinds(spec: Spec, options: CaseOptions) -> tuple[tuple[str, int], ...]:
    """(label, number of values) of each categorical draw ``options`` varies for ``spec`` beyond its
    own inputs' values: the coverage phase takes each value in turn (:func:`coverage_corners`)."""
    kinds: list[tuple[str, int]] = []
    differentiable = [i.name for i in spec.differentiable_inputs]
    if options.requires_grad != "all" and differentiable:
        classes = requires_grad_classes(differentiable, min_size=1 if options.requires_grad == "nonempty" else 0)
        kinds.append((REQUIRES_GRAD_LABEL, len(classes)))
    if options.broadcast and any(getattr(i, "broadcast_tokens", lambda: None)() for i in spec.inputs):
        kinds.append((BROADCAST_LABEL, 2))
    for spec_input in spec.inputs:
        if isinstance(spec_input, (Mask, AdditiveMask)):
            kinds.append((mask_kind_label(spec_input.name), len(options.mask_kinds)))
        elif isinstance(spec_input, Tensor):
            kinds.append((layout_label(spec_input.name), len(options.layouts)))
            if not options.spacing:  # ties and runs of repeated values on purpose, in turn with the others
                kinds.append((pattern_label(spec_input.name), len(options.value_patterns)))
            if options.extreme:  # an ordinary scale, the smallest extreme one (1e2: large logits), the dtype's largest
                kinds.append((scale_label(spec_input.name), 3))
    kinds.append((GRAD_KIND_LABEL, len(options.grad_output_kinds)))
    return tuple((label, count) for label, count in kinds if count > 1)


@st.composite
def cases(
    draw: st.DrawFn,
    /,
    spec: Spec,
    options: CaseOptions | None = None,
    *,
    device: str = "cpu",
    **changes: Any,
) -> Case:
    """Calls of ``spec``: sizes for its dims, values by domain, a dtype and requires_grad set.

    spec: the registered spec.
    options: what to vary (:class:`CaseOptions`; default ``CaseOptions()``); ``changes`` are
    applied to it, so ``cases(spec, broadcast=True)`` is ``cases(spec, CaseOptions(broadcast=True))``.
    device: the device the tensors are built on.
    Shrinks towards the smallest sizes, no batch dims, the first dtype, seeds 0 and scale 1;
    a failure that needs a size past a block boundary shrinks to the smallest such size.
    Example: ``cases(spec, device="cpu").example()``.
    """
    chosen = options if options is not None else CaseOptions()
    if changes:
        chosen = chosen.replace(**changes)
    dtypes = chosen.dtypes
    if dtypes is None:
        dtype_strategy = dtypes_for(spec, device)
    else:
        # Explicit dtypes are honoured as given, minus those the device cannot run.
        supported = tuple(d for d in dtypes if device_supports(device, d))
        dtype_strategy = sampled(supported or tuple(dtypes))
    corner = chosen.corner
    if corner is not None:
        listed = finite_values(dtype_strategy)
        if listed:
            dtype_strategy = just(listed[corner.dtype_index % len(listed)])
    dtype = draw(dtype_strategy, label="dtype")
    rules = dict(getattr(spec, "dim_rules", {}))
    if corner is not None and all(corner.size(name) is not None for name in spec.dim_names):
        sizes = {name: size for name, size in corner.sizes if name in spec.dim_names}
    else:
        sizes = draw(
            dim_sizes(
                spec.dim_names, min_size=chosen.min_size, max_size=chosen.max_size, block_sizes=chosen.block_sizes,
                unique=chosen.unique_dims, rules=rules,
            ),
            label="dim sizes",
        )
    batches = {name: _batch_shape(draw, name, chosen) for name in spec.batch_names}
    spec_budget = getattr(spec, "max_elements", None)
    budget = min(chosen.max_elements, spec_budget) if spec_budget is not None else chosen.max_elements
    sizes, batches = fit_to_budget(spec, sizes, batches, budget, min_size=chosen.min_size)

    partial = PartialCase(spec=spec, dtype=dtype, device=device, sizes=sizes, batches=batches, options=chosen)
    for spec_input in spec.inputs:
        partial.recipes[spec_input.name] = draw_recipe(spec_input, draw, partial)
    recipes = list(partial.recipes.values())

    # Declared kinks: no element on one in the tested dtype (tensor_from_seed), and with spacing,
    # none within it of one.
    if chosen.spacing or any(getattr(i, "kinks", ()) for i in spec.tensor_inputs):
        scalars = {r.name: r.value for r in recipes if isinstance(r, ScalarRecipe)}
        kinks = {i.name: resolve_kinks(i, scalars) for i in spec.tensor_inputs}
        spacing = float(chosen.spacing)
        recipes = [
            replace(r, spacing=spacing if r.layout != "expanded" else 0.0, kinks=kinks[r.name])
            if isinstance(r, TensorRecipe) and (kinks[r.name] or (spacing and r.layout != "expanded")) else r
            for r in recipes
        ]

    differentiable = [i.name for i in spec.differentiable_inputs]
    if chosen.requires_grad == "all" or not differentiable:
        wanted = frozenset(differentiable)
    else:
        min_size = 1 if chosen.requires_grad == "nonempty" else 0
        subsets = requires_grad_subsets(differentiable, min_size=min_size)
        if corner is not None and corner.choice(REQUIRES_GRAD_LABEL) is not None:
            subsets = sampled(tuple(requires_grad_classes(differentiable, min_size=min_size)))
        wanted = draw(cornered(subsets, REQUIRES_GRAD_LABEL, corner), label=REQUIRES_GRAD_LABEL)
    grad_seed = distinct_seed(draw(value_seeds(), label="grad_output seed"), "grad_output")
    grad_kind = draw(cornered(sampled(tuple(chosen.grad_output_kinds)), GRAD_KIND_LABEL, corner), label=GRAD_KIND_LABEL)
    grad_scale = draw(magnitudes(dtype=dtype), label="grad_output scale") if grad_kind == "scaled" else 1.0
    return Case(
        spec=spec, device=device, dtype=dtype, sizes=sizes, batches=batches,
        recipes=tuple(recipes), requires_grad=wanted, grad_seed=grad_seed,
        grad_scale=grad_scale, grad_kind=grad_kind,
    )
