"""Numerical comparison shared by the ``reference`` and ``stability`` contracts.

Policy (see README, "Numerical tolerance policy"):

* **Truth** is the spec's ``reference`` (or ``surrogate`` for gradients of surrogate-gradient
  specs) evaluated in float64 on the CPU with TF32 off, on the *same input values* the
  implementation received (built in the tested dtype, then upcast exactly) and the same
  grad_outputs (upcast).
* **Baseline** is the same reference evaluated in the tested dtype on the tested device: how
  wrong plain PyTorch is in that precision.
* Low precision passes iff ``max|impl - truth| <= k * max|baseline - truth| + floor`` per output
  and per gradient, ``floor = FLOOR_ULPS`` rounding steps of the tested dtype at ``max|truth|``.
  The floor keeps an exact reference (baseline error 0) from demanding bit-exactness.
* A position is *checked* where the truth is finite and representable in the tested dtype
  (rounding it to the dtype gives a finite number). A value the dtype cannot hold (e.g. a
  float16 square of 300) may overflow in any correct implementation, so it is not checked;
  where the truth is NaN or +-inf, the implementation must give the same non-finite value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from conformance.harness import as_tuple, differentiable_positions
from conformance.report import mismatch_report
from conformance.spec import DEFAULT_TOLERANCES, Spec

__all__ = [
    "FLOOR_ULPS",
    "Comparison",
    "Evaluated",
    "checked_positions",
    "compare_budget",
    "compare_finiteness",
    "evaluate",
    "multiplier",
    "rounding_floor",
    "strict_float32",
    "ulp",
    "upcast",
]

FLOOR_ULPS = 2  # rounding steps of the tested dtype at max|truth| added to the budget


@contextmanager
def strict_float32() -> Iterator[None]:
    """TF32 off (matmul and cuDNN) and 'highest' matmul precision; restored afterwards."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def ulp(value: float, dtype: torch.dtype) -> float:
    """One rounding step (unit in the last place) of ``dtype`` at magnitude ``value``.

    ``eps * 2**floor(log2(|value|))``, i.e. the spacing of the binade holding ``value``; below
    the smallest normal number it is the subnormal spacing ``eps * tiny``.
    """
    finfo = torch.finfo(dtype)
    magnitude = abs(float(value))
    if not math.isfinite(magnitude):
        magnitude = float(finfo.max)
    magnitude = max(magnitude, float(finfo.tiny))
    return float(finfo.eps) * 2.0 ** math.floor(math.log2(magnitude))


def rounding_floor(truth: torch.Tensor, dtype: torch.dtype, checked: torch.Tensor, steps: int = FLOOR_ULPS) -> float:
    """``steps`` rounding steps of ``dtype`` at the largest checked ``|truth|``."""
    values = truth[checked].abs()
    peak = float(values.max()) if values.numel() else 0.0
    return steps * ulp(peak, dtype)


def multiplier(spec: Spec, dtype: torch.dtype, which: str) -> float:
    """k for ``which`` ("output" or "grad") in ``dtype``: the spec's override, else the default."""
    return float(spec.tolerances.get(dtype, {}).get(which, DEFAULT_TOLERANCES[which]))


def upcast(value: Any) -> Any:
    """A float64 CPU leaf copy of a floating tensor (keeping requires_grad); others moved to CPU."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.detach().to(device="cpu", dtype=torch.float64).requires_grad_(value.requires_grad)
        return value.detach().cpu()
    return value


@dataclass
class Evaluated:
    """Outputs and input gradients of one evaluation (of the impl, the truth or the baseline)."""

    outputs: tuple[Any, ...]
    grads: dict[str, torch.Tensor | None]


def evaluate(
    func: Callable[..., Any],
    args: Sequence[Any],
    names: Sequence[str],
    grad_outputs: Mapping[int, torch.Tensor],
) -> Evaluated:
    """Run ``func(*args)`` and backpropagate ``grad_outputs`` (by output position).

    Gradients are taken with respect to every tensor argument that requires grad; each
    grad_output is cast to its output's dtype and device first.
    """
    outputs = as_tuple(func(*args))
    wrt = [(name, a) for name, a in zip(names, args) if isinstance(a, torch.Tensor) and a.requires_grad]
    positions = [p for p in differentiable_positions(outputs) if p in grad_outputs]
    if not wrt or not positions:
        return Evaluated(outputs, {})
    grads = torch.autograd.grad(
        [outputs[p] for p in positions],
        [a for _, a in wrt],
        [grad_outputs[p].detach().to(device=outputs[p].device, dtype=outputs[p].dtype) for p in positions],
        allow_unused=True,
    )
    return Evaluated(outputs, {name: grad for (name, _), grad in zip(wrt, grads)})


def checked_positions(truth: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where ``truth`` is finite and representable in ``dtype`` (rounds to a finite value)."""
    finite = torch.isfinite(truth)
    if dtype == torch.float64:
        return finite
    return finite & torch.isfinite(truth.to(dtype))


@dataclass
class Comparison:
    """A failed comparison: the summary line and the assert_close-style details."""

    summary: str
    details: str


def _nonfinite_mismatch(actual: torch.Tensor, truth: torch.Tensor, checked: torch.Tensor) -> torch.Tensor:
    """Positions where the truth is checked but ``actual`` is not finite, or the truth is NaN/inf
    and ``actual`` is not the same non-finite value."""
    bad_checked = checked & ~torch.isfinite(actual)
    truth_nan = torch.isnan(truth)
    truth_inf = torch.isinf(truth)
    bad_nan = truth_nan & ~torch.isnan(actual)
    bad_inf = truth_inf & (actual != truth)
    return bad_checked | bad_nan | bad_inf


def _shown(actual: torch.Tensor, truth: torch.Tensor, checked: torch.Tensor) -> torch.Tensor:
    """``actual`` with unchecked representable-overflow positions replaced by the truth, so the
    mismatch report counts only what the contract checks."""
    ignored = ~checked & torch.isfinite(truth)
    return torch.where(ignored, truth, actual)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def compare_finiteness(
    actual: torch.Tensor, truth: torch.Tensor, dtype: torch.dtype, *, what: str, where: str
) -> Comparison | None:
    """Non-finite values must sit exactly where the truth has them (within ``dtype``'s range)."""
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    checked = checked_positions(truth64, dtype)
    bad = _nonfinite_mismatch(actual64, truth64, checked)
    if not bool(bad.any()):
        return None
    index = _first(bad)
    got, want = float(actual64[index]), float(truth64[index])
    count = int(bad.sum())
    if math.isfinite(want):
        summary = (
            f"{what}[{', '.join(map(str, index))}]={got}, but should be finite (float64 reference: {want:.6g}); "
            f"{count} of {bad.numel()} values non-finite where the reference is finite [{where}]"
        )
    else:
        summary = (
            f"{what}[{', '.join(map(str, index))}]={got}, but should be {want} like the float64 reference; "
            f"{count} of {bad.numel()} non-finite positions differ [{where}]"
        )
    details = mismatch_report(_shown(actual64, truth64, checked), truth64, allowed=math.inf)
    return Comparison(summary, details)


def compare_budget(
    actual: torch.Tensor,
    truth: torch.Tensor,
    baseline: torch.Tensor,
    dtype: torch.dtype,
    *,
    k: float,
    what: str,
    where: str,
) -> Comparison | None:
    """``max|actual - truth| <= k * max|baseline - truth| + floor`` over the checked positions,
    after the non-finite positions match."""
    mismatch = compare_finiteness(actual, truth, dtype, what=what, where=where)
    if mismatch is not None:
        return mismatch
    actual64 = actual.detach().to("cpu", torch.float64)
    truth64 = truth.detach().to("cpu", torch.float64)
    baseline64 = baseline.detach().to("cpu", torch.float64)
    checked = checked_positions(truth64, dtype)
    if not bool(checked.any()):
        return None
    error = torch.where(checked, (actual64 - truth64).abs(), torch.zeros_like(truth64))
    # The baseline's own overflow (an unstable reference in this dtype) says nothing about its
    # rounding error: measure it where it is finite.
    usable = checked & torch.isfinite(baseline64)
    baseline_error = float(torch.where(usable, (baseline64 - truth64).abs(), torch.zeros_like(truth64)).max())
    floor = rounding_floor(truth64, dtype, checked)
    allowed = k * baseline_error + floor
    worst = float(error.max())
    if worst <= allowed:
        return None
    index = _index_of_max(error)
    summary = (
        f"max|{what} - reference|={worst:.6g} at {index}, but should be <= {k:g} x {baseline_error:.6g} "
        f"(reference's own error in {str(dtype).removeprefix('torch.')}) + {floor:.3g} ({FLOOR_ULPS} ulps at "
        f"max|reference|) = {allowed:.6g} [{where}]"
    )
    details = mismatch_report(_shown(actual64, truth64, checked), truth64, allowed=allowed, baseline=baseline_error)
    return Comparison(summary, details)


def _index_of_max(values: torch.Tensor) -> tuple[int, ...]:
    flat = int(values.reshape(-1).argmax())
    index = []
    for size in reversed(values.shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))
