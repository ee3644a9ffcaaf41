"""Whole calls of a registered Function: concrete sizes, values, dtype and requires_grad.

A :class:`Case` is a *recipe*, not tensors: every contract asks it for fresh leaf tensors
(in any dtype/device, with any requires_grad subset), so runs never share state, and a failure
can print a snippet that rebuilds exactly the same inputs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies.dims import DimRule, batch_shapes, broadcast_forms, dim_sizes
from strategies.inputs import device_supports, dtypes_for, requires_grad_subsets
from strategies.recipes import OffsetsRecipe, Recipe, ScalarRecipe, TensorRecipe
from strategies.values import (
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    VALUE_PATTERNS,
    distinct_seed,
    grad_output_from_seed,
    magnitudes,
    value_seeds,
)

if TYPE_CHECKING:
    from conformance.spec import Spec

__all__ = [
    "GRAD_LAYOUTS",
    "LAYOUTS",
    "Case",
    "DrawOptions",
    "PartialCase",
    "apply_grad_layout",
    "apply_layout",
    "broadcast_forms",
    "cases",
    "fit_to_budget",
    "layouts",
    "shape_of",
]


LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "expanded", "channels_last", "permuted", "swapped")


def apply_layout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``tensor`` (same shape) in another memory layout.

    ``transposed``: stored with the last two dims swapped; ``sliced``: every other element of a
    twice-as-long last dim; ``offset``: a view with a non-zero storage offset; ``expanded``: a
    stride-0 view (only when every last-dim row is constant, otherwise returned contiguous);
    ``channels_last``: 4-d tensors in channels-last memory format; ``permuted``: stored with
    every dim reversed (differs from ``transposed`` from 3-d on); ``swapped``: stored with dims 1
    and 2 swapped (3-d and up: ``(b, s, h, d)`` memory seen as ``(b, h, s, d)``, the layout every
    Hugging Face attention hands on). Layouts that do not apply to a tensor (``transposed`` on
    1-d, ``channels_last`` off 4-d, ``swapped`` below 3-d) give it contiguous.
    """
    if layout not in LAYOUTS:
        raise InvalidArgument(f"layout={layout!r} must be one of {LAYOUTS}")
    if layout == "contiguous" or tensor.ndim == 0:
        return tensor.contiguous()
    if layout == "transposed":
        if tensor.ndim < 2:
            return tensor.contiguous()
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        wide = torch.zeros((*tensor.shape[:-1], tensor.shape[-1] * 2), dtype=tensor.dtype, device=tensor.device)
        wide[..., ::2] = tensor
        return wide[..., ::2]
    if layout == "offset":
        flat = torch.zeros(tensor.numel() + 3, dtype=tensor.dtype, device=tensor.device)
        flat[3:] = tensor.reshape(-1)
        return flat[3:].view(tensor.shape)
    if layout == "expanded":
        if tensor.shape[-1] > 0 and bool((tensor == tensor[..., :1]).all()):
            # Own compact storage (as a broadcast bias has): storage-level reads cannot see full rows.
            return tensor[..., :1].clone().expand(tensor.shape)
        return tensor.contiguous()
    if layout == "swapped":
        if tensor.ndim < 3:
            return tensor.contiguous()
        return tensor.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "permuted":
        if tensor.ndim < 2:
            return tensor.contiguous()
        order = tuple(reversed(range(tensor.ndim)))
        return tensor.permute(order).contiguous().permute(order)
    if tensor.ndim == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor.contiguous()


def layouts(*, kinds: Sequence[str] = LAYOUTS, ndim: int | None = None, allow_expanded: bool = True) -> st.SearchStrategy[str]:
    """Memory-layout names for :func:`apply_layout`.

    kinds: the layouts to choose from (see :data:`LAYOUTS`).
    ndim: when given, only layouts that really change a tensor of that many dims (``transposed``
    and ``permuted`` need 2+, ``channels_last`` exactly 4, ``sliced``/``offset``/``expanded`` 1+).
    allow_expanded: False drops ``expanded`` (stride-0 inputs are never fed to gradcheck, whose
    finite differences would write through the shared element).
    Shrinks towards the first kind (``contiguous`` by default).
    Example: ``layouts(ndim=4).example() -> 'channels_last'``.
    """
    given = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in given if k not in LAYOUTS]
    if bad:
        raise InvalidArgument(f"kinds={list(given)!r}: {bad} not in {LAYOUTS}")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0):
        raise InvalidArgument(f"ndim={ndim!r} must be an int >= 0 or None")
    chosen = [k for k in given if (allow_expanded or k != "expanded") and (ndim is None or _layout_applies(k, ndim))]
    if not chosen:
        raise InvalidArgument(f"no layout left from kinds={list(given)!r} with ndim={ndim!r}, allow_expanded={allow_expanded!r}")
    return st.sampled_from(chosen)


def _layout_applies(layout: str, ndim: int) -> bool:
    if layout == "contiguous":
        return True
    if layout in ("transposed", "permuted"):
        return ndim >= 2
    if layout == "swapped":
        return ndim >= 3
    if layout == "channels_last":
        return ndim == 4
    return ndim >= 1


GRAD_LAYOUTS = ("as_drawn", "like_output", "swapped", "narrow")


def apply_grad_layout(grad: torch.Tensor, output: torch.Tensor, layout: str) -> torch.Tensor:
    """``grad`` (a grad_output for ``output``) with the same values in another memory layout.

    ``as_drawn``: unchanged; ``like_output``: the output's own strides (what a loss computed
    elementwise from a transposed-view output hands back); ``swapped``: dims 1 and 2 swapped in
    memory (3-d and up, see :func:`apply_layout`); ``narrow``: a slice of a wider buffer along
    the last dim (what ``torch.cat``/``split`` hand to backward). A layout that does not apply
    (``swapped`` below 3-d, ``like_output`` for an overlapping output) leaves ``grad`` unchanged.
    """
    if layout not in GRAD_LAYOUTS:
        raise InvalidArgument(f"layout={layout!r} must be one of {GRAD_LAYOUTS}")
    if layout == "as_drawn" or grad.ndim == 0 or grad.stride() == (0,) * grad.ndim:
        return grad
    if layout == "like_output":
        if not _dense(output):
            return grad
        return torch.empty_strided(grad.shape, output.stride(), dtype=grad.dtype, device=grad.device).copy_(grad)
    if layout == "swapped":
        return apply_layout(grad, "swapped") if grad.ndim >= 3 else grad
    wide = torch.zeros((*grad.shape[:-1], grad.shape[-1] + 3), dtype=grad.dtype, device=grad.device)
    wide[..., 1 : 1 + grad.shape[-1]] = grad
    return wide[..., 1 : 1 + grad.shape[-1]]


def _dense(tensor: torch.Tensor) -> bool:
    """True when ``tensor``'s strides tile its storage exactly (a permutation of a contiguous
    layout): no overlap, no gaps, so an empty tensor can be given the same strides."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(tensor.shape, tensor.stride()) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True, repr=False)
class Case:
    """One concrete call of a spec: every argument's recipe plus dtype, device and requires_grad."""

    spec: Spec
    device: str
    dtype: torch.dtype
    sizes: dict[str, int]
    batches: dict[str, tuple[int, ...]]
    recipes: tuple[Recipe, ...]
    requires_grad: frozenset[str]
    grad_seed: int = 0
    grad_scale: float = 1.0
    grad_kind: str = "random"
    grad_layout: str = "as_drawn"
    notes: dict[str, Any] = field(default_factory=dict)

    def args(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: str | None = None,
        requires_grad: frozenset[str] | set[str] | None = None,
    ) -> list[Any]:
        """Fresh positional arguments (new leaf tensors every call)."""
        dtype = dtype or self.dtype
        device = device or self.device
        wanted = self.requires_grad if requires_grad is None else requires_grad
        built: dict[str, Any] = {}
        for recipe, spec_input in zip(self.recipes, self.spec.inputs, strict=True):
            value = recipe.build(dtype, device, spec_input=spec_input, earlier=built)
            if recipe.differentiable and recipe.name in wanted:
                # A leaf that requires grad, keeping the recipe's layout (requires_grad_ on a view
                # of a non-leaf buffer would not make a leaf).
                value = value.detach().requires_grad_(True)
            built[recipe.name] = value
        return list(built.values())

    def grad_outputs(self, outputs: Sequence[torch.Tensor], *, dtype: torch.dtype | None = None, device: str | None = None) -> tuple[torch.Tensor, ...]:
        """One grad_output per given output, from ``grad_seed`` (same values for every dtype),
        in the memory layout ``grad_layout`` (see :func:`apply_grad_layout`)."""
        return tuple(
            apply_grad_layout(
                grad_output_from_seed(
                    tuple(out.shape), dtype or out.dtype, seed=self.grad_seed + position, kind=self.grad_kind,
                    scale=self.grad_scale, device=device or str(out.device),
                ),
                out,
                self.grad_layout,
            )
            for position, out in enumerate(outputs)
        )

    def __repr__(self) -> str:
        return f"Case({self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def with_dtype(self, dtype: torch.dtype) -> Case:
        return replace(self, dtype=dtype)

    def describe(self) -> str:
        parts = [recipe.describe() + (", requires_grad" if recipe.name in self.requires_grad else "") for recipe in self.recipes]
        if self.grad_layout != "as_drawn":
            parts.append(f"grad_outputs: {self.grad_kind}, layout={self.grad_layout}")
        config = getattr(self.spec, "autotune_config", "")
        if config:
            parts.append(config)
        return f"{self.dtype} on {self.device}; " + "; ".join(parts)

    def repro(self) -> str:
        """A runnable snippet that rebuilds the inputs and calls forward and backward."""
        lines = [
            "import torch",
            "from strategies.values import tensor_from_seed, mask_from_seed, additive_mask_from_seed, index_from_seed, grad_output_from_seed",
            "from strategies.cases import apply_layout",
            "from strategies.recipes import derived_from_seed",
        ]
        op = self.spec.op
        module = sys.modules.get(op.module)
        source_file = getattr(module, "__file__", None) or self.spec.source_file
        imports, callee = op.repro_import(source_file or "")
        lines.extend(imports)
        names: list[str] = []
        for recipe, spec_input in zip(self.recipes, self.spec.inputs, strict=True):
            source = recipe.source(self.dtype, self.device, spec_input=spec_input, earlier=tuple(names))
            if "spec.input_named(" in source and not any(line.startswith("spec = registered_spec(") for line in lines):
                lines.append("from conformance.spec import registered_spec")
                lines.append(f"spec = registered_spec({self.spec.name!r})")
            if recipe.name in self.requires_grad:
                source += ".detach().requires_grad_()"
            lines.append(f"{recipe.name} = {source}")
            names.append(recipe.name)
        lines.append(f"out = {callee}({', '.join(names)})")
        lines.append("outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor) and o.requires_grad]")
        grads = (
            f"grad_output_from_seed(tuple(o.shape), o.dtype, seed={self.grad_seed} + i, "
            f"kind={self.grad_kind!r}, scale={self.grad_scale!r}, device={self.device!r})"
        )
        if self.grad_layout != "as_drawn":
            lines[2] = "from strategies.cases import apply_layout, apply_grad_layout"
            grads = f"apply_grad_layout({grads}, o, {self.grad_layout!r})"
        lines.append(f"grads = [{grads} for i, o in enumerate(outs)]")
        lines.append("torch.autograd.backward(outs, grads)")
        return "\n".join(lines)


def _resolve_kinks(spec_input: Any, scalars: dict[str, Any]) -> tuple[float, ...]:
    """A Tensor input's declared kinks as numbers: Scalar names (``"-name"``: minus it) replaced
    by this call's values (the spec validated the names; a drawn non-number is an error)."""
    resolved = []
    for kink in getattr(spec_input, "kinks", ()):
        if isinstance(kink, str):
            value = scalars[kink.removeprefix("-")]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgument(f"kink {kink!r} of {spec_input.name!r}: the Scalar's value {value!r} is not a finite number")
            resolved.append(-float(value) if kink.startswith("-") else float(value))
        else:
            resolved.append(float(kink))
    return tuple(resolved)


def shape_of(spec_input: Any, sizes: dict[str, int], batches: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The concrete (unbroadcast) shape of a shaped spec input under drawn sizes."""
    return tuple(spec_input.parsed.concrete(sizes, batches))


def fit_to_budget(
    spec: Spec,
    sizes: dict[str, int],
    batches: dict[str, tuple[int, ...]],
    max_elements: int,
    *,
    min_size: int = 1,
) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Halve the largest dims until every input has at most ``max_elements`` elements, keeping
    each dim legal under the spec's dim rules (multiples, bounds, ``at_most``).

    Deterministic, so shrinking the drawn sizes still shrinks the result.
    """
    sizes = dict(sizes)
    batches = {k: list(v) for k, v in batches.items()}  # type: ignore[misc]
    rules: dict[str, DimRule] = dict(getattr(spec, "dim_rules", {}))
    shaped = [i for i in spec.inputs if hasattr(i, "parsed")]
    for _ in range(200):
        numels = [(_numel(shape_of(i, sizes, batches)), i) for i in shaped]  # type: ignore[arg-type]
        if not numels:
            break
        largest_numel, largest = max(numels, key=lambda pair: pair[0])
        if largest_numel <= max_elements:
            break
        parsed = largest.parsed
        candidates: list[tuple[int, str, Any]] = []
        for name in dict.fromkeys(parsed.names):
            rule = rules.get(name, DimRule())
            if rule.fit((sizes[name] + 1) // 2, run_min=min_size) < sizes[name]:
                candidates.append((sizes[name], "dim", name))
        if parsed.batch:
            candidates += [(s, "batch", (parsed.batch, j)) for j, s in enumerate(batches[parsed.batch]) if s > 1]
        if not candidates:
            break  # only literal or minimal dims left: the spec itself is larger than the budget
        size, where, key = max(candidates, key=lambda c: c[0])
        if where == "dim":
            sizes[key] = rules.get(key, DimRule()).fit((size + 1) // 2, run_min=min_size)
            for name, rule in rules.items():  # dims bounded by the one just halved
                if rule.at_most is not None:
                    sizes[name] = rule.fit(sizes[name], run_min=min_size, limit=sizes[rule.at_most])
        else:
            batches[key[0]][key[1]] = (size + 1) // 2  # type: ignore[index]
    return sizes, {k: tuple(v) for k, v in batches.items()}


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for s in shape:
        total *= s
    return total


@dataclass(frozen=True)
class DrawOptions:
    """What a contract asks :func:`cases` to vary beyond sizes (validated there)."""

    layouts: tuple[str, ...] = ("contiguous",)
    mask_kinds: tuple[str, ...] = ("random", "all_true", "padding")
    broadcast: bool = False
    extreme: bool = False
    constant_rows: bool = False
    value_patterns: tuple[str, ...] = ("random",)
    spacing: float = 0.0


@dataclass
class PartialCase:
    """The case drawn so far: what ``Scalar(from_case=...)`` functions are given, and what each
    spec input's ``draw_recipe`` reads (sizes, batch shapes, options, earlier recipes)."""

    spec: Spec
    dtype: torch.dtype
    device: str
    sizes: dict[str, int]
    batches: dict[str, tuple[int, ...]]
    options: DrawOptions = field(default_factory=DrawOptions)
    recipes: dict[str, Recipe] = field(default_factory=dict)

    def _input(self, name: str) -> Any:
        for spec_input in self.spec.inputs:
            if spec_input.name == name:
                return spec_input
        raise KeyError(f"spec {self.spec.name!r} has no input {name!r} (inputs: {[i.name for i in self.spec.inputs]})")

    def shape(self, name: str) -> tuple[int, ...]:
        """Input ``name``'s shape: as drawn (after broadcasting) once drawn, else as declared."""
        if name in self.recipes:
            return tuple(self.recipes[name].shape)
        spec_input = self._input(name)
        if not hasattr(spec_input, "parsed"):
            raise KeyError(f"input {name!r} is a {spec_input.kind}, which has no shape")
        return shape_of(spec_input, self.sizes, self.batches)

    def ndim(self, name: str) -> int:
        """Input ``name``'s number of dims (see :meth:`shape`)."""
        return len(self.shape(name))

    def value(self, name: str) -> Any:
        """The drawn value of an earlier Scalar (or the offsets of an earlier Offsets) input."""
        self._input(name)
        if name not in self.recipes:
            raise KeyError(f"input {name!r} is not drawn yet: list it before the input that reads it")
        recipe = self.recipes[name]
        if isinstance(recipe, ScalarRecipe):
            return recipe.value
        if isinstance(recipe, OffsetsRecipe):
            return recipe.values
        raise KeyError(f"input {name!r} is a {recipe.kind}; value() reads Scalar and Offsets inputs")

    def max_length(self, name: str) -> int:
        """The longest sequence of an earlier Offsets input (flash-attention's ``max_seqlen``)."""
        recipe = self.recipes.get(name)
        if not isinstance(recipe, OffsetsRecipe):
            self._input(name)
            raise KeyError(f"input {name!r} is not an Offsets input drawn before this one")
        return max(recipe.lengths, default=0)


REQUIRES_GRAD_MODES = ("all", "subsets", "nonempty")


@dataclass(frozen=True)
class CaseOptions:
    """What :func:`cases` varies beyond the spec: one frozen, validated preset per contract.

    dtypes: the dtypes to choose from (None: the spec's that the device supports, see :func:`dtypes_for`).
    max_elements: per-input element budget; larger drawn sizes are halved to fit (:func:`fit_to_budget`).
    min_size / max_size / block_sizes: passed to :func:`strategies.dims.dim_sizes` (min_size=0: zero-size dims).
    extreme: draw value magnitudes up towards the dtype's range.
    requires_grad: ``"all"`` (every differentiable input), ``"subsets"`` (any subset, none
    included) or ``"nonempty"`` (any subset with at least one input).
    layouts: memory layouts to draw per tensor input (see :func:`apply_layout`); an ``expanded``
    input gets constant rows so that it really is stride-0.
    mask_kinds: kinds to draw per Mask input (see :func:`strategies.values.mask_from_seed`).
    constant_rows: sometimes make a tensor's last-dim rows constant (ties, zero variance).
    broadcast: give ``broadcastable=True`` inputs size-1 dims and dropped leading dims.
    grad_output_kinds: kinds to draw for grad_outputs (see :func:`grad_output_from_seed`).
    value_patterns: value patterns per tensor input (``ties``; ``near_zero`` applies to
    ``real``-domain inputs only, others fall back to ``random``).
    max_batch_dims: ``*batch`` groups expand to 0..max_batch_dims dims.
    unique_dims: dims with different names get different sizes.
    spacing: for finite differences (gradcheck): every tensor input's elements at least this far
    apart and from the kinks its spec declares (:func:`strategies.values.spread`); ignores
    ``constant_rows`` and ``value_patterns``, which make ties on purpose.

    Invalid values raise ``InvalidArgument`` naming the field and echoing the value, when the
    preset is made (at import of the contract that declares it), not when a case is drawn.
    ``options.replace(dtypes=...)`` is a validated copy.
    """

    dtypes: tuple[torch.dtype, ...] | None = None
    max_elements: int = 512
    min_size: int = 1
    max_size: int = 7
    block_sizes: tuple[int, ...] = (16,)
    extreme: bool = False
    requires_grad: str = "all"
    layouts: tuple[str, ...] = ("contiguous",)
    mask_kinds: tuple[str, ...] = ("random", "all_true", "padding")
    constant_rows: bool = False
    broadcast: bool = False
    grad_output_kinds: tuple[str, ...] = ("random",)
    value_patterns: tuple[str, ...] = ("random",)
    max_batch_dims: int = 2
    unique_dims: bool = False
    spacing: float = 0.0

    def __post_init__(self) -> None:
        for name in ("dtypes", "block_sizes", "layouts", "mask_kinds", "grad_output_kinds", "value_patterns"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise InvalidArgument(f"{name}={value!r} is a string; pass a tuple, e.g. {name}=({value!r},)")
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.requires_grad not in REQUIRES_GRAD_MODES:
            raise InvalidArgument(f"requires_grad={self.requires_grad!r} must be one of {REQUIRES_GRAD_MODES}")
        for name, low in (("max_elements", 1), ("min_size", 0), ("max_size", 0), ("max_batch_dims", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgument(f"{name}={value!r} must be an int >= {low}")
        if self.max_size < self.min_size:
            raise InvalidArgument(f"max_size={self.max_size!r} is below min_size={self.min_size!r}")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.block_sizes):
            raise InvalidArgument(f"block_sizes={self.block_sizes!r} must be ints >= 1")
        for given, allowed, what in (
            (self.layouts, LAYOUTS, "layouts"),
            (self.mask_kinds, MASK_KINDS, "mask_kinds"),
            (self.grad_output_kinds, GRAD_OUTPUT_KINDS, "grad_output_kinds"),
            (self.value_patterns, VALUE_PATTERNS, "value_patterns"),
        ):
            bad = [item for item in given if item not in allowed]
            if bad or not given:
                raise InvalidArgument(f"{what}={list(given)!r}: {bad or 'empty'}; choose from {allowed}")
        if self.dtypes is not None:
            if not self.dtypes:
                raise InvalidArgument(f"dtypes={self.dtypes!r} is empty")
            bad_dtypes = [d for d in self.dtypes if not isinstance(d, torch.dtype)]
            if bad_dtypes:
                raise InvalidArgument(f"dtypes={self.dtypes!r}: {bad_dtypes} are not torch.dtype")
        if not (isinstance(self.spacing, (int, float)) and not isinstance(self.spacing, bool) and self.spacing >= 0):
            raise InvalidArgument(f"spacing={self.spacing!r} must be a number >= 0")

    def replace(self, **changes: Any) -> CaseOptions:
        """A validated copy with ``changes`` (unknown names raise ``InvalidArgument``)."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise InvalidArgument(f"unknown case options {unknown}; choose from {[f.name for f in fields(self)]}")
        return replace(self, **changes)


@st.composite
def cases(
    draw: st.DrawFn,
    spec: Spec,
    options: CaseOptions | None = None,
    *,
    device: str = "cpu",
    **changes: Any,
) -> Case:
    """Calls of ``spec``: sizes for its dims, values by domain, a dtype and requires_grad set.

    spec: the registered spec.
    options: what to vary (:class:`CaseOptions`; default ``CaseOptions()``); ``changes`` are
    applied to it, so ``cases(spec, broadcast=True)`` is ``cases(spec, CaseOptions(broadcast=True))``.
    device: the device the tensors are built on.
    Shrinks towards the smallest sizes, no batch dims, the first dtype, seeds 0 and scale 1;
    a failure that needs a size past a block boundary shrinks to the smallest such size.
    Example: ``cases(spec, device="cpu").example()``.
    """
    chosen = options if options is not None else CaseOptions()
    if changes:
        chosen = chosen.replace(**changes)
    dtypes = chosen.dtypes
    if dtypes is None:
        dtype_strategy = dtypes_for(spec, device)
    else:
        # Explicit dtypes are honoured as given, minus those the device cannot run.
        supported = tuple(d for d in dtypes if device_supports(device, d))
        dtype_strategy = st.sampled_from(supported or tuple(dtypes))
    dtype = draw(dtype_strategy, label="dtype")
    rules = dict(getattr(spec, "dim_rules", {}))
    sizes = draw(
        dim_sizes(
            spec.dim_names, min_size=chosen.min_size, max_size=chosen.max_size, block_sizes=chosen.block_sizes,
            unique=chosen.unique_dims, rules=rules,
        ),
        label="dim sizes",
    )
    batches = {name: draw(batch_shapes(max_dims=chosen.max_batch_dims), label=f"*{name}") for name in spec.batch_names}
    spec_budget = getattr(spec, "max_elements", None)
    budget = min(chosen.max_elements, spec_budget) if spec_budget is not None else chosen.max_elements
    sizes, batches = fit_to_budget(spec, sizes, batches, budget, min_size=chosen.min_size)

    draw_options = DrawOptions(
        layouts=tuple(chosen.layouts), mask_kinds=tuple(chosen.mask_kinds), broadcast=chosen.broadcast, extreme=chosen.extreme,
        constant_rows=chosen.constant_rows, value_patterns=tuple(chosen.value_patterns), spacing=float(chosen.spacing),
    )
    partial = PartialCase(spec=spec, dtype=dtype, device=device, sizes=sizes, batches=batches, options=draw_options)
    for spec_input in spec.inputs:
        partial.recipes[spec_input.name] = spec_input.draw_recipe(draw, partial)
    recipes = list(partial.recipes.values())

    if chosen.spacing:
        scalars = {r.name: r.value for r in recipes if isinstance(r, ScalarRecipe)}
        kinks = {i.name: _resolve_kinks(i, scalars) for i in spec.tensor_inputs}
        recipes = [
            replace(r, spacing=float(chosen.spacing), kinks=kinks[r.name]) if isinstance(r, TensorRecipe) and r.layout != "expanded" else r
            for r in recipes
        ]

    differentiable = [i.name for i in spec.differentiable_inputs]
    if chosen.requires_grad == "all" or not differentiable:
        wanted = frozenset(differentiable)
    else:
        wanted = draw(
            requires_grad_subsets(differentiable, min_size=1 if chosen.requires_grad == "nonempty" else 0), label="requires_grad"
        )
    grad_seed = distinct_seed(draw(value_seeds(), label="grad_output seed"), "grad_output")
    grad_kind = draw(st.sampled_from(tuple(chosen.grad_output_kinds)), label="grad_output kind")
    grad_scale = draw(magnitudes(dtype=dtype), label="grad_output scale") if grad_kind == "scaled" else 1.0
    return Case(
        spec=spec, device=device, dtype=dtype, sizes=sizes, batches=batches,
        recipes=tuple(recipes), requires_grad=wanted, grad_seed=grad_seed,
        grad_scale=grad_scale, grad_kind=grad_kind,
    )
