"""Functions that leave torch's global state changed (the global_state contract), and correct
ones that touch it legitimately (they must pass it).

Each bug works: its outputs and gradients are right, so only global_state can fail it.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register


class LeaksDefaultDtype(torch.autograd.Function):
    """Switches the default dtype to float64 "for accuracy" and never switches it back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.set_default_dtype(torch.float64)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class LeaksDeterministicAlgorithms(torch.autograd.Function):
    """Turns deterministic algorithms on in forward (later scatter_add_/index_add_ on CUDA raise)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.use_deterministic_algorithms(True)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class LeaksAnomalyModeInBackward(torch.autograd.Function):
    """Enables anomaly detection while debugging backward, and leaves it on (every later
    backward runs many times slower)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        torch.autograd.set_detect_anomaly(True)
        return grad_output * 2


class LeaksDefaultDevice(torch.autograd.Function):
    """Sets the default device to "meta" (to measure shapes) and leaves it: every tensor the
    caller creates afterwards has no data."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.set_default_device("meta")
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class ReseedsRng(torch.autograd.Function):
    """Dropout that calls torch.manual_seed(0) for "reproducibility": the caller's RNG restarts
    at the same state on every call (the same mask every step)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)
        keep = (torch.rand(x.shape, dtype=x.dtype, device=x.device) > 0.5).to(x.dtype)
        ctx.save_for_backward(keep)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (keep,) = ctx.saved_tensors
        return grad_output * keep * 2


class RewindsRngInBackward(torch.autograd.Function):
    """Dropout that saves the RNG state before drawing its mask and restores it in backward to
    redraw the mask -- without torch.random.fork_rng, so the caller's RNG is rewound."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(torch.get_rng_state())
        keep = (torch.rand(x.shape, dtype=x.dtype, device=x.device) > 0.5).to(x.dtype)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (rng_state,) = ctx.saved_tensors
        torch.set_rng_state(rng_state)
        keep = (torch.rand(grad_output.shape, dtype=grad_output.dtype, device=grad_output.device) > 0.5)
        torch.set_rng_state(rng_state)  # "put it back where we found it" -- before forward's draw
        return grad_output * keep.to(grad_output.dtype) * 2


# -- correct: these touch global state and must pass -----------------------------------------


class Dropout(torch.autograd.Function):
    """Plain dropout: draws from torch's RNG, which advances it (legitimate; declared random)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        keep = (torch.rand(x.shape, dtype=x.dtype, device=x.device) > 0.5).to(x.dtype)
        ctx.save_for_backward(keep)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (keep,) = ctx.saved_tensors
        return grad_output * keep * 2


class RecomputingDropout(torch.autograd.Function):
    """Saves the RNG state and redraws the mask in backward inside torch.random.fork_rng, as
    torch.utils.checkpoint does: the caller's RNG is left where forward left it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(torch.get_rng_state())
        keep = (torch.rand(x.shape, dtype=x.dtype, device=x.device) > 0.5).to(x.dtype)
        return x * keep * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (rng_state,) = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state)
            keep = (torch.rand(grad_output.shape, dtype=grad_output.dtype, device=grad_output.device) > 0.5)
        return grad_output * keep.to(grad_output.dtype) * 2


class GradModeInsideForward(torch.autograd.Function):
    """Calls torch.set_grad_enabled(False) in forward: autograd restores grad mode when forward
    returns, so the caller never sees it (no leak)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.set_grad_enabled(False)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class ScopedFloat64(torch.autograd.Function):
    """Computes in float64 under a scoped default dtype that it restores."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            two = torch.tensor(2.0, device=x.device)
        finally:
            torch.set_default_dtype(previous)
        return (x.double() * two).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _dropout_reference(x: torch.Tensor) -> torch.Tensor:
    return x * (torch.rand(x.shape, dtype=x.dtype, device=x.device) > 0.5).to(x.dtype) * 2


for fn, name in (
    (LeaksDefaultDtype, "leaks_default_dtype"),
    (LeaksDeterministicAlgorithms, "leaks_deterministic_algorithms"),
    (LeaksAnomalyModeInBackward, "leaks_anomaly_mode_in_backward"),
    (LeaksDefaultDevice, "leaks_default_device"),
    (GradModeInsideForward, "grad_mode_inside_forward"),
    (ScopedFloat64, "scoped_float64"),
):
    register(fn, name=name, inputs=[Tensor("x", "*batch n")], reference=_twice)
for fn, name in (
    (ReseedsRng, "reseeds_rng"),
    (RewindsRngInBackward, "rewinds_rng_in_backward"),
    (Dropout, "dropout"),
    (RecomputingDropout, "recomputing_dropout"),
):
    register(fn, name=name, inputs=[Tensor("x", "*batch n")], reference=_dropout_reference, nondeterministic=True)
