"""Whole calls of a registered Function: concrete sizes, values, dtype and requires_grad.

A :class:`Case` is a *recipe*, not tensors: every contract asks it for fresh leaf tensors
(in any dtype/device, with any requires_grad subset), so runs never share state, and a failure
can print a snippet that rebuilds exactly the same inputs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies.dims import batch_shapes, broadcast_forms, dim_sizes
from strategies.inputs import device_supports, dtypes_for, requires_grad_subsets
from strategies.values import (
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    VALUE_PATTERNS,
    distinct_seed,
    grad_output_from_seed,
    index_from_seed,
    magnitudes,
    mask_densities,
    mask_from_seed,
    tensor_from_seed,
    value_seeds,
)

if TYPE_CHECKING:
    from conformance.spec import Spec

__all__ = [
    "GRAD_LAYOUTS",
    "LAYOUTS",
    "ArgRecipe",
    "Case",
    "apply_grad_layout",
    "apply_layout",
    "broadcast_forms",
    "cases",
    "fit_to_budget",
    "layouts",
    "shape_of",
]


@dataclass(frozen=True)
class ArgRecipe:
    """How to rebuild one argument: a tensor/mask/index from a seed, or a scalar value."""

    name: str
    kind: str  # "tensor" | "mask" | "index" | "scalar"
    shape: tuple[int, ...] = ()
    seed: int = 0
    domain: Any = "real"
    scale: float = 1.0
    constant_rows: bool = False
    mask_kind: str = "random"
    high: int = 1
    value: Any = None
    layout: str = "contiguous"
    density: float = 0.7
    pattern: str = "random"
    # Finite differences: elements at least ``spacing`` apart and from ``kinks`` (see spread()).
    spacing: float = 0.0
    kinks: tuple[float, ...] = ()

    def build(self, dtype: torch.dtype, device: str) -> Any:
        if self.kind == "scalar":
            return self.value
        if self.kind == "mask":
            return mask_from_seed(self.shape, seed=self.seed, kind=self.mask_kind, density=self.density, device=device)
        if self.kind == "index":
            return index_from_seed(self.shape, seed=self.seed, high=self.high, device=device)
        tensor = tensor_from_seed(
            self.shape, dtype, seed=self.seed, domain=self.domain, scale=self.scale,
            device=device, constant_rows=self.constant_rows, pattern=self.pattern,
            spacing=self.spacing, kinks=self.kinks,
        )
        return apply_layout(tensor, self.layout)

    def source(self, dtype: torch.dtype, device: str) -> str:
        """Python source that rebuilds this argument (used in repro snippets)."""
        if self.kind == "scalar":
            return repr(self.value)
        if self.kind == "mask":
            density = f", density={self.density!r}" if self.density != 0.7 else ""
            return f"mask_from_seed({self.shape!r}, seed={self.seed}, kind={self.mask_kind!r}{density}, device={device!r})"
        if self.kind == "index":
            return f"index_from_seed({self.shape!r}, seed={self.seed}, high={self.high}, device={device!r})"
        extra = ", constant_rows=True" if self.constant_rows else ""
        if self.pattern != "random":
            extra += f", pattern={self.pattern!r}"
        if self.spacing:
            extra += f", spacing={self.spacing!r}" + (f", kinks={self.kinks!r}" if self.kinks else "")
        text = (
            f"tensor_from_seed({self.shape!r}, {dtype}, seed={self.seed}, domain={self.domain!r}, "
            f"scale={self.scale!r}, device={device!r}{extra})"
        )
        if self.layout != "contiguous":
            text = f"apply_layout({text}, {self.layout!r})"
        return text


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
    recipes: tuple[ArgRecipe, ...]
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
        built = []
        for recipe in self.recipes:
            value = recipe.build(dtype, device)
            if recipe.kind == "tensor" and recipe.name in wanted:
                # A leaf that requires grad, keeping the recipe's layout (requires_grad_ on a view
                # of a non-leaf buffer would not make a leaf).
                value = value.detach().requires_grad_(True)
            built.append(value)
        return built

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
        parts = []
        for recipe in self.recipes:
            if recipe.kind == "scalar":
                parts.append(f"{recipe.name}={recipe.value!r}")
            else:
                grad = ", requires_grad" if recipe.name in self.requires_grad else ""
                extra = f", layout={recipe.layout}" if recipe.layout != "contiguous" else ""
                parts.append(f"{recipe.name}: {recipe.kind}{tuple(recipe.shape)}{extra}{grad}")
        if self.grad_layout != "as_drawn":
            parts.append(f"grad_outputs: {self.grad_kind}, layout={self.grad_layout}")
        return f"{self.dtype} on {self.device}; " + "; ".join(parts)

    def repro(self) -> str:
        """A runnable snippet that rebuilds the inputs and calls forward and backward."""
        fn = self.spec.fn
        lines = [
            "import torch",
            "from strategies.values import tensor_from_seed, mask_from_seed, index_from_seed, grad_output_from_seed",
            "from strategies.cases import apply_layout",
        ]
        module = sys.modules.get(fn.__module__)
        top = fn.__qualname__.split(".")[0]
        source_file = getattr(module, "__file__", None) or self.spec.source_file
        if fn.__module__.startswith("_conformance_impl_") and source_file:
            lines.append("from conformance.loader import import_path")
            lines.append(f"{top} = import_path({source_file!r}).{top}")
        else:
            lines.append(f"from {fn.__module__} import {top}")
        names = []
        for recipe in self.recipes:
            source = recipe.source(self.dtype, self.device)
            if recipe.name in self.requires_grad:
                source += ".detach().requires_grad_()"
            lines.append(f"{recipe.name} = {source}")
            names.append(recipe.name)
        lines.append(f"out = {fn.__qualname__}.apply({', '.join(names)})")
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
    """The concrete shape of a Tensor/Mask/Index spec input under drawn sizes."""
    parsed = spec_input.parsed
    shape: list[int] = list(batches[parsed.batch]) if parsed.batch else []
    shape.extend(sizes[d] if isinstance(d, str) else d for d in parsed.dims)
    return tuple(shape)


def fit_to_budget(
    spec: Spec, sizes: dict[str, int], batches: dict[str, tuple[int, ...]], max_elements: int
) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Halve the largest dims until every input has at most ``max_elements`` elements.

    Deterministic, so shrinking the drawn sizes still shrinks the result.
    """
    sizes = dict(sizes)
    batches = {k: list(v) for k, v in batches.items()}  # type: ignore[misc]
    shaped = [i for i in spec.inputs if getattr(i, "kind", "scalar") != "scalar"]
    for _ in range(200):
        numels = [(_numel(shape_of(i, sizes, batches)), i) for i in shaped]  # type: ignore[arg-type]
        if not numels:
            break
        largest_numel, largest = max(numels, key=lambda pair: pair[0])
        if largest_numel <= max_elements:
            break
        parsed = largest.parsed  # type: ignore[union-attr]
        candidates: list[tuple[int, str, Any]] = [(sizes[d], "dim", d) for d in parsed.dims if isinstance(d, str)]
        if parsed.batch:
            candidates += [(s, "batch", (parsed.batch, j)) for j, s in enumerate(batches[parsed.batch])]
        candidates = [c for c in candidates if c[0] > 1]
        if not candidates:
            break  # only literal dims left: the spec itself is larger than the budget
        size, where, key = max(candidates, key=lambda c: c[0])
        if where == "dim":
            sizes[key] = (size + 1) // 2
        else:
            batches[key[0]][key[1]] = (size + 1) // 2  # type: ignore[index]
    return sizes, {k: tuple(v) for k, v in batches.items()}


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for s in shape:
        total *= s
    return total


@st.composite
def cases(
    draw: st.DrawFn,
    spec: Spec,
    *,
    device: str = "cpu",
    dtypes: Sequence[torch.dtype] | None = None,
    max_elements: int = 512,
    min_size: int = 1,
    max_size: int = 7,
    block_sizes: Sequence[int] = (16,),
    extreme: bool = False,
    requires_grad: str = "all",
    layouts: Sequence[str] = ("contiguous",),
    mask_kinds: Sequence[str] = ("random", "all_true", "padding"),
    constant_rows: bool = False,
    broadcast: bool = False,
    grad_output_kinds: Sequence[str] = ("random",),
    value_patterns: Sequence[str] = ("random",),
    max_batch_dims: int = 2,
    unique_dims: bool = False,
    spacing: float = 0.0,
) -> Case:
    """Calls of ``spec``: sizes for its dims, values by domain, a dtype and requires_grad set.

    spec: the registered spec.
    device: the device the tensors are built on.
    dtypes: the dtypes to choose from (default: the spec's that ``device`` supports, see :func:`dtypes_for`).
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
    Shrinks towards the smallest sizes, no batch dims, the first dtype, seeds 0 and scale 1;
    a failure that needs a size past a block boundary shrinks to the smallest such size.
    Example: ``cases(spec, device="cpu").example()``.
    """
    if requires_grad not in ("all", "subsets", "nonempty"):
        raise InvalidArgument(f"requires_grad={requires_grad!r} must be 'all', 'subsets' or 'nonempty'")
    if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 1:
        raise InvalidArgument(f"max_elements={max_elements!r} must be an int >= 1")
    if isinstance(max_batch_dims, bool) or not isinstance(max_batch_dims, int) or max_batch_dims < 0:
        raise InvalidArgument(f"max_batch_dims={max_batch_dims!r} must be an int >= 0")
    for given, allowed, what in (
        (layouts, LAYOUTS, "layouts"),
        (mask_kinds, MASK_KINDS, "mask_kinds"),
        (grad_output_kinds, GRAD_OUTPUT_KINDS, "grad_output_kinds"),
        (value_patterns, VALUE_PATTERNS, "value_patterns"),
    ):
        bad = [item for item in given if item not in allowed]
        if bad or not given or isinstance(given, str):
            raise InvalidArgument(f"{what}={list(given)!r}: {bad or 'empty'}; choose from {allowed}")
    if dtypes is not None and not tuple(dtypes):
        raise InvalidArgument(f"dtypes={dtypes!r} is empty")
    if dtypes is None:
        dtype_strategy = dtypes_for(spec, device)
    else:
        # Explicit dtypes are honoured as given, minus those the device cannot run.
        supported = tuple(d for d in dtypes if device_supports(device, d))
        dtype_strategy = st.sampled_from(supported or tuple(dtypes))
    dtype = draw(dtype_strategy, label="dtype")
    sizes = draw(
        dim_sizes(spec.dim_names, min_size=min_size, max_size=max_size, block_sizes=block_sizes, unique=unique_dims),
        label="dim sizes",
    )
    batches = {name: draw(batch_shapes(max_dims=max_batch_dims), label=f"*{name}") for name in spec.batch_names}
    sizes, batches = fit_to_budget(spec, sizes, batches, max_elements)

    recipes = []
    for spec_input in spec.inputs:
        if spec_input.kind == "scalar":
            value = spec_input.value  # type: ignore[union-attr]
            if isinstance(value, st.SearchStrategy):
                value = draw(value, label=spec_input.name)
            recipes.append(ArgRecipe(spec_input.name, "scalar", value=value))
            continue
        shape = shape_of(spec_input, sizes, batches)
        seed = distinct_seed(draw(value_seeds(), label=f"{spec_input.name} seed"), spec_input.name)
        if spec_input.kind == "mask":
            kind = draw(st.sampled_from(tuple(mask_kinds)), label=f"{spec_input.name} mask kind")
            density = draw(mask_densities(), label=f"{spec_input.name} mask density") if kind in ("random", "masked_rows") else 0.7
            recipes.append(ArgRecipe(spec_input.name, "mask", shape, seed, mask_kind=kind, density=density))
        elif spec_input.kind == "index":
            high = spec_input.high  # type: ignore[union-attr]
            recipes.append(ArgRecipe(spec_input.name, "index", shape, seed, high=sizes[high] if isinstance(high, str) else high))
        else:
            if broadcast and spec_input.broadcastable:  # type: ignore[union-attr]
                shape = draw(broadcast_forms(shape), label=f"{spec_input.name} broadcast shape")
            scale = draw(magnitudes(dtype=dtype, extreme=extreme), label=f"{spec_input.name} scale")
            constant = constant_rows and not spacing and draw(st.booleans(), label=f"{spec_input.name} constant rows")
            layout = draw(st.sampled_from(tuple(layouts)), label=f"{spec_input.name} layout")
            # Only constant rows can be stored stride-0 with the same values.
            constant = constant or layout == "expanded"
            pattern = "random"
            if tuple(value_patterns) != ("random",) and not spacing:
                pattern = draw(st.sampled_from(tuple(value_patterns)), label=f"{spec_input.name} pattern")
                if pattern == "near_zero" and spec_input.domain != "real":  # type: ignore[union-attr]
                    pattern = "random"
            recipes.append(
                ArgRecipe(
                    spec_input.name, "tensor", shape, seed, domain=spec_input.domain,  # type: ignore[union-attr]
                    scale=scale, constant_rows=constant, layout=layout, pattern=pattern,
                )
            )

    if spacing:
        scalars = {r.name: r.value for r in recipes if r.kind == "scalar"}
        kinks = {i.name: _resolve_kinks(i, scalars) for i in spec.tensor_inputs}
        recipes = [
            replace(r, spacing=float(spacing), kinks=kinks[r.name]) if r.kind == "tensor" and r.layout != "expanded" else r
            for r in recipes
        ]

    differentiable = [i.name for i in spec.differentiable_inputs]
    if requires_grad == "all" or not differentiable:
        wanted = frozenset(differentiable)
    else:
        wanted = draw(
            requires_grad_subsets(differentiable, min_size=1 if requires_grad == "nonempty" else 0), label="requires_grad"
        )
    grad_seed = distinct_seed(draw(value_seeds(), label="grad_output seed"), "grad_output")
    grad_kind = draw(st.sampled_from(tuple(grad_output_kinds)), label="grad_output kind")
    grad_scale = draw(magnitudes(dtype=dtype), label="grad_output scale") if grad_kind == "scaled" else 1.0
    return Case(
        spec=spec, device=device, dtype=dtype, sizes=sizes, batches=batches,
        recipes=tuple(recipes), requires_grad=wanted, grad_seed=grad_seed,
        grad_scale=grad_scale, grad_kind=grad_kind,
    )
