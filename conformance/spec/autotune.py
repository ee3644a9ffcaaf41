"""Introspection of ``@triton.autotune`` kernels: their configs, and a config in words.

Pure introspection (attributes of the Autotuner and its ``triton.Config`` objects; triton is not
imported): ``register(..., autotune=kernel)`` makes one spec per config with it, and
:mod:`conformance.engine.triton_interpreter` pins a kernel to one of them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["autotuned_configs", "describe_config"]


def autotuned_configs(kernel: Any) -> list[Any]:
    """The ``triton.Config`` list of an ``@triton.autotune`` kernel; ValueError for anything else."""
    configs = getattr(kernel, "configs", None)
    if not isinstance(configs, list) or not configs or not hasattr(kernel, "keys"):
        raise ValueError(f"{kernel!r} is not an @triton.autotune kernel (no configs)")
    return list(configs)


def describe_config(config: Any) -> str:
    """``BLOCK_M=16, BLOCK_N=32, num_warps=4``: the kwargs then the launch options that differ
    from the defaults."""
    parts = [f"{k}={v}" for k, v in getattr(config, "kwargs", {}).items()]
    for option, default in (("num_warps", 4), ("num_stages", 3), ("num_ctas", 1)):
        value = getattr(config, option, None)
        if value is not None and value != default:
            parts.append(f"{option}={value}")
    return ", ".join(parts) or "defaults"
