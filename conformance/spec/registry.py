"""The registry: ``register`` validates a spec (:func:`_build_spec`) and records it.

``register(fn, inputs=..., reference=...)`` returns ``fn`` unchanged; :func:`registered` lists
the specs so far (the pytest plugin collects them), :func:`registered_spec` finds one by name.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import FrameType
from typing import Any, TypeVar

import torch

from conformance.spec.autotune import autotuned_configs, describe_config
from conformance.spec.checks import NAME, SpecError
from conformance.spec.dims import Dim
from conformance.spec.inputs import InputSpec
from conformance.spec.spec import SavesPromise, Spec
from conformance.spec.targets import OpAdapter, adapt
from conformance.spec.validation import (
    check_arity,
    check_budgets,
    check_compile_promises,
    check_declared_mutations,
    check_devices,
    check_dtypes,
    check_flags,
    check_inputs,
    check_mutates,
    check_references,
    check_saves,
    check_spec_name,
    check_timeout,
    check_tolerances,
    check_waivers,
    compile_dim_rules,
)

__all__ = ["_REGISTRY", "_build_spec", "make_specs", "register", "registered", "registered_spec"]

T = TypeVar("T")

_REGISTRY: list[Spec] = []


def registered() -> list[Spec]:
    """The specs registered so far, in registration order."""
    return list(_REGISTRY)


def registered_spec(name: str) -> Spec:
    """The registered spec called ``name`` (repro snippets use it to reach a spec's functions)."""
    for spec in _REGISTRY:
        if spec.name == name:
            return spec
    raise KeyError(f"no registered spec {name!r}; registered: {[s.name for s in _REGISTRY]}")


def _caller() -> tuple[str, str]:
    """The module that called ``register`` (or ``conformance.check``) and the call's ``file:line``
    (the first frame outside the ``conformance`` package)."""
    frame: FrameType | None = sys._getframe(1)
    top = __name__.partition(".")[0]  # conformance: register's and conformance.check's callers alike
    while frame is not None:
        module = frame.f_globals.get("__name__", "__main__")
        if module != top and not module.startswith(top + "."):
            filename = frame.f_code.co_filename
            if not filename.startswith("<"):  # one file imported by path and by name: one call site
                filename = os.path.realpath(filename)
            return str(module), f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "__main__", ""


def register(
    fn: T,
    *,
    inputs: Sequence[InputSpec],
    reference: Callable[..., Any],
    name: str | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float64, torch.float32),
    devices: Sequence[str] = ("cpu", "cuda"),
    double_backward: bool = True,
    surrogate: Callable[..., Any] | None = None,
    mutates: Sequence[str] = (),
    nondeterministic: bool = False,
    tolerances: Mapping[torch.dtype, Mapping[str, float]] | None = None,
    waivers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    saves: SavesPromise | None = None,
    dims: Sequence[Dim] = (),
    max_elements: int | None = None,
    max_examples: int | None = None,
    autotune: Any = None,
    fast_gradcheck: bool = False,
    compile: str | Sequence[str] = (),
) -> T:
    """Register ``fn`` for conformance testing: a ``torch.autograd.Function`` subclass, or a
    ``torch.library.custom_op`` with ``register_autograd`` (the object the decorator returns,
    or ``torch.ops.<ns>.<name>``). A custom op's arguments are the spec's inputs, in order.

    ``fast_gradcheck=True``: the gradcheck contract uses random projections (a few evaluations
    per example) at every size, not the full Jacobian below 256 elements: for a Function each
    evaluation of which is costly (an interpreted Triton kernel).

    ``compile``: what the Function promises under ``torch.compile`` beyond matching eager:
    ``"fullgraph"`` (it traces as one graph, so a graph break is a defect) and/or ``"dynamic"``
    (one graph serves every size, so a recompile is a defect). Without a promise both are advice.

    ``autotune``: an ``@triton.autotune`` kernel the Function launches (or several): every
    config of each is checked as its own test id, named ``<name>:<config>``, with the kernel
    pinned to that config (natively and under the interpreter, where it cannot benchmark).

    Returns ``fn`` unchanged, so it can be used after the class statement. Raises
    :class:`SpecError` naming the field when the spec cannot work.
    """
    keywords = dict(locals())
    del keywords["fn"]
    for one in make_specs(fn, **keywords):
        _add(one, one.origin, one.registered_at)
    return fn


def make_specs(fn: Any, /, **keywords: Any) -> list[Spec]:
    """The validated specs ``register(fn, **keywords)`` records (one, or one per autotune config),
    without recording them: what ``conformance.check(fn, **keywords)`` runs. Raises
    :class:`SpecError` as ``register`` does, and ``TypeError`` for a keyword ``register`` lacks."""
    unknown = sorted(set(keywords) - set(_REGISTER_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown register() keywords {unknown}; it takes {sorted(_REGISTER_DEFAULTS)}")
    missing = [k for k in ("inputs", "reference") if k not in keywords]
    if missing:
        raise TypeError(f"register() needs {' and '.join(f'{k}=' for k in missing)} for {fn!r}")
    options = {**_REGISTER_DEFAULTS, **keywords}
    name = options["name"]
    spec_name = name if name is not None else getattr(fn, "__name__", None) or getattr(fn, "_name", None) or repr(fn)
    origin, registered_at = _caller()
    # register()'s keywords are _build_spec's, but for name (spec_name), autotune (copies) and compile.
    passed = {k: v for k, v in options.items() if k not in ("name", "autotune", "compile", "tolerances", "waivers")}
    spec = _build_spec(
        fn, spec_name=spec_name, **passed, tolerances=options["tolerances"] or {}, waivers=options["waivers"] or {},
        compile_promises=options["compile"], origin=origin, registered_at=registered_at,
    )
    return _autotune_specs(spec, options["autotune"])


# register()'s keywords and their defaults (inputs and reference have none: required).
_REGISTER_DEFAULTS: dict[str, Any] = {
    name: (None if parameter.default is inspect.Parameter.empty else parameter.default)
    for name, parameter in inspect.signature(register).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
}


def _add(spec: Spec, origin: str, registered_at: str) -> None:
    for existing in _REGISTRY:
        if existing.name == spec.name:
            same_call = existing.registered_at == registered_at != "" and existing.display_name == spec.display_name
            if same_call:
                _REGISTRY.remove(existing)  # the same file imported again (by path or name): replace
                break
            raise SpecError(
                spec.name,
                "name",
                f"registered twice: for {existing.display_name} at {existing.registered_at or existing.origin} "
                f"and for {spec.display_name} at {registered_at or origin}; pass a distinct name= to one of them",
            )
    _REGISTRY.append(spec)


def _autotune_specs(spec: Spec, autotune: Any) -> list[Spec]:
    """``spec`` itself, or one copy per config of each autotuned kernel, pinned to it."""
    if autotune is None:
        return [spec]
    kernels = list(autotune) if isinstance(autotune, (list, tuple)) else [autotune]
    if not kernels:
        raise SpecError(spec.name, "autotune", "must be an @triton.autotune kernel or a list of them, got an empty list")
    specs = []
    for position, kernel in enumerate(kernels):
        try:
            configs = autotuned_configs(kernel)
        except ValueError as error:
            raise SpecError(spec.name, "autotune", str(error)) from None
        for index, config in enumerate(configs):
            described = describe_config(config)
            compact = "-".join(part.replace("=", "").replace("num_warps", "w").replace("num_stages", "s").replace("num_ctas", "ctas")
                               for part in described.split(", "))
            prefix = f"k{position}." if len(kernels) > 1 else ""
            suffix = prefix + (compact if NAME.match(compact) else f"cfg{index}")
            kernel_name = getattr(getattr(kernel, "fn", None), "__name__", "kernel")
            specs.append(replace(
                spec,
                name=f"{spec.name}:{suffix}",
                autotune_pin=(kernel, index),
                autotune_config=f"autotune config {index + 1} of {len(configs)} of {kernel_name}: {described}",
            ))
    return specs


def _build_spec(
    fn: Any,
    *,
    spec_name: Any,
    inputs: Any,
    reference: Any,
    dtypes: Any,
    devices: Any,
    double_backward: Any,
    surrogate: Any,
    mutates: Any,
    nondeterministic: Any,
    tolerances: Any,
    origin: str,
    waivers: Any = None,
    timeout: Any = None,
    saves: Any = None,
    dims: Any = (),
    max_elements: Any = None,
    max_examples: Any = None,
    fast_gradcheck: Any = False,
    compile_promises: Any = (),
    registered_at: str = "",
) -> Spec:
    """The validated :class:`Spec` (not registered); raises :class:`SpecError` naming the first
    bad field, checked in a fixed order."""
    shown = str(spec_name)

    def fail(field_name: str, problem: str) -> SpecError:
        return SpecError(shown, field_name, problem)

    check_spec_name(spec_name, fail)
    op = _adapt(fn, fail)
    inputs = check_inputs(inputs, fail)
    dim_rules = compile_dim_rules(inputs, dims, fail)
    check_references(reference, surrogate, fail)
    check_arity(op, inputs, reference, surrogate, fail)
    check_dtypes(dtypes, fail)
    check_devices(devices, fail)
    check_flags(
        {"double_backward": double_backward, "nondeterministic": nondeterministic, "fast_gradcheck": fast_gradcheck}, fail
    )
    check_mutates(mutates, inputs, fail)
    check_tolerances(tolerances, dtypes, fail)
    waivers = check_waivers(waivers, fail)
    check_timeout(timeout, fail)
    check_saves(saves, fail)
    check_budgets({"max_elements": max_elements, "max_examples": max_examples}, fail)
    check_declared_mutations(op, mutates, fail)
    promises = check_compile_promises(compile_promises, fail)
    return Spec(
        op=op,
        fn=op.function,
        name=spec_name,
        inputs=inputs,
        reference=reference,
        dtypes=tuple(dtypes),
        devices=tuple(devices),
        double_backward=double_backward,
        surrogate=surrogate,
        mutates=tuple(mutates),
        nondeterministic=nondeterministic,
        tolerances={dtype: dict(ks) for dtype, ks in tolerances.items()},
        waivers=dict(waivers),
        timeout=float(timeout) if timeout is not None else None,
        saves=saves,
        dim_rules=dim_rules,
        max_elements=max_elements,
        max_examples=max_examples,
        fast_gradcheck=fast_gradcheck,
        compile_promises=promises,
        origin=origin,
        registered_at=registered_at,
        source_file=_source_file(sys.modules.get(op.module)),
    )


def _adapt(fn: Any, fail: Callable[[str, str], SpecError]) -> OpAdapter:
    try:
        return adapt(fn)
    except TypeError as error:
        raise fail("fn", str(error)) from None


def _source_file(module: Any) -> str:
    try:
        return inspect.getsourcefile(module) or ""
    except TypeError:
        return ""
