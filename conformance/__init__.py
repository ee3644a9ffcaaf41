"""autograd-conformance: property-based contract tests for torch.autograd.Function.

Register a Function with :func:`register`; run ``pytest conformance --impl=yourmodule``, or call
:func:`check` inside any test.
The names below are imported on first use, so importing this package (as pytest's plugin
machinery may) costs nothing until a spec module uses it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.embed.check import CheckResult, ConformanceFailure, ContractResult, check
    from conformance.spec import (
        AdditiveMask,
        Derived,
        Dim,
        Index,
        Mask,
        Offsets,
        Scalar,
        Spec,
        SpecError,
        Tensor,
        register,
        registered,
    )

__all__ = [
    "AdditiveMask",
    "CheckResult",
    "ConformanceFailure",
    "ContractResult",
    "Derived",
    "Dim",
    "Index",
    "Mask",
    "Offsets",
    "Scalar",
    "Spec",
    "SpecError",
    "Tensor",
    "check",
    "register",
    "registered",
]


_CHECK_NAMES = ("CheckResult", "ConformanceFailure", "ContractResult", "check")


def __getattr__(name: str) -> Any:
    if name in _CHECK_NAMES:
        return getattr(importlib.import_module("conformance.embed.check"), name)
    if name in __all__:
        return getattr(importlib.import_module("conformance.spec"), name)
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
