"""Validators: one per input kind, one per group of ``register`` fields, and the dims compiler.

Each is made of the small checks of :mod:`conformance.spec.checks` and raises
:class:`~conformance.spec.checks.SpecError` (through ``fail``) naming the field and echoing the
bad value. :func:`conformance.spec.registry._build_spec` runs them in a fixed order, so a spec
with several mistakes always reports the same one first.
"""

from __future__ import annotations

import functools
import keyword
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from hypothesis.errors import HypothesisSideeffectWarning

from conformance.spec.checks import (
    NAME,
    Fail,
    check_bool,
    check_callable,
    check_listed,
    check_optional_count,
    check_sequence,
    is_count,
    is_identifier,
    is_int,
    is_number,
    is_real,
    is_strategy,
)
from conformance.spec.dims import Dim, DimConflict, DimRule, dim_bounds, rule_order
from conformance.spec.inputs import (
    DOMAINS,
    INPUT_KINDS,
    NO_VALUE,
    Derived,
    Index,
    Mask,
    Offsets,
    Scalar,
    Shaped,
    Tensor,
)
from conformance.spec.shapes import ShapeSpec, parse_shape
from conformance.spec.spec import (
    DEFAULT_TOLERANCES,
    DEVICES,
    FLOAT64_TOLERANCE_KEYS,
    MAX_FLOAT64_TOLERANCE,
    MAX_FLOOR_ULPS,
    MAX_TOLERANCE,
    SAVES_CHOICES,
    SUPPORTED_DTYPES,
    WAIVABLE,
)
from conformance.spec.targets import OpAdapter, positional_arity

__all__ = [
    "check_arity",
    "check_budgets",
    "check_declared_mutations",
    "check_devices",
    "check_dtypes",
    "check_flags",
    "check_inputs",
    "check_mutates",
    "check_references",
    "check_saves",
    "check_spec_name",
    "check_timeout",
    "check_tolerances",
    "check_waivers",
    "compile_dim_rules",
    "validate_input",
]


# --------------------------------------------------------------------------- shared by inputs


def check_shape(spec_input: Shaped, fail: Fail, where: str) -> ShapeSpec:
    """The input's shape string parses."""
    try:
        return parse_shape(spec_input.shape)
    except ValueError as error:
        raise fail(f"{where}.shape", f"malformed shape string: {error}") from None


def check_broadcast(spec_input: Shaped, broadcast: Any, broadcastable: bool, fail: Fail, where: str) -> None:
    """``broadcast=`` names dims of the input's shape (and is not given with ``broadcastable``)."""
    if broadcast is None:
        return
    if broadcastable:
        raise fail(f"{where}.broadcast", "give broadcast='<dims>' or broadcastable=True, not both")
    if not isinstance(broadcast, str) or not broadcast.split():
        raise fail(f"{where}.broadcast", f"must name the dims that may broadcast, e.g. 'b', got {broadcast!r}")
    parsed = parse_shape(spec_input.shape)
    known = {str(d) for d in parsed.dims if not isinstance(d, int)} | ({f"*{parsed.batch}"} if parsed.batch else set())
    known |= {str(d) for d in parsed.dims if isinstance(d, int)}
    for token in broadcast.split():
        if token not in known:
            raise fail(f"{where}.broadcast", f"{token!r} is not a dim of shape {spec_input.shape!r} (dims: {sorted(known)})")


def check_domain(domain: Any, fail: Fail, where: str) -> None:
    """One of :data:`DOMAINS` or a finite ``(low, high)`` tuple with ``low < high``."""
    if isinstance(domain, str):
        if domain not in DOMAINS:
            raise fail(where, f"unknown domain {domain!r}; use one of {DOMAINS} or a (low, high) tuple")
        return
    if (
        isinstance(domain, tuple)
        and len(domain) == 2
        and all(isinstance(b, (int, float)) and math.isfinite(b) for b in domain)
        and domain[0] < domain[1]
    ):
        return
    raise fail(where, f"unknown domain {domain!r}; use one of {DOMAINS} or a finite (low, high) tuple with low < high")


def check_kinks(kinks: Any, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    """Finite numbers, or names of Scalar inputs (``"-name"``) whose value is a finite number."""
    check_sequence(
        kinks, fail, where, f"must be a tuple of kink locations (numbers, or names of Scalar inputs), got {kinks!r}",
        kinds=(tuple, list),
    )
    scalars = {i.name: i for i in inputs if isinstance(i, Scalar)}
    for kink in kinks:
        if isinstance(kink, str):
            name = kink.removeprefix("-")
            if name not in scalars:
                raise fail(where, f"{kink!r} names no Scalar input (Scalar inputs: {sorted(scalars)})")
            value = scalars[name].value
            if scalars[name].from_case is None and not is_strategy(value) and not is_real(value):
                raise fail(where, f"{kink!r} refers to Scalar {name!r} = {value!r}, which is not a finite number")
        elif not is_real(kink):
            raise fail(where, f"kink {kink!r} is not a finite number or the name of a Scalar input")


def check_strategy(scalar: Scalar, fail: Fail, where: str) -> None:
    """A strategy must be valid and able to draw a value: Hypothesis would otherwise fail every
    test of the spec at run time, each with a long traceback."""
    if not is_strategy(scalar.value):
        return
    try:
        # Validated at register(), usually while pytest loads --impl: Hypothesis warns about
        # evaluating a lazy strategy during plugin start-up, once per strategy, for a check
        # made on purpose (a clear spec error now, not a Hypothesis error mid-run).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HypothesisSideeffectWarning)
            scalar.value.validate()
            empty = scalar.value.is_empty
    except Exception as error:
        raise fail(
            where, f"Scalar {scalar.name!r}: the strategy {scalar.value!r} is invalid: {type(error).__name__}: {error}"
        ) from None
    if empty:
        raise fail(
            where,
            f"Scalar {scalar.name!r}: the strategy {scalar.value!r} can never draw a value; "
            "pass a strategy that does, or a constant",
        )


# --------------------------------------------------------------------------- one validator per input kind


def _not_an_input(value: Any) -> str:
    return f"{value!r} is not a Tensor, Scalar, Mask, AdditiveMask, Index, Derived or Offsets"


@functools.singledispatch
def validate_input(spec_input: Any, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    """Check one input of its kind (``inputs``: all of the spec's, for cross-references)."""
    raise fail(where, _not_an_input(spec_input))


@validate_input.register
def _validate_tensor(spec_input: Tensor, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    check_shape(spec_input, fail, where)
    check_domain(spec_input.domain, fail, f"{where}.domain")
    check_kinks(spec_input.kinks, inputs, fail, f"{where}.kinks")
    check_bool(spec_input.requires_grad, fail, f"{where}.requires_grad")
    check_broadcast(spec_input, spec_input.broadcast, spec_input.broadcastable, fail, where)


@validate_input.register
def _validate_mask(spec_input: Mask, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    check_shape(spec_input, fail, where)  # AdditiveMask too


@validate_input.register
def _validate_index(spec_input: Index, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    check_shape(spec_input, fail, where)
    high = spec_input.high
    if not is_identifier(high) and not is_count(high, 1):
        raise fail(f"{where}.high", f"{high!r} must be a dim name or a positive int")
    sentinels = spec_input.sentinels
    check_sequence(sentinels, fail, f"{where}.sentinels", f"must be a tuple of ints, got {sentinels!r}", kinds=(tuple, list))
    for sentinel in sentinels:
        if not is_int(sentinel):
            raise fail(f"{where}.sentinels", f"{sentinel!r} is not an int")
        if sentinel >= 0 and (isinstance(high, str) or sentinel < high):
            raise fail(f"{where}.sentinels", f"{sentinel!r} could be a valid index in [0, {high}); use a negative value")


@validate_input.register
def _validate_scalar(spec_input: Scalar, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    if spec_input.from_case is not None:
        if spec_input.value is not NO_VALUE:
            raise fail(f"{where}.from_case", f"Scalar {spec_input.name!r}: give a value or from_case, not both")
        check_callable(spec_input.from_case, fail, f"{where}.from_case", prefix=f"Scalar {spec_input.name!r}: ")
        return
    if spec_input.value is NO_VALUE:
        raise fail(f"{where}.value", f"Scalar {spec_input.name!r} needs a value (a constant or a strategy) or from_case=")
    check_strategy(spec_input, fail, f"{where}.value")


@validate_input.register
def _validate_offsets(spec_input: Offsets, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    for field_name in ("sequences", "total"):
        value = getattr(spec_input, field_name)
        if not is_identifier(value):
            raise fail(f"{where}.{field_name}", f"must be a dim name, got {value!r}")
    if spec_input.sequences == spec_input.total:
        raise fail(f"{where}.total", f"must differ from sequences={spec_input.sequences!r}")
    if not any(isinstance(i, Shaped) and spec_input.total in i.parsed.names for i in inputs):
        raise fail(f"{where}.total", f"{spec_input.total!r} is not a dim of any tensor input (the packed dim, e.g. 't h d')")


@validate_input.register
def _validate_derived(spec_input: Derived, inputs: Sequence[Any], fail: Fail, where: str) -> None:
    check_callable(spec_input.fn, fail, f"{where}.fn", hint=" (ctx -> tensor of ctx.shape)")
    check_shape(spec_input, fail, where)
    check_bool(spec_input.requires_grad, fail, f"{where}.requires_grad")
    check_broadcast(spec_input, spec_input.broadcast, False, fail, where)
    if spec_input.seed_from is not None:
        earlier = [i.name for i in inputs[: list(inputs).index(spec_input)] if isinstance(i, Derived)]
        if spec_input.seed_from not in earlier:
            raise fail(f"{where}.seed_from", f"{spec_input.seed_from!r} is not an earlier Derived input (have {earlier})")


# --------------------------------------------------------------------------- register's fields


def check_spec_name(spec_name: Any, fail: Fail) -> None:
    if not isinstance(spec_name, str) or not spec_name or not NAME.match(spec_name):
        raise fail("name", f"{spec_name!r} must be a non-empty string of letters, digits and _.:+-")


def check_inputs(inputs: Any, fail: Fail) -> tuple[Any, ...]:
    """Every input of a known kind, validly and distinctly named, and valid of its kind; returned
    as a tuple, with each Tensor's kinks and each Index's sentinels made tuples."""
    check_sequence(inputs, fail, "inputs", f"must be a list of Tensor/Scalar/Mask/Index/Derived/Offsets/AdditiveMask, got {inputs!r}")
    inputs = tuple(inputs)
    seen: set[str] = set()
    for position, spec_input in enumerate(inputs):
        where = f"inputs[{position}]"
        if not isinstance(spec_input, INPUT_KINDS):
            raise fail(where, _not_an_input(spec_input))
        name = spec_input.name
        if not is_identifier(name) or keyword.iskeyword(name):
            raise fail(f"{where}.name", f"{name!r} is not a valid argument name")
        if name in seen:
            raise fail(f"{where}.name", f"duplicate argument name {name!r}")
        seen.add(name)
        validate_input(spec_input, inputs, fail, where)
    return tuple(_with_tuples(i) for i in inputs)


def _with_tuples(spec_input: Any) -> Any:
    if isinstance(spec_input, Tensor):
        return replace(spec_input, kinks=tuple(spec_input.kinks))
    if isinstance(spec_input, Index):
        return replace(spec_input, sentinels=tuple(spec_input.sentinels))
    return spec_input


def check_references(reference: Any, surrogate: Any, fail: Fail) -> None:
    check_callable(reference, fail, "reference")
    if surrogate is not None:
        check_callable(surrogate, fail, "surrogate")


def check_arity(op: OpAdapter, inputs: tuple[Any, ...], reference: Any, surrogate: Any, fail: Fail) -> None:
    """The target, the reference and the surrogate each take as many arguments as the spec lists."""
    arity = op.arity()
    if arity is not None:
        required, maximum = arity
        if not required <= len(inputs) <= maximum:
            function = op.kind == "autograd.Function"
            expected = f"{required}" if required == maximum else f"{required}..{maximum}"
            raise fail(
                "inputs",
                f"{op.display_name}{'.forward' if function else ''} takes {expected} arguments"
                f"{' after ctx' if function else ''}, "
                f"but the spec lists {len(inputs)}: {[i.name for i in inputs]}",
            )
    for field_name, func in (("reference", reference), ("surrogate", surrogate)):
        if func is None:
            continue
        arity = positional_arity(func, skip=0)
        if arity is not None and not arity[0] <= len(inputs) <= arity[1]:
            raise fail(field_name, f"takes {arity[0]}..{arity[1]} positional arguments, but the spec lists {len(inputs)}")


def check_dtypes(dtypes: Any, fail: Fail) -> None:
    check_sequence(
        dtypes, fail, "dtypes", f"must be a non-empty sequence of float dtypes, got {dtypes!r}",
        exclude=torch.dtype, non_empty=True,
    )
    for dtype in dtypes:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise fail("dtypes", f"{dtype!r} is not a floating-point torch.dtype")
        check_listed(dtype, SUPPORTED_DTYPES, fail, "dtypes", f"{dtype!r} is not supported; use float64, float32, float16 or bfloat16")


def check_devices(devices: Any, fail: Fail) -> None:
    check_sequence(
        devices, fail, "devices", f"must be a non-empty sequence drawn from {DEVICES}, got {devices!r}",
        exclude=str, non_empty=True,
    )
    for device in devices:
        check_listed(device, DEVICES, fail, "devices", f"{device!r} is not one of {DEVICES}")


def check_flags(flags: Mapping[str, Any], fail: Fail) -> None:
    """Each named flag is True or False."""
    for flag_name, flag in flags.items():
        check_bool(flag, fail, flag_name)


def check_mutates(mutates: Any, inputs: tuple[Any, ...], fail: Fail) -> None:
    if isinstance(mutates, str):
        raise fail("mutates", f"must be a sequence of input names, got the string {mutates!r}")
    tensor_names = {i.name for i in inputs if isinstance(i, Tensor)}
    for mutated in mutates:
        if mutated not in tensor_names:
            raise fail("mutates", f"{mutated!r} is not the name of a Tensor input (have {sorted(tensor_names)})")


def check_tolerances(tolerances: Any, dtypes: Any, fail: Fail) -> None:
    """``{dtype: {"output": k, "grad": k, "floor_ulps": n}}`` for dtypes of the spec."""
    if not isinstance(tolerances, Mapping):
        raise fail("tolerances", f"must map dtype -> {{'output': k, 'grad': k}}, got {tolerances!r}")
    for dtype, ks in tolerances.items():
        check_listed(dtype, dtypes, fail, "tolerances", f"{dtype!r} is not one of the spec's dtypes {tuple(dtypes)}")
        if not isinstance(ks, Mapping):
            raise fail("tolerances", f"tolerances[{dtype}] must be a mapping, got {ks!r}")
        for key, k in ks.items():
            _check_tolerance(dtype, key, k, fail)


def _check_tolerance(dtype: Any, key: Any, k: Any, fail: Fail) -> None:
    if key in FLOAT64_TOLERANCE_KEYS:
        if dtype != torch.float64:
            raise fail(
                "tolerances", f"tolerances[{dtype}][{key!r}]: rtol and atol are for torch.float64 only (results approximate "
                "by design); other dtypes take 'output' and 'grad' multipliers of the reference's own error",
            )
        if not is_number(k) or not 0 < k <= MAX_FLOAT64_TOLERANCE:
            raise fail("tolerances", f"tolerances[{dtype}][{key!r}] = {k!r} must be a number in (0, {MAX_FLOAT64_TOLERANCE}]")
        return
    if key == "floor_ulps":
        if not is_count(k, 1) or k > MAX_FLOOR_ULPS:
            raise fail("tolerances", f"tolerances[{dtype}]['floor_ulps'] = {k!r} must be an int in [1, {MAX_FLOOR_ULPS}]")
        return
    check_listed(
        key, tuple(DEFAULT_TOLERANCES), fail, "tolerances",
        f"tolerances[{dtype}] key {key!r} is not one of {(*DEFAULT_TOLERANCES, 'floor_ulps', *FLOAT64_TOLERANCE_KEYS)}",
    )
    if not is_number(k) or not 0 < k <= MAX_TOLERANCE:
        raise fail("tolerances", f"tolerances[{dtype}][{key!r}] = {k!r} must be a number in (0, {MAX_TOLERANCE}]")


def check_waivers(waivers: Any, fail: Fail) -> Mapping[str, str]:
    """``{contract: reason}`` for waivable contracts (None: no waivers); returned as given."""
    if waivers is None:
        waivers = {}
    if not isinstance(waivers, Mapping):
        raise fail("waivers", f"must map a contract name to the reason it does not apply, got {waivers!r}")
    for contract, reason in waivers.items():
        check_listed(
            contract, WAIVABLE, fail, "waivers",
            f"{contract!r} cannot be waived; waivable contracts: {WAIVABLE} (correctness contracts never are)",
        )
        if not isinstance(reason, str) or not reason.strip():
            raise fail("waivers", f"waivers[{contract!r}] must be a non-empty reason, got {reason!r}")
    return waivers


COMPILE_PROMISES = ("fullgraph", "dynamic")


def check_compile_promises(promises: Any, fail: Fail) -> frozenset[str]:
    """``compile=``: "fullgraph", "dynamic", or a sequence of them; returned as a frozenset."""
    given = (promises,) if isinstance(promises, str) else promises
    if not isinstance(given, (tuple, list, set, frozenset)):
        raise fail("compile", f"must be one of {COMPILE_PROMISES} or a sequence of them, got {promises!r}")
    for promise in given:
        check_listed(
            promise, COMPILE_PROMISES, fail, "compile",
            f"{promise!r} is not a torch.compile promise; choose from {COMPILE_PROMISES} (e.g. compile='fullgraph')",
        )
    return frozenset(given)


def check_timeout(timeout: Any, fail: Fail) -> None:
    if timeout is not None and (not is_number(timeout) or not 0 < timeout < math.inf):
        raise fail("timeout", f"must be a positive number of seconds per example (or None), got {timeout!r}")


def check_saves(saves: Any, fail: Fail) -> None:
    if saves is not None and not callable(saves) and saves not in SAVES_CHOICES:
        raise fail(
            "saves",
            f"must be one of {SAVES_CHOICES} or a callable (input tensors by name -> bytes allowed beyond the "
            f"inputs and outputs), got {saves!r}",
        )


def check_budgets(budgets: Mapping[str, Any], fail: Fail) -> None:
    """Each named budget is a positive int or None."""
    for field_name, budget in budgets.items():
        check_optional_count(
            budget, fail, field_name, low=1, problem=f"must be a positive int (or None for the run's), got {budget!r}"
        )


def check_declared_mutations(op: OpAdapter, mutates: Any, fail: Fail) -> None:
    """The arguments the target's schema says it mutates are all listed in ``mutates=``."""
    declared = op.mutated_arguments() or ()
    undeclared = [m for m in declared if m not in mutates]
    if undeclared:
        raise fail("mutates", f"{op.display_name} mutates {undeclared} (its schema says so): list them in mutates=")


# --------------------------------------------------------------------------- dims


def compile_dim_rules(inputs: tuple[Any, ...], dims: Any, fail: Fail) -> dict[str, DimRule]:
    """Per-dim rules from ``Dim(...)`` declarations and ``name:even`` shape annotations."""
    used = {name for i in inputs for name in i.dims_used()}
    multiples: dict[str, int] = {}
    for spec_input in inputs:
        if isinstance(spec_input, Shaped):
            for name, step in spec_input.parsed.multiples:
                multiples[name] = math.lcm(multiples.get(name, 1), step)
    declared = _declared_dims(dims, used, fail)
    rules: dict[str, DimRule] = {}
    for name in sorted(used | set(declared)):
        dim = declared.get(name, Dim(name))
        where = f"dims[{list(declared).index(name)}]" if name in declared else f"inputs (dim {name!r})"
        check_dim(dim, used, fail, where)
        rule = _rule_of(dim, multiples.get(name, 1), fail, where)
        if rule != DimRule():
            rules[name] = rule
    _check_relations(tuple(sorted(used)), rules, declared, multiples, fail)
    return rules


def _check_relations(
    names: tuple[str, ...], rules: dict[str, DimRule], declared: dict[str, Dim], multiples: dict[str, int], fail: Fail
) -> None:
    """Rules that hold one by one but not together (``Dim("f", multiple_of=2, max_size="n")``
    with ``Dim("n", max_size=1)``) are an error naming every dim involved."""
    try:
        rule_order(names, rules)
    except DimConflict as conflict:  # a cycle: no one dim is at fault
        raise fail("dims", f"{_shown(conflict, declared, multiples)}: {conflict}") from None
    try:
        dim_bounds(names, rules, run_min=1)
    except DimConflict as conflict:
        where = next((f"dims[{list(declared).index(name)}]" for name in conflict.dims if name in declared), "dims")
        raise fail(where, f"{_shown(conflict, declared, multiples)}: {conflict}") from None


def _shown(conflict: DimConflict, declared: dict[str, Dim], multiples: dict[str, int]) -> str:
    """The declarations of the dims in ``conflict``, as written (and the shapes' multiples)."""
    shown = [repr(declared[name]) for name in conflict.dims if name in declared]
    shown += [f"{name!r} a multiple of {multiples[name]} (shape)" for name in conflict.dims if multiples.get(name, 1) > 1]
    return ", ".join(shown)


def _declared_dims(dims: Any, used: set[str], fail: Fail) -> dict[str, Dim]:
    check_sequence(dims, fail, "dims", f"must be a list of Dim(...), got {dims!r}")
    declared: dict[str, Dim] = {}
    for position, dim in enumerate(dims):
        where = f"dims[{position}]"
        if not isinstance(dim, Dim):
            raise fail(where, f"{dim!r} is not a Dim")
        if dim.name not in used:
            raise fail(f"{where}.name", f"{dim.name!r} is not a dim of any input (dims: {sorted(used)})")
        if dim.name in declared:
            raise fail(f"{where}.name", f"dim {dim.name!r} declared twice")
        declared[dim.name] = dim
    return declared


def _rule_of(dim: Dim, multiple: int, fail: Fail, where: str) -> DimRule:
    at_most = dim.max_size if isinstance(dim.max_size, str) else None
    try:
        return DimRule(
            min_size=dim.min_size,
            max_size=dim.max_size if not isinstance(dim.max_size, str) else None,
            multiple_of=math.lcm(dim.multiple_of, multiple),
            block_sizes=tuple(dim.block_sizes) if dim.block_sizes is not None else None,
            at_most=at_most,
        )
    except Exception as error:  # bounds that leave no legal size (hypothesis' InvalidArgument)
        shape = f" (a multiple of {multiple} in a shape)" if multiple > 1 else ""
        raise fail(where, f"{dim!r}{shape}: {error}") from None


def check_dim(dim: Dim, used: set[str], fail: Fail, where: str) -> None:
    """One dim's fields: bounds (``max_size`` may name another dim), multiple, blocks."""
    check_optional_count(
        dim.min_size, fail, f"{where}.min_size", low=0,
        problem=f"must be an int >= 0 (0 allows zero-size dims) or None, got {dim.min_size!r}",
    )
    if isinstance(dim.max_size, str):
        if dim.max_size not in used:
            raise fail(f"{where}.max_size", f"{dim.max_size!r} is not a dim of any input (dims: {sorted(used)})")
        if dim.max_size == dim.name:
            raise fail(f"{where}.max_size", f"dim {dim.name!r} cannot be bounded by itself")
    else:
        check_optional_count(
            dim.max_size, fail, f"{where}.max_size", low=1,
            problem=f"must be an int >= 1, another dim's name or None, got {dim.max_size!r}",
        )
    if not is_count(dim.multiple_of, 1):
        raise fail(f"{where}.multiple_of", f"must be an int >= 1, got {dim.multiple_of!r}")
    blocks = dim.block_sizes
    if blocks is not None:
        check_sequence(
            blocks, fail, f"{where}.block_sizes", f"must be a tuple of ints >= 2 (or None for the run's), got {blocks!r}",
            kinds=(tuple, list),
        )
        if not all(is_count(b, 2) for b in blocks):
            raise fail(f"{where}.block_sizes", f"must be a tuple of ints >= 2 (or None for the run's), got {blocks!r}")
