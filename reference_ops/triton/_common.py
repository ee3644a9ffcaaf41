"""Helpers shared by the Triton reference Functions (not part of the public API).

Whether a kernel runs natively (CUDA) or under the Triton interpreter is fixed when it is
decorated: ``TRITON_INTERPRET=1`` must be set before the kernel module is imported (the pytest
plugin does so on machines without CUDA). The spec's dtypes and devices are derived from the
decorated kernel, so they always describe where the kernel really runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "INTERPRETED",
    "check_device",
    "device_guard",
    "interpreted",
    "kernel_devices",
    "kernel_dtypes",
    "launch_grid",
    "next_power_of_2",
    "stable_sigmoid",
]


@triton.jit
def stable_sigmoid(z):
    """sigmoid(z) from exp of a non-positive number only: no overflow for any |z|
    (``1 / (1 + exp(-z))`` overflows for large negative z)."""
    e = tl.exp(-tl.abs(z))
    return tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def interpreted(kernel: Any) -> bool:
    """True when ``kernel`` (a ``@triton.jit`` function) was decorated under the interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


def kernel_dtypes(kernel: Any) -> tuple[torch.dtype, ...]:
    """Dtypes the kernel computes correctly where it runs.

    float64 is listed in both modes so gradcheck runs; bfloat16 only natively: the interpreter
    (numpy has no bfloat16) truncates float32 -> bfloat16 instead of rounding to nearest, a
    silent bias, and lacks bfloat16 constants.
    """
    dtypes = (torch.float64, torch.float32, torch.float16)
    return dtypes if interpreted(kernel) else (*dtypes, torch.bfloat16)


def kernel_devices(kernel: Any) -> tuple[str, ...]:
    """Natively a Triton kernel needs CUDA tensors; the interpreter runs CPU (and CUDA) tensors."""
    return ("cpu", "cuda") if interpreted(kernel) else ("cuda",)


# Fixed when this package's kernels are decorated (stable_sigmoid above, the first of them); a
# plain bool, so that torch.compile traces check_device without a graph break (Dynamo cannot
# take type() of a Triton kernel).
INTERPRETED = interpreted(stable_sigmoid)


def check_device(*tensors: torch.Tensor) -> None:
    """Raise a clear error instead of Triton's driver error for CPU tensors on a native kernel."""
    if INTERPRETED:
        return
    for tensor in tensors:
        if tensor.device.type != "cuda":
            raise RuntimeError(
                f"this Triton kernel was compiled for the GPU, but got a tensor on {tensor.device}; "
                "set TRITON_INTERPRET=1 before importing it to run on CPU tensors"
            )


def device_guard(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Launch on the tensor's own GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.device.type == "cuda" else contextlib.nullcontext()


def launch_grid(kernel: Any, grid: Sequence[int], *args: Any, **meta: Any) -> None:
    """``kernel[grid](*args, **meta)``, skipped for an empty grid (zero-size tensors)."""
    if all(g > 0 for g in grid):
        launcher: Callable[..., Any] = kernel[tuple(grid)]
        launcher(*args, **meta)


def next_power_of_2(n: int) -> int:
    return int(triton.next_power_of_2(max(int(n), 1)))
