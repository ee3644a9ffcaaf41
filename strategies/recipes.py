"""Recipes: how to rebuild one drawn argument, one class per input kind.

A recipe holds only what was drawn (shape, seed, kind, ...), never tensors. It builds fresh
values in any dtype/device (:meth:`Recipe.build`), writes Python that rebuilds them for a repro
snippet (:meth:`Recipe.source`) and describes itself in one line (:meth:`Recipe.describe`). The
drawing functions of :mod:`strategies.draw` make them, one per input kind of ``conformance.spec``;
a new input kind is one input class, one drawing function and one recipe class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from hypothesis.errors import InvalidArgument

from strategies.layouts import apply_layout
from strategies.values import (
    additive_mask_from_seed,
    index_from_seed,
    mask_from_seed,
    tensor_from_seed,
)

__all__ = [
    "AdditiveMaskRecipe",
    "DerivedContext",
    "DerivedRecipe",
    "FloatingRecipe",
    "IndexRecipe",
    "MaskRecipe",
    "OffsetsRecipe",
    "Recipe",
    "ScalarRecipe",
    "TensorRecipe",
    "derived_from_seed",
]


@dataclass(frozen=True)
class Recipe:
    """One drawn argument. Subclasses set ``kind`` and implement build/source."""

    name: str

    kind: ClassVar[str] = "argument"

    @property
    def differentiable(self) -> bool:
        """Whether this argument can require grad (backward must return None for the others)."""
        return False

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name}: {self.kind}{tuple(self.shape)}"


@dataclass(frozen=True)
class ScalarRecipe(Recipe):
    """A non-tensor argument: the drawn (or constant) value itself."""

    value: Any = None

    kind: ClassVar[str] = "scalar"

    @property
    def plain(self) -> bool:
        """Whether the value is plain data whose repr tells it apart from every other value (numbers,
        strings, dtypes, None and tuples or lists of them; not an array, a tensor or a callable)."""
        return _plain(self.value, lists=True)

    @property
    def immutable(self) -> bool:
        """Plain data nothing can change in place: :attr:`plain` without a list inside."""
        return _plain(self.value, lists=False)

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        return self.value

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        return repr(self.value)

    def describe(self) -> str:
        # A function or class by its name: its repr's address differs from process to process.
        shown = _name_of(self.value) if callable(self.value) else repr(self.value)
        return f"{self.name}={shown}"


def _plain(value: Any, *, lists: bool) -> bool:
    if isinstance(value, tuple) or (lists and isinstance(value, list)):
        return all(_plain(item, lists=lists) for item in value)
    return value is None or isinstance(value, (bool, int, float, complex, str, torch.dtype))


@dataclass(frozen=True)
class FloatingRecipe(Recipe):
    """A floating tensor in a memory layout (Tensor, Derived): the layout contracts change its
    ``layout``, and backward may return a gradient for it (for other kinds it must return None)."""

    shape: tuple[int, ...] = ()
    seed: int = 0
    layout: str = "contiguous"


@dataclass(frozen=True)
class TensorRecipe(FloatingRecipe):
    """A floating tensor from a seed (:func:`strategies.values.tensor_from_seed`) in a layout."""

    domain: Any = "real"
    scale: float = 1.0
    constant_rows: bool = False
    pattern: str = "random"
    # Finite differences: elements at least ``spacing`` apart and from ``kinks`` (see spread()).
    spacing: float = 0.0
    kinks: tuple[float, ...] = ()

    kind: ClassVar[str] = "tensor"

    @property
    def differentiable(self) -> bool:
        return True

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        tensor = tensor_from_seed(
            self.shape, dtype, seed=self.seed, domain=self.domain, scale=self.scale,
            device=device, constant_rows=self.constant_rows, pattern=self.pattern,
            spacing=self.spacing, kinks=self.kinks,
        )
        return apply_layout(tensor, self.layout)

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        extra = ", constant_rows=True" if self.constant_rows else ""
        if self.pattern != "random":
            extra += f", pattern={self.pattern!r}"
        if self.spacing:
            extra += f", spacing={self.spacing!r}"
        if self.kinks:
            extra += f", kinks={self.kinks!r}"
        text = (
            f"tensor_from_seed({self.shape!r}, {dtype}, seed={self.seed}, domain={self.domain!r}, "
            f"scale={self.scale!r}, device={device!r}{extra})"
        )
        return _with_layout(text, self.layout)

    def describe(self) -> str:
        # What the repro's values hold beyond a shape: what made a Function raise or overflow.
        extra = f", layout={self.layout}" if self.layout != "contiguous" else ""
        extra += f", magnitude~{self.scale:g}" if self.scale != 1.0 else ""
        extra += ", constant rows" if self.constant_rows else ""
        extra += f", {self.pattern} values" if self.pattern != "random" else ""
        return f"{self.name}: tensor{tuple(self.shape)}{extra}"


@dataclass(frozen=True)
class MaskRecipe(Recipe):
    """A boolean mask (``True`` = keep) of a kind (:func:`strategies.values.mask_from_seed`)."""

    shape: tuple[int, ...] = ()
    seed: int = 0
    mask_kind: str = "random"
    density: float = 0.7

    kind: ClassVar[str] = "mask"

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        return mask_from_seed(self.shape, seed=self.seed, kind=self.mask_kind, density=self.density, device=device)

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        density = f", density={self.density!r}" if self.density != 0.7 else ""
        return f"mask_from_seed({self.shape!r}, seed={self.seed}, kind={self.mask_kind!r}{density}, device={device!r})"

    def describe(self) -> str:
        return f"{self.name}: mask{tuple(self.shape)} {self.mask_kind}"


@dataclass(frozen=True)
class AdditiveMaskRecipe(MaskRecipe):
    """The additive form of a mask, in the case dtype: 0 where kept, ``-inf`` where masked."""

    kind: ClassVar[str] = "additive mask"

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        return additive_mask_from_seed(self.shape, dtype, seed=self.seed, kind=self.mask_kind, density=self.density, device=device)

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        density = f", density={self.density!r}" if self.density != 0.7 else ""
        return (
            f"additive_mask_from_seed({self.shape!r}, {dtype}, seed={self.seed}, kind={self.mask_kind!r}{density}, "
            f"device={device!r})"
        )

    def describe(self) -> str:
        return f"{self.name}: additive mask{tuple(self.shape)} {self.mask_kind}"


@dataclass(frozen=True)
class IndexRecipe(Recipe):
    """An int64 index tensor in ``[0, high)``; a ``sentinel_fraction`` of it set to ``sentinels``."""

    shape: tuple[int, ...] = ()
    seed: int = 0
    high: int = 1
    sentinels: tuple[int, ...] = ()
    sentinel_fraction: float = 0.0

    kind: ClassVar[str] = "index"

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        return index_from_seed(
            self.shape, seed=self.seed, high=self.high, device=device,
            sentinels=self.sentinels, sentinel_fraction=self.sentinel_fraction,
        )

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        extra = f", sentinels={self.sentinels!r}, sentinel_fraction={self.sentinel_fraction!r}" if self.sentinel_fraction else ""
        return f"index_from_seed({self.shape!r}, seed={self.seed}, high={self.high}{extra}, device={device!r})"

    def describe(self) -> str:
        extra = ""
        if self.sentinel_fraction:  # what this tensor holds: a drawn fraction of one element is often none
            built = self.build(torch.int64, "cpu")
            count = int(sum(int((built == s).sum()) for s in self.sentinels))
            extra = f", {count} of {built.numel()} set to {list(self.sentinels)}"
        return f"{self.name}: index{tuple(self.shape)} < {self.high}{extra}"


@dataclass(frozen=True)
class OffsetsRecipe(Recipe):
    """Cumulative sequence offsets (``cu_seqlens``): int32, ``0 = c0 <= ... <= cb = total``."""

    values: tuple[int, ...] = (0,)

    kind: ClassVar[str] = "offsets"

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.values),)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.values, self.values[1:]))

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        return torch.tensor(self.values, dtype=torch.int32, device=device)

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        return f"torch.tensor({list(self.values)!r}, dtype=torch.int32, device={device!r})"

    def describe(self) -> str:
        return f"{self.name}: offsets {list(self.values)} (lengths {list(self.lengths)})"


@dataclass(frozen=True)
class DerivedContext:
    """What a ``Derived`` input's function is given: the drawn shape of the input, every drawn dim
    size, a CPU generator seeded for this call, and the earlier inputs (CPU float64 copies)."""

    shape: tuple[int, ...]
    sizes: Mapping[str, int]
    generator: torch.Generator
    inputs: Mapping[str, Any]


def derived_from_seed(
    fn: Callable[[DerivedContext], torch.Tensor],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    seed: int,
    sizes: Mapping[str, int],
    inputs: Mapping[str, Any] | None = None,
    device: str | torch.device = "cpu",
    name: str = "derived",
) -> torch.Tensor:
    """``fn(ctx)`` for a ``Derived`` input, checked and cast to ``dtype`` on ``device``.

    The function computes on the CPU (any floating dtype; float64 recommended) from
    ``ctx.generator`` (seeded with ``seed``), ``ctx.sizes`` and ``ctx.inputs``; the same seed
    gives the same values for every dtype. An integer or bool result keeps its dtype (indices with a
    precondition, such as a permutation). Raises ``InvalidArgument`` naming the input when it
    returns something other than a real tensor of ``shape``.
    """
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    upcast = {
        key: value.detach().to("cpu", torch.float64) if isinstance(value, torch.Tensor) and value.is_floating_point()
        else value.detach().cpu() if isinstance(value, torch.Tensor) else value
        for key, value in (inputs or {}).items()
    }
    context = DerivedContext(shape=tuple(int(s) for s in shape), sizes=dict(sizes), generator=generator, inputs=upcast)
    value = fn(context)
    if not isinstance(value, torch.Tensor) or value.is_complex():
        raise InvalidArgument(
            f"Derived input {name!r}: {_name_of(fn)} returned {type(value).__name__}, not a floating, integer or bool tensor"
        )
    if tuple(value.shape) != context.shape:
        raise InvalidArgument(
            f"Derived input {name!r}: {_name_of(fn)} returned shape {tuple(value.shape)}, but should be {context.shape} (ctx.shape)"
        )
    if not value.is_floating_point():
        return value.detach().to(device)  # indices with a precondition (a permutation): kept exact
    return value.detach().to(device="cpu", dtype=torch.float64).to(dtype).to(device)


@dataclass(frozen=True)
class DerivedRecipe(FloatingRecipe):
    """A tensor computed by the spec's function from a seed, the sizes and earlier inputs."""

    sizes: tuple[tuple[str, int], ...] = ()
    requires_grad: bool = False

    kind: ClassVar[str] = "derived"

    @property
    def differentiable(self) -> bool:
        return self.requires_grad

    def build(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: Mapping[str, Any] | None = None) -> Any:
        if spec_input is None or not callable(getattr(spec_input, "fn", None)):
            raise InvalidArgument(f"Derived input {self.name!r} needs its spec input (the function) to be built")
        value = derived_from_seed(
            spec_input.fn, self.shape, dtype, seed=self.seed, sizes=dict(self.sizes), inputs=earlier,
            device=device, name=self.name,
        )
        return apply_layout(value, self.layout)

    def source(self, dtype: torch.dtype, device: str, *, spec_input: Any = None, earlier: tuple[str, ...] = ()) -> str:
        fn = getattr(spec_input, "fn", None)
        shown = _importable(fn) or f"spec.input_named({self.name!r}).fn"  # Case.repro defines spec
        inputs = ", inputs={" + ", ".join(f"{n!r}: {n}" for n in earlier) + "}" if earlier else ""
        text = (
            f"derived_from_seed({shown}, {self.shape!r}, {dtype}, seed={self.seed}, sizes={dict(self.sizes)!r}"
            f"{inputs}, device={device!r}, name={self.name!r})"
        )
        return _with_layout(text, self.layout)

    def describe(self) -> str:
        extra = f", layout={self.layout}" if self.layout != "contiguous" else ""
        return f"{self.name}: derived{tuple(self.shape)}{extra}"


def _with_layout(text: str, layout: str) -> str:
    return text if layout == "contiguous" else f"apply_layout({text}, {layout!r})"


def _name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _importable(fn: Any) -> str | None:
    """``module.qualname`` source for a module-level function, else None (lambdas, closures)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module or not qualname or "<" in qualname or module.startswith("_conformance_impl_"):
        return None
    return f"__import__('importlib').import_module({module!r}).{qualname}"
