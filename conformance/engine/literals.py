"""The literal constants Hypothesis mixes into the suite's draws: the target's own code's, fixed.

Hypothesis (6.13x and later) takes about one integer draw in 20, and more float draws, from a
list of constants: its own, or half the time the literals of every loaded module outside
site-packages, rescanned whenever a module is imported. Left alone, the examples a seed gives
would depend on the suite's own source, on whether the suite is installed or checked out, on
plugins on the path, and on which modules earlier tests imported (so on ``-n``, ``--shard`` and
``-k``).

Here each Function's runs see the literals of its own code instead: the module that registered
it, the module that defines it, and every module they reach -- by import statements, or through
their global names (functions, classes, Triton kernels' ``kernel.fn``, wrapped functions) -- that
is local source or part of the registering top-level package (so an installed package counts
too); not the suite's, not a library's (a Function of torch's brings none of torch's), nor test
files other than the registering one. A kernel's ``BLOCK = 128`` in a module the
Function imports still becomes a drawn size; a module loaded for another reason does not move
the draws.

This reaches into Hypothesis internals (``providers._get_local_constants`` and
``providers.CONSTANTS_CACHE``, swapped for the length of one of the suite's runs and put back).
A Hypothesis without them draws as it always did: :data:`HOOKED` says which, and the project's
tests fail while it is false.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import stat
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis.internal.conjecture import providers

from conformance.spec import Spec

try:
    from hypothesis.internal.cache import LRUCache
    from hypothesis.internal.constants_ast import Constants, constants_from_module, is_local_module_file
    from hypothesis.internal.floats import float_to_int
    from sortedcontainers import SortedSet
except ImportError:  # a Hypothesis before local constants: nothing to fix
    HOOKED = False
else:
    HOOKED = hasattr(providers, "_get_local_constants") and hasattr(providers, "CONSTANTS_CACHE")

__all__ = ["HOOKED", "Literals", "drawing_from", "snapshot", "source_modules"]

# The suite's own packages: their literals are not the target's.
_SUITE_PACKAGES = frozenset({"conformance", "strategies", "autograd_conformance_plugin"})
# Where a value keeps the function it stands for: Triton kernels, functools.wraps, partial.
_UNWRAP = ("fn", "__wrapped__", "func")


@dataclass(frozen=True, eq=False)
class Literals:
    """The literals of some modules, as Hypothesis keeps its local constants, with the cache of
    allowed values Hypothesis fills from them."""

    modules: tuple[str, ...]
    constants: Any  # hypothesis.internal.constants_ast.Constants; Any: absent from older Hypothesis
    cache: Any = field(repr=False)  # its own LRUCache: entries derive from `constants`


def _top(name: str) -> str:
    return name.partition(".")[0]


def _named_modules(module: ModuleType) -> Iterator[str]:
    """The modules ``module`` imports, and those its global names are or were defined in (a
    function imported from a module that imported it from another)."""
    yield from _imported_modules(module)
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            # By its import statements only: importing a submodule anywhere sets it on its
            # package, so a package's attributes depend on what else was imported.
            continue
        for candidate in (value, *(_attribute(value, a) for a in _UNWRAP)):
            name = _attribute(candidate, "__module__")
            if isinstance(name, str):
                yield name


def _imported_modules(module: ModuleType) -> Iterator[str]:
    """The modules ``module``'s source imports, at any depth of its code: ``from kern import
    BLOCK`` binds an int, which names no module."""
    file = getattr(module, "__file__", None)  # absent on some: an xdist worker's __main__
    if not isinstance(file, str):
        return
    try:
        with open(file, "rb") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return
    package = getattr(module, "__package__", None) or ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):
                continue
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _attribute(value: Any, name: str) -> Any:
    try:
        return getattr(value, name, None)
    except Exception:  # a property that raises, a proxy: nothing to follow
        return None


def _is_root(name: str) -> bool:
    """Whether the module ``name``, where a spec was registered or defined, is the user's code:
    not the suite's, and ``__main__`` only as a script of theirs (a spec made outside ``register``
    says ``__main__``, which under pytest is pytest's, under xdist a worker's)."""
    module = sys.modules.get(name)
    if module is None or _top(name) in _SUITE_PACKAGES:
        return False
    file = getattr(module, "__file__", None)
    return name != "__main__" or (isinstance(file, str) and is_local_module_file(file))


def source_modules(spec: Spec, reached: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The modules of ``spec``'s own code, by name: where it was registered, where it was defined
    (when that is local or in the registering package: not a Function of torch's), and every
    module they reach that is local source or in the registering package. ``reached`` keeps what
    each module names across calls on the same loaded modules (the specs of one snapshot share
    most of theirs: each source file is parsed once)."""
    reached = {} if reached is None else reached
    registering = spec.origin if _is_root(spec.origin) else None
    package = _top(registering) if registering is not None else None

    def admitted(name: str) -> bool:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or _top(name) in _SUITE_PACKAGES:
            return False
        return _top(name) == package or is_local_module_file(file)

    roots = {name for name in (registering, spec.op.module) if name is not None and _is_root(name)}
    roots = {name for name in roots if name == registering or admitted(name)}
    found = set(roots)
    pending = sorted(roots)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading a deprecated global warns: not the user's run
        while pending:
            current = pending.pop()
            if current not in reached:
                reached[current] = tuple(_named_modules(sys.modules[current]))
            for name in reached[current]:
                if name not in found and admitted(name):
                    found.add(name)
                    pending.append(name)
    return tuple(sorted(name for name in found if getattr(sys.modules[name], "__file__", None)))


def snapshot(specs: Iterable[Spec]) -> dict[str, Literals]:
    """Each spec's literals (by spec name), from its source modules as loaded now; specs with the
    same modules share one object."""
    by_modules: dict[tuple[str, ...], Literals] = {}
    book: dict[str, Literals] = {}
    reached: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        modules = source_modules(spec, reached) if HOOKED else ()
        literals = by_modules.get(modules)
        if literals is None:
            literals = by_modules[modules] = _collect(modules)
        book[spec.name] = literals
    return book


def _collect(modules: tuple[str, ...]) -> Literals:
    if not HOOKED:
        return Literals(modules, None, None)
    # Sorted, as Hypothesis keeps its own: a plain set of strings iterates in an order
    # PYTHONHASHSEED picks, so the constant drawn would differ from process to process.
    constants = Constants(integers=SortedSet(), floats=SortedSet(key=float_to_int), bytes=SortedSet(), strings=SortedSet())
    for name in modules:
        constants = constants | constants_from_module(sys.modules[name])  # Hypothesis caches it per module
    return Literals(modules, constants, LRUCache(1024))


@contextlib.contextmanager
def drawing_from(literals: Literals | None) -> Iterator[None]:
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


SHARED_HOME_PREFIX = "autograd-conformance-hypothesis-"


def shared_hypothesis_home() -> tuple[Path, Callable[[], None]]:
    """A folder for Hypothesis's files (its cache of the constants it reads in source files; the
    suite keeps no example database) when the caller has none: one per user in the temporary
    directory, reused by every run, so that a process a crashing Function kills leaves nothing
    new behind (a folder per run leaked one per crash). Where that folder is not safely this
    user's alone (someone else's, a link, open to others), a fresh temporary folder instead. The
    callable removes what this call made for the run alone (nothing for the shared folder)."""
    user = getattr(os, "getuid", lambda: "user")()
    shared = Path(tempfile.gettempdir()) / f"{SHARED_HOME_PREFIX}{user}"
    with contextlib.suppress(OSError):
        shared.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(shared)
        if stat.S_ISDIR(found.st_mode) and found.st_uid == getattr(os, "getuid", lambda: found.st_uid)() \
                and not found.st_mode & 0o077:
            return shared, lambda: None
    scratch = tempfile.TemporaryDirectory(prefix=SHARED_HOME_PREFIX)
    return Path(scratch.name), scratch.cleanup

