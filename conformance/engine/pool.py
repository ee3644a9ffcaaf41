"""Evaluate once, judge many: one probed evaluation per equal case and options, for every
contract test of one Function on one device that asks for it.

Several contracts judge the same evaluation -- :func:`conformance.engine.evaluate.execute` of a
case, with nothing of their own attached (no hooks, guards or replaced grad_outputs) -- and their
coverage corners, and Hypothesis' simplest examples, draw equal cases. The pool keeps each such
evaluation while the run stays on its Function and device (the plugin orders the tests Function
by Function), and hands it to the next contract that asks for the same case and options.

An evaluation is shared only where sharing cannot change a verdict:

* never for a Function declared ``nondeterministic`` (each call draws new numbers), nor for an
  evaluation that drew from a global generator (torch's, Python's or numpy's): every example
  starts from the same generator states, so a served evaluation would leave a later one another
  state than a fresh one leaves it;
* never for a case whose Scalar values are not plain numbers, strings, dtypes or tuples of them
  (the key is the case's repro text, and a numpy array's repr rounds);
* each RNG regime its own (``rng``: a contract that evaluates under a fixed seed shares only with
  contracts that use the same seed);
* before a kept evaluation is handed out again, its tensors (inputs, outputs, gradients, what
  backward returned) are
  compared bitwise with a snapshot taken when it was made: a Function that writes into a tensor it
  handed out earlier (a reused workspace returned as a result) gets a fresh evaluation instead;
* a contract that compares two calls (determinism) makes both: every example starts from the same
  RNG state, so an undeclared random draw shows only between two calls made in the same example.

Each caller gets its own :class:`~conformance.engine.harness.Execution` record (the same tensors,
its own case), so its report names its own case. The records of one kept evaluation share its
``judgements``: a test that meets an equal case again (Hypothesis draws some cases more than
once: a stability test of 10 examples judged ~30% of its cases before) takes what it concluded
the first time instead of judging the same tensors again (:meth:`Target.judged_once
<conformance.engine.runner.Target.judged_once>`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from conformance.engine.global_state import rng_states
from conformance.engine.harness import Execution
from conformance.engine.seeding import may_draw_beyond_torch
from strategies.cases import Case
from strategies.recipes import ScalarRecipe

__all__ = ["EvaluationPool", "PoolStats"]

# Evaluations kept per Function and device (oldest dropped first): a test draws at most a profile's
# examples (100 at thorough) times the cases per example; small tensors, but graphs and margins too.
CAPACITY = 256


@dataclass
class PoolStats:
    """How the pool served this process: for the benchmark and the tests."""

    made: int = 0  # evaluations run and kept
    served: int = 0  # evaluations handed out again instead of run
    stale: int = 0  # kept evaluations whose tensors had changed since: run again
    unshared: int = 0  # evaluations the pool could not key (or must not share): run, not kept
    drew: int = 0  # evaluations that drew from a global generator: run, not kept


@dataclass
class _Kept:
    execution: Execution
    snapshot: list[torch.Tensor]


@dataclass
class EvaluationPool:
    """The evaluations of the Function and device the run is on (see the module docstring)."""

    capacity: int = CAPACITY
    stats: PoolStats = field(default_factory=PoolStats)
    _owner: tuple[str, str] | None = None
    _kept: dict[tuple[Any, ...], _Kept] = field(default_factory=dict)

    def execution(self, case: Case, make: Callable[[], Execution], *, options: tuple[Any, ...], rng: str = "") -> Execution:
        """``make()``'s evaluation of ``case`` under ``options`` (the evaluation's own arguments,
        hashable) and the RNG regime ``rng``: kept from an earlier call with an equal case, options
        and regime when it is still intact, else made now."""
        key = self._key(case, options, rng)
        if key is None:
            self.stats.unshared += 1
            return make()
        kept = self._kept.get(key)
        if kept is not None:
            if _intact(kept):
                self.stats.served += 1
                return replace(kept.execution, case=case)
            self.stats.stale += 1
            del self._kept[key]
        every_generator = may_draw_beyond_torch(case.spec.op)  # reading those states costs ~45 us
        before = _generators(every_generator)
        execution = make()
        if not _same_generators(before, _generators(every_generator)):
            self.stats.drew += 1
            return execution
        try:
            snapshot = _snapshot(execution)
        except (RuntimeError, TypeError):  # a layout without a byte view (sparse, quantized): not kept
            self.stats.unshared += 1
            return execution
        if len(self._kept) >= self.capacity:
            del self._kept[next(iter(self._kept))]
        execution.judgements = {}
        self._kept[key] = _Kept(execution, snapshot)
        self.stats.made += 1
        return execution

    def clear(self) -> None:
        self._kept.clear()
        self._owner = None

    def _key(self, case: Case, options: tuple[Any, ...], rng: str) -> tuple[Any, ...] | None:
        spec = case.spec
        owner = (spec.name, case.device)
        if owner != self._owner:  # the run moved on to another Function: its evaluations are not asked for again
            self.clear()
            self._owner = owner
        if spec.nondeterministic or not all(r.plain for r in case.recipes if isinstance(r, ScalarRecipe)):
            return None
        try:
            # The repro snippet rebuilds exactly these inputs and grad_outputs: it names every
            # value by its repr (0 and False, 0.0 and -0.0 differ), so equal snippets are equal cases.
            described = case.repro()
            key = (described, str(case.dtype), case.device, tuple(sorted(case.requires_grad)), options, rng)
            hash(key)
        except Exception:  # a value without a source form, an unhashable option: not shared
            return None
        return key


def _generators(every_generator: bool) -> tuple[Any, ...]:
    if not every_generator:
        return rng_states(), None, None
    return rng_states(), random.getstate(), np.random.get_state(legacy=False)


def _same_generators(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    torch_before, python_before, numpy_before = before
    torch_after, python_after, numpy_after = after
    if numpy_before is None:
        return bool(torch_before.same_as(torch_after))
    return bool(
        torch_before.same_as(torch_after) and python_before == python_after
        and numpy_before["has_gauss"] == numpy_after["has_gauss"]
        and numpy_before["state"]["pos"] == numpy_after["state"]["pos"]
        and np.array_equal(numpy_before["state"]["key"], numpy_after["state"]["key"])
    )


def _tensors(execution: Execution) -> list[torch.Tensor]:
    found = [a for a in execution.args if isinstance(a, torch.Tensor)]
    found += [o for o in execution.outputs if isinstance(o, torch.Tensor)]
    found += [g for g in execution.grads.values() if isinstance(g, torch.Tensor)]
    for call in execution.recorder.calls:  # what backward returned, before the engine's repairs
        found += [g for g in (call.raw or ()) if isinstance(g, torch.Tensor)]
    return found


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as bytes (bitwise: NaN equals NaN, -0.0 differs from 0.0); a view of
    them where its memory is already flat, so only a snapshot needs to copy."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype in (torch.bool, torch.uint8) or flat.numel() == 0:
        return flat
    return flat.contiguous().view(torch.uint8)


def _snapshot(execution: Execution) -> list[torch.Tensor]:
    return [_bits(t).clone() for t in _tensors(execution)]


def _intact(kept: _Kept) -> bool:
    now = _tensors(kept.execution)
    if len(now) != len(kept.snapshot):
        return False
    try:
        return all(_bits(t).equal(s) for t, s in zip(now, kept.snapshot))
    except RuntimeError:  # resized or freed since: not the evaluation it was
        return False
