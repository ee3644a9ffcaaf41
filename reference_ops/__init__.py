"""Correct reference Functions, registered with autograd-conformance.

This is the default ``--impl``: importing the package registers every Function below.
"""

from reference_ops import elementwise, linalg, reductions

__all__ = ["elementwise", "linalg", "reductions"]
