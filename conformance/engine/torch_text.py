"""Everything the suite reads out of torch's own message text, in one place, and the two steps of
torch's whose only products are text and a metric the suite never shows.

torch reports some facts only in prose: which input gradcheck found wrong, that a backward is not
reentrant, that double backward went through ``@once_differentiable``, that Dynamo cannot trace a
Function with a ``jvp``. The phrases are torch's, not an API, and may change between versions:
``tests/test_torch_text.py`` pins each one against the messages the installed torch really
produces (torch 2.13), so a torch upgrade that rewords one fails there, not as a silently
vaguer report.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "JIT_SCRIPT_DEPRECATION",
    "PINNED_TORCH",
    "dynamo_refuses_jvp",
    "dynamo_unbacked_symbol",
    "gradcheck_input",
    "gradcheck_not_reentrant",
    "is_once_differentiable_node",
    "jacobian_pair",
    "modified_no_grad_view",
    "modified_saved_tensor",
    "raised_by_once_differentiable",
    "without_guard_latency_profile",
    "without_slow_mode_jacobians",
    "writes_overlapping_memory",
]

# The torch release whose messages tests/test_torch_text.py checks.
PINNED_TORCH = "2.13"

# The warning torch's forward-AD machinery gives when it scripts a helper on first use.
JIT_SCRIPT_DEPRECATION = r".*torch\.jit\.script.* is deprecated"

_GRADCHECK_INPUT = re.compile(r"with respect to input (\d+)")
_JACOBIAN_PAIR = re.compile(r"output (\d+) with respect to input (\d+)")


_SLOW_MODE_STEP = "_run_slow_mode_and_get_error"  # torch.autograd.gradcheck's, called by name
SLOW_MODE_SKIPPED = (
    "\n(the slow-mode Jacobians torch prints here were not recomputed for this example: "
    "the reported example recomputes them)\n"
)


@contextlib.contextmanager
def _replaced(module_name: str, step: str, stub: Callable[..., Any]) -> Iterator[None]:
    """The block with torch's ``module_name.step`` replaced by ``stub`` (torch calls it by name
    from that module, so the swap takes), restored after; nothing changes when this torch has no
    such step."""
    module = importlib.import_module(module_name)
    original = getattr(module, step, None)
    if original is None:
        yield
        return
    setattr(module, step, stub)
    try:
        yield
    finally:
        setattr(module, step, original)


def without_slow_mode_jacobians() -> contextlib.AbstractContextManager[None]:
    """Fast-mode gradcheck/gradgradcheck without the message's slow-mode Jacobians.

    On a fast-mode mismatch torch recomputes both Jacobians of the mismatching pair in slow mode
    (one backward and two forwards per input element) only to print them in its message: the
    verdict is the same, the cost is the whole slow check, paid on every failing example a search
    meets and shrinks through. Here the message keeps torch's fast-mode part and says the rest was
    skipped (:data:`SLOW_MODE_SKIPPED`). If this torch has no such step, nothing changes."""
    # The module, not the function torch.autograd exports.
    return _replaced("torch.autograd.gradcheck", _SLOW_MODE_STEP, lambda *args, **kwargs: SLOW_MODE_SKIPPED)


_GUARD_LATENCY_STEP = "profile_guard_manager"  # torch._dynamo.guards', called by name


def without_guard_latency_profile() -> contextlib.AbstractContextManager[None]:
    """torch.compile without Dynamo's guard-latency measurement.

    After building a frame's guards, Dynamo flushes the CPU caches and times one evaluation of
    them, only to write the latency to a debug log line and a compile metric: ~21 ms per compile
    (measured, torch 2.13, CPU), about a quarter of a small Function's ``aot_eager`` compile. The
    guards are built, checked and used as before; the latency reads 0. If this torch has no such
    step, nothing changes."""
    return _replaced("torch._dynamo.guards", _GUARD_LATENCY_STEP, lambda *args, **kwargs: 0.0)


def gradcheck_not_reentrant(message: str) -> bool:
    """A ``GradcheckError`` saying two backward calls on the same graph differed."""
    return "not reentrant" in message


def gradcheck_input(message: str) -> int | None:
    """The input position a ``GradcheckError`` names ("... with respect to input 1"), or None."""
    match = _GRADCHECK_INPUT.search(message)
    return int(match.group(1)) if match else None


def jacobian_pair(message: str) -> tuple[int, int] | None:
    """``(output, input)`` a ``GradcheckError`` names ("Jacobian mismatch for output 0 with respect
    to input 2"); for gradgradcheck the output is a first-order gradient and the input one of the
    function's inputs followed by the grad_outputs. None when it names none."""
    match = _JACOBIAN_PAIR.search(message)
    return (int(match.group(1)), int(match.group(2))) if match else None


def raised_by_once_differentiable(error: BaseException) -> bool:
    """The error a double backward through a ``@once_differentiable`` backward raises."""
    return "once_differentiable" in str(error)


def is_once_differentiable_node(grad_fn: Any) -> bool:
    """A graph node that only raises when differentiated (what ``@once_differentiable`` attaches
    to a gradient computed under ``create_graph=True``): torch names it ``...Error...``."""
    return grad_fn is not None and "Error" in grad_fn.name()


def dynamo_refuses_jvp(text: str) -> bool:
    """Dynamo's refusal to trace an autograd.Function that defines ``jvp`` (``text``: the error's
    message, whitespace collapsed)."""
    return "jvp" in text


def dynamo_unbacked_symbol(text: str) -> bool:
    """Dynamo failing on an unbacked symbol: a number read from a tensor's values (``int(t)``,
    ``t.item()``) that the traced region does not return ("Pending unbacked symbols {u1} not in
    returned outputs"; ``text``: the error's message)."""
    return "unbacked symbol" in text.lower()


def writes_overlapping_memory(error: BaseException) -> bool:
    """torch's refusal to write in place into a tensor whose elements share memory (an expanded,
    stride-0 tensor): "unsupported operation: more than one element of the written-to tensor
    refers to a single memory location"."""
    return "more than one element of the written-to tensor refers to a single memory location" in str(error)


def modified_no_grad_view(error: BaseException) -> bool:
    """autograd's refusal of an in-place write, with grad mode on, into a view made under no_grad
    (or into its base): "A view was created in no_grad mode and [its base ... has been | is being]
    modified inplace with grad mode enabled". gradcheck perturbs its inputs through such views,
    so a backward that writes into what it saved of an input meets this on gradcheck's next call."""
    text = str(error)
    return "A view was created in no_grad mode and" in text and "modified inplace with grad mode enabled" in text


def modified_saved_tensor(error: BaseException) -> bool:
    """autograd's refusal to run a backward whose saved tensor was written in place since it was
    saved: "one of the variables needed for gradient computation has been modified by an inplace
    operation" (a backward that writes into what it saved fails when the graph is run again)."""
    return "needed for gradient computation has been modified by an inplace operation" in str(error)
