"""The dims language: what a spec says about a dim (:class:`Dim`) and the rule it compiles to.

``register(..., dims=[Dim("k", max_size="n")])`` and ``"d:even"`` shape tokens compile to one
:class:`DimRule` per dim (:func:`conformance.spec.validation.compile_dim_rules`); the drawing of
sizes under those rules is ``strategies.dims``. Invalid rules raise Hypothesis'
``InvalidArgument``, as the strategies that take them do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis.errors import InvalidArgument

__all__ = ["Dim", "DimRule", "check_blocks", "round_up", "rule_order"]


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
    of another dim this one never exceeds (a top-k ``k <= n``).
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
                f"max_size={self.max_size!r} leaves no multiple of {self.multiple_of} >= min_size={self.min_size!r}"
            )

    def smallest(self, run_min: int) -> int:
        """The smallest legal size under the run's ``min_size``."""
        low = self.min_size if self.min_size is not None else run_min
        return round_up(low, self.multiple_of)

    def fit(self, size: int, *, run_min: int, limit: int | None = None) -> int:
        """``size`` made legal: rounded up to a multiple, at least the minimum, at most
        ``max_size`` and ``limit`` (the ``at_most`` dim's size), rounded down to a multiple there;
        where the bounds conflict (``limit`` below the minimum) the minimum wins."""
        low = self.smallest(run_min)
        size = max(round_up(size, self.multiple_of), low)
        high = min(x for x in (self.max_size, limit, size) if x is not None)
        return max(high - high % self.multiple_of, low)


def round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def rule_order(names: tuple[str, ...], rules: Mapping[str, DimRule]) -> tuple[str, ...]:
    """``names`` with every dim after the dim it is bounded by (``at_most``)."""
    ordered: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in visiting:
            raise InvalidArgument(f"dims {sorted(visiting)} bound each other in a cycle (at_most)")
        visiting.add(name)
        bound = rules[name].at_most if name in rules else None
        if bound is not None:
            if bound not in names:
                raise InvalidArgument(f"dim {name!r} is at most {bound!r}, which is not one of the dims {list(names)}")
            visit(bound)
        visiting.discard(name)
        ordered.append(name)

    for name in names:
        visit(name)
    return tuple(ordered)
