"""Finite-difference settings shared by the gradcheck, gradgradcheck and forward_ad contracts
(and the benchmarks that price them)."""

from __future__ import annotations

__all__ = [
    "FAST_ATOL",
    "FAST_RTOL",
    "FD_EPS",
    "FD_SPACING",
    "GRADCHECK_FAST_MODE_ELEMENTS",
    "NONDET_TOL",
    "SLOW_ATOL",
    "SLOW_RTOL",
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
