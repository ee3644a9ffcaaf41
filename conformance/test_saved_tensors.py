"""Contract saved_tensors: tensors reach backward through ctx.save_for_backward, and are freed.

* No ctx attribute holds a tensor. ``ctx.x = x`` escapes what save_for_backward gives: the
  check that the tensor was not modified in place before backward (a silently wrong gradient),
  saved-tensor hooks (offloading, checkpointing), release after backward, and ``ctx.y = y`` on
  an output forms a reference cycle through the graph. gradcheck sees none of this. Searched at
  any depth: in tuples, lists, dicts, sets, dataclasses, namedtuples and plain objects
  (:mod:`conformance.engine.held`); the failure names the path (``ctx.cache[0][1][0]``).
* No ctx attribute holds a view of an input's or output's memory that is not a tensor: a numpy
  array from ``x.detach().numpy()``, a memoryview. Writes to the input after forward then change
  the gradient, and no version counter sees them. A copy (``.numpy().copy()``, ``.cpu().numpy()``
  of a CUDA tensor) and views of the Function's own intermediates are fine.
* A saved tensor keeps autograd's check of in-place writes: when a caller writes an input in
  place between forward and backward, backward raises ("modified by an inplace operation") or its
  gradients stay as they were. ``ctx.save_for_backward(x.data)`` saves an alias outside the
  input's version counter: backward silently reads the new values (a wrong gradient after an
  optimizer step or a reused buffer), which gradcheck never sees.
* Per-call state lives on ctx: two forwards before their backwards (micro-batches in a pipeline,
  activation checkpointing, a model that calls the Function twice) give each call the gradients
  it gets alone. State kept elsewhere -- on the Function class, in a module global, in a cache
  keyed by shape -- is overwritten by the second forward, and the first backward silently reads
  the second call's values (gradcheck, which runs one call at a time, cannot see it). The second
  call is the case with other values (every floating tensor input and grad_output from another
  seed); results are compared bitwise, as the determinism contract compares two calls.
* After backward without retain_graph, once the caller drops its outputs, the outputs and the
  graph node (ctx) are freed: a Function that keeps them alive (a module-level cache of
  outputs or contexts, a reference cycle the collector cannot break) leaks a whole graph per
  call. Only the outputs and the node are tracked -- never the inputs, which the caller owns --
  so checkpoint-style Functions that save only their inputs pass.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import require_sound
from conformance.engine.evaluate import forward, gradients, unversioned_saves
from conformance.engine.harness import Execution, differentiable_positions, random_state
from conformance.engine.held import Held, owner_of
from conformance.engine.numerics import same_bits
from conformance.engine.report import fail
from conformance.engine.runner import Target
from strategies.cases import Case
from strategies.recipes import TensorRecipe


def _forward_backward_and_drop(case: Case) -> tuple[list[weakref.ref[Any]], list[str]]:
    """Run forward and backward with the unprobed Function (guarded, recording nothing), drop
    everything, keep weakrefs.

    Runs in its own frame so that no local of the caller keeps a tensor alive.
    """
    leaves = case.args()
    outputs = forward(case, leaves, how="guarded").outputs
    positions = differentiable_positions(outputs)
    wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    refs: list[weakref.ref[Any]] = []
    labels: list[str] = []
    nodes = {id(outputs[p].grad_fn): outputs[p].grad_fn for p in positions if outputs[p].grad_fn is not None}
    for position, out in enumerate(outputs):
        # Declared in-place outputs are the caller's own (cloned) input: not the Function's to free.
        if isinstance(out, torch.Tensor) and not any(out is a for a in leaves):
            refs.append(weakref.ref(out))
            labels.append(f"output[{position}] {tuple(out.shape)} {out.dtype}")
    for node in nodes.values():
        try:
            refs.append(weakref.ref(node))
        except TypeError:  # a node type without weakref support: the outputs still tell
            continue
        labels.append(f"graph node {type(node).__name__} (the ctx of {case.spec.display_name})")
    del nodes
    if positions and wrt:
        diff = [outputs[p] for p in positions]
        grads = gradients(diff, wrt, case.grad_outputs(diff))
        del grads, diff
    del outputs, leaves, wrt
    return refs, labels


def _misheld(held: list[Held], execution: Execution) -> list[tuple[Held, str]]:
    """What forward kept on ctx outside save_for_backward, each with whose memory it is: every
    tensor (``""`` when it is the Function's own), and every buffer that views an input's or
    output's storage. A buffer over the Function's own memory (a copy) is fine."""
    owners = [
        (f"input {recipe.name!r}", arg)
        for recipe, arg in zip(execution.case.recipes, execution.passed)
        if isinstance(arg, torch.Tensor)
    ]
    owners += [(f"output[{i}]", out) for i, out in enumerate(execution.outputs) if isinstance(out, torch.Tensor)]
    found = []
    for item in held:
        owner = owner_of(item.span, owners)
        if item.is_tensor or owner is not None:
            found.append((item, owner or ""))
    return found


_VIEWS = {"numpy": "a numpy view", "memoryview": "a memoryview", "storage": "a storage"}


def check_saved_tensors(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    fn_name = target.spec.display_name
    execution = target.execution(case)
    require_sound(target.contract, execution)
    if not target.backward_ran(execution):
        return  # without a backward there is no ctx to inspect and no graph to free
    for call in execution.recorder.calls:
        kept = _misheld(call.ctx_held, execution)
        if kept:
            (first, owner), others = kept[0], [held.path for held, _ in kept[1:]]
            also = f"Also kept on ctx: {others}." if others else ""
            if first.is_tensor:
                fail(
                    f"{first.path} holds a tensor ({first.description}), but should not [{fn_name}.forward]",
                    f"It shares memory with {owner}." if owner else "",
                    f"Use ctx.save_for_backward(...) in forward and ctx.saved_tensors in backward instead of "
                    f"{first.path} = tensor. Tensors on ctx attributes bypass autograd's check for in-place "
                    "modification before backward (silently wrong gradients), saved-tensor hooks, and release "
                    "after backward, and an output kept on ctx forms a reference cycle through the graph.",
                    also,
                )
            view = _VIEWS.get(first.kind, f"a {first.kind} view")
            side = "input" if owner.startswith("input") else "output"
            fail(
                f"{first.path} holds {view} of {owner} memory ({first.description}), but should not [{fn_name}.forward]",
                f"{view[0].upper()}{view[1:]} of {owner} memory: writes to the {side} change the gradient, and "
                "autograd's check for in-place modification before backward cannot see them. Keep a copy "
                "(x.detach().numpy().copy()), or save the tensor with ctx.save_for_backward(...) and convert it "
                "in backward.",
                also,
            )
    del execution
    unversioned = unversioned_saves(case)
    if unversioned is not None:
        written, changed = unversioned
        fail(
            f"grad[{changed[0]!r}] changed after input {', '.join(map(repr, written))} was written in place between "
            f"forward and backward, but backward should raise or use the values forward saw [{fn_name}.backward]",
            f"The write: {' and '.join(f'{name}.mul_(2).add_(1)' for name in written)} under torch.no_grad(), as an "
            f"optimizer step or a reused buffer writes it; gradients that changed: {changed}. "
            f"ctx.save_for_backward({written[0]}) makes backward raise autograd's 'modified by an inplace operation' "
            "error instead. This backward read the new values silently: forward saved x.data, or another alias "
            "outside the input's version counter. Save the tensor itself, or a copy (x.clone()) when forward must "
            "keep its values.",
        )
    _check_interleaved(target, case)
    refs, labels = _forward_backward_and_drop(case)
    if any(ref() is not None for ref in refs):
        # Reference counting frees an acyclic graph at once; only a survivor needs the (slow,
        # whole-heap) cycle collector before it counts as a leak.
        gc.collect()
    alive = [label for ref, label in zip(refs, labels) if ref() is not None]
    if alive:
        fail(
            f"{alive[0]} is alive after backward and after every reference to the outputs was dropped, "
            f"but should be freed [{fn_name}]",
            f"Still alive after gc.collect(): {alive}.",
            "Something keeps the graph alive: a module-level cache or list of outputs/ctx objects, or a "
            "reference cycle the garbage collector cannot break. Each call then leaks its whole graph "
            "(and every tensor it saved).",
        )
    target.checked()


def second_call(case: Case) -> Case:
    """``case`` with other values: every floating tensor input and its grad_outputs from another seed
    (masks, indices and Python values as they were)."""
    recipes = tuple(dataclasses.replace(r, seed=r.seed + 1) if isinstance(r, TensorRecipe) else r for r in case.recipes)
    return dataclasses.replace(case, recipes=recipes, grad_seed=case.grad_seed + 1)


def _grads_of(case: Case, outputs: tuple[Any, ...], leaves: list[Any]) -> list[torch.Tensor | None]:
    positions = differentiable_positions(outputs)
    wrt = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    if not positions or not wrt:
        return []
    diff_outputs = [outputs[p] for p in positions]
    return [g.detach() if g is not None else None for g in gradients(diff_outputs, wrt, case.grad_outputs(diff_outputs))]


def _alone(case: Case) -> list[torch.Tensor | None]:
    leaves = case.args()
    return _grads_of(case, forward(case, leaves, how="guarded").outputs, leaves)


def _check_interleaved(target: Target, case: Case) -> None:
    """Fail unless each of two calls whose forwards both run before either backward gets the
    gradients it gets alone (see the module docstring)."""
    if target.spec.nondeterministic:
        return  # random draws depend on the order of calls: nothing to compare bitwise
    other = second_call(case)
    if other == case or not any(isinstance(r, TensorRecipe) and r.shape and all(r.shape) for r in case.recipes):
        return  # no values to tell the two calls apart
    with random_state(target.spec, case):
        first_alone = _alone(case)
        first_leaves, second_leaves = case.args(), other.args()
        first_outputs = forward(case, first_leaves, how="guarded").outputs
        second_outputs = forward(other, second_leaves, how="guarded").outputs
        try:
            first = _grads_of(case, first_outputs, first_leaves)
        except Exception as error:
            _interleaved_failure(target, case, f"the first call's backward raised {type(error).__name__}: {error}")
        _grads_of(other, second_outputs, second_leaves)
    names = [r.name for r in case.recipes if r.differentiable and r.name in case.requires_grad]
    for name, got, alone in zip(names, first, first_alone):
        if (got is None) != (alone is None) or (got is not None and alone is not None and not same_bits(got, alone)):
            _interleaved_failure(target, case, f"grad[{name!r}] of the first call differs from the same call's alone")


def _interleaved_failure(target: Target, case: Case, what: str) -> None:
    __tracebackhide__ = True
    target.blocked_by_undeclared_randomness(case)  # values that differ between identical calls: determinism's
    fail(
        f"{what} when a second call's forward runs before the first call's backward, but should be the "
        f"same [{target.spec.display_name}: forward(a), forward(b), backward(a)]",
        "Backward read state that the second forward overwrote: something kept outside ctx (an attribute of "
        "the Function class, a module global, a cache keyed by shape). Keep per-call state on ctx "
        "(ctx.save_for_backward for tensors, ctx.<name> for Python values). Two forwards before their backwards "
        "happen with micro-batches in a pipeline, activation checkpointing, and any model that calls the "
        "Function twice.",
        f"The second call: {second_call(case).describe()}.",
    )


@contract("saved_tensors")
def test_saved_tensors(conformance_target: Target) -> None:
    conformance_target.run(check_saved_tensors)
