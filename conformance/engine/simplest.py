"""A Hypothesis test's simplest example, run without Hypothesis' engine.

Every Hypothesis run starts with the simplest choice sequence (each draw's simplest value: 0,
False, a sampled list's first element). A run of one example -- each coverage corner's, the
compile contract's -- is exactly that example: a corner fixes the sizes, dtype and kinds, and every
other draw (seeds, scales) takes its simplest value. Starting an engine for it -- a
``StateForActualGivenExecution``, a ``ConjectureRunner``, its tree and caches -- costs ~0.4 ms a
run, more than a cheap contract's check, and a main job makes ~8,000 such runs.

:func:`passes_simplest` runs that example the way Hypothesis' engine runs one (its settings,
``random`` and the other managed generators seeded as Hypothesis seeds them, a build context, the
``data`` argument drawn, the recursion limit raised as the engine raises it), and reports whether it passed. Anything else -- an error, a failure, an
invalid example -- is left to Hypothesis: the caller runs the test under the engine, whose first
example is this one again, and which shrinks and reports as always. So a passing corner costs one
example instead of an engine, and a failing one costs one example more than before.

This reaches into Hypothesis internals (the classes its engine uses for one example). A
Hypothesis without them runs every corner under the engine: :data:`HOOKED` says which, and the
project's tests fail while it is false.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import Verbosity, settings
from hypothesis import strategies as st

try:
    from hypothesis._settings import local_settings
    from hypothesis.control import BuildContext
    from hypothesis.core import failure_exceptions_to_catch, skip_exceptions_to_reraise, unwrap_markers_from_group
    from hypothesis.internal.conjecture.choice import ChoiceTemplate
    from hypothesis.internal.conjecture.data import ConjectureData, Status
    from hypothesis.internal.conjecture.engine import BUFFER_SIZE
    from hypothesis.internal.conjecture.junkdrawer import ensure_free_stackframes
    from hypothesis.internal.entropy import deterministic_PRNG
    from hypothesis.internal.observability import observability_enabled

    HOOKED = True
except ImportError:  # another Hypothesis layout: every run goes through the engine
    HOOKED = False

__all__ = ["HOOKED", "only_simplest_choices", "passes_simplest", "running"]

_DATA = st.data()
_RUNNING = [False]


def running() -> bool:
    """Whether the example running now is :func:`passes_simplest`'s: every draw takes its
    simplest value, so a draw from a strategy made of the suite's pure parts gives the same value
    each time (a caller may keep it for the next test that draws from an equal strategy)."""
    return _RUNNING[0]


def only_simplest_choices(data: Any) -> bool:
    """Whether every choice Hypothesis' ``data`` made so far took its simplest value: the engine's
    first example, which a random phase after the corners has already run (its smallest case).
    False where the internals are missing."""
    nodes = getattr(getattr(data, "conjecture_data", None), "nodes", None)
    return HOOKED and nodes is not None and all(getattr(node, "trivial", False) for node in nodes)


def passes_simplest(test: Callable[[Any], None], run_settings: settings) -> bool:
    """Run ``test`` (a property taking Hypothesis' ``data`` object) once on the simplest choice
    sequence, as Hypothesis' engine runs its first example; True when it returned normally on a
    valid example. False when it raised what Hypothesis treats as a failure or a rejected
    example, or when the run must be Hypothesis' own (observability, verbose output, the
    internals missing): the caller then runs ``test`` under Hypothesis. A skip, and what
    Hypothesis does not catch (an abort, KeyboardInterrupt), propagates as it would there."""
    if not HOOKED or observability_enabled() or run_settings.verbosity >= Verbosity.verbose:
        return False
    data = ConjectureData(prefix=(ChoiceTemplate("simplest", count=None),), random=None)
    _RUNNING[0] = True
    try:
        with (
            ensure_free_stackframes(),  # the engine's room for deep calls (Dynamo), raised recursion limit
            local_settings(run_settings),
            deterministic_PRNG(),
            BuildContext(data, is_final=False, wrapped_test=test),
        ):
            drawn = data.draw(_DATA)
            with unwrap_markers_from_group(), ensure_free_stackframes():
                test(drawn)
    except skip_exceptions_to_reraise():  # type: ignore[no-untyped-call]
        raise
    except failure_exceptions_to_catch():
        return False
    finally:
        _RUNNING[0] = False
    data.freeze()
    # The engine's health check on the simplest example: a very large one is its finding.
    return data.status == Status.VALID and data.length * 2 <= BUFFER_SIZE
