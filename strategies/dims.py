"""Concrete sizes for a spec's symbolic dims and ``*batch`` groups."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra.numpy import array_shapes

__all__ = ["batch_shapes", "dim_sizes", "sizes_near_blocks"]


def sizes_near_blocks(*, block_sizes: Sequence[int] = (16, 32)) -> st.SearchStrategy[int]:
    """Sizes just around kernel block boundaries: ``block - 1``, ``block``, ``block + 1``.

    block_sizes: the block sizes to straddle (each >= 2).
    Shrinks towards the first block's ``block - 1``. Example: ``sizes_near_blocks().example() -> 33``.
    """
    blocks = list(block_sizes)
    if not blocks or any(not isinstance(b, int) or b < 2 for b in blocks):
        raise InvalidArgument(f"block_sizes={block_sizes!r} must be a non-empty list of ints >= 2")
    return st.sampled_from([size for b in blocks for size in (b - 1, b, b + 1)])


def dim_sizes(
    names: Sequence[str],
    *,
    min_size: int = 1,
    max_size: int = 7,
    block_sizes: Sequence[int] = (16, 32),
) -> st.SearchStrategy[dict[str, int]]:
    """One size per distinct dim name (dims that share a name share a size).

    names: the symbolic dim names, e.g. ``("n", "d")``.
    min_size: smallest size drawn (0 allows zero-size dims).
    max_size: largest "ordinary" size; block-boundary sizes may exceed it.
    block_sizes: blocks whose neighbourhood (b-1, b, b+1) is drawn sometimes; () for none.
    Shrinks towards every dim at ``min_size``. Example: ``dim_sizes(["n", "d"]).example() -> {'n': 3, 'd': 17}``.
    """
    if not isinstance(min_size, int) or min_size < 0:
        raise InvalidArgument(f"min_size={min_size!r} must be an int >= 0")
    if not isinstance(max_size, int) or max_size < min_size:
        raise InvalidArgument(f"max_size={max_size!r} must be an int >= min_size={min_size!r}")
    if len(set(names)) != len(list(names)):
        raise InvalidArgument(f"names={list(names)!r} contains duplicates")
    size = st.integers(min_value=min_size, max_value=max_size)
    if block_sizes:
        size = st.one_of(size, sizes_near_blocks(block_sizes=block_sizes))
    return st.fixed_dictionaries({name: size for name in names})


def batch_shapes(*, min_dims: int = 0, max_dims: int = 2, min_side: int = 1, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes for a ``*batch`` group: zero or more leading dims.

    min_dims / max_dims: how many batch dims.
    min_side / max_side: the size of each.
    Shrinks towards ``()`` (no batch dims). Example: ``batch_shapes().example() -> (2, 1)``.
    """
    if min_dims < 0 or max_dims < min_dims:
        raise InvalidArgument(f"need 0 <= min_dims <= max_dims, got min_dims={min_dims!r}, max_dims={max_dims!r}")
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)
