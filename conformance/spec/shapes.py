"""The shape language: ``"*batch n d"``, ``"b s h d:even"``, ``"t 2*f"``, parsed once.

A :class:`ShapeSpec` is what a shape string means: an optional leading ``*batch`` group, then
named, scaled (``2*f``) or literal dims, and the ``name:even`` / ``name:8`` multiples.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from conformance.spec.checks import IDENT

__all__ = ["DimToken", "Scaled", "ShapeSpec", "parse_shape"]


@dataclass(frozen=True)
class Scaled:
    """A dim that is ``factor`` times another dim (``"2*f"``: a fused gate-up's last dim)."""

    factor: int
    name: str

    def __str__(self) -> str:
        return f"{self.factor}*{self.name}"


DimToken = Union[str, int, Scaled]


@dataclass(frozen=True)
class ShapeSpec:
    """A parsed symbolic shape: an optional leading ``*batch`` then named, scaled or literal dims.

    ``multiples``: the ``name:even`` / ``name:8`` annotations (dim name, multiple).
    """

    text: str
    batch: str | None
    dims: tuple[DimToken, ...]
    multiples: tuple[tuple[str, int], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name if isinstance(d, Scaled) else d for d in self.dims if not isinstance(d, int))

    @property
    def ndim_min(self) -> int:
        return len(self.dims)

    def concrete(self, sizes: Mapping[str, int], batches: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        """The shape under drawn sizes."""
        shape: list[int] = list(batches[self.batch]) if self.batch else []
        for dim in self.dims:
            if isinstance(dim, int):
                shape.append(dim)
            elif isinstance(dim, Scaled):
                shape.append(dim.factor * sizes[dim.name])
            else:
                shape.append(sizes[dim])
        return tuple(shape)

    def labels(self, batches: Mapping[str, Sequence[int]]) -> tuple[str, ...]:
        """Per concrete dim, the token it comes from (``*batch`` for every batch dim)."""
        lead = (f"*{self.batch}",) * len(batches[self.batch]) if self.batch else ()
        return lead + tuple(str(d) for d in self.dims)


_SCALED = re.compile(r"^([0-9]+)\*([A-Za-z_][A-Za-z0-9_]*)$")
_ANNOTATED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(even|[0-9]+)$")


def parse_shape(text: str) -> ShapeSpec:
    """Parse shape strings: ``"*batch n d"``, ``"b s h d:even"`` (d a multiple of 2; ``d:8`` a
    multiple of 8), ``"t 2*f"`` (twice f); raises ``ValueError`` on malformed text."""
    if not isinstance(text, str):
        raise ValueError(f"shape must be a string like '*batch n d', got {text!r}")
    return _parse(text)


@functools.cache
def _parse(text: str) -> ShapeSpec:
    """:func:`parse_shape` of a string: each distinct shape string is parsed once (a ShapeSpec is
    frozen, so every input declaring it shares the one result)."""
    tokens = text.split()
    batch: str | None = None
    dims: list[DimToken] = []
    multiples: list[tuple[str, int]] = []
    for position, token in enumerate(tokens):
        scaled = _SCALED.match(token)
        annotated = _ANNOTATED.match(token)
        if token.startswith("*"):
            if position != 0:
                raise ValueError(f"shape {text!r}: {token!r} must be the first token")
            if not IDENT.match(token[1:]):
                raise ValueError(f"shape {text!r}: {token!r} is not '*' followed by a name")
            batch = token[1:]
        elif token.isdigit():
            size = int(token)
            if size < 1:
                raise ValueError(f"shape {text!r}: literal size {token!r} must be >= 1")
            dims.append(size)
        elif scaled:
            factor = int(scaled.group(1))
            if factor < 1:
                raise ValueError(f"shape {text!r}: {token!r} needs a factor >= 1")
            dims.append(Scaled(factor, scaled.group(2)) if factor != 1 else scaled.group(2))
        elif annotated:
            name, multiple = annotated.group(1), annotated.group(2)
            step = 2 if multiple == "even" else int(multiple)
            if step < 1:
                raise ValueError(f"shape {text!r}: {token!r} needs a multiple >= 1")
            dims.append(name)
            multiples.append((name, step))
        elif IDENT.match(token):
            dims.append(token)
        else:
            raise ValueError(
                f"shape {text!r}: token {token!r} is neither a dim name (optionally 'name:even' or 'name:8'), "
                "a scaled dim ('2*name'), a positive integer nor a leading '*name'"
            )
    return ShapeSpec(text=text, batch=batch, dims=tuple(dims), multiples=tuple(multiples))
