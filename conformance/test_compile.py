"""Contract compile: under ``torch.compile(fullgraph=True)`` outputs and gradients equal eager's.

Each example draws several cases of one dtype with different sizes (dynamic shapes) and runs them
through one compiled callable per backend of ``--compile-backends`` (``aot_eager`` by default;
``inductor`` opt-in), forward and backward, each against eager on the same inputs and
grad_outputs. Results bitwise equal to eager's pass at once; otherwise the compiled result must
meet the reference policy against the float64 truth (the reference contract's rule), and when
eager itself does not, the difference is the reference contract's finding, not this one's.

Reported here: a graph break or anything else Dynamo cannot trace (``fullgraph=True`` turns a
break into an error, with Dynamo's reason), an error only the compiled call raises, a value that
is right in eager and wrong compiled (a backward that depends on Python-side state, a traceable
fallback that differs from the eager kernel), and a recompile storm: a case that recompiles
although it changes no size or value that had not changed before (the first change of a size
makes Dynamo compile once more with that size dynamic; sizes 0 and 1 are specialised). A custom
op whose fake kernel is wrong is opcheck's finding (blocked by opcheck here). Costly: one
example per test unless ``--max-examples`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.adapters import CustomOpAdapter
from conformance.contracts import Requirement, contract
from conformance.defects import Blocked, Defect
from conformance.harness import as_tuple, differentiable_positions, forward_args, random_state
from conformance.numerics import Evaluated, Judged, evaluate_spec, judge_against_truth, strict_float32, upcast
from conformance.report import fail
from conformance.runner import Target
from conformance.triton_interpreter import interpreting, uses_triton
from strategies.cases import Case
from strategies.recipes import ScalarRecipe

CASES_PER_EXAMPLE = 3  # sizes per compiled callable: static, dynamic, and one that must reuse it


def compiled_variants(function: Callable[..., Any]) -> int:
    """How many compiled variants Dynamo keeps for ``function`` (one per recompile): its cache
    entries. (A backend's call count is no measure: Dynamo may hand it one graph twice.)"""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


def _signature(case: Case) -> tuple[Any, ...]:
    """What Dynamo specialises on besides the sizes themselves: ranks, size classes (0, 1, >=2;
    0 and 1 are specialised), which sizes are equal (duck sizing) and the Python values."""
    shapes = [tuple(r.shape) for r in case.recipes if isinstance(getattr(r, "shape", None), tuple)]
    flat = [size for shape in shapes for size in shape]
    equal_to = tuple(flat.index(size) if size >= 2 else -1 for size in flat)
    values = tuple(repr(r.value) for r in case.recipes if isinstance(r, ScalarRecipe))
    return tuple(len(s) for s in shapes), tuple(min(x, 2) for x in flat), equal_to, values


def _new_in(previous: Sequence[Case], case: Case) -> list[str]:
    """Why ``case`` may compile once more after ``previous``: a new signature (see
    :func:`_signature`), or a size that changes for the first time (which turns it dynamic)."""
    if not previous:
        return ["the first call"]
    reasons = []
    if _signature(case) not in {_signature(p) for p in previous}:
        reasons.append("ranks, sizes 0/1, equal sizes or Python values not seen before")
    for position, recipe in enumerate(case.recipes):
        shape = getattr(recipe, "shape", None)
        if not isinstance(shape, tuple):
            continue
        for dim, size in enumerate(shape):
            seen = {p.recipes[position].shape[dim] for p in previous if len(p.recipes[position].shape) == len(shape)}  # type: ignore[attr-defined]
            general = {s for s in seen if s >= 2}  # 0 and 1 get specialised graphs of their own
            if size >= 2 and len(general) == 1 and size not in general:
                reasons.append(f"{recipe.name}.shape[{dim}] changes for the first time")
    return reasons


def _run(func: Callable[..., Any], case: Case, grad_outputs: dict[int, torch.Tensor] | None) -> tuple[Evaluated, dict[int, torch.Tensor]]:
    """Outputs and gradients of ``func`` on fresh inputs; grad_outputs drawn for the first call
    (the eager one) and given to the next."""
    args = case.args()
    names = [r.name for r in case.recipes]
    with random_state(case.spec, case):
        outputs = as_tuple(func(*forward_args(case, args)))
        if grad_outputs is None:
            positions = differentiable_positions(outputs)
            grad_outputs = dict(zip(positions, case.grad_outputs([outputs[p] for p in positions])))
        wrt = [(n, a) for n, a in zip(names, args) if isinstance(a, torch.Tensor) and a.requires_grad]
        positions = [p for p in differentiable_positions(outputs) if p in grad_outputs]
        grads: dict[str, torch.Tensor | None] = {}
        if wrt and positions:
            found = torch.autograd.grad(
                [outputs[p] for p in positions], [a for _, a in wrt], [grad_outputs[p] for p in positions], allow_unused=True
            )
            grads = {n: g for (n, _), g in zip(wrt, found)}
        elif wrt and grad_outputs:
            grads = {n: None for n, _ in wrt}  # outputs detached from the graph: no gradient reaches any input
    return Evaluated(outputs, grads), grad_outputs


def _bitwise_equal(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a == b if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) else False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _judged(results: Evaluated, truth: Evaluated, baseline: Evaluated, where: str, args: list[Any], names: list[str]) -> list[Judged]:
    values: list[Judged] = []
    for position, (got, want, base) in enumerate(zip(results.outputs, truth.outputs, baseline.outputs)):
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and isinstance(base, torch.Tensor):
            values.append(Judged(f"output[{position}]", "output", got, want, base, f"{where}, forward", truth.output_terms.get(position)))
    for name, got in results.grads.items():
        arg = args[names.index(name)]
        want = truth.grads.get(name)
        base = baseline.grads.get(name)
        values.append(Judged(
            f"grad[{name!r}]", "grad", torch.zeros_like(arg) if got is None else got,
            torch.zeros(arg.shape, dtype=torch.float64) if want is None else want,
            torch.zeros_like(arg) if base is None else base, f"{where}, backward, input {name!r}", truth.grad_terms.get(name),
        ))
    return values


def _compare(target: Target, case: Case, eager: Evaluated, compiled: Evaluated, grad_outputs: dict[int, torch.Tensor], where: str) -> None:
    """Compiled results bitwise equal to eager's, or within the reference policy of the truth."""
    if len(compiled.outputs) != len(eager.outputs):
        fail(f"len(outputs)={len(compiled.outputs)} compiled, but should be {len(eager.outputs)} like eager [{where}]")
    pairs = [(f"output[{i}]", c, e) for i, (c, e) in enumerate(zip(compiled.outputs, eager.outputs))]
    pairs += [(f"grad[{n!r}]", compiled.grads.get(n), g) for n, g in eager.grads.items()]
    differing = [what for what, c, e in pairs if not (c is None and e is None) and not _bitwise_equal(c, e)]
    if not differing:
        return
    for what, c, e in pairs:
        if isinstance(c, torch.Tensor) and isinstance(e, torch.Tensor) and tuple(c.shape) != tuple(e.shape):
            fail(f"{what}.shape={tuple(c.shape)} compiled, but should be {tuple(e.shape)} like eager [{where}]")
        if (c is None) != (e is None):
            fail(f"{what} is {'None' if c is None else 'a tensor'} compiled, but {'None' if e is None else 'a tensor'} in eager [{where}]")
    spec = target.spec
    names = [r.name for r in case.recipes]
    pristine = case.args()
    with strict_float32(), random_state(spec, case):
        truth = evaluate_spec(spec, [upcast(a) for a in pristine], names, grad_outputs, terms=True)
    with random_state(spec, case):
        baseline = evaluate_spec(spec, pristine, names, grad_outputs)
    verdict = judge_against_truth(spec, case.dtype, _judged(compiled, truth, baseline, where, pristine, names))
    if verdict is None:
        return
    if judge_against_truth(spec, case.dtype, _judged(eager, truth, baseline, where, pristine, names)) is not None:
        target.not_checked("eager results are already outside the reference policy on this case: the reference contract's finding")
        return
    fail(
        f"compiled {verdict.summary.replace(' - reference|', ' - reference| (eager is within it)', 1)}",
        f"differs from eager (not bitwise): {', '.join(differing)}",
        verdict.details,
    )


def _trace_failure(target: Target, error: BaseException, backend: str, case: Case) -> None:
    """Report what compiling raised: Dynamo's reason for a graph break, else the error."""
    where = f"{target.spec.display_name}, torch.compile(fullgraph=True, backend={backend!r}), {str(case.dtype).removeprefix('torch.')}"
    text = " ".join(str(error).split())
    if target.spec.op.declares("jvp") and "jvp" in text:
        target.not_checked(
            "Dynamo cannot trace an autograd.Function that defines a jvp staticmethod (torch "
            f"{torch.__version__}: {text[:160]}); without fullgraph it runs that Function eagerly"
        )
        return
    dynamo = isinstance(error, torch._dynamo.exc.TorchDynamoException)
    graph_break = isinstance(error, torch._dynamo.exc.Unsupported)
    what = "could not trace it (a graph break)" if graph_break else f"raised {type(error).__name__}"
    fail(
        f"torch.compile {what}, but eager runs this case [{where}]",
        f"{type(error).__name__}: {text[:1500]}",
        "Dynamo traces forward and backward with fake tensors: no data pointers, .item()/.tolist() or print in "
        "forward, no Python side effects (globals, caches) shared between forward and backward; keep state on ctx."
        if dynamo else "",
    )


def _blocked_by_opcheck(target: Target, case: Case) -> None:
    op = target.spec.op
    if not isinstance(op, CustomOpAdapter):
        return
    error = op.opcheck(case.args(requires_grad=set()), ("test_faketensor",))["test_faketensor"]
    if error is not None:
        first = " ".join(str(error).split())[:200]
        raise Blocked(Defect("opcheck", f"test_faketensor failed ({type(error).__name__}: {first})"), case)


def check_compile(target: Target, data: st.DataObject) -> None:
    first = target.draw_case(data)
    drawn = [first] + [target.draw_case(data, dtypes=(first.dtype,)) for _ in range(CASES_PER_EXAMPLE - 1)]
    _blocked_by_opcheck(target, first)
    call = target.spec.op.call
    for backend_name in target.options.compile_backends:
        torch._dynamo.reset()  # each example compiles afresh: no cache entries from another test

        def traced(*args: Any) -> Any:
            return call(*args)

        compiled_call = torch.compile(traced, backend=backend_name, fullgraph=True)
        allowed = 0
        for index, case in enumerate(drawn):
            if target.context is not None:
                target.context.use_case(case)
            eager, grad_outputs = _run(call, case, None)
            try:
                compiled, _ = _run(compiled_call, case, grad_outputs)
            except Exception as error:
                _trace_failure(target, error, backend_name, case)
                return
            allowed += 1 if _new_in(drawn[:index], case) else 0
            variants = compiled_variants(traced)
            if variants > allowed:
                sizes = "; ".join(c.describe() for c in drawn[: index + 1])
                fail(
                    f"torch.compile compiled {variants} variants for {index + 1} calls, but should reuse one after "
                    f"the sizes that change have turned dynamic (call {index + 1} changes nothing new) "
                    f"[{target.spec.display_name}, backend={backend_name!r}]",
                    f"calls: {sizes}",
                    "A recompile on every new size: the Function branches on a size or a Python number in forward "
                    "(guards on it). Rerun with TORCH_LOGS=recompiles to see the failing guard.",
                )
            _compare(target, case, eager, compiled, grad_outputs, f"{target.spec.display_name}, backend={backend_name!r}")
    target.checked()


def _traceable_here(target: Target) -> None:
    if target.device == "cpu" and target.spec.op.kind == "autograd.Function" and interpreting() and uses_triton(target.spec.op.module):
        target.not_run_here(
            "Dynamo traces Triton kernels with fake tensors, which the Triton interpreter cannot launch "
            "(no data pointers): torch.compile of this Function is checked on a GPU"
        )
    if target.spec.nondeterministic:
        target.not_applicable("declared nondeterministic: compiled random streams need not match eager's")


@contract("compile", max_examples=1, requires=[Requirement("traceable here, deterministic", _traceable_here)])
def test_compile(conformance_target: Target) -> None:
    conformance_target.run(check_compile)

