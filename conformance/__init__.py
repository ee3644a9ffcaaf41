"""autograd-conformance: property-based contract tests for torch.autograd.Function.

Register a Function with :func:`register`; run ``pytest conformance --impl=yourmodule``.
"""

from conformance.spec import Index, Mask, Scalar, Spec, SpecError, Tensor, register, registered

__all__ = ["Index", "Mask", "Scalar", "Spec", "SpecError", "Tensor", "register", "registered"]
