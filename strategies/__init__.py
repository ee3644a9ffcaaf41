"""Hypothesis strategies that generate the inputs of registered autograd Functions.

Each family is a standalone public strategy (``sizes``, ``dim_sizes``, ``batch_shapes``,
``broadcast_forms``, ``dtypes_for``, ``masks``, ``additive_masks``, ``requires_grad_subsets``,
``layouts``, ``tensors``, ``magnitudes``, ``grad_outputs``) and all of them are wired into
``cases(spec, ...)``, which draws whole calls of a registered Function.

Modules, bottom up: ``values`` (tensors from seeds), ``layouts`` (memory layouts), ``recipes``
(how to rebuild one drawn argument), ``options`` (CaseOptions), ``dims`` (sizes under the spec's
dim rules), ``inputs`` (dtypes, requires_grad subsets), ``draw`` (one drawing function per input
kind of the spec language), ``cases`` (whole calls).
"""

from strategies.cases import Case, cases, fit_to_budget
from strategies.dims import BLOCK_SIZES, DimRule, batch_shapes, broadcast_forms, dim_sizes, sizes, sizes_near_blocks
from strategies.draw import PartialCase, draw_recipe, shape_of
from strategies.inputs import device_supports, dtypes_for, requires_grad_subsets
from strategies.layouts import LAYOUTS, apply_layout, layouts
from strategies.options import CaseOptions
from strategies.recipes import (
    AdditiveMaskRecipe,
    DerivedContext,
    DerivedRecipe,
    IndexRecipe,
    MaskRecipe,
    OffsetsRecipe,
    Recipe,
    ScalarRecipe,
    TensorRecipe,
    derived_from_seed,
)
from strategies.values import (
    DOMAINS,
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    VALUE_PATTERNS,
    additive_mask_from_seed,
    additive_masks,
    grad_output_from_seed,
    grad_outputs,
    index_from_seed,
    magnitudes,
    mask_densities,
    mask_from_seed,
    masks,
    tensor_from_seed,
    tensors,
    value_seeds,
)

__all__ = [
    "BLOCK_SIZES",
    "DOMAINS",
    "GRAD_OUTPUT_KINDS",
    "LAYOUTS",
    "MASK_KINDS",
    "VALUE_PATTERNS",
    "AdditiveMaskRecipe",
    "Case",
    "CaseOptions",
    "DerivedContext",
    "DerivedRecipe",
    "DimRule",
    "IndexRecipe",
    "MaskRecipe",
    "OffsetsRecipe",
    "PartialCase",
    "Recipe",
    "ScalarRecipe",
    "TensorRecipe",
    "additive_mask_from_seed",
    "additive_masks",
    "apply_layout",
    "batch_shapes",
    "broadcast_forms",
    "cases",
    "derived_from_seed",
    "device_supports",
    "dim_sizes",
    "draw_recipe",
    "dtypes_for",
    "fit_to_budget",
    "grad_output_from_seed",
    "grad_outputs",
    "index_from_seed",
    "layouts",
    "magnitudes",
    "mask_densities",
    "mask_from_seed",
    "masks",
    "requires_grad_subsets",
    "shape_of",
    "sizes",
    "sizes_near_blocks",
    "tensor_from_seed",
    "tensors",
    "value_seeds",
]
