"""The dims language: what a spec says about a dim (:class:`Dim`) and the rule it compiles to.

``register(..., dims=[Dim("k", max_size="n")])`` and ``"d:even"`` shape tokens compile to one
:class:`DimRule` per dim (:func:`conformance.spec.validation.compile_dim_rules`); the drawing of
sizes under those rules is ``strategies.dims``. Invalid rules raise Hypothesis'
``InvalidArgument``, as the strategies that take them do.

Rules relate dims (``Dim("f", multiple_of=2, max_size="n")``: ``f <= n``), so one dim's legal
sizes depend on the others': :func:`dim_bounds` works out each dim's hard bounds under all of
them (the smallest legal ``f`` raises ``n``'s minimum; ``n``'s maximum caps ``f``), and raises
:class:`DimConflict` naming the dims and the rules that leave one of them no legal size. Every
size drawn, and every size shrunk to fit a budget, is made legal by :meth:`DimBounds.fit`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis.errors import InvalidArgument

__all__ = ["Dim", "DimBounds", "DimConflict", "DimRule", "check_blocks", "dim_bounds", "round_down", "round_up", "rule_order"]


@dataclass(frozen=True)
class Dim:
    """Rules for one dim, given to ``register(..., dims=[...])``.

    min_size / max_size: hard bounds (``min_size=0`` opts the dim into zero sizes; ``max_size``
    may name another dim: ``Dim("k", max_size="n")`` keeps a top-k within the row);
    multiple_of: sizes are multiples of it (``"d:even"`` in a shape says the same);
    block_sizes: this dim's kernel blocks, whose boundaries (b-1, b, b+1) are drawn.
    """

    name: str
    min_size: int | None = None
    max_size: int | str | None = None
    multiple_of: int = 1
    block_sizes: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        given = [f"{f}={getattr(self, f)!r}" for f, default in _DIM_DEFAULTS if getattr(self, f) != default]
        return f"Dim({', '.join([repr(self.name), *given])})"


_DIM_DEFAULTS = (("min_size", None), ("max_size", None), ("multiple_of", 1), ("block_sizes", None))


def check_blocks(block_sizes: Sequence[int], *, allow_empty: bool) -> list[int]:
    """``block_sizes`` as a list, each an int >= 2 (and at least one unless ``allow_empty``)."""
    blocks = list(block_sizes)
    if (not blocks and not allow_empty) or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in blocks):
        raise InvalidArgument(f"block_sizes={block_sizes!r} must be a {'' if allow_empty else 'non-empty '}list of ints >= 2")
    return blocks


@dataclass(frozen=True)
class DimRule:
    """What one dim must satisfy (``conformance.Dim`` and ``"d:even"`` shape tokens compile to it).

    min_size / max_size: hard bounds (None: the run's); max_size never cuts a block-boundary
    size of its own ``block_sizes``. multiple_of: sizes are multiples of it (drawn sizes are
    rounded up). block_sizes: this dim's block boundaries (None: the run's). at_most: the name
    of another dim this one never exceeds (a top-k ``k <= n``); that dim is then never drawn
    below this one's smallest legal size (:func:`dim_bounds`).
    """

    min_size: int | None = None
    max_size: int | None = None
    multiple_of: int = 1
    block_sizes: tuple[int, ...] | None = None
    at_most: str | None = None

    def __post_init__(self) -> None:
        for name in ("min_size", "max_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"{name}={value!r} must be an int >= 0 or None")
        if self.min_size is not None and self.max_size is not None and self.max_size < self.min_size:
            raise InvalidArgument(f"max_size={self.max_size!r} must be >= min_size={self.min_size!r}")
        if isinstance(self.multiple_of, bool) or not isinstance(self.multiple_of, int) or self.multiple_of < 1:
            raise InvalidArgument(f"multiple_of={self.multiple_of!r} must be an int >= 1")
        if self.block_sizes is not None:
            check_blocks(self.block_sizes, allow_empty=True)
        if self.max_size is not None and self.max_size < self.smallest(1):
            raise InvalidArgument(
                f"max_size={self.max_size!r} leaves no multiple of {self.multiple_of} >= "
                + (f"min_size={self.min_size!r}" if self.min_size is not None else "1")
            )

    def smallest(self, run_min: int) -> int:
        """The smallest legal size under the run's ``min_size``."""
        low = self.min_size if self.min_size is not None else run_min
        return round_up(low, self.multiple_of)


def round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def round_down(size: int, multiple: int) -> int:
    return size - size % multiple


class DimConflict(InvalidArgument):
    """Rules no size assignment meets (a dim left no legal size, or dims bounding each other in
    a cycle); ``dims`` names the dims whose rules conflict (the dim without a size first)."""

    def __init__(self, message: str, dims: tuple[str, ...]) -> None:
        super().__init__(message)
        self.dims = dims


def rule_order(names: tuple[str, ...], rules: Mapping[str, DimRule]) -> tuple[str, ...]:
    """``names`` with every dim after the dim it is bounded by (``at_most``)."""
    ordered: list[str] = []
    path: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in path:
            cycle = path[path.index(name):]
            shown = " <= ".join(repr(d) for d in [*cycle, name])
            raise DimConflict(f"dims {cycle} bound each other in a cycle ({shown}: at_most / max_size='<dim>')", tuple(cycle))
        path.append(name)
        bound = rules[name].at_most if name in rules else None
        if bound is not None:
            if bound not in names:
                raise InvalidArgument(f"dim {name!r} is at most {bound!r}, which is not one of the dims {list(names)}")
            visit(bound)
        path.pop()
        ordered.append(name)

    for name in names:
        visit(name)
    return tuple(ordered)


@dataclass(frozen=True)
class DimBounds:
    """Where one dim's sizes lie under every rule and relation (see :func:`dim_bounds`).

    low / high: hard bounds (high None: none), each a multiple of ``multiple_of``: every multiple
    in between is legal and leaves each dim bounded by this one (``at_most``) a legal size.
    start: the smallest size to draw: the run's ``min_size`` (a preference, unless the dim
    declares its own) raised to ``low`` and to the ``start`` of the dims bounded by this one,
    capped at ``high``.
    """

    low: int
    high: int | None
    start: int
    multiple_of: int = 1

    def top(self, limit: int | None = None) -> int | None:
        """The largest legal size when the ``at_most`` dim has size ``limit``."""
        caps = [c for c in (self.high, limit) if c is not None]
        return round_down(min(caps), self.multiple_of) if caps else None

    def fit(self, size: int, *, limit: int | None = None) -> int:
        """``size`` made legal: rounded up to a multiple, at least ``start``, at most ``high`` and
        ``limit`` (the size drawn for the ``at_most`` dim, itself legal), rounded down to a
        multiple there; ``start`` gives way to the bounds (never below ``low``)."""
        top = self.top(limit)
        floor = self.start if top is None else max(self.low, min(self.start, top))
        size = max(round_up(size, self.multiple_of), floor)
        return size if top is None else min(size, top)


def _own_low(rule: DimRule) -> str:
    parts = [f"min_size={rule.min_size!r}"] if rule.min_size is not None else []
    return ", ".join([*parts, f"multiple_of={rule.multiple_of}"] if rule.multiple_of > 1 else parts)


def dim_bounds(names: tuple[str, ...], rules: Mapping[str, DimRule], *, run_min: int = 1) -> dict[str, DimBounds]:
    """Each dim's :class:`DimBounds` under ``rules`` and the run's ``min_size``.

    A dim bounded by another (``f <= n``) raises that one's minimum to its own (n >= the smallest
    legal f) and takes that one's maximum as its own; a dim left with no legal size raises
    :class:`DimConflict`, naming it and the rules on either side. The run's minimum is a
    preference: a dim without a ``min_size`` of its own may always be 1 (0 where the run allows
    zero sizes), so rules that hold with ``run_min=1`` (what registration checks) hold in every
    run; a larger ``run_min`` (compile's growing sizes) only moves ``start``.
    """
    own = {name: rule for name, rule in rules.items() if name in names}
    return dict(_dim_bounds(tuple(names), tuple(own.items()), run_min))


@functools.lru_cache(maxsize=1024)
def _dim_bounds(names: tuple[str, ...], rule_items: tuple[tuple[str, DimRule], ...], run_min: int) -> dict[str, DimBounds]:
    """:func:`dim_bounds` on hashable arguments, once per arguments (a case draws it every example;
    callers get a copy of the dict: the :class:`DimBounds` are frozen)."""
    rules = dict(rule_items)
    order = rule_order(names, rules)
    rule = {name: rules.get(name, DimRule()) for name in order}
    low: dict[str, int] = {}
    why_low: dict[str, str] = {}
    for name in order:
        r = rule[name]
        low[name] = round_up(r.min_size if r.min_size is not None else min(run_min, 1), r.multiple_of)
        why_low[name] = _own_low(r) or f"sizes start at {low[name]}"
    dependents: dict[str, list[str]] = {name: [] for name in order}
    for name in reversed(order):  # every dim before the dim bounding it: lows flow up the chain
        bound = rule[name].at_most
        if bound is None:
            continue
        dependents[bound].append(name)
        if low[name] > low[bound]:
            low[bound] = round_up(low[name], rule[bound].multiple_of)
            why_low[bound] = f"{name!r} <= {bound!r} and {name!r} >= {low[name]} ({why_low[name]})"
    high: dict[str, int | None] = {}
    why_high: dict[str, str] = {}
    for name in order:  # every dim after the dim bounding it: highs flow down the chain
        r = rule[name]
        caps: list[tuple[int, str]] = [(r.max_size, f"max_size={r.max_size}")] if r.max_size is not None else []
        above = high[r.at_most] if r.at_most is not None else None
        if above is not None:
            caps.append((above, f"{name!r} <= {r.at_most!r} and {r.at_most!r} <= {above} ({why_high[r.at_most or '']})"))
        if not caps:
            high[name] = None
            continue
        cap, why_high[name] = min(caps, key=lambda c: c[0])
        top = high[name] = round_down(cap, r.multiple_of)
        if top < low[name]:
            multiple = f", a multiple of {r.multiple_of}" if r.multiple_of > 1 else ""
            raise DimConflict(
                f"dim {name!r} has no legal size: it must be >= {low[name]} ({why_low[name]}) "
                f"and <= {cap} ({why_high[name]}){multiple}",
                tuple(dict.fromkeys((name, *_chain(name, rule, dependents)))),
            )
    bounds: dict[str, DimBounds] = {}
    start: dict[str, int] = {}
    for name in reversed(order):
        r = rule[name]
        wanted = max(r.min_size if r.min_size is not None else run_min, low[name],
                     *(start[d] for d in dependents[name]))
        wanted = round_up(wanted, r.multiple_of)
        ceiling = high[name]
        start[name] = wanted if ceiling is None else min(wanted, ceiling)
        bounds[name] = DimBounds(low=low[name], high=ceiling, start=start[name], multiple_of=r.multiple_of)
    return {name: bounds[name] for name in order}


def _chain(name: str, rule: Mapping[str, DimRule], dependents: Mapping[str, list[str]]) -> list[str]:
    """The dims whose rules bear on ``name``'s bounds: the dims above it (``at_most``) and below it."""
    above: list[str] = []
    bound = rule[name].at_most
    while bound is not None:
        above.append(bound)
        bound = rule[bound].at_most
    below: list[str] = []
    stack = list(dependents[name])
    while stack:
        dim = stack.pop()
        below.append(dim)
        stack.extend(dependents[dim])
    return [*above, *below]
