"""Whether a test's examples need numpy's global generator seeded by Hypothesis.

Before every example Hypothesis seeds Python's ``random``, numpy's global generator and its own,
and puts them back afterwards, so that code drawing from them sees the same numbers in every run.
numpy's share costs ~75 us an example (``get_state``, ``seed``, ``set_state``), about 1.5% of the
main job. Nothing of the suite draws from numpy's generator (its values come from Hypothesis and
from seeded torch generators), so a test runs with numpy's left out when its Function cannot draw
from it either: its own code (forward, setup_context, backward, jvp, vmap and the helpers they
reach), its reference and surrogate and its Derived inputs' functions, read to their end by
:mod:`conformance.engine.code_reach`,
reach neither numpy nor ``random``, and every Scalar input is a constant of plain data (a drawn or
case-built value may be a callable, whose code is not read).

This reaches into Hypothesis internals (``entropy.RANDOMS_TO_MANAGE``, ``entropy.NP_RANDOM``). A
Hypothesis without them seeds numpy as it always did: :data:`HOOKED` says which, and the project's
tests fail while it is false.
"""

from __future__ import annotations

import contextlib
import random
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from hypothesis.internal import entropy

from conformance.engine.code_reach import reaches_once
from conformance.engine.memory import plain_arguments
from conformance.spec import Spec
from conformance.spec.inputs import NO_VALUE, Derived, Scalar
from conformance.spec.targets import OpAdapter

__all__ = ["HOOKED", "may_draw_beyond_torch", "needs_numpy_seeded", "numpy_seeded_only_if"]

HOOKED = isinstance(getattr(entropy, "RANDOMS_TO_MANAGE", None), weakref.WeakValueDictionary) and hasattr(entropy, "NP_RANDOM")


def may_draw_beyond_torch(op: OpAdapter) -> bool:
    """Whether the Function's own code may draw from Python's or numpy's global generator: it
    reaches ``random``, numpy or a generator of theirs, or cannot be read to the end."""
    return reaches_once(op.function, lambda: op.user_code().values(), _beyond_torch) is not False


def needs_numpy_seeded(spec: Spec) -> bool:
    """Whether anything an example of ``spec`` runs may draw from numpy's global generator (see
    the module docstring)."""
    if may_draw_beyond_torch(spec.op):
        return True
    plain_functions: list[Callable[..., Any]] = [f for f in (spec.reference, spec.surrogate) if f is not None]
    plain_functions += [i.fn for i in spec.inputs if isinstance(i, Derived)]
    if reaches_once(spec, lambda: plain_functions, _beyond_torch) is not False:
        return True
    # A strategy or a callable is not plain data.
    return not all(
        i.from_case is None and i.value is not NO_VALUE and plain_arguments([i.value]) for i in spec.inputs if isinstance(i, Scalar)
    )


@contextlib.contextmanager
def numpy_seeded_only_if(needed: bool) -> Iterator[None]:
    """Hypothesis seeds and restores numpy's global generator around each example of the block
    only when ``needed`` (and always on a Hypothesis without the internals this uses)."""
    wrapper = getattr(entropy, "NP_RANDOM", None)
    if needed or not HOOKED or wrapper is None:  # None: made and registered at the block's first example
        yield
        return
    managed = entropy.RANDOMS_TO_MANAGE
    keys = [key for key, managed_random in list(managed.items()) if managed_random is wrapper]
    for key in keys:
        del managed[key]
    try:
        yield
    finally:
        for key in keys:
            managed[key] = wrapper


def _beyond_torch(value: Any) -> bool:
    generators = (random.Random, np.random.RandomState, np.random.Generator, np.random.BitGenerator)
    if value is random or value is np or value is np.random or isinstance(value, generators):
        return True
    # A bound method of a generator (``from random import random``); only methods are asked for
    # their __self__ (a user's object may answer any attribute with an error of its own).
    bound = isinstance(value, (types.MethodType, types.BuiltinMethodType))
    return bound and isinstance(value.__self__, generators)
