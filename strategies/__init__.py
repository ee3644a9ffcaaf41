"""Hypothesis strategies that generate the inputs of registered autograd Functions.

Each family is a standalone public strategy (``sizes``, ``dim_sizes``, ``batch_shapes``,
``broadcast_forms``, ``dtypes_for``, ``masks``, ``additive_masks``, ``requires_grad_subsets``,
``layouts``, ``tensors``, ``magnitudes``, ``grad_outputs``) and all of them are wired into
``cases(spec, ...)``, which draws whole calls of a registered Function.
"""

from strategies.cases import LAYOUTS, ArgRecipe, Case, apply_layout, cases, fit_to_budget, layouts, shape_of
from strategies.dims import BLOCK_SIZES, batch_shapes, broadcast_forms, dim_sizes, sizes, sizes_near_blocks
from strategies.inputs import device_supports, dtypes_for, requires_grad_subsets
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
    "ArgRecipe",
    "Case",
    "additive_mask_from_seed",
    "additive_masks",
    "apply_layout",
    "batch_shapes",
    "broadcast_forms",
    "cases",
    "device_supports",
    "dim_sizes",
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
