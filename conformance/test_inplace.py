"""Contract inplace: no undeclared in-place writes, no undeclared aliasing.

* forward leaves every input bitwise unchanged (NaN-aware, -0.0 vs 0.0 counts) with the same
  ``_version`` -- unless the spec declares it in ``mutates``; a declared mutation must really
  happen and go through ``ctx.mark_dirty`` (apply then returns that very input object);
* no output shares memory with an input behind autograd's back: a declared, marked-dirty input
  returned, or a plain view (``x[idx]``, ``x.view(...)``, as torch's own select and view ops
  return) is legal -- autograd refuses an in-place write into such an output, or sees it through
  the shared version counter; an alias made through ``.data`` or a raw pointer is not;
* backward leaves grad_output, every saved tensor and every input unchanged, and returns no
  gradient that shares memory with an input (a write through ``.data`` is invisible to
  autograd's version counters, so values are compared, not only versions);
* a second backward through the same graph (``retain_graph=True``) gives the same gradients
  (saved buffers overwritten in place break this).

Returning grad_output itself, or a view of it, as a gradient is legal as long as backward did
not modify it. gradcheck passes a backward that scales grad_output in place, so this contract
is the one that sees it.

Declared-mutated inputs are passed as clones (``forward_args``): a leaf that requires grad cannot
be modified in place, and the clone's gradient flows back to the leaf as in a real model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.evaluate import forward, gradients
from conformance.engine.harness import changed_elements, differentiable_positions, forward_args
from conformance.engine.numerics import RANDOM_BACKWARD_CAUSE, rerun_mismatch
from conformance.engine.overlap import shares_memory
from conformance.engine.probe import BackwardCall
from conformance.engine.report import advise, describe_value, fail
from conformance.engine.runner import Target
from strategies.cases import GRAD_LAYOUTS, Case


@dataclass
class Snapshot:
    """A tensor's values (a private copy) and version counter at one moment."""

    values: torch.Tensor
    version: int


def snapshot(tensor: torch.Tensor) -> Snapshot:
    return Snapshot(tensor.detach().clone(), tensor._version)


def _describe_change(count: int, now: torch.Tensor, before: Snapshot) -> str:
    version = f"version counter {before.version} -> {now._version}"
    if count and now._version == before.version:
        version += " (unchanged: the write went through .data, .detach() or a raw pointer, so autograd cannot see it)"
    return f"{count} of {now.numel()} elements changed; {version}"


def check_inplace(target: Target, data: st.DataObject) -> None:
    drawn = target.draw_case(data)
    execution = target.preflight(drawn)  # a structural defect blocks this contract; see defects.py
    # A case drawn again is not checked again: the pool served the same results (intact), and
    # the Function is deterministic and draws from no generator, or it would not be kept.
    target.judged_once(execution, "every grad_output layout", lambda: _check_every_grad_layout(target, drawn))
    target.checked()  # forward's inputs and outputs were checked on every layout, at least


def _check_every_grad_layout(target: Target, drawn: Case) -> None:
    # Every grad_output layout: a backward that writes into ``grad.transpose(1, 2).contiguous()``
    # or ``grad.view(...)`` writes into the caller's tensor only when that call is a no-op, i.e.
    # when grad_output has the layout backward turns it into (often the output's own strides).
    for layout in GRAD_LAYOUTS:
        case = replace(drawn, grad_layout=layout)
        if target.context is not None:
            target.context.case = case
        _check_once(target, case)
    if target.context is not None:
        target.context.case = drawn


def _check_once(target: Target, case: Case) -> None:
    spec = target.spec
    fn_name = spec.display_name
    mutated = set(spec.mutates)
    leaves = case.args()
    args = forward_args(case, leaves)
    names = [r.name for r in case.recipes]
    tensors = [(n, a) for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    before = {n: snapshot(a) for n, a in tensors}

    called = forward(case, leaves, passed=args)
    outputs, recorder = called.outputs, called.recorder
    del called

    # -- forward: inputs untouched unless declared, declared ones really marked dirty
    for name, arg in tensors:
        count = changed_elements(arg, before[name].values)
        bumped = arg._version != before[name].version
        where = f"{fn_name}.forward, input {name!r}"
        if name in mutated:
            if not bumped and not count:
                fail(
                    f"input {name!r} unchanged, but should be modified in place [{where}, declared in mutates]",
                    f"The spec declares mutates=[{name!r}], but forward neither changed its values nor bumped "
                    "its version counter. Remove it from mutates if the op is not in place.",
                )
            if not any(out is arg for out in outputs):
                fail(
                    f"input {name!r} modified in place but not marked dirty [{where}, declared in mutates]",
                    f"Call ctx.mark_dirty({name}) in forward and return the modified tensor itself; without it "
                    "autograd does not know the tensor changed and earlier users of its old value get "
                    "wrong gradients.",
                )
        elif count or bumped:
            fail(
                f"input {name!r} was modified in place by forward, but should be unchanged [{where}]",
                _describe_change(count, arg, before[name]),
                f"Work on a copy ({name}.clone()), or declare the in-place op: ctx.mark_dirty({name}) in "
                f"forward and register(..., mutates=[{name!r}]).",
            )

    # -- outputs must not alias inputs behind autograd's back (judged last: see _check_views)
    views = [(position, name, out, arg) for position, out in enumerate(outputs) for name, arg in tensors
             if not (name in mutated and out is arg) and shares_memory(out, arg)]

    positions = differentiable_positions(outputs)
    wrt = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    wrt_names = [n for n, leaf in zip(names, leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    if not positions or not wrt:
        _check_views(fn_name, views)
        return
    diff_outputs = [outputs[p] for p in positions]
    after_forward = {n: snapshot(a) for n, a in tensors}
    backward_error: BaseException | None = None
    first: tuple[torch.Tensor | None, ...] = ()
    try:
        grads = gradients(diff_outputs, wrt, case.grad_outputs(diff_outputs), retain_graph=True)
        first = tuple(g.detach().clone() if g is not None else None for g in grads)
        del grads
    except Exception as error:  # explained from the record below when possible
        backward_error = error
    if not recorder.calls:
        if backward_error is not None:
            raise backward_error
        return
    call = recorder.last
    private_writes = _check_backward_record(target, call, names, tensors, after_forward, outputs)
    if backward_error is not None:
        raise backward_error

    # -- the same graph backpropagated again gives the same gradients
    try:
        second = gradients(diff_outputs, wrt, case.grad_outputs(diff_outputs))
    except RuntimeError as error:
        fail(
            f"second backward raised, but should give the same gradients [{fn_name}.backward, retain_graph=True]",
            f"{type(error).__name__}: {error}",
            "The first backward changed state the second needs (a saved tensor or a ctx buffer modified in place).",
        )
    for name, one, two in zip(wrt_names, first, second):
        if (one is None) != (two is None):
            fail(
                f"grad[{name!r}] on the second backward={describe_value(two)}, but should be "
                f"{describe_value(one)} as on the first [{fn_name}.backward, retain_graph=True]"
            )
        mismatch = rerun_mismatch(two, one, case.dtype) if one is not None and two is not None else None
        if mismatch is None:
            continue
        target.blocked_by_undeclared_randomness(case)  # a backward that draws noise differs from itself anyway
        fail(
            f"grad[{name!r}] on the second backward != first backward [{fn_name}.backward, retain_graph=True]",
            RANDOM_BACKWARD_CAUSE if spec.nondeterministic and not private_writes else
            "Backpropagating the same graph twice must give the same gradients; the first call changed "
            "something the second reads (a saved tensor or a buffer kept on ctx, written in place)"
            + (f": backward wrote into {', '.join(private_writes)}." if private_writes else "."),
            mismatch,
        )
    _check_views(fn_name, views)
    if private_writes:
        advise(
            f"backward modified {', '.join(private_writes)} in place; no input or output shares its memory and a "
            f"second backward (retain_graph=True) gives the same gradients, so this is hygiene [{fn_name}.backward]",
            "Compute into new tensors: a backward that writes into what forward saved is right only while "
            "its writes stay idempotent.",
        )


def _check_views(fn_name: str, views: list[tuple[int, str, torch.Tensor, torch.Tensor]]) -> None:
    """An output that shares memory with an input must be a view autograd tracks (``x[idx]``,
    ``x.view(...)``, as torch's own select and view ops return): it shares the input's version
    counter, so an in-place write into it is refused or seen by every graph that saved the input.
    Run last: bumping the counter invalidates the input for backward."""
    for position, name, out, arg in views:
        version = arg._version
        torch.autograd.graph.increment_version(out)
        if arg._version == version:
            fail(
                f"output[{position}] shares memory with input {name!r} behind autograd's back, but should not "
                f"[{fn_name}.forward]",
                f"output[{position}]: {describe_value(out)}, input {name!r}: {describe_value(arg)}.",
                "The output aliases the input without sharing its version counter (made through .data, "
                "a raw pointer or storage tricks), so writing to one silently changes the other. Return "
                "a copy (x.clone()), a plain view (x[...], x.view(...): autograd tracks those), or declare "
                "an in-place op with ctx.mark_dirty and mutates=[...].",
            )


def _check_backward_record(
    target: Target,
    call: BackwardCall,
    names: list[str],
    tensors: list[tuple[str, torch.Tensor]],
    after_forward: dict[str, Snapshot],
    outputs: Sequence[Any],
) -> list[str]:
    """Fails for writes into grad_output, inputs and saved tensors others can see; returns the
    saved tensors of backward's own (sharing memory with no input or output) that it modified:
    harmless where a second backward still gives the same gradients (judged by the caller)."""
    fn_name = target.spec.display_name
    private_writes: list[str] = []
    raw = call.raw or ()
    returned_for = {
        position: names[position] if position < len(names) else f"#{position}" for position in range(len(raw))
    }

    def aliases(tensor: torch.Tensor) -> list[str]:
        return [f"grad[{returned_for[i]!r}]" for i, g in enumerate(raw) if shares_memory(g, tensor)]

    # grad_output, as this backward received it
    for position, (now, then) in enumerate(zip(call.grad_outputs, call.grad_outputs_before)):
        if not isinstance(now, torch.Tensor) or not isinstance(then, torch.Tensor):
            continue
        count = changed_elements(now, then)
        if count:
            returned = aliases(now)
            fail(
                f"grad_output[{position}] was modified in place by backward, but should be unchanged "
                f"[{fn_name}.backward]",
                f"{count} of {now.numel()} elements changed"
                + (f"; it was then returned as {', '.join(returned)}" if returned else "")
                + ".",
                "grad_output may be shared with other consumers of the output (and with the caller); "
                "compute into a new tensor (grad_output * 2, not grad_output.mul_(2)). Returning an "
                "unmodified grad_output as a gradient is fine.",
            )
    # the Function's own inputs
    for name, arg in tensors:
        count = changed_elements(arg, after_forward[name].values)
        if count or arg._version != after_forward[name].version:
            returned = aliases(arg)
            fail(
                f"input {name!r} was modified in place by backward, but should be unchanged [{fn_name}.backward]",
                _describe_change(count, arg, after_forward[name])
                + (f"; backward returned its memory as {', '.join(returned)}" if returned else "")
                + ".",
                "Backward must not write into the inputs (e.g. x.data.copy_(grad)); allocate the gradient "
                "(torch.empty_like(x)) instead.",
            )
    # saved tensors
    if call.saved_error is not None:
        fail(
            f"ctx.saved_tensors raised, but should return the saved tensors [{fn_name}.backward]",
            f"{type(call.saved_error).__name__}: {call.saved_error}",
            "A tensor passed to ctx.save_for_backward was modified in place afterwards.",
        )
    for position, (now, then) in enumerate(zip(call.saved_tensors, call.saved_before)):
        if now is None or then is None:
            continue  # ctx.save_for_backward(x, None): nothing was saved there
        count = changed_elements(now, then)
        visible = any(shares_memory(now, t) for t in [*(a for _, a in tensors), *outputs] if isinstance(t, torch.Tensor))
        if count and not visible:
            private_writes.append(f"ctx.saved_tensors[{position}] ({describe_value(now)}, {count} of {now.numel()} elements)")
        elif count:
            fail(
                f"ctx.saved_tensors[{position}] was modified in place by backward, but should be unchanged "
                f"[{fn_name}.backward, {describe_value(now)}]",
                f"{count} of {now.numel()} elements changed.",
                "Saved tensors can be shared with the outputs and are read again by a second backward "
                "(retain_graph=True); compute into new tensors instead of writing into them.",
            )
    # returned gradients must not share memory with an input
    for position, grad in enumerate(raw):
        for name, arg in tensors:
            if shares_memory(grad, arg):
                fail(
                    f"grad[{returned_for[position]!r}] shares memory with input {name!r}, but should not "
                    f"[{fn_name}.backward]",
                    "A gradient returned in the input's own storage (e.g. x.data filled with the gradient) "
                    "overwrites the input and breaks every other user of it.",
                )
    return private_writes


@contract("inplace")
def test_inplace(conformance_target: Target) -> None:
    conformance_target.run(check_inplace)
