"""Finite-difference settings shared by the gradcheck, gradgradcheck and forward_ad contracts
(and the benchmarks that price them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "FAST_ATOL",
    "FAST_RTOL",
    "FD_EPS",
    "FD_SPACING",
    "GRADCHECK_FAST_MODE_ELEMENTS",
    "NONDET_TOL",
    "SLOW_ATOL",
    "SLOW_RTOL",
    "unresolvable_outputs",
]

# The finite-difference step of gradcheck/gradgradcheck (torch's default), and how far apart the
# values drawn for them are kept -- from each other and from declared kinks: 100 steps, so that
# no central difference (which moves an element, or the difference of two, by at most 2 steps in
# fast mode) straddles a tie or a kink (see strategies.values.spread).
FD_EPS = 1e-6
FD_SPACING = 100 * FD_EPS

# Declared-nondeterministic backward: allowed difference between two backward calls (float64),
# for gradcheck's and gradgradcheck's reentrancy check.
NONDET_TOL = 1e-10

# gradcheck (and forward_ad's float64 gradcheck) uses fast mode above this many input plus output
# elements. Fast mode scales atol by sum(u) * sum(v), so the default atol=1e-5 lets a backward
# that is 5% off pass on a few thousand elements (measured: tests/test_gradcheck_tolerance.py):
# it gets FAST_ATOL instead.
GRADCHECK_FAST_MODE_ELEMENTS = 256
SLOW_ATOL, SLOW_RTOL = 1e-5, 1e-3
FAST_ATOL, FAST_RTOL = 1e-8, 1e-3


_FULL_PRECISION = (torch.float64, torch.complex128)


def unresolvable_outputs(outputs: Sequence[Any]) -> str | None:
    """Why finite differences in float64 cannot check these outputs of a float64 call, or None.

    A differentiable output of lower precision (a Function that returns float32 whatever its
    input's dtype) rounds away a step of ``FD_EPS``: the central difference of ``x.float()`` at a
    float64 ``x`` is 0.9984 where the derivative is 1. Its gradients are the reference contract's
    to judge, against the float64 truth."""
    coarse = [
        f"output[{position}] is {str(output.dtype).removeprefix('torch.')}"
        for position, output in enumerate(outputs)
        if isinstance(output, torch.Tensor) and output.requires_grad and output.dtype not in _FULL_PRECISION
    ]
    if not coarse:
        return None
    return (
        f"{', '.join(coarse)} for float64 inputs: finite differences (eps={FD_EPS:g}) cannot resolve a "
        "lower-precision output; the reference contract compares the gradients with the float64 truth"
    )
