"""Room on CPython's frame stack for a test's deep, hot call chains.

Since 3.11 CPython keeps frames in 16 KiB chunks, allocated with ``mmap`` when a call does not fit
and unmapped when the call returns. Under pytest, Hypothesis and the suite, a test's hot path sits
at a depth where calls cross a chunk boundary over and over: the main job made ~220,000 ``mmap`` and
``munmap`` pairs in one contract's tests alone (a tenth of its time in the kernel). :func:`with_room`
runs a call above a frame that takes a chunk of its own big enough to leave ~128 KiB after it, so
the call's descendants stay inside that chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["with_room"]

T = TypeVar("T")

_LOCALS = 16_000  # x 8 bytes: a frame of ~128 KiB, so CPython gives it a 256 KiB chunk

# Unreachable assignments make the names locals (sized into the frame) without running anything.
_SOURCE = (
    "def with_room(call, /, *args, **kwargs):\n"
    "    __tracebackhide__ = True\n"
    "    return call(*args, **kwargs)\n"
    "    " + " = ".join(f"_{i}" for i in range(_LOCALS)) + " = None\n"
)
_namespace: dict[str, Any] = {}
exec(compile(_SOURCE, "<conformance stack room>", "exec"), _namespace)
_with_room: Callable[..., Any] = _namespace["with_room"]


def with_room(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, run with room on the frame stack (see the module docstring)."""
    __tracebackhide__ = True
    return _with_room(call, *args, **kwargs)  # type: ignore[no-any-return]
