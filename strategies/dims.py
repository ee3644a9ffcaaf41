"""Concrete sizes for a spec's symbolic dims, ``*batch`` groups and broadcastable shapes.

The rules sizes obey (:class:`DimRule`) are spec-language data (:mod:`conformance.spec.dims`);
this module draws sizes under them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra.numpy import array_shapes

from conformance.spec.dims import DimRule, check_blocks, dim_bounds
from strategies.reuse import reused, sampled

__all__ = ["BLOCK_SIZES", "DimRule", "batch_shapes", "broadcast_forms", "dim_sizes", "sizes", "sizes_near_blocks"]

# Typical kernel block widths (Triton BLOCK_*, warp multiples): the sizes around them are where
# masking and tail-handling bugs live.
BLOCK_SIZES = (16, 32, 64, 128)


def _check_size_bounds(min_size: int, max_size: int) -> None:
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise InvalidArgument(f"min_size={min_size!r} must be an int >= 0")
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < min_size:
        raise InvalidArgument(f"max_size={max_size!r} must be an int >= min_size={min_size!r}")


def sizes_near_blocks(*, block_sizes: Sequence[int] = (16, 32)) -> st.SearchStrategy[int]:
    """Sizes just around kernel block boundaries: ``block - 1``, ``block``, ``block + 1``.

    block_sizes: the block sizes to straddle (each >= 2).
    Shrinks towards the first block's ``block - 1``. Example: ``sizes_near_blocks().example() -> 33``.
    """
    blocks = check_blocks(block_sizes, allow_empty=False)
    return sampled(tuple(size for b in blocks for size in (b - 1, b, b + 1)))


@st.composite
def _sizes(draw: st.DrawFn, min_size: int, max_size: int, blocks: tuple[int, ...]) -> int:
    blocks = tuple(b for b in blocks if b + 1 >= min_size)  # a block below the smallest size has no sizes near it
    if not blocks:
        return draw(st.integers(min_value=min_size, max_value=max_size), label="size")
    top = max(max_size, max(blocks) + 1)
    # The mode order is what makes failures shrink to the *smallest* failing size, not just the
    # smallest drawn one: the shrinker lowers the mode first, and mode 1 ("any size up to the
    # largest block") accepts every value the near-block modes produce, so a failure found at
    # 15 (near 16) moves to mode 1 and then shrinks by value, e.g. down to 9 for a tail bug
    # with 8-wide blocks. Mode 0 (small sizes) is where passing examples shrink to.
    mode = draw(st.integers(min_value=0, max_value=1 + len(blocks)), label="size mode")
    if mode == 0:
        return draw(st.integers(min_value=min_size, max_value=max_size), label="small size")
    if mode == 1:
        return draw(st.integers(min_value=min_size, max_value=top), label="any size")
    block = blocks[mode - 2]
    return draw(st.integers(min_value=max(min_size, block - 1), max_value=block + 1), label=f"size near {block}")


def sizes(
    *, min_size: int = 1, max_size: int = 7, block_sizes: Sequence[int] = (16, 32)
) -> st.SearchStrategy[int]:
    """One dim size: small sizes (1 and small primes included), any size up to the largest
    block + 1 (non-powers of two), and ``block - 1``, ``block``, ``block + 1`` for each block.

    min_size: smallest size drawn (0 allows zero-size dims).
    max_size: largest "small" size; the other modes may exceed it.
    block_sizes: kernel block widths whose boundaries are drawn; () for small sizes only.
    Shrinks towards ``min_size``; a failure that needs a size above a block boundary shrinks to
    the smallest such size (e.g. 9 for a bug in the tail of 8-wide blocks).
    Example: ``sizes(block_sizes=(64,)).example() -> 65``.
    """
    _check_size_bounds(min_size, max_size)
    blocks = tuple(check_blocks(block_sizes, allow_empty=True))
    return _sizes(min_size, max_size, blocks)


@st.composite
def _dim_sizes(
    draw: st.DrawFn,
    names: tuple[str, ...],
    min_size: int,
    max_size: int,
    blocks: tuple[int, ...],
    unique: bool,
    rules: tuple[tuple[str, DimRule], ...],
) -> dict[str, int]:
    by_name = dict(rules)
    bounds = dim_bounds(names, by_name, run_min=min_size)
    drawn: dict[str, int] = {}
    for name, bound in bounds.items():  # every dim after the dim bounding it (at_most)
        rule = by_name.get(name, DimRule())
        low = bound.start
        high = max_size if bound.high is None else max(low, min(max_size, bound.high))
        own_blocks = blocks if rule.block_sizes is None else rule.block_sizes
        if bound.high is not None:
            own_blocks = tuple(b for b in own_blocks if b - 1 <= bound.high)
        size = draw(reused(_sizes, low, max(low, high), tuple(own_blocks)), label=f"dim {name}")
        limit = drawn[rule.at_most] if rule.at_most is not None else None
        size = bound.fit(size, limit=limit)
        top = bound.top(limit)
        if unique:
            # Deterministic bump (not a filter): keeps generation cheap and shrinking monotone.
            while size in drawn.values() and (top is None or size + bound.multiple_of <= top):
                size += bound.multiple_of
        drawn[name] = size
    return {name: drawn[name] for name in names}


def dim_sizes(
    names: Sequence[str],
    *,
    min_size: int = 1,
    max_size: int = 7,
    block_sizes: Sequence[int] = (16, 32),
    unique: bool = False,
    rules: Mapping[str, DimRule] | None = None,
) -> st.SearchStrategy[dict[str, int]]:
    """One size per distinct dim name (dims that share a name share a size).

    names: the symbolic dim names, e.g. ``("n", "d")``.
    min_size: smallest size drawn (0 allows zero-size dims).
    max_size: largest "small" size; block-boundary sizes may exceed it (see :func:`sizes`).
    block_sizes: blocks whose neighbourhood (b-1, b, b+1) is drawn sometimes; () for none.
    unique: give dims with different names different sizes (a transposed-weight bug hides when
    ``n == d``); a colliding size is bumped up (by its multiple) until it is free, where its
    bounds allow.
    rules: per-dim :class:`DimRule` (multiples, hard bounds, own blocks, ``at_most`` another dim).
    Every drawn assignment meets every rule: a dim another is at most is drawn at least that
    one's smallest legal size (``f`` even and ``<= n``: ``n >= 2``); ``min_size`` gives way to a
    rule's bounds; rules no assignment meets raise :class:`DimConflict` (an ``InvalidArgument``).
    Shrinks towards every dim at its smallest legal size.
    Example: ``dim_sizes(["n", "d"], rules={"d": DimRule(multiple_of=2)}).example() -> {'n': 3, 'd': 18}``.
    """
    _check_size_bounds(min_size, max_size)
    blocks = tuple(check_blocks(block_sizes, allow_empty=True))
    if isinstance(names, str) or len(set(names)) != len(list(names)):
        raise InvalidArgument(f"names={names!r} must be a sequence of distinct dim names")
    given = dict(rules or {})
    unknown = [name for name in given if name not in names]
    if unknown:
        raise InvalidArgument(f"rules for {unknown} name no dim in names={list(names)!r}")
    for name, rule in given.items():
        if not isinstance(rule, DimRule):
            raise InvalidArgument(f"rules[{name!r}]={rule!r} must be a DimRule")
    dim_bounds(tuple(names), given, run_min=min_size)  # a bad at_most or a conflict is an error now, not at draw time
    return reused(_dim_sizes, tuple(names), min_size, max_size, blocks, bool(unique), tuple(given.items()))


def batch_shapes(*, min_dims: int = 0, max_dims: int = 2, min_side: int = 1, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes for a ``*batch`` group: zero or more leading dims.

    min_dims / max_dims: how many batch dims (``*batch`` expands to min_dims..max_dims dims).
    min_side / max_side: the size of each (min_side=0 allows empty batches).
    Shrinks towards ``()`` (no batch dims). Example: ``batch_shapes().example() -> (2, 1)``.
    """
    if min_dims < 0 or max_dims < min_dims:
        raise InvalidArgument(f"need 0 <= min_dims <= max_dims, got min_dims={min_dims!r}, max_dims={max_dims!r}")
    if min_side < 0 or max_side < min_side:
        raise InvalidArgument(f"need 0 <= min_side <= max_side, got min_side={min_side!r}, max_side={max_side!r}")
    return reused(array_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


@st.composite
def _broadcast_forms(draw: st.DrawFn, shape: tuple[int, ...], allowed: tuple[bool, ...]) -> tuple[int, ...]:
    # A fixed number of choices (one flag per broadcastable dim, then the drop count), so that
    # shrinking, which prefers shorter choice sequences, goes to ``shape`` itself and not to ``()``.
    ones = [draw(st.booleans(), label=f"dim {i} -> 1") if ok else False for i, ok in enumerate(allowed)]
    leading = next((i for i, ok in enumerate(allowed) if not ok), len(shape))
    dropped = draw(st.integers(min_value=0, max_value=leading), label="leading dims dropped") if leading else 0
    return tuple(1 if one else size for one, size in zip(ones[dropped:], shape[dropped:], strict=True))


def broadcast_forms(shape: tuple[int, ...], *, allowed: Sequence[bool] | None = None) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast to ``shape``: leading dims dropped, others set to 1.

    shape: the full shape the result must broadcast to (a tuple of ints >= 0).
    allowed: per dim, whether it may broadcast (set to 1, or dropped while every dim before it
    may be too); None: every dim. A rotary ``cos`` table ``(b, s, 1, d)`` broadcast over the
    batch only: ``allowed=(True, False, True, False)``.
    Shrinks towards ``shape`` itself. Example: ``broadcast_forms((2, 3, 4)).example() -> (1, 4)``.
    """
    if not isinstance(shape, tuple) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise InvalidArgument(f"shape={shape!r} must be a tuple of ints >= 0")
    flags = (True,) * len(shape) if allowed is None else tuple(allowed)
    if len(flags) != len(shape) or any(not isinstance(f, bool) for f in flags):
        raise InvalidArgument(f"allowed={allowed!r} must be one bool per dim of shape={shape!r}")
    return reused(_broadcast_forms, shape, flags)
