"""Contract compile: under ``torch.compile`` outputs and gradients equal eager's.

Each example draws several cases of one dtype with different sizes (dynamic shapes; after the
first, different dims get different sizes, so a fake kernel or gradient that swaps two shows) and runs them
through one compiled callable per backend of ``--compile-backends`` (``aot_eager`` by default;
``inductor`` opt-in), forward and backward, each against eager on the same inputs and
grad_outputs. Results bitwise equal to eager's pass at once; otherwise the compiled result must
meet the reference policy against the float64 truth (the reference contract's rule), and when
eager itself does not, the difference is the reference contract's finding, not this one's.

Tiers (see the README): a graph break (``fullgraph=True`` is tried first; Dynamo's reason is
given) and a recompile storm (a case that recompiles although an earlier dynamic graph should
serve it; sizes 0 and 1 are specialised) are advice on correct code, unless the spec promises
``compile="fullgraph"`` / ``compile="dynamic"``; correctness is then checked with graph breaks
allowed. A value that is right in eager and wrong compiled, or an error only compiled code
raises, is a defect -- or upstream (torch's bug) when Dynamo's trace alone (``backend="eager"``)
agrees with eager and only AOTAutograd or Inductor differs, or when this torch's Dynamo is wrong on a
correct canary Function (torch 2.11 is) and the Function's compile-only branch, run eagerly with
``is_compiling()`` True, shows no difference of its own. A custom op whose fake kernel is
wrong on any of the example's cases is opcheck's finding (blocked by opcheck here). Costly: one example per test unless
``--max-examples`` is given.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np
import torch
from hypothesis import strategies as st

from conformance.engine.contract import Requirement, contract
from conformance.engine.evaluate import (
    Evaluated,
    blocked_by_fake_kernel,
    blocked_by_undeclared_writes,
    outputs_and_grads,
)
from conformance.engine.numerics import (
    Judged,
    judge_against_truth,
    judged_grads,
    judged_outputs,
    reference_truth_and_baseline,
)
from conformance.engine.report import advise, fail, upstream, upstream_noted
from conformance.engine.repro import torch_only_script
from conformance.engine.runner import Target
from conformance.engine.torch_text import dynamo_refuses_jvp, dynamo_unbacked_symbol, without_guard_latency_profile
from conformance.engine.triton_interpreter import runs_interpreted
from strategies.cases import Case
from strategies.recipes import ScalarRecipe

CASES_PER_EXAMPLE = 3  # sizes per compiled callable: static, dynamic, and one that must reuse it


def compiled_variants(function: Callable[..., Any]) -> int:
    """How many compiled variants Dynamo keeps for ``function`` (one per recompile): its cache
    entries. (A backend's call count is no measure: Dynamo may hand it one graph twice.)"""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


@dataclass(frozen=True)
class _Call:
    """What Dynamo guards on in one call: ranks, every size (flattened) and the Python values."""

    ranks: tuple[int, ...]
    sizes: tuple[int, ...]
    values: tuple[str, ...]

    @classmethod
    def of(cls, case: Case) -> _Call:
        shapes = [tuple(r.shape) for r in case.recipes if isinstance(getattr(r, "shape", None), tuple)]
        values = tuple(repr(r.value) for r in case.recipes if isinstance(r, ScalarRecipe))
        return cls(tuple(len(s) for s in shapes), tuple(x for s in shapes for x in s), values)


@dataclass
class ExpectedRecompiles:
    """How many graphs a well-behaved Function needs for a sequence of calls, by Dynamo's rules
    for dynamic shapes, erring towards more: the first graph is static; a size that has changed
    since the first call becomes dynamic in the next graph; sizes 0 and 1 are specialised;
    equal sizes share one symbol (duck sizing); any other rank or Python value may compile anew.
    A call that an earlier graph serves must not compile (a recompile storm)."""

    graphs: list[tuple[_Call, frozenset[int]]] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)

    def add(self, case: Case) -> bool:
        """Record a call; whether it may compile a new graph."""
        call = _Call.of(case)
        self.calls.append(call)
        if any(self._serves(graph, dynamic, call) for graph, dynamic in self.graphs):
            return False
        same = [c for c in self.calls if c.ranks == call.ranks]
        changed = frozenset(i for i in range(len(call.sizes)) if len({c.sizes[i] for c in same}) > 1)
        self.graphs.append((call, changed))
        return True

    @staticmethod
    def _serves(graph: _Call, dynamic: frozenset[int], call: _Call) -> bool:
        if graph.ranks != call.ranks or graph.values != call.values:
            return False
        for i, (then, now) in enumerate(zip(graph.sizes, call.sizes)):
            if i not in dynamic or then < 2:
                if then != now:
                    return False
            elif now < 2:
                return False
        duck = [i for i in dynamic if graph.sizes[i] >= 2]
        return all((graph.sizes[i] == graph.sizes[j]) == (call.sizes[i] == call.sizes[j]) for i in duck for j in duck)


def _bitwise_equal(a: Any, b: Any) -> bool:
    """Same values, compared by kind: tensors bitwise (NaN equal to NaN), numpy arrays likewise,
    anything else by ``==``."""
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if not isinstance(a, torch.Tensor):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and bool(
                np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
            )
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _judged(results: Evaluated, truth: Evaluated, baseline: Evaluated, where: str, args: list[Any], names: list[str]) -> list[Judged]:
    values = judged_outputs(results.outputs, truth, baseline, f"{where}, forward")
    values += judged_grads(results.grads, truth, baseline, args, names, lambda name: f"{where}, backward, input {name!r}")
    return values


@dataclass(frozen=True)
class _Mismatch:
    """How compiled results differ from eager's beyond what the reference policy allows."""

    summary: str
    details: tuple[str, ...]


def _mismatch(
    target: Target, case: Case, eager: Evaluated, compiled: Evaluated, grad_outputs: dict[int, torch.Tensor], where: str
) -> _Mismatch | None:
    """None when compiled results equal eager's bitwise, or lie within the reference policy of the
    truth; else what differs. Stops the example as not checked when eager itself is outside the
    policy (the reference contract's finding)."""
    if len(compiled.outputs) != len(eager.outputs):
        return _Mismatch(f"len(outputs)={len(compiled.outputs)} compiled, but should be {len(eager.outputs)} like eager [{where}]", ())
    pairs = [(f"output[{i}]", c, e) for i, (c, e) in enumerate(zip(compiled.outputs, eager.outputs))]
    pairs += [(f"grad[{n!r}]", compiled.grads.get(n), g) for n, g in eager.grads.items()]
    differing = [what for what, c, e in pairs if not (c is None and e is None) and not _bitwise_equal(c, e)]
    if not differing:
        return None
    for what, c, e in pairs:
        if isinstance(c, torch.Tensor) and isinstance(e, torch.Tensor) and tuple(c.shape) != tuple(e.shape):
            return _Mismatch(f"{what}.shape={tuple(c.shape)} compiled, but should be {tuple(e.shape)} like eager [{where}]", ())
        if (c is None) != (e is None):
            return _Mismatch(
                f"{what} is {'None' if c is None else 'a tensor'} compiled, but {'None' if e is None else 'a tensor'} in eager [{where}]", ()
            )
        if not isinstance(c, torch.Tensor) and what in differing:
            return _Mismatch(f"{what}={c!r} compiled, but should be {e!r} like eager [{where}]", ())
    spec = target.spec
    names = [r.name for r in case.recipes]
    pristine = case.args()
    truth, baseline = reference_truth_and_baseline(spec, case, pristine, names, grad_outputs, terms=True)
    verdict = judge_against_truth(spec, case.dtype, _judged(compiled, truth, baseline, where, pristine, names))
    if verdict is None:
        return None
    if judge_against_truth(spec, case.dtype, _judged(eager, truth, baseline, where, pristine, names)) is not None:
        target.not_checked("eager results are already outside the reference policy on this case: the reference contract's finding")
        raise _NothingToJudge
    head, bracket, where_it_was = verdict.summary.partition(" [")
    return _Mismatch(
        f"compiled {head} (eager is within it){bracket}{where_it_was}",
        (f"differs from eager (not bitwise): {', '.join(differing)}", verdict.details),
    )


class _NothingToJudge(Exception):
    """The example has nothing to say about compile (eager is outside the policy already, or
    Dynamo cannot trace a Function with a jvp): the reason went to ``target.not_checked``."""


def _dynamo_alone(target: Target, case: Case, grad_outputs: dict[int, torch.Tensor]) -> Evaluated | BaseException:
    """The case under Dynamo's trace alone (backend 'eager': no AOTAutograd, no Inductor), or
    what it raised: when it agrees with eager, a compiled difference comes from torch's backend."""
    call = target.spec.op.call
    torch._dynamo.reset()

    def dynamo_only(*args: Any) -> Any:
        return call(*args)

    try:
        return outputs_and_grads(torch.compile(dynamo_only, backend="eager"), case, grad_outputs)[0]
    except Exception as error:
        return error


class _NoOpCastReturn(torch.autograd.Function):
    """A correct Function whose forward returns ``y.to(x.dtype)`` with ``y`` already of that dtype
    (the no-op cast every upcast-compute-downcast kernel makes in its own dtype)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.unsqueeze(-1).expand(*grad.shape, 3).clone()


@functools.cache
def dynamo_canary_failure() -> str:
    """What Dynamo's own trace (backend 'eager') of a correct canary Function gets wrong on this
    torch, or "". torch 2.11 returns zero gradients for ``_NoOpCastReturn`` (2.13 is right): with
    such a Dynamo, a difference between Dynamo's trace and eager does not show the Function's defect."""
    torch._dynamo.reset()
    x = torch.tensor([0.5, -1.25, 2.0], dtype=torch.float64, requires_grad=True)
    grad = torch.tensor(0.75, dtype=torch.float64)
    try:
        traced = torch.compile(_NoOpCastReturn.apply, backend="eager", fullgraph=True)
        (found,) = torch.autograd.grad([traced(x)], [x], [grad])
    except Exception:  # a Dynamo that cannot trace it says nothing about wrong values
        return ""
    finally:
        torch._dynamo.reset()
    if torch.equal(found, torch.full_like(x, 0.75)):
        return ""
    return (
        f"under torch {torch.__version__}, Dynamo's trace alone (backend='eager') gives grad {found.tolist()} instead of "
        f"[0.75, 0.75, 0.75] for a correct canary Function whose forward returns x.sum(-1).to(x.dtype)"
    )


def _is_compiling_flags() -> tuple[tuple[object, str], ...]:
    # Resolved when used: reading torch._dynamo at import would import Dynamo (~1 s) in every run.
    return ((torch.compiler, "is_compiling"), (torch.compiler, "is_dynamo_compiling"), (torch._dynamo, "is_compiling"))


def _compiling_branch_eagerly(target: Target, case: Case, grad_outputs: dict[int, torch.Tensor]) -> Evaluated | BaseException:
    """The case run eagerly with ``torch.compiler.is_compiling()`` (and its aliases) returning True:
    the branch a Function takes only under compile, without Dynamo, or what it raised."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in _is_compiling_flags() if hasattr(owner, name)]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, lambda: True)
        return outputs_and_grads(target.spec.op.call, case, grad_outputs)[0]
    except Exception as error:
        return error
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _upstream_or_defect(
    target: Target, case: Case, backend: str, eager: Evaluated, grad_outputs: dict[int, torch.Tensor],
    summary: str, details: Sequence[str],
) -> NoReturn:
    """A difference only compiled code shows: torch's bug when Dynamo's own trace of the Function
    agrees with eager (only the backend differs), else the Function's defect."""
    __tracebackhide__ = True
    blocked_by_undeclared_writes(case)  # what a compiler does with an undeclared in-place write is undefined
    where = f"{target.spec.display_name}, backend='eager'"
    alone = _dynamo_alone(target, case, grad_outputs) if backend != "eager" else None
    if isinstance(alone, Evaluated) and _mismatch(target, case, eager, alone, grad_outputs, where) is None:
        upstream(
            f"torch's bug: backend={backend!r} is wrong where eager and Dynamo's trace alone (backend='eager') are "
            f"right: {summary}",
            *details,
            "Workaround: call this Function outside the compiled region (decorate the caller with "
            "torch.compiler.disable) or compile with backend='eager'"
            + ("; for an in-place Function (mark_dirty), pass it a tensor created inside the compiled region, "
               "or have forward write into a new tensor" if target.spec.mutates else "") + ".",
            "Torch-only repro to file at https://github.com/pytorch/pytorch/issues (it needs only torch and this Function):",
            torch_only_script(case, grad_outputs, backend),
        )
    canary = dynamo_canary_failure()
    if canary:
        branch = _compiling_branch_eagerly(target, case, grad_outputs)
        if isinstance(branch, Evaluated):
            own = _mismatch(target, case, eager, branch, grad_outputs, f"{target.spec.display_name}, eager with is_compiling()=True")
            if own is not None:
                fail(summary, *details, f"The Function's own compile-only branch shows it without Dynamo: {own.summary}")
        upstream(
            f"torch's bug, most likely: Dynamo is wrong on a correct canary Function on this torch, so a compiled "
            f"difference cannot be blamed on the Function: {summary}",
            *details,
            f"Canary: {canary}. Rerun on a torch whose Dynamo passes it (2.13 does) to judge this Function's compiled "
            "gradients.",
        )
    fail(summary, *details)


# Where Dynamo fails on a number read from a tensor's values: what the Function's author can change.
UNBACKED_WORKAROUND = (
    "The unbacked symbol is a number forward reads from a tensor's values (int(t), t.item(), a count kept on "
    "ctx): keep it a tensor (ctx.save_for_backward(count), divide by it as a tensor) and the Function traces "
    "as one graph."
)


def _trace_advice(target: Target, error: BaseException, backend: str, case: Case) -> None:
    """A Function that does not trace as one graph: a defect when the spec promises fullgraph,
    else advice naming Dynamo's reason (and the Function's own definition, where that is the cause)."""
    where = f"{target.spec.display_name}, torch.compile(fullgraph=True, backend={backend!r}), {str(case.dtype).removeprefix('torch.')}"
    text = " ".join(str(error).split())
    graph_break = isinstance(error, torch._dynamo.exc.Unsupported)
    what = "could not trace it as one graph (a graph break)" if graph_break else f"raised {type(error).__name__} under fullgraph=True"
    own = _own_definition_cause(target)
    details = (
        f"{type(error).__name__}: {text[:1500]}",
        own or "Dynamo traces forward and backward with fake tensors: no data pointers, .item()/.tolist() or print in "
        "forward, no Python side effects (globals, caches) shared between forward and backward; keep state on ctx.",
    )
    if "fullgraph" in target.spec.compile_promises:
        fail(f"torch.compile {what}, but the spec promises compile='fullgraph' [{where}]", *details)
    if isinstance(error, torch._dynamo.exc.InternalTorchDynamoError):
        upstream_noted(
            f"torch's bug: Dynamo failed internally under fullgraph=True ({type(error).__name__}, not a graph break of the "
            f"Function); without fullgraph it runs and matches eager [{where}]",
            f"{type(error).__name__}: {text[:1500]}",
            *((UNBACKED_WORKAROUND,) if dynamo_unbacked_symbol(text) else ()),
            "Meanwhile torch.compile without fullgraph=True works for this Function; to report it, call "
            "torch.compile(fn, fullgraph=True, backend=...) on the case below.",
        )
        return
    advise(
        f"torch.compile {what}; without fullgraph it runs and matches eager, so this is performance advice [{where}]",
        *details,
        "register(..., compile='fullgraph') makes this a failure for a Function that promises one graph.",
    )


def _own_definition_cause(target: Target) -> str:
    """The part of the Function's own definition that Dynamo cannot trace, when we can tell."""
    function = target.spec.op.function
    if isinstance(function, type) and isinstance(inspect.getattr_static(function, "forward", None), classmethod):
        return (
            f"{target.spec.display_name}.forward is a @classmethod: Dynamo binds autograd.Function.forward as a "
            "staticmethod, so it cannot trace this definition (make forward a @staticmethod)."
        )
    return ""


def _compile_error(target: Target, error: BaseException, backend: str, case: Case, eager: Evaluated, grad_outputs: dict[int, torch.Tensor]) -> NoReturn:
    """torch.compile (graph breaks allowed) raised where eager runs."""
    __tracebackhide__ = True
    where = f"{target.spec.display_name}, torch.compile(backend={backend!r}), {str(case.dtype).removeprefix('torch.')}"
    text = " ".join(str(error).split())
    if isinstance(error, torch._dynamo.exc.InternalTorchDynamoError):
        blocked_by_undeclared_writes(case)  # what a compiler does with an undeclared in-place write is undefined
        # Dynamo's own code failed where it should have broken the graph (a user error is a graph
        # break, Unsupported, or the error itself): torch's bug, whatever in the definition set it off.
        upstream(
            f"torch's bug: Dynamo failed internally ({type(error).__name__}) with graph breaks allowed, where it "
            f"should break the graph; eager runs this case [{where}]",
            f"{type(error).__name__}: {text[:1500]}",
            *([own] if (own := _own_definition_cause(target)) else []),
            "Workaround: call this Function outside the compiled region (decorate the caller with "
            "torch.compiler.disable). To report it: torch.compile(fn, backend=...) on the case below.",
        )
    _upstream_or_defect(
        target, case, backend, eager, grad_outputs,
        f"torch.compile raised {type(error).__name__}, but eager runs this case [{where}]",
        (f"{type(error).__name__}: {text[:1500]}",),
    )


def check_compile(target: Target, data: st.DataObject) -> None:
    first = target.draw_case(data)
    drawn = [first]
    for index in range(1, CASES_PER_EXAMPLE):
        # Later calls draw every dim at least index + 1 long where its dim rules allow (min_size
        # is the run's preference: a dim's max_size and its relations win, strategies.dims): even
        # the simplest example (all dims at their minimum) then sees new sizes, which dynamic
        # shapes must absorb. Different dims get different sizes: with all of them equal, a
        # fake kernel or a gradient that swaps two dims traces and runs as if it were right.
        larger = target.case_options.replace(
            min_size=index + 1, max_size=max(target.case_options.max_size, index + 1), unique_dims=True
        )
        drawn.append(target.draw_case(data, larger, dtypes=(first.dtype,)))
    for case in drawn:
        # A defect eager already shows is its owner's (blocked by it), at every call's sizes: a
        # gradient summed over the wrong dim has the right shape only where the dims are equal.
        target.preflight(case)
        blocked_by_fake_kernel(case)  # a fake kernel right only where dims are equal
    try:
        with without_guard_latency_profile():  # a debug log's number, a quarter of each compile
            for backend_name in target.options.compile_backends:
                _check_backend(target, drawn, backend_name)
    except _NothingToJudge:
        return
    finally:
        torch._dynamo.reset()  # the example's graphs and fake tensors go now, not at the next compile test
    target.checked()


class _Compiled:
    """One compiled callable of the Function for one backend, fullgraph until a graph break."""

    def __init__(self, target: Target, backend: str, *, fullgraph: bool) -> None:
        torch._dynamo.reset()  # each example compiles afresh: no cache entries from another test
        call = target.spec.op.call

        def traced(*args: Any) -> Any:
            return call(*args)

        self.traced = traced
        self.fullgraph = fullgraph
        self.call = torch.compile(traced, backend=backend, fullgraph=fullgraph)
        self.expected = ExpectedRecompiles()
        self.allowed = 0


def _check_backend(target: Target, drawn: list[Case], backend: str) -> None:
    call = target.spec.op.call
    compiled_fn = _Compiled(target, backend, fullgraph=True)
    storm_reported = False
    for index, case in enumerate(drawn):
        if target.context is not None:
            target.context.use_case(case)
        eager, grad_outputs = outputs_and_grads(call, case, None)
        try:
            compiled, _ = outputs_and_grads(compiled_fn.call, case, grad_outputs)
        except Exception as error:
            if not compiled_fn.fullgraph:
                _compile_error(target, error, backend, case, eager, grad_outputs)
            if target.spec.op.declares("jvp") and dynamo_refuses_jvp(" ".join(str(error).split())):
                target.not_checked(
                    "Dynamo cannot trace an autograd.Function that defines a jvp staticmethod (torch "
                    f"{torch.__version__}); without fullgraph it runs that Function eagerly"
                )
                raise _NothingToJudge from None
            _trace_advice(target, error, backend, case)
            compiled_fn = _Compiled(target, backend, fullgraph=False)  # graph breaks allowed from here on
            try:
                compiled, _ = outputs_and_grads(compiled_fn.call, case, grad_outputs)
            except Exception as error_again:
                _compile_error(target, error_again, backend, case, eager, grad_outputs)
        compiled_fn.allowed += 1 if compiled_fn.expected.add(case) else 0
        variants = compiled_variants(compiled_fn.traced)
        if variants > compiled_fn.allowed and not storm_reported:
            storm_reported = True
            _recompile_finding(target, backend, drawn[: index + 1], variants)
        where = f"{target.spec.display_name}, backend={backend!r}"
        mismatch = _mismatch(target, case, eager, compiled, grad_outputs, where)
        if mismatch is not None:
            _upstream_or_defect(target, case, backend, eager, grad_outputs, mismatch.summary, mismatch.details)


def _recompile_finding(target: Target, backend: str, calls: list[Case], variants: int) -> None:
    """A call that an earlier (dynamic) graph should serve compiled again: a defect when the spec
    promises dynamic shapes, else advice naming the sizes that drove it."""
    sizes = "; ".join(c.describe() for c in calls)
    summary = (
        f"torch.compile compiled {variants} variants for {len(calls)} calls, but should reuse one after "
        f"the sizes that change have turned dynamic (Dynamo marks a size dynamic once it changes, so later calls normally reuse "
        f"that graph; call {len(calls)} did not) "
        f"[{target.spec.display_name}, backend={backend!r}]"
    )
    details = (
        f"calls: {sizes}",
        "A recompile on every new size: the Function branches on a size or a Python number in forward, "
        "or loops over a size in Python (range(0, n, BLOCK)), so Dynamo guards on it. Rerun with "
        "TORCH_LOGS=recompiles to see the failing guard.",
    )
    if "dynamic" in target.spec.compile_promises:
        fail(summary.replace("but should reuse one", "but the spec promises compile='dynamic' and should reuse one"), *details)
    advise(
        summary.replace(", but should reuse one", "; performance advice: unless its structure depends on the size, it would reuse one"),
        *details,
        "Where the structure really depends on the size (scan levels, block counts), this is by design; "
        "register(..., compile='dynamic') makes it a failure for a Function that promises one graph.",
    )


def _traceable_here(target: Target) -> None:
    if target.spec.op.kind == "autograd.Function" and runs_interpreted(target.spec.op, target.device):
        target.not_run_here(
            "Dynamo traces Triton kernels with fake tensors, which the Triton interpreter cannot launch "
            "(no data pointers): torch.compile of this Function is checked on a GPU"
        )
    if target.spec.nondeterministic:
        target.not_applicable("declared nondeterministic: compiled random streams need not match eager's")


@contract("compile", max_examples=1, requires=[Requirement("traceable here, deterministic", _traceable_here)], compares_values=True)
def test_compile(conformance_target: Target) -> None:
    conformance_target.run(check_compile)

