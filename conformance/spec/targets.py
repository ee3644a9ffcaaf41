"""Op adapters: what the suite needs to know about a registered target, whatever its kind.

Every contract sees a target through one :class:`OpAdapter`: how to call it as a user would,
the ``torch.autograd.Function`` the probe (:mod:`conformance.engine.probe`) subclasses to see
backward's raw returns, its name in messages, how a repro script imports it, which arguments it
mutates, and which transforms it declares (a ``jvp``, a vmap rule). Two kinds exist:

* :class:`FunctionAdapter` -- a ``torch.autograd.Function`` subclass: called with ``.apply``,
  probed as itself.
* :class:`CustomOpAdapter` -- a ``torch.library.custom_op`` with ``register_autograd``: called
  through the dispatcher (``op(*args)``: its autograd, fake and backend kernels, as
  ``torch.compile`` and ``opcheck`` see it); probed through a Function built from its own
  registered pieces -- its forward is the op below autograd, its ``setup_context`` and
  ``backward`` are the ones registered -- so every contract inspects exactly what the user's
  backward returned, as it does for a Function.

:func:`adapt` picks the adapter, or raises ``TypeError`` saying what is accepted. A new kind of
target is one new adapter class here.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

# torch.library.opcheck's default sub-checks, in the order it runs them.
OPCHECK_SUB_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

__all__ = [
    "OPCHECK_SUB_CHECKS", "CustomOpAdapter", "FunctionAdapter", "OpAdapter", "adapt", "declares_jvp", "positional_arity",
    "uses_setup_context",
]


@runtime_checkable
class OpAdapter(Protocol):
    """How the suite calls, probes, names and imports one registered target."""

    @property
    def kind(self) -> str:
        """``"autograd.Function"`` or ``"custom op"``, in messages."""
        ...

    @property
    def display_name(self) -> str:
        """The target in messages: ``MyFn``, ``mylib::softplus``."""
        ...

    @property
    def module(self) -> str:
        """The module defining the user's code (Triton detection, repro imports)."""
        ...

    @property
    def function(self) -> type[torch.autograd.Function]:
        """What the probe subclasses."""
        ...

    def call(self, *args: Any) -> Any:
        """Run the target as its users do (``Fn.apply(*args)``, ``op(*args)``)."""
        ...

    def arity(self) -> tuple[int, float] | None:
        """(required, maximum) positional arguments, or None when not introspectable."""
        ...

    def mutated_arguments(self) -> tuple[str, ...] | None:
        """The arguments the target itself declares it mutates; None when it declares nothing."""
        ...

    def user_code(self) -> dict[str, Callable[..., Any]]:
        """Phase label -> the user's own function (``"backward"``: the registered backward), for
        naming where a hung example is stuck."""
        ...

    def repro_import(self, source_file: str) -> tuple[list[str], str]:
        """(import lines, callee expression): ``callee(*args)`` runs the target in a repro script."""
        ...

    def declares(self, feature: str) -> bool:
        """Whether the target declares ``feature``: ``"jvp"`` (forward-mode AD), ``"vmap"``
        (a vmap staticmethod or ``generate_vmap_rule=True``), ``"setup_context"``."""
        ...


def _import_lines(module: str, name: str, source_file: str) -> list[str]:
    """Lines binding ``name`` from ``module`` (a file loaded by path is imported by its path)."""
    if module.startswith("_conformance_impl_") and source_file:
        return ["from conformance.engine.loader import import_path", f"{name} = import_path({source_file!r}).{name}"]
    return [f"from {module} import {name}"]


def positional_arity(func: Callable[..., Any], *, skip: int) -> tuple[int, float] | None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    required = 0
    maximum: float = 0  # math.inf with *args; an int otherwise, shown as such
    for param in list(signature.parameters.values())[skip:]:
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            maximum = math.inf
        elif param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            maximum += 1
            if param.default is inspect.Parameter.empty:
                required += 1
    return required, maximum


def uses_setup_context(fn: type[torch.autograd.Function]) -> bool:
    base = torch.autograd.function._SingleLevelFunction.setup_context
    return getattr(fn, "setup_context", base) is not base


@dataclass(frozen=True)
class FunctionAdapter:
    """A ``torch.autograd.Function`` subclass."""

    function: type[torch.autograd.Function]
    kind: str = "autograd.Function"

    @property
    def display_name(self) -> str:
        return self.function.__qualname__

    @property
    def module(self) -> str:
        return self.function.__module__

    def call(self, *args: Any) -> Any:
        return self.function.apply(*args)  # type: ignore[no-untyped-call]  # torch does not annotate Function.apply

    def arity(self) -> tuple[int, float] | None:
        return positional_arity(self.function.forward, skip=0 if uses_setup_context(self.function) else 1)

    def mutated_arguments(self) -> tuple[str, ...] | None:
        return None  # a Function says so only through ctx.mark_dirty, at run time

    def user_code(self) -> dict[str, Callable[..., Any]]:
        methods = ("forward", "setup_context", "backward", "vjp", "jvp", "vmap")
        return {m: getattr(self.function, m) for m in methods if m in _own_methods(self.function)}

    def repro_import(self, source_file: str) -> tuple[list[str], str]:
        top = self.function.__qualname__.split(".")[0]
        return _import_lines(self.module, top, source_file), f"{self.function.__qualname__}.apply"

    def declares(self, feature: str) -> bool:
        fn = self.function
        base = torch.autograd.Function
        if feature == "jvp":
            return declares_jvp(fn)
        if feature == "vmap":
            return bool(getattr(fn, "generate_vmap_rule", False)) or getattr(fn, "vmap", base.vmap) is not base.vmap
        if feature == "setup_context":
            return uses_setup_context(fn)
        raise ValueError(f"unknown feature {feature!r}; choose from 'jvp', 'vmap', 'setup_context'")


def declares_jvp(fn: type[torch.autograd.Function]) -> bool:
    """Whether ``fn`` defines its own ``jvp`` staticmethod (forward-mode AD)."""
    return getattr(fn, "jvp", torch.autograd.Function.jvp) is not torch.autograd.Function.jvp


def _own_methods(fn: type) -> set[str]:
    """Methods defined by ``fn`` or a user base class (not torch's)."""
    names: set[str] = set()
    for klass in fn.__mro__:
        if klass.__module__.startswith("torch."):
            break
        names.update(vars(klass))
    return names


def _custom_op_def(target: Any) -> Any | None:
    """The ``CustomOpDef`` behind ``target``: the object ``@torch.library.custom_op`` returns,
    or ``torch.ops.ns.name`` / ``.default`` of such an op; None for anything else."""
    from torch._library.custom_ops import OPDEFS, CustomOpDef

    if isinstance(target, CustomOpDef):
        return target
    if isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        schema = target._schema if isinstance(target, torch._ops.OpOverload) else None
        name = schema.name if schema is not None else getattr(target, "_qualified_op_name", "")
        return OPDEFS.get(name)
    return None


@dataclass(frozen=True)
class CustomOpAdapter:
    """A ``torch.library.custom_op`` (its ``CustomOpDef``) with autograd registered."""

    op: Any  # torch._library.custom_ops.CustomOpDef
    kind: str = "custom op"
    function: type[torch.autograd.Function] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "function", _function_of_custom_op(self.op))

    @property
    def display_name(self) -> str:
        return str(self.op._qualname)

    @property
    def module(self) -> str:
        return str(getattr(self.op._init_fn, "__module__", "__main__"))

    @property
    def schema(self) -> Any:
        return self.op._opoverload._schema

    def call(self, *args: Any) -> Any:
        return self.op(*args)

    def arity(self) -> tuple[int, float] | None:
        positional = [a for a in self.schema.arguments if not a.kwarg_only]
        required = sum(1 for a in positional if not a.has_default_value())
        return required, float(len(positional))

    def mutated_arguments(self) -> tuple[str, ...] | None:
        return tuple(a.name for a in self.schema.arguments if a.alias_info is not None and a.alias_info.is_write)

    def user_code(self) -> dict[str, Callable[..., Any]]:
        pieces = {"forward": self.op._init_fn, "setup_context": self.op._setup_context_fn, "backward": self.op._backward_fn}
        pieces.update({f"forward ({device or 'default'} kernel)": fn for device, fn in self.op._backend_fns.items()})
        return {label: fn for label, fn in pieces.items() if fn is not None}

    def repro_import(self, source_file: str) -> tuple[list[str], str]:
        name = getattr(self.op._init_fn, "__name__", "")
        module = sys.modules.get(self.module)
        if name and module is not None and getattr(module, name, None) is self.op:
            return _import_lines(self.module, name, source_file), name
        namespace, opname = self.display_name.split("::")
        if self.module.startswith("_conformance_impl_") and source_file:
            lines = ["from conformance.engine.loader import import_path", f"import_path({source_file!r})  # registers {self.display_name}"]
        else:
            lines = [f"import {self.module}  # registers {self.display_name}"]
        return lines, f"torch.ops.{namespace}.{opname}"

    def opcheck(self, args: Sequence[Any], sub_checks: Sequence[str] = OPCHECK_SUB_CHECKS) -> dict[str, BaseException | None]:
        """``torch.library.opcheck`` on ``args``: each sub-check's error, or None where it passed."""
        results = torch.library.opcheck(self.op, tuple(args), test_utils=tuple(sub_checks), raise_exception=False)
        checked: dict[str, BaseException | None] = {}
        for name in sub_checks:
            value = results.get(name)
            if value == "SUCCESS":
                checked[name] = None
            else:
                checked[name] = value if isinstance(value, BaseException) else RuntimeError(f"opcheck reported {value!r}")
        return checked

    def declares(self, feature: str) -> bool:
        if feature == "jvp":
            return False  # torch.library has no forward-mode AD registration
        if feature == "vmap":
            return self.op._vmap_fn is not None
        if feature == "setup_context":
            return True
        raise ValueError(f"unknown feature {feature!r}; choose from 'jvp', 'vmap', 'setup_context'")


def _function_of_custom_op(op: Any) -> type[torch.autograd.Function]:
    """A Function made of ``op``'s registered pieces, which the probe can subclass: forward
    runs the op (inside a Function's forward grad mode is off, so the dispatcher goes straight
    to its backend kernel), ``setup_context`` and ``backward`` are the registered ones."""
    qualname = str(op._qualname)

    def forward(*args: Any) -> Any:
        return op._opoverload(*args)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        if op._setup_context_fn is not None:
            op._setup_context_fn(ctx=ctx, inputs=inputs, output=output)

    def backward(ctx: Any, *grads: Any) -> Any:
        if op._backward_fn is None:
            raise RuntimeError(f"{qualname} has no autograd formula: call register_autograd on it")
        return op._backward_fn(ctx, *grads)

    namespace: dict[str, Any] = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "__module__": getattr(op._init_fn, "__module__", __name__),
        "__qualname__": qualname,
        "__doc__": f"The registered autograd of custom op {qualname}, as a Function the suite's probe can wrap.",
    }
    return type(qualname.replace("::", "."), (torch.autograd.Function,), namespace)


def adapt(target: Any) -> OpAdapter:
    """The adapter for a registered target; ``TypeError`` saying what is accepted otherwise."""
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return FunctionAdapter(target)
    op = _custom_op_def(target)
    if op is not None:
        if op._backward_fn is None:
            written = [a.name for a in op._opoverload._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            if written:  # torch refuses register_autograd on an op that mutates its arguments
                raise TypeError(
                    f"custom op {op._qualname} has no autograd formula, and torch gives none to an op that mutates its "
                    f"arguments ({', '.join(written)}): register a torch.autograd.Function whose forward calls it "
                    "(ctx.mark_dirty on the arguments it writes) instead, with mutates=(...) naming them"
                )
            raise TypeError(
                f"custom op {op._qualname} has no autograd formula: call "
                f"{getattr(op._init_fn, '__name__', 'op')}.register_autograd(backward, setup_context=...) before register()"
            )
        if any(a.kwarg_only for a in op._opoverload._schema.arguments):
            raise TypeError(f"custom op {op._qualname} has keyword-only arguments, which the suite cannot pass yet")
        return CustomOpAdapter(op)
    if isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        raise TypeError(f"{target!r} is not a torch.library.custom_op (only ops made by torch.library.custom_op are supported)")
    return _raise_unsupported(target)


def _raise_unsupported(target: Any) -> OpAdapter:
    raise TypeError(
        f"{target!r} is neither a torch.autograd.Function subclass nor a torch.library.custom_op "
        "(the object @torch.library.custom_op returns, or torch.ops.<ns>.<name>)"
    )
