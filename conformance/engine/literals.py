"""The literal constants Hypothesis mixes into the suite's draws: the target package's, fixed once.

Hypothesis (6.13x and later) takes about one integer draw in 20, and more float draws, from a
list of constants: its own, or half the time the literals of every loaded module outside
site-packages, rescanned whenever a module is imported. Left alone, the examples a seed gives
would depend on the suite's own source, on whether the suite and the target are installed or
checked out, on plugins on the path, and on which modules earlier tests imported (so on ``-n``,
``--shard`` and ``-k``).

Here each Function's runs see the literals of the package that registers it instead: every
module of that top-level package loaded when the run starts, installed or not, collected once.
A kernel's ``BLOCK = 128`` still becomes a drawn size; nothing else moves the draws.

This reaches into Hypothesis internals (``providers._get_local_constants`` and
``providers.CONSTANTS_CACHE``, swapped for the length of one of the suite's runs and put back).
A Hypothesis without them draws as it always did: :data:`HOOKED` says which, and the project's
tests fail while it is false.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis.internal.conjecture import providers

from conformance.spec import Spec

try:
    from hypothesis.internal.cache import LRUCache
    from hypothesis.internal.constants_ast import Constants, constants_from_module
    from hypothesis.internal.floats import float_to_int
    from sortedcontainers import SortedSet
except ImportError:  # a Hypothesis before local constants: nothing to fix
    HOOKED = False
else:
    HOOKED = hasattr(providers, "_get_local_constants") and hasattr(providers, "CONSTANTS_CACHE")

__all__ = ["HOOKED", "PackageLiterals", "drawing_from", "package_of", "snapshot"]

# The suite's own packages: their literals are not the target's.
_SUITE_PACKAGES = frozenset({"conformance", "strategies", "autograd_conformance_plugin"})


@dataclass(frozen=True, eq=False)
class PackageLiterals:
    """The literals of one package's modules, as Hypothesis keeps its local constants, with the
    cache of allowed values Hypothesis fills from them."""

    package: str
    modules: tuple[str, ...]
    constants: Any  # hypothesis.internal.constants_ast.Constants; Any: absent from older Hypothesis
    cache: Any = field(repr=False)  # its own LRUCache: entries derive from `constants`


def package_of(spec: Spec) -> str:
    """The top-level package that registered ``spec`` (a module imported by path is its own)."""
    return spec.origin.partition(".")[0]


def snapshot(packages: Iterable[str]) -> dict[str, PackageLiterals]:
    """Each package's literals, from the modules of it loaded now (the suite's own: none)."""
    loaded = sorted(sys.modules.items())
    book: dict[str, PackageLiterals] = {}
    for package in sorted(set(packages)):
        names = () if package in _SUITE_PACKAGES else tuple(
            name for name, module in loaded
            if (name == package or name.startswith(package + ".")) and getattr(module, "__file__", None)
        )
        if not HOOKED:
            book[package] = PackageLiterals(package, names, None, None)
            continue
        # Sorted, as Hypothesis keeps its own: a plain set of strings iterates in an order
        # PYTHONHASHSEED picks, so the constant drawn would differ from process to process.
        constants = Constants(
            integers=SortedSet(), floats=SortedSet(key=float_to_int), bytes=SortedSet(), strings=SortedSet()
        )
        for name in names:
            constants = constants | constants_from_module(sys.modules[name])
        book[package] = PackageLiterals(package, names, constants, LRUCache(1024))
    return book


@contextlib.contextmanager
def drawing_from(literals: PackageLiterals | None) -> Iterator[None]:
    """Hypothesis draws its local constants from ``literals`` (None, or a Hypothesis without
    them: as it always does) until the block ends."""
    if literals is None or not HOOKED:
        yield
        return
    saved = providers._get_local_constants, providers.CONSTANTS_CACHE
    providers._get_local_constants = lambda: literals.constants
    providers.CONSTANTS_CACHE = literals.cache
    try:
        yield
    finally:
        providers._get_local_constants, providers.CONSTANTS_CACHE = saved
