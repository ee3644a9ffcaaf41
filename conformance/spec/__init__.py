"""The spec language: pure, frozen, validated data that says what a Function takes and how to judge it.

Modules, bottom up: ``checks`` (SpecError and small reusable checks), ``shapes`` (the shape
language), ``dims`` (Dim and the DimRule it compiles to), ``targets`` (op adapters), ``autotune``
(autotuned kernels' configs), ``inputs`` (the input kinds), ``spec`` (Spec), ``validation`` (one
validator per input kind and per group of fields), ``registry`` (register and the registry).
Nothing here imports ``strategies`` or ``conformance.engine``/``conformance.plugin``.
"""

from conformance.spec.checks import SpecError
from conformance.spec.dims import Dim
from conformance.spec.inputs import (
    DOMAINS,
    AdditiveMask,
    Derived,
    Index,
    InputSpec,
    Mask,
    Offsets,
    Scalar,
    Tensor,
)
from conformance.spec.registry import _REGISTRY, _build_spec, make_specs, register, registered, registered_spec
from conformance.spec.shapes import ShapeSpec, parse_shape
from conformance.spec.spec import DEFAULT_TOLERANCES, MAX_TOLERANCE, Spec

__all__ = [
    "DEFAULT_TOLERANCES",
    "DOMAINS",
    "MAX_TOLERANCE",
    "_REGISTRY",
    "AdditiveMask",
    "Derived",
    "Dim",
    "Index",
    "InputSpec",
    "Mask",
    "Offsets",
    "Scalar",
    "ShapeSpec",
    "Spec",
    "SpecError",
    "Tensor",
    "_build_spec",
    "make_specs",
    "parse_shape",
    "register",
    "registered",
    "registered_spec",
]
