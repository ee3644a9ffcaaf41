"""What a target's own code reaches: the globals, closures, defaults and attributes its functions
name, followed through the user's helper functions, classes and modules (never into torch, numpy,
the standard library or the suite).

:func:`reaches` answers per Function what a look at its whole module answered before: a plain
Function that shares a module with a Triton kernel does not launch it. Where the code is too
dynamic to follow (``getattr``, ``eval``, ``torch.ops`` -- a custom op behind which any kernel may
run -- a callable object, too many hops) the answer is None, and the caller falls back to the
module.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["reaches"]

# Modules whose code is not the user's: never followed (their objects are not what we look for).
LIBRARY_ROOTS = frozenset({
    "torch", "numpy", "triton", "builtins", "typing", "functools", "math", "collections", "itertools", "operator",
    "abc", "enum", "dataclasses", "contextlib", "warnings", "hypothesis", "conformance", "strategies",
}) | frozenset(sys.stdlib_module_names)
# Names after which any function may run: the answer cannot be read from the code.
DYNAMIC_NAMES = frozenset({"getattr", "eval", "exec", "__import__", "import_module", "ops", "globals", "vars"})
MAX_HOPS = 8


def reaches(code: Iterable[Callable[..., Any]], found: Callable[[Any], bool]) -> bool | None:
    """True when a value for which ``found`` holds is reachable from ``code``; False when every
    path was followed and none is; None when some path cannot be followed (see the module)."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(fn, 0) for fn in code]
    opaque = False
    while stack:
        value, hops = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if found(value):
            return True
        if isinstance(value, functools.partial):
            stack.extend((part, hops + 1) for part in (value.func, *value.args, *value.keywords.values()))
            continue
        function = _function(value)
        if function is None:
            opaque = opaque or _callable_object(value)
            continue
        if hops >= MAX_HOPS:
            opaque = True
            continue
        names = set(_names(function.__code__))
        if names & DYNAMIC_NAMES:
            opaque = True
        for item in _referenced(function, names):
            if found(item):
                return True
            if _users(item):
                stack.append((item, hops + 1))
    return None if opaque else False


def _function(value: Any) -> types.FunctionType | None:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.MethodType):
        value = value.__func__
    value = inspect.unwrap(value) if callable(value) else value
    return value if isinstance(value, types.FunctionType) else None


def _names(code: types.CodeType) -> Iterator[str]:
    """Every global or attribute name ``code`` and its nested functions, lambdas and comprehensions use."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def _referenced(function: types.FunctionType, names: set[str]) -> Iterator[Any]:
    """The values ``function`` can reach in one hop: its globals by name, the attributes of the
    user's modules, classes and objects it names, its closure and its defaults (and a wrapper's)."""
    namespace = function.__globals__
    values = [namespace[name] for name in names if name in namespace]
    values += [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
    values += list(function.__defaults__ or ()) + list((function.__kwdefaults__ or {}).values())
    for value in values:
        yield value
        if isinstance(value, (dict, list, tuple, set, frozenset)) and len(value) <= 256:
            yield from value.values() if isinstance(value, dict) else value
        elif _users(value) and not isinstance(value, types.FunctionType):
            # A module, class or object of the user's: the attributes the code names on it.
            holder = value if isinstance(value, (types.ModuleType, type)) else type(value)
            for name in names:
                attribute = inspect.getattr_static(holder, name, None)
                if attribute is not None:
                    yield attribute


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  # an empty cell raises
    except ValueError:
        return False
    return True


def _users(value: Any) -> bool:
    """Whether ``value`` is the user's code (a function, class, module or object of a module
    outside the libraries), which the walk follows."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
    elif isinstance(value, (types.FunctionType, type, staticmethod, classmethod)):
        module = getattr(_function(value) or value, "__module__", None) or ""
    elif isinstance(value, (int, float, str, bytes, bool, type(None))) or value is builtins:
        return False
    else:
        module = type(value).__module__ or ""
    return module.split(".")[0] not in LIBRARY_ROOTS


def _callable_object(value: Any) -> bool:
    """A callable of the user's that is not a function or class (a partial, an object with
    ``__call__``): what it runs cannot be read without calling it."""
    return callable(value) and not isinstance(value, type) and _users(value)
