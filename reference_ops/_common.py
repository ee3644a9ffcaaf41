"""Helpers shared by the reference Functions (not part of the public API)."""

from __future__ import annotations

import torch

__all__ = ["ALL_FLOATS", "HALF_FLOATS", "upcast"]

ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
HALF_FLOATS = (torch.float16, torch.bfloat16)


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32, anything else unchanged (a differentiable cast).

    Compound kernels (reductions, normalisations, attention) accumulate in float32 the way fused
    GPU kernels do; the result is cast back to the input dtype, so it is at least as accurate
    as the reference evaluated in the low-precision dtype.
    """
    return tensor.float() if tensor.dtype in HALF_FLOATS else tensor
