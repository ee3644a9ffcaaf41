"""The probe: one mechanism every contract uses to see what backward itself did.

The autograd engine repairs some mistakes before anyone sees them: it sums a gradient whose
shape is merely expandable to the input's, casts a wrong dtype, and drops gradients for inputs
that need none. ``probe(fn)`` returns a subclass of ``fn`` whose backward calls the user's
backward unchanged and records, per call, the raw return value, the grad_outputs it received
(and copies taken before the call), ``ctx.needs_input_grad``, the saved tensors, and the tensors
and tensor-memory views kept on ctx outside save_for_backward (:mod:`conformance.engine.held`).
Nothing is added to ``ctx``.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.engine.held import Held, held_on
from conformance.engine.memory import AllocationPolicy, Allocations, CanaryBuffer, WatchedCode
from conformance.spec.targets import declares_jvp, uses_setup_context

__all__ = ["BackwardCall", "Recorder", "forget_probe_classes", "guarded", "probe", "record_into", "user_backward_name"]


@dataclass
class BackwardCall:
    """What one call of the user's backward saw and returned."""

    grad_outputs: tuple[Any, ...] = ()
    grad_outputs_before: tuple[Any, ...] = ()
    needs_input_grad: tuple[bool, ...] = ()
    saved_tensors: tuple[torch.Tensor | None, ...] = ()  # None where ctx.save_for_backward got None
    saved_before: tuple[torch.Tensor | None, ...] = ()
    saved_error: BaseException | None = None
    # Tensors and buffers on ctx attributes, at any depth (described, not kept), as backward began.
    ctx_held: list[Held] = field(default_factory=list)
    raw: tuple[Any, ...] | None = None
    returned_tuple: bool = True
    error: BaseException | None = None


@dataclass
class Recorder:
    """Every backward call made through one probe class, in order."""

    calls: list[BackwardCall] = field(default_factory=list)
    # Uninitialised allocations the user's forward and backward made (conformance.engine.memory), and
    # the canary-margined buffers they were placed in when canaries were on.
    uninitialised_allocations: int = 0
    canaries: list[CanaryBuffer] = field(default_factory=list)
    # The policy this evaluation's forward and backward run under (None: not under Allocations),
    # and whether Allocations must be entered for them (see WatchedCode: sticky per evaluation).
    allocations: AllocationPolicy | None = None
    watch: WatchedCode | None = None

    @property
    def last(self) -> BackwardCall:
        if not self.calls:
            raise LookupError("backward was never called")
        return self.calls[-1]


def user_backward_name(fn: type[torch.autograd.Function]) -> str:
    """``"vjp"`` when the user implemented vjp instead of backward, else ``"backward"``."""
    base = torch.autograd.Function
    return "vjp" if getattr(fn, "vjp", base.vjp) is not base.vjp else "backward"


def _private(value: Any) -> Any:
    """A differentiable copy of a tensor with the same strides (stride-0 ones become dense)."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.clone()


def _clone(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _subclass(fn: type[torch.autograd.Function], methods: dict[str, Any]) -> type[torch.autograd.Function]:
    """A subclass of ``fn`` with ``methods`` replaced, named and documented as ``fn`` (so grad_fn
    names and error messages read as the user's own)."""
    namespace: dict[str, Any] = {name: staticmethod(method) for name, method in methods.items()}
    namespace.update({"__module__": fn.__module__, "__qualname__": fn.__qualname__, "__doc__": fn.__doc__})
    return type(fn.__name__, (fn,), namespace)


def guarded(fn: type[torch.autograd.Function], allocations: AllocationPolicy, *, shield: bool = False) -> type[torch.autograd.Function]:
    """A subclass of ``fn`` that records nothing (so it keeps nothing alive) but runs forward and
    backward under :class:`conformance.engine.memory.Allocations` like every evaluation: for contracts
    that must call the Function unprobed (saved_tensors checks what is freed) or call it hundreds
    of times (gradcheck). ``shield`` as for :func:`probe`."""
    policy = dataclasses.replace(allocations, keep_canaries=False)
    watch = WatchedCode(fn)
    unkept = Recorder(allocations=policy, watch=watch)  # counts only: no canaries kept, nothing stays alive
    method = user_backward_name(fn)
    user_backward = getattr(fn, method)

    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        if shield:
            grad_outputs = tuple(_private(g) for g in grad_outputs)
        with Allocations(policy, phase=method, watched=watch.watched):
            return user_backward(ctx, *grad_outputs)

    methods = {"forward": _routed(fn.forward, "forward", lambda args: unkept), method: backward}
    if declares_jvp(fn):
        methods["jvp"] = _routed(fn.jvp, "jvp", lambda args: unkept)
    return _subclass(fn, methods)


class _Route:
    """Which evaluation's :class:`Recorder` the calls of one cached probe class go to: the
    current one (the last :func:`probe` or :func:`record_into`) for a forward, and for a
    backward or jvp the one whose forward made its ``ctx`` (a graph may be differentiated after
    another evaluation of the same Function began)."""

    __slots__ = ("by_ctx", "current", "watch")

    def __init__(self, watch: WatchedCode) -> None:
        self.watch = watch  # read once per Function; each evaluation watches from a copy of it
        self.current = Recorder()
        self.by_ctx: weakref.WeakKeyDictionary[Any, Recorder] = weakref.WeakKeyDictionary()

    def bind(self, ctx: Any) -> Recorder:
        try:
            self.by_ctx[ctx] = self.current
        except TypeError:  # a ctx without weak references: its calls go to the current evaluation
            pass
        return self.current

    def of(self, ctx: Any) -> Recorder:
        try:
            found = self.by_ctx.get(ctx)
        except TypeError:
            found = None
        return found if found is not None else self.current


# One probe class per (Function, shield), made once: a class per evaluation cost ~48 us (26,000 in
# the main job, 1.5% of it). The session drops them where a new Function's tests begin.
_PROBE_CLASSES: dict[tuple[type[torch.autograd.Function], bool], type[torch.autograd.Function]] = {}
_MAX_PROBE_CLASSES = 32
_ROUTES: weakref.WeakKeyDictionary[type, _Route] = weakref.WeakKeyDictionary()  # also of dropped classes still in use


def forget_probe_classes() -> None:
    """Drop the cached probe classes (and the last record each kept routed)."""
    _PROBE_CLASSES.clear()


def probe(
    fn: type[torch.autograd.Function],
    *,
    shield: bool = False,
    allocations: AllocationPolicy | None = None,
) -> tuple[type[torch.autograd.Function], Recorder]:
    """A recording subclass of ``fn`` and the recorder it writes to.

    The subclass keeps ``fn``'s name, setup_context and flags, so grad_fn names and error
    messages read as the user's own. With ``shield``, the user's backward receives private
    copies of its grad_outputs (same strides): a backward that writes into grad_output cannot
    change what the caller (gradcheck) passes again -- that write is the inplace contract's
    finding, not a wrong derivative. With ``allocations``, the user's forward and backward run
    under :class:`conformance.engine.memory.Allocations`: what they allocate uninitialised is poisoned
    (or zeroed) and surrounded by canaries, as the policy says.

    The class is made once per ``(fn, shield)`` and reused; calls made through it from now on
    record into the returned recorder (a caller that keeps the class and calls it again after
    other evaluations says so with :func:`record_into`).
    """
    key = (fn, shield)
    probed = _PROBE_CLASSES.get(key)
    if probed is None:
        if len(_PROBE_CLASSES) >= _MAX_PROBE_CLASSES:
            _PROBE_CLASSES.clear()
        probed = _PROBE_CLASSES[key] = _probe_class(fn, shield)
    route = _ROUTES[probed]
    recorder = Recorder(allocations=allocations, watch=route.watch.anew())
    route.current = recorder
    return probed, recorder


def record_into(probed: type[torch.autograd.Function], recorder: Recorder) -> None:
    """Route the next calls of ``probed`` (from :func:`probe`) to ``recorder`` again."""
    _ROUTES[probed].current = recorder


def _probe_class(fn: type[torch.autograd.Function], shield: bool) -> type[torch.autograd.Function]:
    route = _Route(WatchedCode(fn))
    method = user_backward_name(fn)
    user_backward = getattr(fn, method)

    def backward_of_user(recorder: Recorder, ctx: Any, *grad_outputs: Any) -> Any:
        if recorder.allocations is None or recorder.watch is None or not recorder.watch.watched:
            return user_backward(ctx, *grad_outputs)  # nothing the mode could see (WatchedCode)
        mode = Allocations(recorder.allocations, phase=method)
        try:
            with mode:
                return user_backward(ctx, *grad_outputs)
        finally:
            _record(recorder, mode)

    def recording_backward(ctx: Any, *grad_outputs: Any) -> Any:
        recorder = route.of(ctx)
        call = BackwardCall()
        recorder.calls.append(call)
        call.grad_outputs = grad_outputs
        flat = grad_outputs[0] if len(grad_outputs) == 1 and isinstance(grad_outputs[0], list) else grad_outputs
        call.grad_outputs_before = tuple(_clone(g) for g in flat)
        call.needs_input_grad = tuple(bool(n) for n in getattr(ctx, "needs_input_grad", ()))
        call.ctx_held = held_on(ctx)
        try:
            saved = tuple(ctx.saved_tensors)
        except RuntimeError as error:  # modified in place, or freed by an earlier backward
            call.saved_error = error
        else:
            call.saved_tensors = saved
            call.saved_before = tuple(_clone(t) for t in saved)
        if shield:
            grad_outputs = tuple(_private(g) for g in grad_outputs)
        try:
            result = backward_of_user(recorder, ctx, *grad_outputs)
        except BaseException as error:
            call.error = error
            raise
        call.returned_tuple = isinstance(result, tuple)
        call.raw = result if isinstance(result, tuple) else (result,)
        return result

    takes_ctx = not uses_setup_context(fn)  # forward(ctx, ...): forward binds its ctx, else setup_context does
    methods: dict[str, Any] = {
        method: recording_backward,
        "forward": _routed(fn.forward, "forward", lambda args: route.bind(args[0]) if takes_ctx else route.current),
    }
    if not takes_ctx:
        user_setup_context = fn.setup_context

        def setup_context(ctx: Any, inputs: Any, output: Any) -> Any:
            route.bind(ctx)
            return user_setup_context(ctx, inputs, output)

        methods["setup_context"] = setup_context
    if declares_jvp(fn):
        methods["jvp"] = _routed(fn.jvp, "jvp", lambda args: route.of(args[0]))
    probed = _subclass(fn, methods)
    _ROUTES[probed] = route
    return probed


def _record(recorder: Recorder, mode: Allocations) -> None:
    recorder.uninitialised_allocations += mode.allocations
    recorder.canaries.extend(mode.canaries)


def _routed(user: Any, phase: str, recorder_of: Callable[[tuple[Any, ...]], Recorder]) -> Any:
    """``user`` (forward or jvp) recording into its evaluation's recorder, under that evaluation's
    :class:`Allocations` where it has a policy. It keeps the user's signature:
    ``Function.apply`` fills in a setup_context-style forward's defaults from it."""

    @functools.wraps(user)
    def call(*args: Any, **kwargs: Any) -> Any:
        recorder = recorder_of(args)
        if recorder.allocations is None or recorder.watch is None or not recorder.watch.called_with((*args, *kwargs.values())):
            return user(*args, **kwargs)  # nothing the mode could see (WatchedCode)
        mode = Allocations(recorder.allocations, phase=phase)
        try:
            with mode:
                return user(*args, **kwargs)
        finally:
            _record(recorder, mode)

    return call
