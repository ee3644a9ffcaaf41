"""What a target's own code reaches: the globals, closures and defaults its functions name,
followed through the user's helper functions, modules, classes, tables and partials (never into
torch, numpy, the standard library or the suite).

:func:`reaches` answers per Function what a look at its whole module answered before: a plain
Function that shares a module with a Triton kernel does not launch it. It answers False only when
every value on every path was read to its end. Anything it cannot read to the end -- ``getattr``,
``eval``, ``torch.ops`` or a custom op (any kernel may run behind them), ``self.``/``cls.``
attributes, an import inside a function, an object of the user's, a library object it does not know (a callable one, such as an
``nn.Sequential`` holding the user's modules), too many hops -- makes
the answer None, and the caller falls back to the module.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["reaches", "reaches_once"]

# Modules whose functions and submodules are not the user's code: never followed, never opaque.
LIBRARY_ROOTS = frozenset({
    "torch", "numpy", "triton", "builtins", "typing", "functools", "math", "collections", "itertools", "operator",
    "abc", "enum", "dataclasses", "contextlib", "warnings", "hypothesis", "conformance", "strategies",
}) | frozenset(sys.stdlib_module_names)
# Names after which any function may run: the answer cannot be read from the code.
DYNAMIC_NAMES = frozenset({"getattr", "eval", "exec", "__import__", "import_module", "ops", "globals", "vars", "library"})
MAX_HOPS = 8
MAX_ITEMS = 256  # a larger table is not read (opaque)


def reaches(code: Iterable[Callable[..., Any]], found: Callable[[Any], bool], names: frozenset[str] = frozenset()) -> bool | None:
    """True when a value for which ``found`` holds is reachable from ``code``, or a function read
    uses one of ``names`` (``x.new_empty``: a method no value leads to); False when every path was
    read to its end and none is; None when some path cannot be read (see the module)."""
    walk = _Walk(found, names)
    for fn in code:
        walk.push(fn, 0)
    return walk.run()


def reaches_once(
    function: object, code: Callable[[], Iterable[Callable[..., Any]]], found: Callable[[Any], bool], names: frozenset[str] = frozenset()
) -> bool | None:
    """:func:`reaches` of ``code()`` (a target's own code) for the target ``function``, walked once
    per (target, ``found``, ``names``) in a process: a target's code is fixed, and callers ask per evaluation."""
    key = (id(function), found, names)
    known = _ANSWERS.get(key)
    if known is None or known[0] is not function:  # an id reused by another target after the first was freed
        known = _ANSWERS[key] = (function, reaches(code(), found, names))
    return known[1]


_ANSWERS: dict[tuple[int, Callable[[Any], bool], frozenset[str]], tuple[object, bool | None]] = {}


class _Walk:
    def __init__(self, found: Callable[[Any], bool], names: frozenset[str]) -> None:
        self.found = found
        self.names = names
        self.stack: list[tuple[Any, int]] = []
        self.seen: set[int] = set()
        self.kept: list[Any] = []  # what ``seen`` names stays alive, so no id is reused mid-walk
        self.opaque = False
        self.hit = False

    def push(self, value: Any, hops: int) -> None:
        """Look at one reached value: a hit, a function to read, a table or partial to open, a
        value that cannot hold a kernel, or something unreadable (opaque)."""
        if id(value) in self.seen:
            return
        self.seen.add(id(value))
        self.kept.append(value)
        if self.found(value):
            self.hit = True
            return
        for inner in _behind(value):  # what a wrapper, a bound method or a dispatcher runs as well
            self.push(inner, hops)
        if isinstance(value, functools.partial):
            for part in (value.func, *value.args, *value.keywords.values()):
                self.push(part, hops)
        elif isinstance(value, (dict, list, tuple, set, frozenset)):
            items = list(value.values()) if isinstance(value, dict) else list(value)
            if len(items) > MAX_ITEMS:
                self.opaque = True
            for item in items[:MAX_ITEMS]:
                self.push(item, hops)
        elif _inert(value):
            return
        elif _function(value) is not None and _users(value):
            self.stack.append((value, hops))
        else:
            self.opaque = True  # a module, class or object of the user's, or a library object we cannot read

    def run(self) -> bool | None:
        while self.stack and not self.hit:
            value, hops = self.stack.pop()
            function = _function(value)
            assert function is not None
            if hops >= MAX_HOPS:
                self.opaque = True
                continue
            code = function.__code__
            names = set(_names(code))
            if not self.names.isdisjoint(names) or not self.names.isdisjoint(_strings(code)):
                self.hit = True  # ``x.new_empty(...)``, or a name looked up by its string
                break
            if names & DYNAMIC_NAMES or code.co_varnames[:1] in (("self",), ("cls",)) or _imports(code):
                self.opaque = True  # attributes looked up, or modules imported, at run time
            for item in _referenced(function, names):
                self.push(item, hops + 1)
        if self.hit:
            return True
        return None if self.opaque else False


def _function(value: Any) -> types.FunctionType | None:
    """The code-bearing function of ``value`` itself (a decorator's wrapper, not what it wraps:
    :func:`_behind` reaches that)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.MethodType):
        value = value.__func__
    return value if isinstance(value, types.FunctionType) else None


def _behind(value: Any) -> list[Any]:
    """Values ``value`` runs besides its own code: the function a decorator wraps (its wrapper may
    allocate too, so both are read), the instance a bound method is bound to, the implementations
    registered with a ``functools.singledispatch`` function."""
    found: list[Any] = []
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.MethodType):
        found.append(value.__self__)
        value = value.__func__
    if isinstance(value, types.FunctionType):
        registry = value.__dict__.get("registry")
        if isinstance(registry, Mapping):
            found.extend(registry.values())
        wrapped = value.__dict__.get("__wrapped__")
    elif _transparent(value):
        wrapped = value.__wrapped__
    else:
        return found
    if wrapped is not None:
        found.append(wrapped)
    return found


def _transparent(value: Any) -> bool:
    """A functools cache in front of a function (``@functools.cache``): it runs only what it wraps."""
    return type(value).__module__ == "functools" and "__wrapped__" in dir(value)


def _names(code: types.CodeType) -> Iterator[str]:
    """Every global or attribute name ``code`` and its nested functions, lambdas and comprehensions use."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def _strings(code: types.CodeType) -> Iterator[str]:
    """The string constants of ``code`` and its nested functions (``vars(torch)["empty"]``)."""
    for constant in code.co_consts:
        if isinstance(constant, str):
            yield constant
        elif isinstance(constant, types.CodeType):
            yield from _strings(constant)


def _imports(code: types.CodeType) -> bool:
    """Whether ``code`` or a function nested in it imports at run time (``from kernels import fwd``
    inside forward): what it binds is in no namespace the walk can read."""
    if any(instruction.opname == "IMPORT_NAME" for instruction in dis.get_instructions(code)):
        return True
    return any(_imports(constant) for constant in code.co_consts if isinstance(constant, types.CodeType))


def _referenced(function: types.FunctionType, names: set[str]) -> Iterator[Any]:
    """The values ``function`` reaches in one hop: its globals by name, its closure, its defaults,
    and a user's module's attributes by the names the code uses (``kernels.fwd``)."""
    namespace = function.__globals__
    for name in names:
        if name in namespace:
            value = namespace[name]
            if isinstance(value, types.ModuleType) and _users(value):
                yield from (getattr(value, attr) for attr in names if attr in vars(value))
                continue  # the module's other contents are not reached; a deeper chain is opaque (push)
            yield value
    yield from (cell.cell_contents for cell in function.__closure__ or () if _filled(cell))
    yield from function.__defaults__ or ()
    yield from (function.__kwdefaults__ or {}).values()


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  # an empty cell raises
    except ValueError:
        return False
    return True


def _inert(value: Any) -> bool:
    """A value that launches nothing of the user's: a number or string, or a library's module,
    function, class or object -- except the objects that dispatch to registered ops (``torch.ops``,
    a custom op: any kernel may run behind them) and generic holders (a ``SimpleNamespace``)."""
    if value is None or isinstance(value, (int, float, complex, str, bytes, bool)):
        return True
    if _transparent(value):
        return True  # what it wraps is pushed (:func:`_behind`)
    if _users(value):
        return False
    kind = type(value).__module__ or ""
    if callable(value) and not isinstance(value, (types.ModuleType, type, types.FunctionType, *_BUILTIN_CALLABLES)):
        # A library object that runs code of its own choosing (nn.Sequential(user_module),
        # methodcaller) -- except a Triton kernel: a device program, which neither allocates torch
        # memory nor draws from a host generator (``found`` says whether it is a kernel).
        return kind.split(".")[0] == "triton"
    return not kind.startswith(("torch._ops", "torch._library", "types", "functools"))


_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.ClassMethodDescriptorType,
)


def _users(value: Any) -> bool:
    """Whether ``value`` is the user's (its module outside the libraries)."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
    elif isinstance(value, (types.FunctionType, type, staticmethod, classmethod, types.MethodType)):
        module = getattr(_function(value) or value, "__module__", None) or ""
    else:
        module = getattr(value, "__module__", None) or type(value).__module__ or ""
    return str(module).split(".")[0] not in LIBRARY_ROOTS
