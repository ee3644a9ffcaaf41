"""The machine's devices: is CUDA usable, which GPU an xdist worker takes, how Triton runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import torch

from conformance.engine.triton_interpreter import choose_interpreter, installed

__all__ = ["cuda_findings", "cuda_usable", "no_cuda_reason", "prepare_devices", "triton_mode", "worker_gpu", "worker_gpus"]


def cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def cuda_findings() -> str:
    """What torch says about CUDA, for messages that explain why it is not used."""
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (
        f"torch {torch.__version__} ({build}), torch.cuda.is_available()={torch.cuda.is_available()}, "
        f"torch.cuda.device_count()={torch.cuda.device_count()}"
    )


def no_cuda_reason() -> str:
    """Why a ``-cuda`` test is not run here (its verdict's reason)."""
    return f"CUDA is not available on this machine ({cuda_findings()})"


def describe_cuda() -> str:
    """The report header's words for the machine's CUDA."""
    return f"cuda ({torch.cuda.get_device_name()})" if cuda_usable() else "cuda: not available, CUDA tests not run"


# The GPU prepare_devices made current for this whole process (an xdist worker of a suite run).
_PINNED: dict[str, int] = {}


def worker_gpus(worker: str, visible: int, per_worker: int = 1) -> tuple[int, ...]:
    """The CUDA device indices (among the visible ones) xdist worker ``worker`` uses.

    Worker ``gwN`` gets ``per_worker`` consecutive devices starting at ``N * per_worker``, wrapping
    around the ``visible`` devices (so more workers than GPUs share them round-robin). Outside
    xdist (``worker`` is ``""`` or ``"master"``) the first ``per_worker`` devices. Indices are
    relative to ``CUDA_VISIBLE_DEVICES``, as torch's are.
    """
    if visible < 1:
        raise ValueError(f"visible={visible!r}: no CUDA device to assign")
    if per_worker < 1 or per_worker > visible:
        raise ValueError(f"per_worker={per_worker!r} must be between 1 and the {visible} visible devices")
    number = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    first = number * per_worker
    return tuple((first + i) % visible for i in range(per_worker))


@contextlib.contextmanager
def worker_gpu() -> Iterator[None]:
    """In an xdist worker with CUDA, the worker's own GPU (:func:`worker_gpus`, one per worker) is
    the current device for the block, and the previous one after it: ``conformance.check()``
    called from tests spread over workers. Where the suite's own run already pinned this process
    (:func:`prepare_devices`, ``--gpus-per-worker``), and outside xdist, the current device is left
    as it is."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker or "gpu" in _PINNED or not cuda_usable():
        yield
        return
    with torch.cuda.device(worker_gpus(worker, torch.cuda.device_count())[0]):
        yield


def choose_triton_interpreter() -> None:
    """Without CUDA, the Triton interpreter, before the --impl modules are imported."""
    choose_interpreter(torch.cuda.is_available())


def prepare_devices(gpus_per_worker: int) -> None:
    """Before the ``--impl`` modules are imported: pin this process's GPU (an xdist worker takes
    its own), or, without CUDA, choose the Triton interpreter."""
    if not torch.cuda.is_available():
        choose_triton_interpreter()
        return
    try:
        gpus = worker_gpus(os.environ.get("PYTEST_XDIST_WORKER", ""), torch.cuda.device_count(), gpus_per_worker)
    except ValueError as error:
        raise pytest.UsageError(f"--gpus-per-worker={gpus_per_worker}: {error}") from None
    torch.cuda.set_device(gpus[0])
    _PINNED["gpu"] = gpus[0]


def triton_mode() -> str:
    """How Triton kernels run here: not installed, native, or interpreted (and how)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "not installed"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "native"
    if installed():
        return "interpreted (bfloat16 disabled; libdevice fallbacks and one autotune config per test id)"
    return "interpreted (bfloat16 disabled)"
