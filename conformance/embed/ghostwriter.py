"""The spec ghostwriter behind ``python -m conformance write``: a ready-to-edit ``register(...)``
module for a Function, inferred from one example call and a few trial calls.

From the example it infers each input's kind (a floating tensor, a bool mask, integer indices,
cumulative offsets, a Scalar), dim names (equal sizes share one; leading dims every rank-max input
shares become ``*batch`` when forward accepts another one), an Index's bound and sentinels; from
trial calls, which inputs get gradients, the dtypes forward accepts, whether double backward runs
and which inputs forward changes in place. Each guess carries a comment saying what it came from.
The reference is a stub that raises until written: never the Function itself, which would make
every numerical contract compare the Function with itself.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conformance.plugin.devices import choose_triton_interpreter

__all__ = ["GhostwriterError", "load_target", "parse_example", "write_spec"]

TRIED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
DIM_NAMES = ("n", "m", "d", "k", "e", "f", "g", "h", "p", "q", "r", "u", "w", "z")


class GhostwriterError(ValueError):
    """The target or the example cannot be used; the message says which value and why."""


# ----------------------------------------------------------------------------- the target and example


def load_target(text: str) -> tuple[Any, str, str]:
    """``"pkg.module:Name"`` -> (the object, its module, its name)."""
    module_name, colon, attribute = text.partition(":")
    if not colon or not module_name or not attribute.isidentifier():
        raise GhostwriterError(f"target {text!r} is not module:Name; pass e.g. mypkg.kernels:RMSNormFunction")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise GhostwriterError(f"target {text!r}: cannot import {module_name!r} ({error})") from None
    if not hasattr(module, attribute):
        raise GhostwriterError(f"target {text!r}: module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute), module_name, attribute


def parse_example(text: str) -> dict[str, Any]:
    """``"x=torch.randn(4, 8), causal=True"`` -> {name: value}, evaluated with torch and math."""
    try:
        values = eval(f"dict({text})", {"torch": torch, "math": math})  # the user's own expression
    except Exception as error:
        raise GhostwriterError(f"example {text!r} is not name=value, ...: {type(error).__name__}: {error}") from None
    if not values:
        raise GhostwriterError(f"example {text!r} names no argument; pass e.g. --example \"x=torch.randn(4, 8)\"")
    return dict(values)


def parameters_of(target: Any) -> list[inspect.Parameter]:
    """The arguments the target is called with (an autograd.Function's forward without ctx)."""
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return list(inspect.signature(target.forward).parameters.values())[1:]
    return list(inspect.signature(getattr(target, "_init_fn", target)).parameters.values())


def call_target(target: Any, args: Sequence[Any]) -> Any:
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return target.apply(*args)  # type: ignore[no-untyped-call]
    return target(*args)


# ----------------------------------------------------------------------------- inference


@dataclass
class Written:
    """One input's line: its constructor call and the comment saying where it came from."""

    name: str
    call: str
    why: str


@dataclass
class Inference:
    target: Any
    names: list[str]
    values: list[Any]
    dim_of_size: dict[int, str] = field(default_factory=dict)
    users: dict[str, list[str]] = field(default_factory=dict)  # dim -> the inputs whose shapes use it
    repeated: dict[str, list[str]] = field(default_factory=dict)  # dim -> inputs using it twice in one shape
    batch: tuple[int, ...] = ()  # the leading sizes that become *batch
    notes: list[str] = field(default_factory=list)

    def tensor_positions(self, floating: bool | None = None) -> list[int]:
        return [
            i for i, v in enumerate(self.values)
            if isinstance(v, torch.Tensor) and (floating is None or v.is_floating_point() == floating)
        ]

    def dim(self, size: int) -> str:
        if size not in self.dim_of_size:
            taken = set(self.dim_of_size.values()) | set(self.names)
            pool = [*DIM_NAMES, *(f"{n}{i}" for i in range(1, 10) for n in DIM_NAMES)]
            self.dim_of_size[size] = next(n for n in pool if n not in taken)
        return self.dim_of_size[size]

    def shape_text(self, name: str, value: torch.Tensor, batched: bool) -> str:
        sizes = tuple(value.shape)[len(self.batch):] if batched else tuple(value.shape)
        dims = [self.dim(s) for s in sizes]
        for dim in {d for d in dims if dims.count(d) > 1}:
            if name not in self.repeated.setdefault(dim, []):
                self.repeated[dim].append(name)
        for dim in dims:
            if name not in self.users.setdefault(dim, []):
                self.users[dim].append(name)
        return " ".join(["*batch", *dims] if batched else dims)

    def call(self, values: Sequence[Any]) -> Any:
        return call_target(self.target, values)


def _bound_values(target: Any, example: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """The example's values in the target's argument order (defaults filled in)."""
    parameters = [p for p in parameters_of(target) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in parameters]
    unknown = [k for k in example if k not in names]
    if unknown:
        raise GhostwriterError(f"example names {unknown}, which the target does not take; it takes {names}")
    values = []
    for parameter in parameters:
        if parameter.name in example:
            values.append(example[parameter.name])
        elif parameter.default is not inspect.Parameter.empty:
            values.append(parameter.default)
        else:
            raise GhostwriterError(f"example gives no value for {parameter.name!r}; the target takes {names}")
    return names, values


def _leading_batch(inference: Inference) -> tuple[int, ...]:
    """Leading sizes that every floating tensor of the largest rank shares, that no lower-rank
    tensor uses, leaving the trailing dims a lower-rank floating input lines up with (else two from
    rank 3, one below)."""
    floating = [inference.values[i] for i in inference.tensor_positions(floating=True)]
    if not floating:
        return ()
    rank = max(v.dim() for v in floating)
    top = [v for v in floating if v.dim() == rank]
    others = {s for v in inference.values if isinstance(v, torch.Tensor) and v.dim() < rank for s in v.shape}
    others |= {t for v in inference.values if isinstance(v, torch.Tensor) and (t := _offsets_total(v, inference)) is not None}
    lower = [v.dim() for v in floating if v.dim() < rank]
    # Trailing dims a lower-rank input lines up with (an RMSNorm's weight: 1) stay; else two from rank 3 (s d).
    keep = max(1, max(lower)) if lower else (2 if rank >= 3 else 1)
    prefix: list[int] = []
    for position in range(rank - keep):
        sizes = {v.shape[position] for v in top}
        if len(sizes) != 1 or next(iter(sizes)) in others:
            break
        prefix.append(next(iter(sizes)))
    return tuple(prefix)


def _accepts_another_batch_dim(inference: Inference) -> bool:
    """Whether forward runs with one more leading dim on every batched input (the Function may
    hard-code its rank, as many do)."""
    rank = max(inference.values[i].dim() for i in inference.tensor_positions(floating=True))
    stacked = [
        torch.stack([v, v]) if isinstance(v, torch.Tensor) and v.dim() == rank and tuple(v.shape[: len(inference.batch)]) == inference.batch
        else v
        for v in inference.values
    ]
    try:
        with torch.no_grad():
            inference.call(stacked)
    except Exception:
        return False
    return True


def _offsets_total(value: torch.Tensor, inference: Inference) -> int | None:
    """cu_seqlens: a 1-D int32/int64 tensor from 0, non-decreasing, whose last entry is a size of a
    floating input: that size (the packed total)."""
    if value.dim() != 1 or value.numel() < 2 or value.dtype not in (torch.int32, torch.int64):
        return None
    entries = value.tolist()
    if entries[0] != 0 or any(b < a for a, b in itertools.pairwise(entries)):
        return None
    sizes = {s for i in inference.tensor_positions(floating=True) for s in inference.values[i].shape}
    return int(entries[-1]) if entries[-1] in sizes else None


def _index_line(name: str, value: torch.Tensor, inference: Inference, batched: bool) -> Written:
    shape = inference.shape_text(name, value, batched)
    scalars = {v for v in inference.values if isinstance(v, int) and not isinstance(v, bool)}
    entries = {int(v) for v in value.flatten().tolist()}
    sentinels = sorted({v for v in entries if v < 0} | (entries & {s for s in scalars if s < 0}))
    top = max((v for v in entries if v >= 0), default=0)
    own = set(value.shape)
    candidates = sorted(s for s in inference.dim_of_size if s > top)
    outside = [s for s in candidates if s not in own]
    chosen = (outside or candidates)[0] if (outside or candidates) else None  # the tightest bound
    if chosen is None:
        high: str = str(top + 1)
        why = f"from {name}: {tuple(value.shape)} {value.dtype}, values up to {top}; TODO: the bound (no dim is larger)"
    else:
        high = repr(inference.dim(chosen))
        why = f"from {name}: {tuple(value.shape)} {value.dtype}, values in [0, {top}] < {chosen} = dim {inference.dim(chosen)}"
        others = [inference.dim(s) for s in (outside or candidates)[1:]]
        if others:
            why += f"; TODO: or {', '.join(others)} (larger dims fit too)"
    extra = ""
    if sentinels:
        extra = f", sentinels={tuple(sentinels)!r}"
        why += f"; {sentinels} marked special (negative values, or equal to an int argument)"
    return Written(name, f"Index({name!r}, {shape!r}, high={high}{extra})", why)


def _scalar_line(name: str, value: Any, inference: Inference, position: int) -> Written:
    if isinstance(value, bool):
        other = list(inference.values)
        other[position] = not value
        try:
            with torch.no_grad():
                inference.call(other)
        except Exception as error:
            return Written(name, f"Scalar({name!r}, {value!r})", f"a bool; forward raised with {not value} ({type(error).__name__})")
        return Written(name, f"Scalar({name!r}, st.booleans())", "a bool: forward ran with True and with False")
    if isinstance(value, (int, float)):
        kind = type(value).__name__
        return Written(name, f"Scalar({name!r}, {value!r})", f"{'an' if kind == 'int' else 'a'} {kind} of the example; TODO: a strategy if other values are valid "
                       f"(st.{'integers' if kind == 'int' else 'floats'}(...))")
    return Written(name, f"Scalar({name!r}, {value!r})", f"a {type(value).__name__} of the example; TODO: st.sampled_from([...]) of its valid values")


def _differentiable(inference: Inference) -> dict[int, bool]:
    """Which floating inputs get a gradient: one backward with all of them requiring grad."""
    positions = inference.tensor_positions(floating=True)
    leaves = {i: inference.values[i].detach().clone().requires_grad_(True) for i in positions}
    args = [leaves[i].clone() if i in leaves else v for i, v in enumerate(inference.values)]  # clones: in-place safe
    outputs = _floating_outputs(inference.call(args))
    if not outputs:
        raise GhostwriterError("forward returned no floating tensor on the example: nothing to differentiate")
    total = sum((o.float().sum() for o in outputs if o.requires_grad), torch.zeros(()))
    if not total.requires_grad:
        return dict.fromkeys(positions, False)
    grads = torch.autograd.grad(total, [leaves[i] for i in positions], allow_unused=True)
    return {i: g is not None for i, g in zip(positions, grads)}


def _floating_outputs(outputs: Any) -> list[torch.Tensor]:
    items = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    return [o for o in items if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _dtypes(inference: Inference) -> tuple[list[torch.dtype], dict[torch.dtype, str]]:
    accepted, refused = [], {}
    for dtype in TRIED_DTYPES:
        # float64 inputs with bits float32 lacks (x * (1 + 2**-40)): a float64 computation keeps them
        # in its outputs, even a sort or a gather; one in float32 drops them.
        nudge = 1 + 2**-40 if dtype == torch.float64 else 1
        args = [v.to(dtype) * nudge if isinstance(v, torch.Tensor) and v.is_floating_point() else _copy(v) for v in inference.values]
        try:
            with torch.no_grad():
                outputs = _floating_outputs(inference.call(args))
        except Exception as error:
            refused[dtype] = f"{type(error).__name__}"
            continue
        if dtype == torch.float64 and outputs and all(_float32_values(o) for o in outputs):
            # A kernel that accumulates in float32 runs on float64 inputs, but gradcheck and the
            # float64 truth need float64 precision: listing it would fail them on correct code.
            refused[dtype] = "computes in float32: its float64 outputs are all float32 values"
            continue
        if outputs:
            accepted.append(dtype)
    return accepted, refused


def _float32_values(output: torch.Tensor) -> bool:
    """Whether a float64 output holds only values float32 can represent (a float32 computation)."""
    finite = output[torch.isfinite(output)]
    return output.dtype == torch.float64 and finite.numel() > 0 and torch.equal(finite, finite.float().double())


def _double_backward(inference: Inference, differentiable: dict[int, bool]) -> str:
    """"" when double backward runs and torch.autograd.gradgradcheck agrees on the example (float64),
    else what stopped it: a backward built on values forward saved without a graph (a softmax's
    probabilities) runs twice but is wrong the second time."""
    positions = [i for i, d in differentiable.items() if d]

    def function(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = [_copy(v) for v in inference.values]
        for i, t in zip(positions, tensors):
            args[i] = t.clone()
        for i, v in enumerate(args):
            if i not in positions and isinstance(v, torch.Tensor) and v.is_floating_point():
                args[i] = v.to(torch.float64)
        return tuple(_floating_outputs(inference.call(args)))

    leaves = [inference.values[i].detach().to(torch.float64).requires_grad_(True) for i in positions]
    try:
        outputs = [o for o in function(*leaves) if o.requires_grad]
        total = sum((o.sin().sum() for o in outputs), torch.zeros((), dtype=torch.float64))
        grads = torch.autograd.grad(total, leaves, create_graph=True, allow_unused=True)
        again = [g for g in grads if g is not None and g.requires_grad]
        if not again:
            return "its gradients do not require grad: backward is not differentiable"
        second = torch.autograd.grad(torch.stack([g.sum() for g in again]).sum(), leaves, allow_unused=True)
        if all(g is None for g in second):  # @once_differentiable: an error node, not a graph to the inputs
            return "its gradients lead back to no input: backward is not differentiable (@once_differentiable?)"
        agrees = torch.autograd.gradgradcheck(function, leaves, raise_exception=False, fast_mode=True)
    except Exception as error:
        return f"double backward raised {type(error).__name__}: {str(error).splitlines()[0][:100]}"
    if not agrees:
        return "double backward ran, but gradgradcheck disagreed on the example (TODO: a bug, if it should be supported)"
    return ""


def _mutated(inference: Inference) -> list[int]:
    before = [_copy(v) for v in inference.values]
    args = [_copy(v) for v in inference.values]
    with torch.no_grad():
        inference.call(args)
    return [
        i for i, (a, b) in enumerate(zip(before, args))
        if isinstance(a, torch.Tensor) and not torch.equal(a.nan_to_num(), b.nan_to_num())
    ]


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _input_lines(inference: Inference, differentiable: dict[int, bool], batched_ok: bool) -> list[Written]:
    lines = []
    rank = max((v.dim() for v in inference.values if isinstance(v, torch.Tensor) and v.is_floating_point()), default=0)
    for position, (name, value) in enumerate(zip(inference.names, inference.values)):
        batched = batched_ok and isinstance(value, torch.Tensor) and value.dim() == rank and bool(inference.batch) \
            and tuple(value.shape[: len(inference.batch)]) == inference.batch
        if not isinstance(value, torch.Tensor):
            lines.append(_scalar_line(name, value, inference, position))
        elif value.dtype == torch.bool:
            lines.append(Written(name, f"Mask({name!r}, {inference.shape_text(name, value, batched)!r})",
                                 f"from {name}: {tuple(value.shape)} bool"))
        elif not value.is_floating_point():
            total = _offsets_total(value, inference)
            if total is not None:
                lines.append(Written(name, f"Offsets({name!r}, sequences='seqs', total={inference.dim(total)!r})",
                                     f"from {name}: {value.tolist()}, from 0, non-decreasing, ending at {total} = dim {inference.dim(total)}"))
            else:
                lines.append(_index_line(name, value, inference, batched))
        else:
            lines.append(_tensor_line(name, value, inference, batched, differentiable.get(position, False)))
    return lines


def _tensor_line(name: str, value: torch.Tensor, inference: Inference, batched: bool, differentiable: bool) -> Written:
    shape = inference.shape_text(name, value, batched)
    why = f"from {name}: {tuple(value.shape)} {value.dtype}"
    if batched:
        why += f"; leading {inference.batch} -> *batch"
    finite = value[torch.isfinite(value)]
    if value.numel() and finite.numel() < value.numel() and bool((finite == 0).all()):
        return Written(name, f"AdditiveMask({name!r}, {shape!r})", why + "; only 0 and -inf: an additive mask")
    if not differentiable:
        return Written(name, f"Tensor({name!r}, {shape!r}, requires_grad=False)", why + "; no gradient reached it in a trial backward")
    return Written(name, f"Tensor({name!r}, {shape!r})", why)


# ----------------------------------------------------------------------------- the module


def snake_case(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower().strip("_")


def write_spec(target_text: str, example: dict[str, Any], *, name: str | None = None, example_text: str = "") -> str:
    """The spec module's text for ``target_text`` (module:Name) called with ``example``."""
    choose_triton_interpreter()  # without CUDA, before the target's kernels are decorated
    target, module, attribute = load_target(target_text)
    names, values = _bound_values(target, example)
    inference = Inference(target, names, values)
    empty = [n for n, v in zip(names, values) if isinstance(v, torch.Tensor) and v.numel() == 0]
    if empty:
        raise GhostwriterError(f"example tensors {empty} are empty: trials on them show nothing; give each at least one element")
    try:
        with torch.no_grad():
            call_target(target, [_copy(v) for v in values])
    except Exception as error:
        raise GhostwriterError(f"forward raised on the example: {type(error).__name__}: {error}") from None
    inference.batch = _leading_batch(inference)
    batched_ok = bool(inference.batch) and _accepts_another_batch_dim(inference)
    if inference.batch and not batched_ok:
        inference.notes.append(f"leading dims {inference.batch} kept as dims: forward raised with one more leading dim")
    rank = max((v.dim() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()), default=0)
    for v in values:  # dim names in order of first appearance, past the batch
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            skip = len(inference.batch) if batched_ok and v.dim() == rank else 0
            for size in v.shape[skip:]:
                inference.dim(size)
    try:
        differentiable = _differentiable(inference)
    except GhostwriterError:
        raise
    except Exception as error:
        raise GhostwriterError(
            f"a trial backward on the example raised {type(error).__name__}: {error} -- fix backward on this example "
            "first (or give an example it handles)"
        ) from None
    lines = _input_lines(inference, differentiable, batched_ok)
    accepted, refused = _dtypes(inference)
    double = _double_backward(inference, differentiable) if any(differentiable.values()) else "no differentiable input"
    mutated = [names[i] for i in _mutated(inference)]
    return _render(target_text, module, attribute, name or snake_case(attribute), names, lines, inference, accepted,
                   refused, double, mutated, example_text)


def _render(target_text: str, module: str, attribute: str, spec_name: str, names: list[str], lines: list[Written],
            inference: Inference, accepted: list[torch.dtype], refused: dict[torch.dtype, str], double: str,
            mutated: list[str], example_text: str) -> str:
    kinds = sorted({line.call.split("(", 1)[0] for line in lines} | {"register"})
    uses_st = any("st." in line.call for line in lines)
    shared = {dim: users for dim, users in inference.users.items() if len(users) > 1}
    out = [
        f'"""A conformance spec for {target_text}, written by `python -m conformance write`',
        f"from the example {example_text or '(given)'}.",
        "",
        "Each guess says what it was inferred from. Write the reference, check the TODOs, then run",
        "    pytest --pyargs conformance --impl=<this file>",
        '"""',
        "",
        "import torch",
        *(["from hypothesis import strategies as st"] if uses_st else []),
        "",
        f"from conformance import {', '.join(kinds)}",
        f"from {module} import {attribute}",
        "",
        "",
        f"def reference({', '.join(names)}):",
        f'    """{attribute}\'s forward in plain torch (no custom kernel, no autograd.Function): the suite',
        '    differentiates it in float64 as the truth. TODO: write it."""',
        f'    raise NotImplementedError("write the reference of {attribute} in plain torch")',
        "",
        "",
        "register(",
        f"    {attribute},",
        f"    name={spec_name!r},",
        "    inputs=[",
        *(f"        {line.call},  # {line.why}" for line in lines),
        "    ],",
        "    reference=reference,",
    ]
    tried = ", ".join(str(d).removeprefix("torch.") for d in TRIED_DTYPES)
    if torch.float64 not in accepted:
        out.append("    # float64 left out (see below): gradcheck and gradgradcheck will be n/a; the other contracts run")
    dtype_text = ", ".join(f"torch.{str(d).removeprefix('torch.')}" for d in accepted) + ("," if len(accepted) == 1 else "")
    refused_text = "; refused " + ", ".join(f"{str(d).removeprefix('torch.')} ({why})" for d, why in refused.items()) if refused else ""
    out.append(f"    dtypes=({dtype_text}),  # forward ran in these of {tried}{refused_text}")
    if double:
        out.append(f"    double_backward=False,  # {double}")
    if mutated:
        out.append(f"    mutates={mutated!r},  # forward changed them in place on the example")
    out.append(")")
    notes = [*inference.notes]
    for dim, users in inference.repeated.items():
        notes.append(f"dim {dim} appears twice in {', '.join(users)} (equal sizes in the example): only square shapes are drawn; "
                     "if the sizes may differ, give each place its own name")
    for dim, users in shared.items():
        notes.append(f"dim {dim}: one size shared by {', '.join(users)} in the example; if they may differ, give each its own name")
    if notes:
        out.extend(["", *(f"# NOTE: {note}" for note in notes)])
    return "\n".join(out) + "\n"


def write_file(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def main_write(target: str, examples: Sequence[str], *, name: str | None, output: Path | None,
               echo: Callable[[str], None]) -> int:
    """``python -m conformance write``: print (or write to ``output``) the spec module."""
    text = ", ".join(examples)
    module = write_spec(target, parse_example(text), name=name, example_text=text)
    if output is None:
        echo(module)
    else:
        write_file(output, module)
        echo(f"wrote {output}")
    return 0
