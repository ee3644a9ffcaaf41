"""Hypothesis strategies that generate the inputs of registered autograd Functions."""

from strategies.cases import LAYOUTS, ArgRecipe, Case, apply_layout, broadcast_forms, cases, fit_to_budget, shape_of
from strategies.dims import batch_shapes, dim_sizes, sizes_near_blocks
from strategies.values import (
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    grad_output_from_seed,
    index_from_seed,
    magnitudes,
    mask_from_seed,
    tensor_from_seed,
    value_seeds,
)

__all__ = [
    "GRAD_OUTPUT_KINDS",
    "LAYOUTS",
    "MASK_KINDS",
    "ArgRecipe",
    "Case",
    "apply_layout",
    "batch_shapes",
    "broadcast_forms",
    "grad_output_from_seed",
    "cases",
    "dim_sizes",
    "fit_to_budget",
    "index_from_seed",
    "magnitudes",
    "mask_from_seed",
    "shape_of",
    "sizes_near_blocks",
    "tensor_from_seed",
    "value_seeds",
]
