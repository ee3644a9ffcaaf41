"""Correct reference Functions, registered with autograd-conformance.

This is the default ``--impl``: importing the package registers every Function below, grouped
by kind. Each module's docstring names the tutorial pattern (seed file and class) it shows.
They are the suite's proof that it has no false positives: every contract must pass on them.
"""

from reference_ops import (
    amp,
    attention,
    autograd_features,
    custom_ops,
    elementwise,
    estimators,
    linalg,
    losses,
    mlp,
    normalization,
    reductions,
    rotary,
    transforms,
    triton,  # Triton kernels; registers nothing when Triton is not installed
)

__all__ = [
    "amp",
    "attention",
    "autograd_features",
    "custom_ops",
    "elementwise",
    "estimators",
    "linalg",
    "losses",
    "mlp",
    "normalization",
    "reductions",
    "rotary",
    "transforms",
    "triton",
]
