"""torch's process-wide state: pinned for every evaluation, restored afterwards.

torch keeps switches that change what every later op does: grad mode, the default dtype and
device, the RNG, deterministic algorithms, backend precision flags, anomaly mode, the thread
count. A spec module that flips one at import (``torch.set_grad_enabled(False)``), a reference
that leaves grad mode off, or a Function that leaks ``torch.set_default_dtype(torch.float64)``
would otherwise change the examples and verdicts of every test that runs after it -- so they
would differ between a serial run and ``-n 2``.

This module is the one place that knows that state. :func:`pinned_global_state` runs a block
under the suite's fixed defaults (:data:`PINNED`, the RNG seeded with :data:`PINNED_SEED`) and
puts back whatever was there before; the runner wraps every example in it, so whatever the
state is when an evaluation starts, it runs the same way. :func:`preserved_global_state`
only snapshots and restores (for importing ``--impl`` modules); :func:`snapshot`,
:func:`restore` and :func:`differences` serve the ``global_state`` contract, and
:func:`kept_flags` keeps a leak inside the Function call that made it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import torch

__all__ = [
    "FLAGS",
    "PINNED",
    "PINNED_SEED",
    "SUITE_THREADS",
    "THREADS",
    "Flag",
    "RngStates",
    "Snapshot",
    "StateChanges",
    "differences",
    "kept_flags",
    "pin",
    "pinned_global_state",
    "pinned_values",
    "preserved_global_state",
    "restore",
    "rng_states",
    "seed_all",
    "set_backend_flags",
    "set_rng_states",
    "snapshot",
]

# torch's intra-op threads for every evaluation unless --threads says otherwise: the suite's
# tensors are small, so more threads only spin (gradcheck ran 3x the CPU time with two).
SUITE_THREADS = 1
THREADS = "torch.get_num_threads()"

# Every evaluation starts with torch's global RNGs seeded with this: a Function that draws
# random numbers draws the same ones whatever ran before it (serially or under xdist).
PINNED_SEED = 0


@dataclass(frozen=True)
class Flag:
    """One piece of torch's global state: how to read it, set it, and its pinned value."""

    name: str  # as a user would read it, e.g. "torch.is_grad_enabled()"
    get: Callable[[], Any]
    set: Callable[[Any], None]
    pinned: Any


_CPU = torch.device("cpu")


def _default_device() -> torch.device:
    """torch.get_default_device(), without its ~8 us when nothing set one (it is read twice per
    evaluation): no device context set globally and no torch-function mode active."""
    context = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if context is not None and getattr(context, "device_context", None) is None and torch._C._len_torch_function_stack() == 0:
        return _CPU
    return torch.get_default_device()


def _set_default_device(device: Any) -> None:
    # None removes the default-device mode altogether (torch's own default: the CPU).
    torch.set_default_device(None if torch.device(device) == torch.device("cpu") else device)


def set_backend_flags(*settings: tuple[Any, str, Any]) -> None:
    """Set torch.backends flags ``(owner, attribute, value)``, also after a module called
    ``torch.backends.disable_global_flags()`` (torch's own testing helpers do at import): torch
    then refuses direct assignment to cuDNN's flags, and its ``flags()`` context managers use this
    same escape hatch."""
    with getattr(torch.backends, "__allow_nonbracketed_mutation")():
        for owner, attribute, value in settings:
            setattr(owner, attribute, value)


@contextlib.contextmanager
def exact_cuda_math() -> Iterator[None]:
    """TF32 and reduced-precision (fp16/bf16) GEMM reductions off, restored afterwards: CUDA-only
    library approximations, not the Function's. Contracts that compare two runs whose memory
    layouts or devices differ use it, because cuDNN and cuBLAS pick another algorithm (one with
    TF32, one without: float32 results 1e-3 apart) for another layout."""
    matmul = torch.backends.cuda.matmul
    owners = (
        (matmul, "allow_tf32"),
        (torch.backends.cudnn, "allow_tf32"),
        (matmul, "allow_fp16_reduced_precision_reduction"),
        (matmul, "allow_bf16_reduced_precision_reduction"),
    )
    saved = tuple(getattr(owner, name) for owner, name in owners)
    set_backend_flags(*((owner, name, False) for owner, name in owners))
    try:
        yield
    finally:
        set_backend_flags(*((owner, name, value) for (owner, name), value in zip(owners, saved)))


def _set_attribute(owner: Any, attribute: str) -> Callable[[Any], None]:
    def set_(value: Any) -> None:
        set_backend_flags((owner, attribute, value))

    return set_


def _torch_getter(name: str, public: Callable[[], Any], part: int | None = None) -> Callable[[], Any]:
    """The getter in ``torch._C`` behind a ``torch.backends`` attribute (item ``part`` of what it
    returns), else ``public``: reading the attribute goes through the backend module's
    ``__getattr__``, ~0.6 us a flag, and every Function call reads the flags twice."""
    private = getattr(torch._C, name, None)
    if private is None:
        return public
    if part is None:
        return cast(Callable[[], Any], private)
    return lambda: private()[part]


def _flags() -> tuple[Flag, ...]:
    """The table of pinned flags, in restore order (matmul precision before allow_tf32, which
    torch derives from it). Pinned values are torch's own defaults, except the thread count,
    which is the process's at import of this module (torch derives it from the machine)."""
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    determinism: Any = torch.utils.deterministic
    return (
        Flag("torch.is_grad_enabled()", torch.is_grad_enabled, torch._C._set_grad_enabled, True),
        Flag("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype, torch.float32),
        Flag("torch.get_default_device()", _default_device, _set_default_device, torch.device("cpu")),
        Flag(
            "torch.are_deterministic_algorithms_enabled()",
            torch.are_deterministic_algorithms_enabled,
            lambda value: torch.use_deterministic_algorithms(value, warn_only=torch.is_deterministic_algorithms_warn_only_enabled()),
            False,
        ),
        Flag(
            "torch.is_deterministic_algorithms_warn_only_enabled()",
            torch.is_deterministic_algorithms_warn_only_enabled,
            lambda value: torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(), warn_only=value),
            False,
        ),
        Flag(
            "torch.utils.deterministic.fill_uninitialized_memory",
            lambda: bool(determinism.fill_uninitialized_memory),
            _set_attribute(determinism, "fill_uninitialized_memory"),
            True,
        ),
        Flag(
            "torch.is_anomaly_enabled()",
            torch.is_anomaly_enabled,
            lambda value: torch.set_anomaly_enabled(value, torch.is_anomaly_check_nan_enabled()),
            False,
        ),
        Flag(
            "torch.is_anomaly_check_nan_enabled()",
            torch.is_anomaly_check_nan_enabled,
            lambda value: torch.set_anomaly_enabled(torch.is_anomaly_enabled(), value),
            True,
        ),
        Flag(THREADS, torch.get_num_threads, torch.set_num_threads, SUITE_THREADS),
        Flag("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "highest"),
        Flag(
            "torch.backends.cuda.matmul.allow_tf32",
            _torch_getter("_get_cublas_allow_tf32", lambda: bool(matmul.allow_tf32)),
            _set_attribute(matmul, "allow_tf32"),
            False,
        ),
        Flag(
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
            _torch_getter("_get_cublas_allow_fp16_reduced_precision_reduction", lambda: bool(matmul.allow_fp16_reduced_precision_reduction), 0),
            _set_attribute(matmul, "allow_fp16_reduced_precision_reduction"),
            True,
        ),
        Flag(
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
            _torch_getter("_get_cublas_allow_bf16_reduced_precision_reduction", lambda: bool(matmul.allow_bf16_reduced_precision_reduction), 0),
            _set_attribute(matmul, "allow_bf16_reduced_precision_reduction"),
            True,
        ),
        Flag("torch.backends.cudnn.enabled", _torch_getter("_get_cudnn_enabled", lambda: bool(cudnn.enabled)), _set_attribute(cudnn, "enabled"), True),
        Flag(
            "torch.backends.cudnn.deterministic",
            _torch_getter("_get_cudnn_deterministic", lambda: bool(cudnn.deterministic)),
            _set_attribute(cudnn, "deterministic"),
            False,
        ),
        Flag(
            "torch.backends.cudnn.benchmark",
            _torch_getter("_get_cudnn_benchmark", lambda: bool(cudnn.benchmark)),
            _set_attribute(cudnn, "benchmark"),
            False,
        ),
        Flag(
            "torch.backends.cudnn.allow_tf32",
            _torch_getter("_get_cudnn_allow_tf32", lambda: bool(cudnn.allow_tf32)),
            _set_attribute(cudnn, "allow_tf32"),
            True,
        ),
        Flag(
            'torch.is_autocast_enabled("cpu")',
            lambda: torch.is_autocast_enabled("cpu"),
            lambda value: torch.set_autocast_enabled("cpu", value),
            False,
        ),
        Flag(
            'torch.is_autocast_enabled("cuda")',
            lambda: torch.is_autocast_enabled("cuda"),
            lambda value: torch.set_autocast_enabled("cuda", value),
            False,
        ),
    )


FLAGS: tuple[Flag, ...] = _flags()
PINNED: Mapping[str, Any] = MappingProxyType({flag.name: flag.pinned for flag in FLAGS})
INFERENCE_MODE = "torch.is_inference_mode_enabled()"


def pinned_values(*, threads: int = SUITE_THREADS) -> Mapping[str, Any]:
    """The pinned values, with ``threads`` intra-op threads (``--threads``) instead of the default."""
    if threads == PINNED[THREADS]:
        return PINNED
    return MappingProxyType({**PINNED, THREADS: threads})


@dataclass(frozen=True)
class RngStates:
    """torch's global generator states: the CPU's, and every CUDA device's once CUDA is initialised."""

    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...] | None

    def same_as(self, other: RngStates) -> bool:
        if not torch.equal(self.cpu, other.cpu):
            return False
        if self.cuda is None or other.cuda is None:
            return True  # CUDA was not in use on one side: nothing of it to compare
        return len(self.cuda) == len(other.cuda) and all(torch.equal(a, b) for a, b in zip(self.cuda, other.cuda))


def rng_states() -> RngStates:
    """The current global RNG states (never initialises CUDA)."""
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        cuda = tuple(torch.cuda.get_rng_state_all())
    return RngStates(torch.get_rng_state(), cuda)


@dataclass(frozen=True)
class Snapshot:
    """Every pinned flag's value, inference mode, and the RNG states at one moment."""

    flags: Mapping[str, Any]
    inference_mode: bool
    rng: RngStates


def snapshot() -> Snapshot:
    return Snapshot(MappingProxyType({flag.name: flag.get() for flag in FLAGS}), torch.is_inference_mode_enabled(), rng_states())


def _apply(values: Mapping[str, Any]) -> None:
    """Set each flag to ``values[name]``, calling a setter only where the value differs (so an
    unchanged flag costs nothing and triggers no deprecation warning)."""
    for flag in FLAGS:
        wanted = values[flag.name]
        if flag.get() != wanted:
            flag.set(wanted)


def set_rng_states(states: RngStates) -> None:
    """Put the global generators back to ``states`` (CUDA's only where they were recorded)."""
    torch.set_rng_state(states.cpu)
    if states.cuda is not None:
        torch.cuda.set_rng_state_all(list(states.cuda))


def restore(saved: Snapshot, *, rng: bool = True) -> None:
    """Put back the flags (and, unless ``rng=False``, the RNG states) of ``saved``.

    Inference mode is a context, not a flag: :func:`pinned_global_state` leaves it by entering
    ``torch.inference_mode(False)`` and exits that context itself."""
    _apply(saved.flags)
    if rng:
        set_rng_states(saved.rng)


def seed_all(seed: int) -> None:
    """``torch.manual_seed(seed)`` for the devices the suite runs on, without its cost where CUDA
    cannot be used: there it records a formatted stack per device backend (cuda, xpu, mtia) to
    replay at their initialisation, ~1 ms per call, 7% of the main job."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # lazily, until CUDA is initialised


def pin(values: Mapping[str, Any] = PINNED, *, rng: bool = True) -> None:
    """Set every flag to its pinned value (``values``, see :func:`pinned_values`) and (unless
    ``rng=False``) seed the RNGs with :data:`PINNED_SEED` (CUDA lazily: seeding never initialises it)."""
    _apply(values)
    if rng:
        seed_all(PINNED_SEED)


def differences(
    now: Snapshot, expected: Mapping[str, Any] = PINNED, *, inference_mode: bool = False
) -> list[tuple[str, Any, Any]]:
    """``(name, value now, expected value)`` for every flag of ``now`` that differs from
    ``expected`` (default: the pinned values), inference mode first."""
    found = [(name, value, expected[name]) for name, value in now.flags.items() if value != expected[name]]
    if now.inference_mode != inference_mode:
        found.insert(0, (INFERENCE_MODE, now.inference_mode, inference_mode))
    return found


@contextlib.contextmanager
def pinned_global_state(values: Mapping[str, Any] = PINNED) -> Iterator[None]:
    """Run the block under the pinned defaults (grad mode on, float32, CPU default device, RNGs
    seeded, deterministic algorithms and anomaly mode off, torch's backend defaults, one intra-op
    thread; ``values`` from :func:`pinned_values` to change the thread count), then put back
    exactly what was there before, RNG states included."""
    saved = snapshot()
    try:
        with contextlib.ExitStack() as stack:
            if saved.inference_mode:
                stack.enter_context(torch.inference_mode(False))
            pin(values)
            yield
    finally:
        restore(saved)


_GETTERS: tuple[Callable[[], Any], ...] = tuple(flag.get for flag in FLAGS)


def _flag_values() -> list[Any]:
    return [get() for get in _GETTERS]


class kept_flags:  # lower case: used as a context manager, like contextlib's
    """Put every flag back as it was when the block started, but leave the RNG alone (a
    Function's random draws must stay visible to the determinism contract). The execution layer
    runs each Function call in it, so a leak is the ``global_state`` contract's finding only,
    not a crash of whatever the same example runs next.

    A class, not a generator: it wraps every Function call (hundreds per gradcheck), and one
    read of the flags after the block, compared as a whole, costs less than a setter check each."""

    __slots__ = ("_saved",)

    def __enter__(self) -> None:
        self._saved = _flag_values()

    def __exit__(self, *exc_info: object) -> None:
        if _flag_values() != self._saved:
            _apply({flag.name: value for flag, value in zip(FLAGS, self._saved)})


@dataclass
class StateChanges:
    """What a :func:`preserved_global_state` block changed (filled in when it exits)."""

    changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    rng_changed: bool = False

    def describe(self) -> str:
        parts = [f"{name}={before!r} -> {after!r}" for name, after, before in self.changes]
        if self.rng_changed:
            parts.append("the global RNG state")
        return ", ".join(parts)


@contextlib.contextmanager
def preserved_global_state() -> Iterator[StateChanges]:
    """Run the block (e.g. importing an ``--impl`` module) and undo any change it made to
    torch's global state; the yielded :class:`StateChanges` says what was undone.

    Example::

        with preserved_global_state() as changed:
            importlib.import_module(target)
        if changed.changes or changed.rng_changed:
            warnings.warn(f"importing {target} changed {changed.describe()}; restored")
    """
    saved = snapshot()
    report = StateChanges()
    try:
        yield report
    finally:
        after = snapshot()
        # Inference mode left on (a context entered and never exited) cannot be undone from
        # here; it is reported, and pinned_global_state leaves it for every evaluation.
        report.changes = differences(after, saved.flags, inference_mode=saved.inference_mode)
        report.rng_changed = not after.rng.same_as(saved.rng)
        restore(saved)
