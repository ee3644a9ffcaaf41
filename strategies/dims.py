"""Concrete sizes for a spec's symbolic dims, ``*batch`` groups and broadcastable shapes."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra.numpy import array_shapes

__all__ = ["BLOCK_SIZES", "batch_shapes", "broadcast_forms", "dim_sizes", "sizes", "sizes_near_blocks"]

# Typical kernel block widths (Triton BLOCK_*, warp multiples): the sizes around them are where
# masking and tail-handling bugs live.
BLOCK_SIZES = (16, 32, 64, 128)


def _check_blocks(block_sizes: Sequence[int], *, allow_empty: bool) -> list[int]:
    blocks = list(block_sizes)
    if (not blocks and not allow_empty) or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in blocks):
        raise InvalidArgument(f"block_sizes={block_sizes!r} must be a {'' if allow_empty else 'non-empty '}list of ints >= 2")
    return blocks


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
    blocks = _check_blocks(block_sizes, allow_empty=False)
    return st.sampled_from([size for b in blocks for size in (b - 1, b, b + 1)])


@st.composite
def _sizes(draw: st.DrawFn, min_size: int, max_size: int, blocks: tuple[int, ...]) -> int:
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
    blocks = tuple(_check_blocks(block_sizes, allow_empty=True))
    return _sizes(min_size, max_size, blocks)


@st.composite
def _dim_sizes(
    draw: st.DrawFn, names: tuple[str, ...], min_size: int, max_size: int, blocks: tuple[int, ...], unique: bool
) -> dict[str, int]:
    drawn: dict[str, int] = {}
    one = _sizes(min_size, max_size, blocks)
    for name in names:
        size = draw(one, label=f"dim {name}")
        if unique:
            # Deterministic bump (not a filter): keeps generation cheap and shrinking monotone.
            while size in drawn.values():
                size += 1
        drawn[name] = size
    return drawn


def dim_sizes(
    names: Sequence[str],
    *,
    min_size: int = 1,
    max_size: int = 7,
    block_sizes: Sequence[int] = (16, 32),
    unique: bool = False,
) -> st.SearchStrategy[dict[str, int]]:
    """One size per distinct dim name (dims that share a name share a size).

    names: the symbolic dim names, e.g. ``("n", "d")``.
    min_size: smallest size drawn (0 allows zero-size dims).
    max_size: largest "small" size; block-boundary sizes may exceed it (see :func:`sizes`).
    block_sizes: blocks whose neighbourhood (b-1, b, b+1) is drawn sometimes; () for none.
    unique: give dims with different names different sizes (a transposed-weight bug hides when
    ``n == d``); a colliding size is bumped up by one until it is free.
    Shrinks towards every dim at ``min_size`` (``min_size``, ``min_size + 1``, ... when unique).
    Example: ``dim_sizes(["n", "d"]).example() -> {'n': 3, 'd': 17}``.
    """
    _check_size_bounds(min_size, max_size)
    blocks = tuple(_check_blocks(block_sizes, allow_empty=True))
    if isinstance(names, str) or len(set(names)) != len(list(names)):
        raise InvalidArgument(f"names={names!r} must be a sequence of distinct dim names")
    return _dim_sizes(tuple(names), min_size, max_size, blocks, bool(unique))


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
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


@st.composite
def _broadcast_forms(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    # A fixed number of choices (one flag per dim, then the drop count), so that shrinking,
    # which prefers shorter choice sequences, goes to ``shape`` itself and not to ``()``.
    ones = [draw(st.booleans(), label=f"dim {i} -> 1") for i in range(len(shape))]
    dropped = draw(st.integers(min_value=0, max_value=len(shape)), label="leading dims dropped")
    return tuple(1 if one else size for one, size in zip(ones[dropped:], shape[dropped:], strict=True))


def broadcast_forms(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast to ``shape``: leading dims dropped, others set to 1.

    shape: the full shape the result must broadcast to (a tuple of ints >= 0).
    Shrinks towards ``shape`` itself. Example: ``broadcast_forms((2, 3, 4)).example() -> (1, 4)``.
    """
    if not isinstance(shape, tuple) or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise InvalidArgument(f"shape={shape!r} must be a tuple of ints >= 0")
    return _broadcast_forms(shape)
