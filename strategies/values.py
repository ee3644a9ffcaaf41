"""Tensor values from a seed: deterministic, device-independent, shrinkable through the seed.

Torch's own RNG is never used un-seeded: every tensor is generated on the CPU from a
``torch.Generator`` seeded by a Hypothesis draw, then cast and moved, so the same Hypothesis
seed gives bit-identical tensors on every run, worker and device. Every tensor built here names
its dtype and device: torch's defaults (``torch.set_default_dtype``/``set_default_device``, which
a spec module may change) never shape a generated value.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from typing import Union

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies.reuse import sampled

__all__ = [
    "DOMAINS",
    "GRAD_OUTPUT_KINDS",
    "MASK_KINDS",
    "VALUE_PATTERNS",
    "additive_mask_from_seed",
    "additive_masks",
    "corner_magnitudes",
    "grad_outputs",
    "index_from_seed",
    "magnitudes",
    "mask_densities",
    "mask_from_seed",
    "masks",
    "spread",
    "tensor_from_seed",
    "tensors",
    "value_seeds",
]

DOMAINS = ("real", "positive", "nonzero", "unit")
Domain = Union[str, tuple[float, float]]
# left_padding (a kept suffix per row, as batched decoding pads prompts) puts a masked key first:
# under causal attention the first query then sees no key at all.
MASK_KINDS = ("random", "all_true", "causal", "padding", "masked_rows", "left_padding")
# Value patterns on top of a domain: ties (few distinct values, so max/sort/median must break
# ties), near_zero (exact zeros and tiny values, where |x|, relu and division have kinks) and
# ascending (every dim increasing: the maximum last, in a blocked kernel's last block) and repeats
# (runs of equal random values along every dim: small groups of ties, a row's maximum among them
# about half the time, at no special value such as 0 or 1 where a kink would sit as well).
VALUE_PATTERNS = ("random", "ties", "near_zero", "ascending", "repeats")


def distinct_seed(seed: int, name: str) -> int:
    """``seed`` mixed with an argument's name: inputs of one shape drawn with the same seed (all
    shrink towards 0) still get different values, so ``max(a, b)`` is not tested only at a == b."""
    return zlib.crc32(f"{int(seed)}|{name}".encode()) & 0x7FFFFFFF


_VALUE_SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def value_seeds() -> st.SearchStrategy[int]:
    """Seeds for :func:`tensor_from_seed`.

    Shrinks towards 0. Example: ``value_seeds().example() -> 1734``.
    """
    return _VALUE_SEEDS  # one object: Hypothesis validates a strategy on its first draw


@functools.cache
def magnitudes(*, dtype: torch.dtype = torch.float32, extreme: bool = False) -> st.SearchStrategy[float]:
    """Scale factors for generated values.

    dtype: the dtype the values will be cast to; bounds the extreme scales to its range.
    extreme: also generate scales up to ~1/64 of the dtype's finite maximum.
    Shrinks towards 1.0. Example: ``magnitudes(extreme=True).example() -> 1000.0``.
    """
    if not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point dtype")
    ordinary = sampled((1.0, 0.5, 2.0, 1e-2, 10.0))
    if not extreme:
        return ordinary
    finfo = torch.finfo(dtype)
    tiny = [s for s in (1e-4, finfo.tiny * 1e3) if s > finfo.tiny]
    return sampled((1.0, *_extreme_scales(dtype), *tiny))


def _extreme_scales(dtype: torch.dtype) -> list[float]:
    # Leave headroom: a reduction over a few elements of max/64 must itself stay finite.
    top = torch.finfo(dtype).max / 64
    return [s for s in (1e2, 1e3, 1e4, 3e4, 1e6, 1e10, 1e30, 1e100, 1e300) if s <= top]


def corner_magnitudes(*, dtype: torch.dtype = torch.float32) -> st.SearchStrategy[float]:
    """The extreme scales the coverage phase takes in turn: ordinary (1), large logits (1e2) and the
    dtype's largest of :func:`magnitudes` (where an unguarded exp or square overflows). Kept apart
    from :func:`magnitudes`, which shrinks towards the smallest scale that fails."""
    if not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point dtype")
    extremes = _extreme_scales(dtype)
    return sampled((1.0, extremes[0], extremes[-1]))


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
    pattern: str = "random",
    spacing: float = 0.0,
    kinks: Sequence[float] = (),
) -> torch.Tensor:
    """A tensor of ``shape`` whose values depend only on the arguments (never on global RNG).

    ``real``: normal(0, 1) * scale; ``positive``: [0.25, 2) * scale; ``nonzero``: ±[0.25, 2) * scale
    (bounded away from 0, so finite differences do not straddle a kink); ``unit``: [0.05, 0.95];
    ``(low, high)``: the inner 90% of the interval. ``constant_rows`` repeats the first element of
    each last-dim row along it (ties, zero variance). ``pattern``: ``random``; ``ties`` (values
    rounded to a few levels, so many elements are exactly equal); ``near_zero`` (``real`` domain
    only: about a third exact zeros and a third within ±1e-3 * scale); ``ascending`` (the values,
    on the real line their magnitudes, sorted in row-major order: every dim increasing, so a
    blocked reduction's maximum lies in its last block); ``repeats`` (along every dim, each element
    a copy of the one before it with probability 1/2: runs of equal values, so a maximum is often
    tied). ``spacing > 0`` (for
    finite differences, see :func:`spread`): no two elements closer than ``spacing``, none
    closer than ``spacing`` to a ``kinks`` location; with ``kinks`` at any spacing, no element lies
    exactly on one in ``dtype`` (one rounding step off it). Use it to rebuild any drawn input in a repro.
    """
    _check_domain(domain)
    if pattern not in VALUE_PATTERNS:
        raise InvalidArgument(f"pattern={pattern!r} must be one of {VALUE_PATTERNS}")
    if pattern == "near_zero" and domain != "real":
        raise InvalidArgument(f"pattern='near_zero' needs domain='real', got domain={domain!r}")
    if not (isinstance(spacing, (int, float)) and math.isfinite(spacing) and spacing >= 0):
        raise InvalidArgument(f"spacing={spacing!r} must be a finite number >= 0")
    if spacing and (constant_rows or pattern != "random"):
        raise InvalidArgument("spacing > 0 keeps values apart; it cannot be combined with constant_rows or a ties/near_zero pattern")
    values = _float64_values(tuple(int(s) for s in shape), int(seed), domain, float(scale), bool(constant_rows), pattern, float(spacing), tuple(kinks))
    made = values.to(dtype=dtype, device=device, copy=True)  # never the cached tensor itself: callers may write to it
    return _off_kinks(made, values, kinks) if kinks and made.is_floating_point() else made


def _off_kinks(made: torch.Tensor, exact: torch.Tensor, kinks: Sequence[float]) -> torch.Tensor:
    """``made`` with each element that rounded onto a declared kink (bfloat16's 2.0 from a drawn
    1.999) moved one rounding step of its dtype off it (off 0: to the smallest normal number), to
    the side of its float64 value (up from a value on it): at a kink no gradient is right or
    wrong, so no contract may compare one there."""
    for kink in kinks:
        at_kink = torch.tensor(float(kink), dtype=torch.float64, device="cpu").to(dtype=made.dtype, device=made.device)
        on = made == at_kink
        if not bool(on.any()):
            continue
        if float(kink) == 0.0:  # off 0 by the smallest normal number: a subnormal may be flushed back to 0
            tiny = torch.finfo(made.dtype).tiny
            up, down = torch.full_like(at_kink, tiny), torch.full_like(at_kink, -tiny)
        else:
            up = torch.nextafter(at_kink, torch.full_like(at_kink, math.inf))
            down = torch.nextafter(at_kink, torch.full_like(at_kink, -math.inf))
        below = exact.to(made.device) < float(at_kink.to(torch.float64))
        made = torch.where(on, torch.where(below, down, up), made)
    return made


@functools.lru_cache(maxsize=512)
def _float64_values(
    shape: tuple[int, ...], seed: int, domain: Domain, scale: float, constant_rows: bool, pattern: str, spacing: float,
    kinks: tuple[float, ...],
) -> torch.Tensor:
    """tensor_from_seed's values in float64 on the CPU, once per arguments: every contract builds a
    case's inputs again for each evaluation, and each dtype."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64, device="cpu")
    if domain == "real":
        values = torch.randn(shape, generator=generator, dtype=torch.float64, device="cpu") * scale
    elif domain == "positive":
        values = (0.25 + 1.75 * uniform) * scale
    elif domain == "nonzero":
        flip = torch.rand(shape, generator=generator, dtype=torch.float64, device="cpu") < 0.5
        sign = 1.0 - 2.0 * flip.to(torch.float64)
        values = sign * (0.25 + 1.75 * uniform) * scale
    elif domain == "unit":
        values = 0.05 + 0.9 * uniform
    else:
        low, high = float(domain[0]), float(domain[1])
        values = low + (high - low) * (0.05 + 0.9 * uniform)
    if pattern == "ties":
        # Snap to 4 levels per unit of scale: keeps the domain (levels stay inside it).
        if isinstance(domain, tuple) or domain == "unit":
            low, high = (0.05, 0.95) if domain == "unit" else (float(domain[0]), float(domain[1]))
            span = high - low
            values = low + span * (0.05 + 0.9 * torch.round((values - low) / span * 3) / 3)
        else:
            levels = torch.round(values / scale * 2) / 2
            if domain != "real":
                levels = torch.where(levels.abs() < 0.25, torch.sign(values) * 0.5, levels)
            values = levels * scale
    elif pattern == "near_zero":
        which = torch.randint(0, 3, shape, generator=generator, dtype=torch.int64, device="cpu")
        values = torch.where(which == 0, torch.zeros_like(values), torch.where(which == 1, values * 1e-3, values))
    elif pattern == "ascending":
        # Row-major order, every dim increasing: the largest element last along each dim (a blocked
        # reduction's running max moves in its last block). On the real line (and nonzero's) the
        # magnitudes, so that a product of two such tensors (scores q @ k.T) increases too.
        if domain in ("real", "nonzero"):
            values = values.abs()
        values = values.flatten().sort().values.reshape(shape)
    elif pattern == "repeats" and values.ndim and values.numel():
        values = _repeated_runs(values, generator)
    if constant_rows and values.ndim >= 1 and values.shape[-1] > 0:
        values = values[..., :1].expand(shape).clone()
    if spacing:
        values = spread(values, spacing, kinks=kinks, bounds=_drawn_bounds(domain, scale))
    return values


def _repeated_runs(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``values`` with runs of equal elements along every dim (a reduction along any of them meets
    ties): along each in turn, each slice after the first a copy of the one before with
    probability 1/2, element by element."""
    for dim in range(values.ndim):
        moved = values.movedim(dim, -1)
        copies = torch.rand(moved.shape, generator=generator, dtype=torch.float64, device="cpu") < 0.5
        copies[..., 0] = False
        positions = torch.arange(moved.shape[-1]).expand(moved.shape)
        run_starts = torch.where(copies, torch.zeros_like(positions), positions).cummax(dim=-1).values
        values = moved.gather(-1, run_starts).movedim(-1, dim)
    return values.contiguous()


def _drawn_bounds(domain: Domain, scale: float) -> tuple[float, float, tuple[tuple[float, float], ...]]:
    """(low, high, gaps): where ``tensor_from_seed`` puts values of ``domain``, as bounds that
    :func:`spread` keeps (``nonzero`` has a gap around 0)."""
    if domain == "real":
        return -math.inf, math.inf, ()
    if domain == "positive":
        return 0.25 * scale, math.inf, ()
    if domain == "nonzero":
        return -math.inf, math.inf, ((-0.25 * scale, 0.25 * scale),)
    if domain == "unit":
        return 0.05, 0.95, ()
    low, high = float(domain[0]), float(domain[1])
    return low + 0.05 * (high - low), low + 0.95 * (high - low), ()


def _push_up(values: torch.Tensor, spacing: float, low: float) -> torch.Tensor:
    """Sorted ``values`` moved up as little as possible so that each is >= ``low`` and at least
    ``spacing`` above the one before: y[i] = i*d + cummax(x[j] - j*d), with y[0] >= low."""
    steps = torch.arange(values.numel(), dtype=torch.float64, device="cpu") * spacing
    shifted = values - steps
    shifted[0] = max(float(shifted[0]), low)
    return torch.cummax(shifted, dim=0).values + steps


def spread(
    values: torch.Tensor,
    spacing: float,
    *,
    kinks: Sequence[float] = (),
    bounds: tuple[float, float, tuple[tuple[float, float], ...]] = (-math.inf, math.inf, ()),
) -> torch.Tensor:
    """``values`` (float64) moved as little as possible, keeping their order, so that no two are
    closer than ``spacing`` and none is closer than ``spacing`` to a kink.

    Why: ``gradcheck`` compares the analytical gradient with central differences of step
    1e-6. Two elements closer than that (a near-tie of ``max``/``sort``) or an element that close
    to a kink (``clamp``'s bounds) put the difference across the kink, where no gradient is
    right: a false failure of a correct Function. ``bounds`` = (low, high, gaps) are where the
    values must stay (the domain). Values are split at the kinks and gaps into segments, and
    each segment's sorted values are pushed up from its lower end, then down from its upper end.
    A segment too short for its values (a narrow interval domain) gets them evenly spaced, as
    far apart as it allows.
    """
    low, high, domain_gaps = bounds
    gaps = sorted([*domain_gaps, *((float(k) - spacing, float(k) + spacing) for k in kinks)])
    edges: list[tuple[float, float]] = []
    start = low
    for gap_low, gap_high in gaps:
        if gap_high <= start or gap_low >= high:
            continue
        if gap_low > start:
            edges.append((start, gap_low))
        start = max(start, gap_high)
    if start < high:
        edges.append((start, high))
    if not edges or values.numel() == 0:
        return values
    flat = values.reshape(-1).clone()
    # Each value goes to the segment it lies in or, inside a gap, to the nearest segment.
    lows = torch.tensor([a for a, _ in edges], dtype=torch.float64, device="cpu").unsqueeze(1)
    highs = torch.tensor([b for _, b in edges], dtype=torch.float64, device="cpu").unsqueeze(1)
    distance = (lows - flat).clamp(min=0) + (flat - highs).clamp(min=0)
    segment = distance.argmin(dim=0)
    for index, (a, b) in enumerate(edges):
        members = (segment == index).nonzero().reshape(-1)
        if members.numel() == 0:
            continue
        order = members[torch.argsort(flat[members], stable=True)]
        count = order.numel()
        if (count - 1) * spacing > b - a:  # cannot fit: as evenly as the segment allows
            flat[order] = a + (b - a) * (torch.arange(count, dtype=torch.float64, device="cpu") + 0.5) / count
            continue
        up = _push_up(flat[order], spacing, a)
        down = -_push_up(-up.flip(0), spacing, -b).flip(0)
        flat[order] = down
    return flat.reshape(values.shape)


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
    ``masked_rows`` (random, with the first row of each last-two-dims block fully masked),
    ``left_padding`` (each row keeps a random-length suffix, at least 1; the first row is padded
    whenever it has two or more elements).
    """
    if kind not in MASK_KINDS:
        raise InvalidArgument(f"kind={kind!r} must be one of {MASK_KINDS}")
    if not 0.0 <= density <= 1.0:
        raise InvalidArgument(f"density={density!r} must be in [0, 1]")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    shape = tuple(int(s) for s in shape)
    if kind == "all_true" or len(shape) == 0:
        mask = torch.ones(shape, dtype=torch.bool, device="cpu")
    elif kind == "causal":
        rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1])
        tri = torch.ones(rows, cols, dtype=torch.bool, device="cpu").tril(diagonal=max(cols - rows, 0))
        mask = tri.expand(shape).clone() if len(shape) >= 2 else tri[0].clone()
    elif kind in ("padding", "left_padding"):
        cols = shape[-1]
        lengths = torch.randint(1, max(cols, 1) + 1, shape[:-1], generator=generator, dtype=torch.int64, device="cpu")
        positions = torch.arange(cols, dtype=torch.int64, device="cpu")
        if kind == "padding":
            mask = positions < lengths.unsqueeze(-1)
        else:
            first = lengths.reshape(-1)[:1]
            first.clamp_(max=max(cols - 1, 1))  # one padded row at least: the corner meets it
            mask = positions >= (cols - lengths).unsqueeze(-1)
    else:
        # float32 named, never the default dtype: a spec module that sets float64 must not change masks.
        mask = torch.rand(shape, generator=generator, dtype=torch.float32, device="cpu") < density
        if kind == "masked_rows" and len(shape) >= 1:
            if len(shape) >= 2:
                mask[..., 0, :] = False
            else:
                mask[:] = False
    return mask.to(device)


def index_from_seed(
    shape: tuple[int, ...],
    *,
    seed: int,
    high: int,
    device: str | torch.device = "cpu",
    sentinels: Sequence[int] = (),
    sentinel_fraction: float = 0.0,
) -> torch.Tensor:
    """An int64 tensor of ``shape`` with values uniform in ``[0, high)``; about a
    ``sentinel_fraction`` of the elements (all of them at 1.0; at least one, and not all, below
    1.0 when there are two or more) replaced by values drawn from ``sentinels`` (e.g.
    cross-entropy's ``ignore_index=-100``)."""
    if high < 1:
        raise InvalidArgument(f"high={high!r} must be >= 1")
    if not 0.0 <= sentinel_fraction <= 1.0:
        raise InvalidArgument(f"sentinel_fraction={sentinel_fraction!r} must be in [0, 1]")
    if sentinel_fraction and not tuple(sentinels):
        raise InvalidArgument(f"sentinel_fraction={sentinel_fraction!r} needs sentinels")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    index = torch.randint(0, int(high), tuple(shape), generator=generator, dtype=torch.int64, device="cpu")
    if sentinel_fraction:
        # Drawn after the indices: the valid positions keep the values they have without sentinels.
        chosen = torch.rand(tuple(shape), generator=generator, dtype=torch.float32) < sentinel_fraction
        if sentinel_fraction >= 1.0:
            chosen = torch.ones_like(chosen)
        elif chosen.numel() >= 2:
            # A fraction strictly between 0 and 1 means some, not all: at least one of each (a
            # small target tensor would otherwise often hold none, and ignore_index never show).
            flat = chosen.view(-1)
            flat[0] = flat[0] or not bool(flat.any())
            flat[-1] = flat[-1] and not bool(flat.all())
        which = torch.randint(0, len(sentinels), tuple(shape), generator=generator, dtype=torch.int64)
        index = torch.where(chosen, torch.tensor(tuple(sentinels), dtype=torch.int64)[which], index)
    return index.to(device)


GRAD_OUTPUT_KINDS = ("random", "zeros", "scaled", "per_row", "noncontiguous", "expanded", "constant")


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
    strided layout), ``expanded`` (a stride-0 constant, as ``y.sum().backward()`` produces) and
    ``constant`` (one value from the seed, of magnitude 0.5 to a few, everywhere, contiguous:
    terms that never cancel, so an accumulator's rounding adds up instead of averaging out).
    """
    if kind not in GRAD_OUTPUT_KINDS:
        raise InvalidArgument(f"kind={kind!r} must be one of {GRAD_OUTPUT_KINDS}")
    shape = tuple(int(s) for s in shape)
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype, device=device)
    if kind == "expanded":
        return torch.full((), scale, dtype=dtype, device=device).expand(shape)
    if kind == "constant":
        drawn = float(tensor_from_seed((1,), torch.float64, seed=seed)[0])
        return torch.full(shape, math.copysign(0.5 + abs(drawn), drawn) * scale, dtype=dtype, device=device)
    values = tensor_from_seed(shape, torch.float64, seed=seed, scale=scale)
    if kind == "per_row" and values.ndim >= 1 and shape[0] > 0:
        generator = torch.Generator(device="cpu").manual_seed(int(seed) + 1)
        exponents = torch.randint(-2, 3, (shape[0],), generator=generator, dtype=torch.int64, device="cpu").to(torch.float64)
        values = values * (10.0**exponents).reshape((-1,) + (1,) * (values.ndim - 1))
    values = values.to(dtype=dtype, device=device)
    if kind == "noncontiguous" and values.ndim >= 1:
        if values.ndim >= 2:
            return values.transpose(-1, -2).contiguous().transpose(-1, -2)
        wide = torch.zeros((shape[0] * 2,), dtype=dtype, device=device)
        wide[::2] = values
        return wide[::2]
    return values


def _check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list, torch.Size)) or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape
    ):
        raise InvalidArgument(f"shape={shape!r} must be a tuple of ints >= 0")
    return tuple(shape)


def _check_kinds(kinds: Sequence[str], allowed: tuple[str, ...], what: str = "kinds") -> tuple[str, ...]:
    given = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in given if k not in allowed]
    if bad or not given:
        raise InvalidArgument(f"{what}={list(given)!r}: {bad or 'empty'}; choose from {allowed}")
    return given


def mask_densities() -> st.SearchStrategy[float]:
    """Keep-probabilities for ``random`` / ``masked_rows`` masks: 0.7, 0.3, 0.9 and a sparse 0.05.

    Shrinks towards 0.7. Example: ``mask_densities().example() -> 0.05``.
    """
    return sampled((0.7, 0.3, 0.9, 0.05))


@st.composite
def _masks(draw: st.DrawFn, shape: tuple[int, ...], kinds: tuple[str, ...], device: str) -> torch.Tensor:
    kind = draw(sampled(kinds), label="mask kind")
    seed = draw(value_seeds(), label="mask seed")
    density = draw(mask_densities(), label="mask density") if kind in ("random", "masked_rows") else 0.7
    return mask_from_seed(shape, seed=seed, kind=kind, density=density, device=device)


def masks(
    shape: tuple[int, ...], *, kinds: Sequence[str] = MASK_KINDS, device: str = "cpu"
) -> st.SearchStrategy[torch.Tensor]:
    """Boolean masks (``True`` = keep) of ``shape``.

    shape: the mask's shape, e.g. ``(heads, q, k)``.
    kinds: any of ``random`` (random density, see :func:`mask_densities`), ``all_true``,
    ``causal`` (lower-triangular over the last two dims, aligned to the bottom-right when
    ``q != k``), ``padding`` (per-row kept prefix lengths, at least 1), ``masked_rows`` (random
    with the first row of every last-two-dims block fully masked), ``left_padding`` (per-row kept
    suffix lengths, at least 1, the first row padded when it can be).
    device: where the mask is put (built on the CPU from a seed).
    Shrinks towards the first kind with seed 0 and density 0.7.
    Example: ``masks((2, 4, 5), kinds=("causal", "padding")).example()``.
    """
    return _masks(_check_shape(shape), _check_kinds(kinds, MASK_KINDS), device)


def additive_mask_from_seed(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    seed: int,
    kind: str = "random",
    density: float = 0.7,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """The additive form of :func:`mask_from_seed`: 0 where kept, ``-inf`` where masked."""
    if not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point dtype")
    keep = mask_from_seed(shape, seed=seed, kind=kind, density=density)
    zeros = torch.zeros(keep.shape, dtype=dtype, device="cpu")
    return zeros.masked_fill(~keep, float("-inf")).to(device)


@st.composite
def _additive_masks(
    draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype, kinds: tuple[str, ...], device: str
) -> torch.Tensor:
    kind = draw(sampled(kinds), label="mask kind")
    seed = draw(value_seeds(), label="mask seed")
    density = draw(mask_densities(), label="mask density") if kind in ("random", "masked_rows") else 0.7
    return additive_mask_from_seed(shape, dtype, seed=seed, kind=kind, density=density, device=device)


def additive_masks(
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    kinds: Sequence[str] = MASK_KINDS,
    device: str = "cpu",
) -> st.SearchStrategy[torch.Tensor]:
    """Additive float masks (0 = keep, ``-inf`` = masked) of ``shape``, as attention biases use.

    shape: the mask's shape.
    dtype: a floating-point dtype.
    kinds: the boolean mask kinds they are made from (see :func:`masks`); ``masked_rows`` gives
    rows that are all ``-inf`` (softmax of such a row is NaN unless the kernel guards it).
    device: where the mask is put.
    Shrinks towards the first kind with seed 0. Example: ``additive_masks((4, 4), kinds=("causal",)).example()``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point torch.dtype")
    return _additive_masks(_check_shape(shape), dtype, _check_kinds(kinds, MASK_KINDS), device)


@st.composite
def _grad_outputs(
    draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype, kinds: tuple[str, ...], device: str
) -> torch.Tensor:
    kind = draw(sampled(kinds), label="grad_output kind")
    seed = draw(value_seeds(), label="grad_output seed")
    scale = draw(magnitudes(dtype=dtype), label="grad_output scale") if kind == "scaled" else 1.0
    return grad_output_from_seed(shape, dtype, seed=seed, kind=kind, scale=scale, device=device)


def grad_outputs(
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    kinds: Sequence[str] = GRAD_OUTPUT_KINDS,
    device: str = "cpu",
) -> st.SearchStrategy[torch.Tensor]:
    """grad_outputs for an output of ``shape``.

    shape: the output's shape.
    dtype: the output's floating-point dtype.
    kinds: any of ``random``, ``zeros``, ``scaled`` (random times a drawn magnitude), ``per_row``
    (each leading row scaled by a different power of ten), ``noncontiguous`` (transposed or
    strided storage) and ``expanded`` (stride-0, what ``y.sum().backward()`` passes).
    device: where the tensor is put.
    Shrinks towards the first kind with seed 0.
    Example: ``grad_outputs((3, 4), kinds=("expanded",)).example().stride() -> (0, 0)``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point torch.dtype")
    return _grad_outputs(_check_shape(shape), dtype, _check_kinds(kinds, GRAD_OUTPUT_KINDS), device)


@st.composite
def _tensors(
    draw: st.DrawFn,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    domain: Domain,
    extreme: bool,
    patterns: tuple[str, ...],
    constant_rows: bool,
    device: str,
) -> torch.Tensor:
    seed = draw(value_seeds(), label="seed")
    scale = draw(magnitudes(dtype=dtype, extreme=extreme), label="scale") if domain in ("real", "positive", "nonzero") else 1.0
    pattern = draw(sampled(patterns), label="pattern")
    constant = constant_rows and draw(st.booleans(), label="constant rows")
    return tensor_from_seed(shape, dtype, seed=seed, domain=domain, scale=scale, device=device, constant_rows=constant, pattern=pattern)


def tensors(
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    domain: Domain = "real",
    extreme: bool = False,
    patterns: Sequence[str] = ("random",),
    constant_rows: bool = False,
    device: str = "cpu",
) -> st.SearchStrategy[torch.Tensor]:
    """Floating-point tensors of ``shape`` with values in ``domain``, rebuilt from a drawn seed.

    shape: the tensor's shape.
    dtype: a floating-point dtype.
    domain: ``real``, ``positive``, ``nonzero``, ``unit`` or a ``(low, high)`` interval.
    extreme: draw scales up to the dtype's range (see :func:`magnitudes`); bounded domains ignore it.
    patterns: value patterns to draw from :data:`VALUE_PATTERNS` (``near_zero`` only with ``real``).
    constant_rows: sometimes make each last-dim row constant (ties, zero variance).
    device: where the tensor is put (values are generated on the CPU, so identical everywhere).
    Shrinks towards seed 0, scale 1, the first pattern, non-constant rows.
    Example: ``tensors((2, 3), torch.float16, extreme=True).example()``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgument(f"dtype={dtype!r} must be a floating-point torch.dtype")
    _check_domain(domain)
    patterns_ = _check_kinds(patterns, VALUE_PATTERNS, "patterns")
    if "near_zero" in patterns_ and domain != "real":
        raise InvalidArgument(f"patterns={list(patterns_)!r}: 'near_zero' needs domain='real', got domain={domain!r}")
    return _tensors(_check_shape(shape), dtype, domain, bool(extreme), patterns_, bool(constant_rows), device)
