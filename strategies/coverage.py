"""The deterministic coverage phase: corners of a spec's input space, in as few calls as possible.

Random draws leave corners to luck: with 5-10 examples per test, whether a flag meets a size
relation, or a size crosses a block boundary, is chance. Before its random examples, every contract
test runs one example per :class:`Corner` (the runner's coverage phase). A corner forces part of
the case; the rest is drawn at its simplest (Hypothesis' first example is its minimal one), so the
same spec always gives the same corners, and a failing corner shrinks like any example.

What the corners cover (:func:`coverage_corners`):

* sizes, one dim at a time: its smallest legal size, 0 where the spec allows it, ``block - 1``,
  ``block``, ``block + 1`` and ``2 * block + 1`` for each block the dim declares, and the largest of
  129, 65, 33, 17 (past a tail of every common kernel block 16, 32, 64, 128, and past two full blocks
  of 64) that fits the element budget with the other dims at their smallest; likewise each
  ``*batch`` group as one dim of that many rows (kernels flatten the batch into rows and tile them),
  every differentiable input requiring grad there; where the contract draws ``constant``
  grad_outputs, each dim a gradient is likely summed along (:func:`summed_dims`) at that big size
  too, in the lowest half precision dtype with constant grad_outputs (a running sum kept in half
  precision is off by many steps there);
* pairwise, as covering arrays do: every value of each Scalar whose strategy is finite (booleans,
  ``sampled_from``, a small integer range, or a ``from_case`` one, by index), the rank of each
  ``*batch`` group, whether an Index input holds its sentinel (``ignore_index``), and each relation
  (<, =, >) between two dims that stand in the same place of two inputs (q_len and k_len);
* every dtype and every value of the categorical draws the contract varies beyond the spec
  (:func:`strategies.cases.case_kinds`: the requires_grad classes all, each input alone and none;
  broadcast off and on; each mask kind, input layout, value pattern and grad_output kind; a
  big-size or many-rows corner keeps the first value pattern, the other corners take the others
  in turn): with
  ``pairwise_kinds``, pairwise with each other and with the factors above; otherwise one per corner
  in turn. Pairwise, they multiply the corners (over the reference ops at 10 examples: 1.3x for
  most contracts, 3.6x for layouts, 5.4x for the two memory contracts that vary all of them), so
  the runner takes pairs only where they fit in the test's example count (a thorough profile).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.spec import Spec
from conformance.spec.dims import DimBounds, DimRule, dim_bounds
from conformance.spec.inputs import Index, Scalar, Shaped

__all__ = ["BIG_SIZES", "BROADCAST_LABEL", "GRAD_KIND_LABEL", "REQUIRES_GRAD_LABEL", "Corner", "coverage_corners", "describe_coverage", "finite_values", "layout_label", "mask_kind_label", "pairwise_rows", "pattern_label", "scale_label", "smaller_corners", "smaller_sizes", "summed_dims"]

# Past a tail of every common kernel block (16, 32, 64, 128): 129 = 2 * 64 + 1 = 8 * 16 + 1.
BIG_SIZES = (129, 65, 33, 17)
NEUTRAL_SIZE = 3  # a dim no corner sets: odd, above 1, below every block
FROM_CASE_VARIANTS = 4  # a from_case Scalar's values are known per case only: indices 0..3 of them
RELATIONS = ("<", "=", ">")
# Labels of the draws a contract's case kinds make (strategies.cases.case_kinds).
BROADCAST_LABEL = "broadcast"
REQUIRES_GRAD_LABEL = "requires_grad"
GRAD_KIND_LABEL = "grad_output kind"


def layout_label(name: str) -> str:
    return f"{name} layout"


def mask_kind_label(name: str) -> str:
    return f"{name} mask kind"


PATTERN_SUFFIX = " pattern"


def pattern_label(name: str) -> str:
    return f"{name}{PATTERN_SUFFIX}"


def scale_label(name: str) -> str:
    return f"{name} scale"


MAX_RELATIONS = 2


@dataclass(frozen=True)
class Corner:
    """Part of a case, forced: dim sizes, ``*batch`` ranks, the dtype (an index into the test's
    dtypes) and choices by label (an index into a finite strategy's values)."""

    sizes: tuple[tuple[str, int], ...] = ()
    batch_ranks: tuple[tuple[str, int], ...] = ()
    dtype_index: int = 0
    choices: tuple[tuple[str, int], ...] = ()
    batch_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a *batch group's whole shape, forced

    def size(self, name: str) -> int | None:
        return dict(self.sizes).get(name)

    def batch_rank(self, name: str) -> int | None:
        return dict(self.batch_ranks).get(name)

    def batch_shape(self, name: str) -> tuple[int, ...] | None:
        return dict(self.batch_shapes).get(name)

    def choice(self, label: str) -> int | None:
        return dict(self.choices).get(label)

    def describe(self) -> str:
        parts = [f"{n}={s}" for n, s in self.sizes] + [f"*{n}: rank {r}" for n, r in self.batch_ranks]
        parts += [f"*{n}: {shape}" for n, shape in self.batch_shapes]
        parts += [f"{label}: value {i + 1}" for label, i in self.choices]
        return ", ".join(parts) or "smallest case"


def finite_values(strategy: Any) -> tuple[Any, ...] | None:
    """The values of a strategy that has few (booleans, ``sampled_from``, ``just``, an integer range
    of at most 16), in the order it shrinks towards; None for any other."""
    inner = getattr(strategy, "wrapped_strategy", strategy)  # st.* functions return lazy wrappers
    kind = type(inner).__name__
    if kind == "BooleansStrategy":
        return (False, True)
    if kind == "JustStrategy":
        return (inner.value,)
    if kind == "SampledFromStrategy" and not getattr(inner, "_transformations", ()):
        return tuple(inner.elements)
    if kind == "IntegersStrategy" and inner.start is not None and inner.end is not None and inner.end - inner.start < 16:
        return tuple(range(inner.start, inner.end + 1))
    return None


def pairwise_rows(levels: Sequence[int], fixed: Sequence[Mapping[int, int]] = ()) -> list[tuple[int, ...]]:
    """Rows of level indices in which every pair of levels of every two factors appears (a greedy
    covering array, deterministic): near ``max(levels)**2`` rows, not their product. ``fixed``
    rows come first with some factors already set; their other factors are chosen to cover what
    is still uncovered, then new rows cover the rest. A factor fixed at -1 covers no pair in that
    row (a size corner's relations: with the other dims at 1, q_len < k_len says little)."""
    count = len(levels)
    uncovered = {(i, a, j, b) for i, j in itertools.combinations(range(count), 2) for a in range(levels[i]) for b in range(levels[j])}
    rows: list[tuple[int, ...]] = []
    seeds: list[dict[int, int]] = [dict(row) for row in fixed]
    while len(rows) < len(seeds) or uncovered or not rows:
        if len(rows) < len(seeds):
            start = seeds[len(rows)]
        elif uncovered:
            i, a, j, b = min(uncovered)
            start = {i: a, j: b}
        else:
            start = {}
        row: list[int | None] = [start.get(k) for k in range(count)]
        for k in range(count):
            if row[k] is None:
                gains = [(_gain(uncovered, row, k, level), -level) for level in range(levels[k])]
                row[k] = gains.index(max(gains))
        done = tuple(level or 0 for level in row)
        rows.append(tuple(max(level, 0) for level in done))
        uncovered -= {(p, done[p], q, done[q]) for p, q in itertools.combinations(range(count), 2)}
    if count == 1:
        rows += [(level,) for level in range(levels[0]) if (level,) not in rows]
    return rows


def _gain(uncovered: set[tuple[int, int, int, int]], row: Sequence[int | None], k: int, level: int) -> int:
    """How many uncovered pairs setting factor ``k`` to ``level`` covers, given the row so far."""
    gain = 0
    for m, other in enumerate(row):
        if other is not None and m != k:
            gain += ((k, level, m, other) if k < m else (m, other, k, level)) in uncovered
    return gain


@dataclass(frozen=True)
class _Factor:
    """One categorical factor of the pairwise array: where its level goes in a corner."""

    kind: str  # "choice", "batch" or "relation"
    key: Any
    levels: int


def _factors(spec: Spec, max_batch_dims: int) -> list[_Factor]:
    factors: list[_Factor] = []
    for spec_input in spec.inputs:
        if isinstance(spec_input, Scalar):
            if spec_input.from_case is not None:
                factors.append(_Factor("choice", spec_input.name, FROM_CASE_VARIANTS))
            elif isinstance(spec_input.value, st.SearchStrategy):
                values = finite_values(spec_input.value)
                if values is not None and len(values) > 1:
                    factors.append(_Factor("choice", spec_input.name, len(values)))
        elif isinstance(spec_input, Index) and spec_input.sentinels:
            factors.append(_Factor("choice", f"{spec_input.name} sentinel fraction", 2))
    factors += [_Factor("batch", name, max_batch_dims + 1) for name in spec.batch_names if max_batch_dims > 0]
    factors += [_Factor("relation", pair, len(RELATIONS)) for pair in _aligned_pairs(spec)[:MAX_RELATIONS]]
    return factors


def _aligned_pairs(spec: Spec) -> list[tuple[str, str]]:
    """Pairs of different dims in the same place (counted from the end) of two inputs: the sizes
    whose order a kernel may get wrong (q_len vs k_len in attention)."""
    shaped = [i.parsed.dims for i in spec.inputs if isinstance(i, Shaped)]
    pairs: list[tuple[str, str]] = []
    for first, second in itertools.combinations(shaped, 2):
        for a, b in zip(reversed(first), reversed(second)):
            if isinstance(a, str) and isinstance(b, str) and a != b and (a, b) not in pairs and (b, a) not in pairs:
                pairs.append((a, b))
    return pairs


def _size_corners(name: str, bound: DimBounds, rule: DimRule, fits: Any) -> tuple[list[int], list[int]]:
    """(small, big) sizes of one dim worth a corner of their own, legal and within the budget."""
    small = [bound.fit(bound.low)] + ([0] if bound.low == 0 else [])
    big = [s for b in rule.block_sizes or () for s in (b - 1, b, b + 1, 2 * b + 1)]
    big += [next((s for s in BIG_SIZES if fits(name, s)), 0)]
    legal = [bound.fit(s) for s in big if s > 0]
    return list(dict.fromkeys(small)), [s for s in dict.fromkeys(legal) if s not in small and fits(name, s)]


def coverage_corners(
    spec: Spec, *, dtypes: Sequence[torch.dtype], max_elements: int, max_batch_dims: int, kinds: Sequence[tuple[str, int]] = (),
    pairwise_kinds: bool = False, constant_grad_kind: int | None = None,
) -> tuple[Corner, ...]:
    """The corners of ``spec`` (see the module's docstring), deterministic: the same spec, dtypes,
    budget and case kinds always give the same corners, in the same order. ``kinds``: (label,
    number of values) of each categorical draw the contract varies beyond the spec
    (:func:`strategies.cases.case_kinds`): each value in turn, as dtypes are, or with
    ``pairwise_kinds`` the kinds and the dtype as factors of the pairwise array.
    ``constant_grad_kind``: the index of the ``constant`` grad_output kind where the contract draws
    it: then each summed dim takes a corner of many steps in the lowest half precision too."""
    return _corners(spec, tuple(dtypes), max_elements, max_batch_dims, tuple(kinds), pairwise_kinds, constant_grad_kind)


def summed_dims(spec: Spec) -> tuple[str, ...]:
    """Named dims a gradient is likely summed along: each one that some differentiable input lacks
    and another input has (a bias's gradient summed over time, a key's over the queries)."""
    shaped = [i for i in spec.inputs if isinstance(i, Shaped)]
    named = [{d for d in i.parsed.dims if isinstance(d, str)} for i in shaped]
    differentiable = {i.name for i in spec.differentiable_inputs}
    summed = set().union(*(
        set().union(*named) - own for spec_input, own in zip(shaped, named) if spec_input.name in differentiable
    )) if named else set()
    return tuple(name for name in spec.dim_names if name in summed)


def _size_rows(
    names: tuple[str, ...], bounds: Mapping[str, DimBounds], rules: Mapping[str, DimRule], fits: Any,
) -> tuple[list[dict[str, int]], set[int]]:
    """The size corners' forced sizes: small sizes of different dims together, then one big dim per
    corner, the others at their smallest (a dim bounding it at least as big); and which are big."""
    size_rows: list[dict[str, int]] = []
    big_count = 0
    small_items: list[tuple[str, int]] = []
    for name in names:
        small, big = _size_corners(name, bounds[name], rules.get(name, DimRule()), fits)
        size_rows += [_with_bounding_dims({name: s}, rules) for s in big]
        big_count += len(big)
        small_items += [(name, s) for s in small]
    while small_items:  # small sizes of different dims share a corner
        row: dict[str, int] = {}
        for item in list(small_items):
            if item[0] not in row:
                row[item[0]] = item[1]
                small_items.remove(item)
        size_rows.insert(0, row)
    return size_rows, set(range(len(size_rows) - big_count, len(size_rows)))


def _many_steps_rows(spec: Spec, bounds: Mapping[str, DimBounds], rules: Mapping[str, DimRule], fits: Any) -> list[dict[str, int]]:
    """Forced sizes of each summed dim at the largest of :data:`BIG_SIZES` that fits."""
    rows = []
    for name in summed_dims(spec):
        many = next((s for s in BIG_SIZES if fits(name, s)), 0)
        if many and bounds[name].fit(many) == many:
            rows.append(_with_bounding_dims({name: many}, rules))
    return rows


def _lowest_half(dtypes: Sequence[torch.dtype]) -> int | None:
    """The index of the 16-bit floating dtype with the largest rounding step, None if none."""
    halves = [(torch.finfo(d).eps, i) for i, d in enumerate(dtypes) if d.is_floating_point and torch.finfo(d).bits == 16]
    return max(halves)[1] if halves else None


@functools.lru_cache(maxsize=1024)  # asked by every test; a Function's tests that draw alike get the same
def _corners(
    spec: Spec, dtypes: tuple[torch.dtype, ...], max_elements: int, max_batch_dims: int, kinds: tuple[tuple[str, int], ...],
    pairwise_kinds: bool, constant_grad_kind: int | None,
) -> tuple[Corner, ...]:
    rules: Mapping[str, DimRule] = dict(getattr(spec, "dim_rules", {}))
    names = spec.dim_names
    bounds = dim_bounds(names, rules)
    shaped = [i for i in spec.inputs if isinstance(i, Shaped)]
    smallest = {n: max(b.fit(b.low), b.fit(1)) for n, b in bounds.items()}  # a 0 would make any size fit

    no_batch: dict[str, tuple[int, ...]] = {b: () for b in spec.batch_names}

    def within_budget(sizes: Mapping[str, int], batches: Mapping[str, tuple[int, ...]]) -> bool:
        return all(math.prod(i.parsed.concrete(sizes, batches)) <= max_elements for i in shaped)

    def fits(name: str, size: int) -> bool:
        return within_budget({**smallest, **_with_bounding_dims({name: size}, rules)}, no_batch)

    def batch_fits(name: str, rows: int) -> bool:
        return within_budget(smallest, {**no_batch, name: (rows,)})

    def ranks_fit(sizes: Mapping[str, int], ranks: Mapping[str, int]) -> bool:
        return within_budget(sizes, {**no_batch, **{name: (2,) * rank for name, rank in ranks.items()}})

    size_rows, big_rows = _size_rows(names, bounds, rules, fits)
    # One corner per *batch group with many rows (rank 1, the largest of BIG_SIZES in the budget):
    # kernels flatten the batch into rows and tile those (a Python loop over blocks of rows), and
    # rank corners alone (sides of 2) never pass a block of 4 rows.
    big_batches: dict[int, tuple[str, tuple[int, ...]]] = {}
    for name in spec.batch_names if max_batch_dims > 0 else ():
        many = next((s for s in BIG_SIZES if batch_fits(name, s)), 0)
        if many:
            big_batches[len(size_rows)] = (name, (many,))
            size_rows.append({})
    # One corner per summed dim at its big size, in the lowest half precision, with constant
    # grad_outputs (terms that never cancel) and every gradient asked: a running sum along that
    # dim kept in half precision is off by many steps there. Not the big size corner above: a
    # constant grad_output would hide a gradient read from the wrong place of the last block.
    half = _lowest_half(dtypes) if constant_grad_kind is not None else None
    steps = _many_steps_rows(spec, bounds, rules, fits) if half is not None else []
    many_steps = set(range(len(size_rows), len(size_rows) + len(steps)))
    size_rows += steps
    # Sums of many terms (many rows, many steps) meet grad_outputs that never cancel and the first
    # value pattern (``ascending``: magnitudes, one sign, so g * x never cancels either), in the
    # lowest half precision where the contract draws constant grad_outputs.
    every_gradient = big_batches.keys() | many_steps
    big_rows |= every_gradient
    factors = _factors(spec, max_batch_dims)
    if pairwise_kinds:
        factors += [_Factor("dtype", None, max(len(dtypes), 1))] + [_Factor("kind", label, count) for label, count in kinds]
    sized = [_sizes(names, bounds, rules, {}, forced, smallest=True) for forced in size_rows]
    # A size corner's other dims sit at their smallest: its relations count for nothing, its other
    # factors cover pairs as any row's do.
    def kind_level(label: str, index: int, levels: int) -> int:
        # Many rows reach the block loops of a row-tiled kernel: every gradient is computed there
        # (requires_grad class 0: every input); the other corners take the subsets in turn. There
        # a sum over the rows meets grad_outputs whose terms never cancel (``constant``, else the
        # last kind), where an accumulator in half precision is off by many steps.
        if label == GRAD_KIND_LABEL and index in every_gradient:
            return levels - 1 if constant_grad_kind is None else constant_grad_kind
        if label.endswith(PATTERN_SUFFIX) and levels > 1:
            # A big size keeps the first value pattern (``ascending``: a row's maximum in its last
            # block); the other corners take the others in turn (``repeats``: ties on purpose).
            if index in big_rows:
                return 0
            return 1 + (index - sum(1 for i in big_rows if i < index)) % (levels - 1)
        if label != REQUIRES_GRAD_LABEL:
            return index % levels
        return 0 if index in every_gradient else (index - sum(1 for i in every_gradient if i < index)) % levels

    def dtype_level(index: int, levels: int) -> int:
        return half if half is not None and index in every_gradient else index % levels

    fixed = [
        # Size corners spread the dtypes and case kinds in turn, as without pairs; the pairs they
        # leave uncovered take rows of their own.
        {
            k: -1 if f.kind == "relation" else kind_level(str(f.key), index, f.levels) if f.kind == "kind" else dtype_level(index, f.levels)
            for k, f in enumerate(factors) if f.kind in ("relation", "dtype", "kind")
        }
        for index in range(len(sized))
    ]
    rows = pairwise_rows([f.levels for f in factors], fixed)
    if not pairwise_kinds:
        turns = max([len(dtypes), *(levels + (len(every_gradient) if label == REQUIRES_GRAD_LABEL else 0) for label, levels in kinds)])
        rows += [rows[i % len(rows)] for i in range(len(rows), turns)]  # every dtype and case kind value at least once
    corners = []
    for index, levels in enumerate(rows):
        relations = {f.key: RELATIONS[level] for f, level in zip(factors, levels) if f.kind == "relation"}
        sizes = sized[index] if index < len(sized) else _sizes(names, bounds, rules, relations, {}, smallest=False)
        dtype_index = next((level for f, level in zip(factors, levels) if f.kind == "dtype"), dtype_level(index, max(len(dtypes), 1)))
        kind_levels = (
            tuple((f.key, level) for f, level in zip(factors, levels) if f.kind == "kind") if pairwise_kinds
            else tuple((label, kind_level(label, index, count)) for label, count in kinds)
        )
        big_batch = big_batches.get(index)
        ranks = {
            str(f.key): level for f, level in zip(factors, levels) if f.kind == "batch" and (big_batch is None or f.key != big_batch[0])
        }
        if index < len(sized):  # a size corner keeps its sizes: its batch ranks give way to the budget
            ranks = _ranks_within(ranks, sizes, ranks_fit)
        corners.append(Corner(
            sizes=tuple(sizes.items()),
            batch_ranks=tuple(ranks.items()),
            batch_shapes=(big_batch,) if big_batch is not None else (),
            dtype_index=dtype_index,
            choices=tuple((f.key, level) for f, level in zip(factors, levels) if f.kind == "choice") + kind_levels,
        ))
    return tuple(dict.fromkeys(_with_unit_batch_dims(corners)))


def _with_unit_batch_dims(corners: list[Corner]) -> list[Corner]:
    """The first corner of a ``*batch`` group's rank 2 or more, and every second one after it, takes
    the shape (2, ..., 2, 1): a size-1 dim next to the core dims, where ``squeeze()`` or a reduction
    without ``keepdim`` drops the wrong dim (sides of 2 never show it); the others keep sides of 2."""
    seen: Counter[str] = Counter()
    out = []
    for corner in corners:
        for name, rank in corner.batch_ranks:
            if rank < 2:
                continue
            seen[name] += 1
            if seen[name] % 2 == 1:
                corner = dataclasses.replace(
                    corner,
                    batch_ranks=tuple(entry for entry in corner.batch_ranks if entry[0] != name),
                    batch_shapes=(*corner.batch_shapes, (name, (2,) * (rank - 1) + (1,))),
                )
        out.append(corner)
    return out


def smaller_sizes(spec: Spec, sizes: Sequence[tuple[str, int]]) -> list[tuple[tuple[str, int], ...]]:
    """Legal size combinations below a corner's ``sizes``, one dim made smaller at a time, smallest
    first: what the runner tries after a failure at a corner, whose forced sizes Hypothesis cannot
    shrink. Each dim steps down to its smallest nonzero size, the common block tails 17, 33, 65
    and 129, and its declared blocks' ``b-1, b, b+1, 2b+1`` (zero sizes are corners of their own)."""
    rules: Mapping[str, DimRule] = dict(getattr(spec, "dim_rules", {}))
    names = spec.dim_names
    bounds = dim_bounds(names, rules)
    current = dict(sizes)
    found: set[tuple[tuple[str, int], ...]] = set()
    for name in names:
        blocks = rules.get(name, DimRule()).block_sizes or ()
        ladder = {max(bounds[name].low, 1), *BIG_SIZES, *(s for b in blocks for s in (b - 1, b, b + 1, 2 * b + 1))}
        for size in ladder:
            if not 0 < size < current[name]:
                continue
            candidate = _sizes(names, bounds, rules, {}, {**current, name: size}, smallest=True)
            if candidate != current and all(candidate[n] <= current[n] and (candidate[n] or not current[n]) for n in names):
                found.add(tuple(candidate.items()))
    return sorted(found, key=lambda candidate: (sum(s for _, s in candidate), candidate))


def smaller_corners(spec: Spec, corner: Corner) -> list[Corner]:
    """What the runner tries after a failure at ``corner``: its sizes one dim smaller at a time
    (:func:`smaller_sizes`), then each forced ``*batch`` shape at fewer rows (2, 17, 33, 65 below
    its count), smallest first."""
    found = [dataclasses.replace(corner, sizes=sizes) for sizes in smaller_sizes(spec, corner.sizes)]
    for name, shape in corner.batch_shapes:
        rows = math.prod(shape)
        others = tuple(entry for entry in corner.batch_shapes if entry[0] != name)
        found += [
            dataclasses.replace(corner, batch_shapes=(*others, (name, (fewer,))))
            for fewer in sorted({2, *BIG_SIZES}) if fewer < rows
        ]
    return found


def describe_coverage(spec: Spec, corners: Sequence[Corner], dtypes: Sequence[torch.dtype]) -> str:
    """One line on what ``corners`` cover: "5 corners: sizes up to 129 (n, d); causal: 2/2 values;
    m vs n: <, =, >; dtypes 3/3"."""
    parts = []
    largest = {name: max(dict(c.sizes)[name] for c in corners) for name in spec.dim_names} if corners else {}
    if largest:
        top = max(largest.values())
        parts.append(f"sizes up to {top} ({', '.join(n for n, s in largest.items() if s == top)})")
    factors = _factors(spec, max_batch_dims=2)
    for factor in factors:
        if factor.kind == "choice":
            seen = {c.choice(factor.key) for c in corners}
            parts.append(f"{factor.key}: {len(seen)}/{factor.levels} values")
        elif factor.kind == "batch":
            shapes = [shape for c in corners if (shape := c.batch_shape(factor.key)) is not None]
            ranks = sorted({r for c in corners if (r := c.batch_rank(factor.key)) is not None} | {len(s) for s in shapes if len(s) > 1})
            unit = sorted({s for s in shapes if len(s) > 1})
            many = max((s[0] for s in shapes if len(s) == 1), default=0)
            parts.append(
                f"*{factor.key} ranks {', '.join(map(str, ranks))}" + "".join(f", {s}" for s in unit) + (f", {many} rows" if many else "")
            )
        elif factor.kind == "relation":
            a, b = factor.key
            orders = [r for r in RELATIONS if any(_relation(dict(c.sizes), (a, b)) == RELATIONS.index(r) for c in corners)]
            parts.append(f"{a} vs {b}: {', '.join(orders)}")
    parts.append(f"dtypes {len({c.dtype_index for c in corners})}/{len(dtypes)}")
    return f"{len(corners)} corners: " + "; ".join(parts)


def _ranks_within(
    ranks: dict[str, int], sizes: Mapping[str, int], fits: Callable[[Mapping[str, int], Mapping[str, int]], bool]
) -> dict[str, int]:
    """``ranks`` with the largest lowered by one at a time until ``fits(sizes, ranks)`` (a corner of
    ``sizes`` with these batch ranks within the element budget): a declared block's b+1 corner
    (257 for a block of 256) paired with a batch row would otherwise be halved to fit, and never drawn."""
    ranks = dict(ranks)
    while not fits(sizes, ranks) and any(ranks.values()):
        largest = max(ranks, key=lambda name: ranks[name])
        ranks[largest] -= 1
    return ranks


def _relation(sizes: Mapping[str, int], pair: tuple[str, str]) -> int:
    a, b = sizes[pair[0]], sizes[pair[1]]
    return RELATIONS.index("<" if a < b else "=" if a == b else ">")


def _with_bounding_dims(forced: Mapping[str, int], rules: Mapping[str, DimRule]) -> dict[str, int]:
    """``forced`` with each dim that bounds a forced one (``at_most``, ``k <= n``) at least as big,
    through chains: a size corner of ``k`` left at ``n``'s smallest size would be cut back to it."""
    wanted = dict(forced)
    for _ in range(len(rules)):
        raised = {
            bound: size for name, size in wanted.items()
            if (bound := rules.get(name, DimRule()).at_most) is not None and wanted.get(bound, 0) < size
        }
        if not raised:
            break
        wanted.update(raised)
    return wanted


def _sizes(
    names: tuple[str, ...], bounds: Mapping[str, DimBounds], rules: Mapping[str, DimRule],
    relations: Mapping[tuple[str, str], str], forced: Mapping[str, int], *, smallest: bool,
) -> dict[str, int]:
    """Every dim's size in one corner: forced ones as given; the others at their smallest (next
    to a forced size: the budget) or at 3, or 2 and 3 in the order a relation asks for."""
    wanted = dict(forced)
    for (a, b), relation in relations.items():
        low, high = NEUTRAL_SIZE - 1, NEUTRAL_SIZE
        for dim, size in zip((a, b), {"<": (low, high), "=": (high, high), ">": (high, low)}[relation]):
            wanted.setdefault(dim, size)
    sizes: dict[str, int] = {}
    for name in bounds:  # each dim after the dim bounding it (at_most)
        rule = rules.get(name, DimRule())
        limit = sizes.get(rule.at_most) if rule.at_most is not None else None
        default = bounds[name].low if smallest else NEUTRAL_SIZE
        sizes[name] = bounds[name].fit(wanted.get(name, default), limit=limit)
    return {name: sizes[name] for name in names}
