"""Tensor values from a seed: deterministic, device-independent, shrinkable through the seed.

Torch's own RNG is never used un-seeded: every tensor is generated on the CPU from a
``torch.Generator`` seeded by a Hypothesis draw, then cast and moved, so the same Hypothesis
seed gives bit-identical tensors on every run, worker and device.
"""

from __future__ import annotations

from typing import Union

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

__all__ = [
    "DOMAINS",
    "mask_from_seed",
    "index_from_seed",
    "tensor_from_seed",
    "value_seeds",
    "magnitudes",
]

DOMAINS = ("real", "positive", "nonzero", "unit")
Domain = Union[str, tuple[float, float]]
MASK_KINDS = ("random", "all_true", "causal", "padding", "masked_rows")


def value_seeds() -> st.SearchStrategy[int]:
    """Seeds for :func:`tensor_from_seed`.

    Shrinks towards 0. Example: ``value_seeds().example() -> 1734``.
    """
    return st.integers(min_value=0, max_value=2**31 - 1)


def magnitudes(*, dtype: torch.dtype = torch.float32, extreme: bool = False) -> st.SearchStrategy[float]:
    """Scale factors for generated values.

    dtype: the dtype the values will be cast to; bounds the extreme scales to its range.
    extreme: also generate scales up to ~1/64 of the dtype's finite maximum.
    Shrinks towards 1.0. Example: ``magnitudes(extreme=True).example() -> 1000.0``.
    """
    if not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point dtype")
    ordinary = st.sampled_from([1.0, 0.5, 2.0, 1e-2, 10.0])
    if not extreme:
        return ordinary
    finfo = torch.finfo(dtype)
    # Leave headroom: a reduction over a few elements of max/64 must itself stay finite.
    top = finfo.max / 64
    extremes = [s for s in (1e2, 1e3, 1e4, 3e4, 1e6, 1e10, 1e30, 1e100, 1e300) if s <= top]
    tiny = [s for s in (1e-4, finfo.tiny * 1e3) if s > finfo.tiny]
    return st.sampled_from([1.0, *extremes, *tiny])


def _check_domain(domain: Domain) -> None:
    if isinstance(domain, str):
        if domain not in DOMAINS:
            raise InvalidArgument(f"domain={domain!r} must be one of {DOMAINS} or a (low, high) tuple")
    elif not (isinstance(domain, tuple) and len(domain) == 2 and domain[0] < domain[1]):
        raise InvalidArgument(f"domain={domain!r} must be one of {DOMAINS} or a (low, high) tuple with low < high")


def tensor_from_seed(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    seed: int,
    domain: Domain = "real",
    scale: float = 1.0,
    device: str | torch.device = "cpu",
    constant_rows: bool = False,
) -> torch.Tensor:
    """A tensor of ``shape`` whose values depend only on the arguments (never on global RNG).

    ``real``: normal(0, 1) * scale; ``positive``: [0.25, 2) * scale; ``nonzero``: ±[0.25, 2) * scale
    (bounded away from 0, so finite differences do not straddle a kink); ``unit``: [0.05, 0.95];
    ``(low, high)``: the inner 90% of the interval. ``constant_rows`` repeats the first element of
    each last-dim row along it (ties, zero variance). Use it to rebuild any drawn input in a repro.
    """
    _check_domain(domain)
    generator = torch.Generator().manual_seed(int(seed))
    shape = tuple(int(s) for s in shape)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64)
    if domain == "real":
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    elif domain == "positive":
        values = (0.25 + 1.75 * uniform) * scale
    elif domain == "nonzero":
        sign = torch.where(torch.rand(shape, generator=generator, dtype=torch.float64) < 0.5, -1.0, 1.0)
        values = sign * (0.25 + 1.75 * uniform) * scale
    elif domain == "unit":
        values = 0.05 + 0.9 * uniform
    else:
        low, high = float(domain[0]), float(domain[1])  # type: ignore[index]
        values = low + (high - low) * (0.05 + 0.9 * uniform)
    if constant_rows and values.ndim >= 1 and values.shape[-1] > 0:
        values = values[..., :1].expand(shape).clone()
    return values.to(dtype=dtype).to(device)


def mask_from_seed(
    shape: tuple[int, ...],
    *,
    seed: int,
    kind: str = "random",
    density: float = 0.7,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A boolean mask (``True`` = keep) of ``shape`` and ``kind``.

    kinds: ``random`` (Bernoulli(density)), ``all_true``, ``causal`` (lower-triangular over the
    last two dims), ``padding`` (each row keeps a random-length prefix, at least 1),
    ``masked_rows`` (random, with the first row of each last-two-dims block fully masked).
    """
    if kind not in MASK_KINDS:
        raise InvalidArgument(f"kind={kind!r} must be one of {MASK_KINDS}")
    if not 0.0 <= density <= 1.0:
        raise InvalidArgument(f"density={density!r} must be in [0, 1]")
    generator = torch.Generator().manual_seed(int(seed))
    shape = tuple(int(s) for s in shape)
    if kind == "all_true" or len(shape) == 0:
        mask = torch.ones(shape, dtype=torch.bool)
    elif kind == "causal":
        rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1])
        tri = torch.ones(rows, cols, dtype=torch.bool).tril(diagonal=max(cols - rows, 0))
        mask = tri.expand(shape).clone() if len(shape) >= 2 else tri[0].clone()
    elif kind == "padding":
        cols = shape[-1]
        lengths = torch.randint(1, max(cols, 1) + 1, shape[:-1], generator=generator)
        mask = torch.arange(cols) < lengths.unsqueeze(-1)
    else:
        mask = torch.rand(shape, generator=generator) < density
        if kind == "masked_rows" and len(shape) >= 1:
            if len(shape) >= 2:
                mask[..., 0, :] = False
            else:
                mask[:] = False
    return mask.to(device)


def index_from_seed(
    shape: tuple[int, ...], *, seed: int, high: int, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """An int64 tensor of ``shape`` with values uniform in ``[0, high)``."""
    if high < 1:
        raise InvalidArgument(f"high={high!r} must be >= 1")
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, int(high), tuple(shape), generator=generator).to(device)


GRAD_OUTPUT_KINDS = ("random", "zeros", "scaled", "per_row", "noncontiguous", "expanded")


def grad_output_from_seed(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    seed: int,
    kind: str = "random",
    scale: float = 1.0,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A grad_output of ``shape`` and ``kind``.

    kinds: ``random`` / ``scaled`` (normal * scale), ``zeros``, ``per_row`` (each leading-dim row
    scaled by a different power of ten), ``noncontiguous`` (random values in a transposed or
    strided layout) and ``expanded`` (a stride-0 constant, as ``y.sum().backward()`` produces).
    """
    if kind not in GRAD_OUTPUT_KINDS:
        raise InvalidArgument(f"kind={kind!r} must be one of {GRAD_OUTPUT_KINDS}")
    shape = tuple(int(s) for s in shape)
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype, device=device)
    if kind == "expanded":
        return torch.full((), scale, dtype=dtype, device=device).expand(shape)
    values = tensor_from_seed(shape, torch.float64, seed=seed, scale=scale)
    if kind == "per_row" and values.ndim >= 1 and shape[0] > 0:
        generator = torch.Generator().manual_seed(int(seed) + 1)
        exponents = torch.randint(-2, 3, (shape[0],), generator=generator).to(torch.float64)
        values = values * (10.0**exponents).reshape((-1,) + (1,) * (values.ndim - 1))
    values = values.to(dtype=dtype, device=device)
    if kind == "noncontiguous" and values.ndim >= 1:
        if values.ndim >= 2:
            return values.transpose(-1, -2).contiguous().transpose(-1, -2)
        wide = torch.zeros((shape[0] * 2,), dtype=dtype, device=device)
        wide[::2] = values
        return wide[::2]
    return values
