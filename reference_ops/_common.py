"""Helpers shared by the reference Functions (not part of the public API)."""

from __future__ import annotations

import torch

__all__ = ["ALL_FLOATS", "HALF_FLOATS", "upcast"]

ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
HALF_FLOATS = (torch.float16, torch.bfloat16)


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous float64 copy: the accumulation dtype of every floating input.

    Compound ops (reductions, normalisations, attention, products) compute in a wider dtype and
    round once at the end, the way fused kernels accumulate float16 in float32; so their error
    is about one final rounding, never more than the reference's own error in that dtype. One
    compute dtype for every input dtype keeps mixed inputs working (a model under autocast passes
    bfloat16 activations with float32 weights), and autocast leaves float64 arithmetic alone. The
    contiguous copy makes the arithmetic (and so the rounding) independent of the caller's
    memory layout, as a kernel that calls ``.contiguous()`` on its inputs. Both steps are
    differentiable, so double backward sees through them.
    """
    tensor = tensor.contiguous()
    return tensor.double() if tensor.is_floating_point() else tensor
