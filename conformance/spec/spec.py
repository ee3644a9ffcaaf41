"""A registered spec: one target and everything the suite may assume about it, as frozen data.

Also the vocabulary its fields are checked against (supported dtypes and devices, waivable
contracts, what ``saves=`` may promise, tolerance defaults and caps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from conformance.spec.dims import DimRule
from conformance.spec.inputs import Derived, InputSpec, Shaped, Tensor
from conformance.spec.targets import FunctionAdapter, OpAdapter

__all__ = [
    "DEFAULT_TOLERANCES",
    "DEVICES",
    "MAX_FLOOR_ULPS",
    "MAX_TOLERANCE",
    "SAVES_CHOICES",
    "SUPPORTED_DTYPES",
    "WAIVABLE",
    "SavesPromise",
    "Spec",
]

DEVICES = ("cpu", "cuda")
# The dtypes the suite generates cases in and compares (the --dtypes choices): float8 and other
# storage formats have no arithmetic of their own to check a backward in.
SUPPORTED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

# What a Function promises to keep for backward (register(..., saves=)): only its inputs'
# storages; its inputs' and outputs'; or, as a callable of the input tensors by name, how many
# bytes it may keep beyond those (e.g. flash attention's log-sum-exp: batch x heads x rows x 4).
SAVES_CHOICES = ("inputs", "inputs_and_outputs")
SavesPromise = Union[str, Callable[[Mapping[str, torch.Tensor]], int]]

# Contracts a spec may waive with a stated reason (register(..., waivers={name: reason})): findings
# about efficiency, and unwritten_memory for a Function that deliberately returns uninitialised
# padding (the waiver also turns poisoned allocations off for that Function), and compile for a
# Function not meant to be compiled with fullgraph=True (Python loops over data-dependent lengths,
# torch.autograd.grad inside backward) or hit by a torch.compile bug.
# Contracts about how a Function is used or built, not whether its numbers are right where it is
# used: a Function that is never compiled or never run under autocast waives those with a reason.
WAIVABLE = ("unneeded_grads", "unwritten_memory", "compile", "grad_meta", "autocast")

# Default k (error multiplier against the same-dtype reference) and the hard cap on overrides.
DEFAULT_TOLERANCES = {"output": 2.0, "grad": 3.0}
MAX_TOLERANCE = 64.0
# tolerances[dtype]["floor_ulps"]: the floor in rounding steps of the dtype at max|reference|
# (default numerics.FLOOR_ULPS) for a kernel that is near-exact against an exact reference.
MAX_FLOOR_ULPS = 256
# tolerances[torch.float64]["rtol"/"atol"]: float64 results approximate by design (an adjoint ODE
# solve, an iterative solver's tolerance), compared with assert_close at these instead of its defaults.
FLOAT64_TOLERANCE_KEYS = ("rtol", "atol")
MAX_FLOAT64_TOLERANCE = 1e-2


@dataclass(frozen=True, eq=False)
class Spec:
    """One registered target (a Function or a custom op) and everything the suite may assume about it.

    ``op`` is how the suite calls, names and imports it (:mod:`conformance.spec.targets`); ``fn`` is
    the Function the probe wraps (the user's own, or one made of a custom op's registered pieces)."""

    fn: type[torch.autograd.Function]
    name: str
    inputs: tuple[InputSpec, ...]
    reference: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    double_backward: bool
    surrogate: Callable[..., Any] | None
    mutates: tuple[str, ...]
    nondeterministic: bool
    tolerances: Mapping[torch.dtype, Mapping[str, float]] = field(default_factory=dict)
    waivers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None  # seconds per example; None: the run's --example-timeout
    saves: SavesPromise | None = None  # what forward may keep for backward (the saved_memory contract)
    dim_rules: Mapping[str, DimRule] = field(default_factory=dict)  # from Dim(...) and "d:even"
    max_elements: int | None = None  # caps every contract's per-input element budget
    max_examples: int | None = None  # caps the examples per contract test
    fast_gradcheck: bool = False  # gradcheck by random projections at every size (costly evaluations)
    compile_promises: frozenset[str] = frozenset()  # "fullgraph", "dynamic": what compile may fail on beyond values
    # register(..., autotune=kernel): this spec checks one config of an @triton.autotune kernel
    autotune_pin: tuple[Any, int] | None = None
    autotune_config: str = ""  # that config, described for failure messages
    origin: str = "__main__"
    source_file: str = ""
    op: OpAdapter = field(default=None, repr=False)  # type: ignore[assignment]  # None until __post_init__ sets it
    registered_at: str = ""

    def __post_init__(self) -> None:
        # Also when ``dataclasses.replace(spec, fn=other)`` carries the old Function's adapter over.
        if self.op is None or (isinstance(self.op, FunctionAdapter) and self.op.function is not self.fn):
            object.__setattr__(self, "op", FunctionAdapter(self.fn))

    @property
    def display_name(self) -> str:
        """The target in messages: ``MyFn`` or ``mylib::softplus``."""
        return self.op.display_name

    @property
    def tensor_inputs(self) -> tuple[Tensor, ...]:
        return tuple(i for i in self.inputs if isinstance(i, Tensor))

    @property
    def differentiable_inputs(self) -> tuple[Tensor | Derived, ...]:
        return tuple(i for i in self.inputs if isinstance(i, (Tensor, Derived)) and i.differentiable)

    @property
    def dim_names(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for spec_input in self.inputs:
            for dim in spec_input.dims_used():
                names[dim] = None
        return tuple(names)

    @property
    def batch_names(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for spec_input in self.inputs:
            batch = spec_input.parsed.batch if isinstance(spec_input, Shaped) else None
            if batch:
                names[batch] = None
        return tuple(names)

    @property
    def supports_float64(self) -> bool:
        return torch.float64 in self.dtypes

    def index_of(self, name: str) -> int:
        return [i.name for i in self.inputs].index(name)

    def input_named(self, name: str) -> InputSpec:
        return self.inputs[self.index_of(name)]

    def __repr__(self) -> str:
        return f"<conformance spec {self.name!r}: {self.op.module}.{self.display_name}>"
