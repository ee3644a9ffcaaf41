"""Contract func: torch.func transforms of the target agree with plain calls and with autograd.

For a Function that declares vmap support (``generate_vmap_rule = True`` or a ``vmap``
staticmethod; torch.func also needs ``setup_context``):

* ``torch.func.vmap`` over a batch of 2 samples equals calling it on each sample: the batch dim
  of each floating input is drawn (None -- not batched --, 0, or any other position, at least one
  input batched), so a rule that assumes the batch dim is first or ignores an unbatched input is
  seen. Results are judged against the float64 reference per sample under the reference policy.
* ``torch.func.vjp`` gives the same gradients as ``torch.autograd.grad`` (same policy).

A target that declares no vmap support must refuse ``vmap`` with an error; one whose vmap runs
anyway (a custom op's batching fallback) is checked like a declared rule. torch.func.vjp through a
custom op is not checked: torch's generated Function for ``register_autograd`` has no
setup_context (a torch limitation, measured on 2.13).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import Blocked, Defect
from conformance.engine.evaluate import user_call, user_evaluate, vjp_call, vmap_call
from conformance.engine.harness import forward_args, random_state
from conformance.engine.numerics import (
    Comparison,
    Judged,
    cheap_budget_first,
    judge_against_truth,
    judged_grads,
    reference_truth_and_baseline,
)
from conformance.engine.report import fail
from conformance.engine.runner import Target
from strategies.cases import Case
from strategies.recipes import FloatingRecipe
from strategies.values import distinct_seed

BATCH = 2  # samples per vmapped call


def sample(case: Case, index: int) -> Case:
    """The ``index``-th sample of a batch: the same sizes and kinds, other floating values."""
    if index == 0:
        return case
    recipes = tuple(
        replace(r, seed=distinct_seed(r.seed + index, "vmap sample")) if isinstance(r, FloatingRecipe) else r
        for r in case.recipes
    )
    return replace(case, recipes=recipes)


def _draw_in_dims(data: st.DataObject, case: Case, args: list[Any]) -> list[int | None]:
    """Each floating input's batch dim. The simplest draw, which every coverage corner makes, is
    the most telling one: the first input batched last, the others unbatched. A rule that assumes
    the batch dim is first, returns the wrong out_dims or ignores an unbatched input fails on it
    (with None first for every input, corners drew in_dims=(0, None, ...) only)."""
    candidates = [i for i, (r, a) in enumerate(zip(case.recipes, args)) if isinstance(r, FloatingRecipe) and isinstance(a, torch.Tensor)]
    in_dims: list[int | None] = [None] * len(args)
    for order, position in enumerate(candidates):
        dims = list(range(args[position].dim() + 1))
        choices = [*reversed(dims), None] if order == 0 else [None, *dims]
        in_dims[position] = data.draw(st.sampled_from(choices), label=f"vmap in_dim of {case.recipes[position].name}")
    if candidates and all(in_dims[p] is None for p in candidates):
        in_dims[candidates[0]] = 0
    return in_dims


def _stack(values: list[Any], dim: int | None) -> Any:
    return values[0] if dim is None else torch.stack(values, dim=dim)


def _per_sample_truth(
    target: Target, samples: list[Case], args: list[list[Any]], in_dims: list[int | None], *, terms: bool
) -> tuple[list[Any], list[Any]]:
    """The reference per sample in float64 (truth, with its term bounds when ``terms``) and in
    the tested dtype (baseline); an unbatched input is sample 0's in every call."""
    names = [r.name for r in samples[0].recipes]
    truths, baselines = [], []
    for index, case in enumerate(samples):
        sample_args = [args[index][p] if in_dims[p] is not None else args[0][p] for p in range(len(in_dims))]
        truth, baseline = reference_truth_and_baseline(target.spec, case, sample_args, names, {}, terms=terms)
        truths.append(truth)
        baselines.append(baseline)
    return truths, baselines


def _check_vmap(target: Target, data: st.DataObject, case: Case, *, declared: bool) -> None:
    spec = target.spec
    samples = [sample(case, i) for i in range(BATCH)]
    args = [forward_args(s, s.args(requires_grad=set())) for s in samples]
    in_dims = _draw_in_dims(data, case, args[0])
    batched = [_stack([a[p] for a in args], in_dims[p]) for p in range(len(in_dims))]
    where = f"torch.func.vmap({spec.display_name}, in_dims={tuple(in_dims)}), {str(case.dtype).removeprefix('torch.')}"
    try:
        vmapped = vmap_call(case, in_dims, batched)
    except Exception as error:
        if not declared:
            target.checked()
            return
        fail(
            f"vmap raised {type(error).__name__}, but {spec.display_name} declares vmap support [{where}]",
            f"{type(error).__name__}: {' '.join(str(error).split())[:1500]}",
            compares_values=False,
        )
    for position, got in enumerate(vmapped):
        if isinstance(got, torch.Tensor) and (got.dim() == 0 or got.shape[0] != BATCH):
            fail(f"vmapped output[{position}].shape={tuple(got.shape)}, but should have the batch of {BATCH} first [{where}]", compares_values=False)
    per_sample = [[o[i] if isinstance(o, torch.Tensor) else o for o in vmapped] for i in range(BATCH)]
    truths, baselines = _per_sample_truth(target, samples, args, in_dims, terms=False)

    def judge(full_budget: bool) -> Comparison | None:
        nonlocal truths, baselines
        if full_budget:
            truths, baselines = _per_sample_truth(target, samples, args, in_dims, terms=True)
        return judge_against_truth(spec, case.dtype, _judged_samples(per_sample, truths, baselines, where))

    verdict = cheap_budget_first(judge)
    if verdict is None:
        target.checked()
        return
    # Only the vmap rule's fault when each sample alone, through the Function, is right.
    alone = []
    for index, one in enumerate(samples):
        sample_args = [args[index][p] if in_dims[p] is not None else args[0][p] for p in range(len(in_dims))]
        with random_state(spec, one):
            alone.append(user_call(one, sample_args, grad=False))
    if judge_against_truth(spec, case.dtype, _judged_samples(alone, truths, baselines, where)) is not None:
        raise Blocked(Defect("reference", f"each sample alone, through {spec.display_name}, is outside the reference policy too: a forward defect, not the vmap rule's"), case)
    fail(verdict.summary, verdict.details, "Each sample alone, through the Function, is the reference's; only the vmapped call differs.")


def _judged_samples(found: Sequence[Sequence[Any]], truths: list[Any], baselines: list[Any], where: str) -> list[Judged]:
    """Each sample's tensor outputs against its float64 truth and baseline."""
    values = []
    for index, outputs in enumerate(found):
        for position, got in enumerate(outputs):
            if not isinstance(got, torch.Tensor):
                continue
            values.append(Judged(
                f"output[{position}] of sample {index}", "output", got, truths[index].outputs[position],
                baselines[index].outputs[position], where, truths[index].output_terms.get(position), truths[index].accumulation,
            ))
    return values


def _check_vjp(target: Target, case: Case) -> None:
    spec = target.spec
    args = case.args()
    names = [r.name for r in case.recipes]
    wrt = [p for p, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not wrt:
        return
    with random_state(spec, case):
        outputs = user_call(case, grad=False)
    floating = [p for p, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    grad_outputs = dict(zip(floating, case.grad_outputs([outputs[p] for p in floating])))

    where = f"torch.func.vjp({spec.display_name}), {str(case.dtype).removeprefix('torch.')}"
    try:
        found = vjp_call(case, args, wrt, floating, grad_outputs)
    except Exception as error:
        fail(
            f"torch.func.vjp raised {type(error).__name__}, but {spec.display_name} declares torch.func support [{where}]",
            f"{type(error).__name__}: {' '.join(str(error).split())[:1500]}",
            compares_values=False,
        )
    with random_state(spec, case):
        eager = user_evaluate(case, names, grad_outputs)
    pristine = case.args()
    truth, baseline = reference_truth_and_baseline(spec, case, pristine, names, grad_outputs)

    def judge(full_budget: bool) -> Comparison | None:
        nonlocal truth, baseline
        if full_budget:
            truth, baseline = reference_truth_and_baseline(spec, case, pristine, names, grad_outputs, terms=True)
        return judge_against_truth(spec, case.dtype, judged_grads(dict(zip([names[p] for p in wrt], found)), truth, baseline, pristine, names, lambda _: where))

    verdict = cheap_budget_first(judge)
    if verdict is None:
        return
    if judge_against_truth(spec, case.dtype, judged_grads(eager.grads, truth, baseline, pristine, names, lambda _: where)) is not None:
        raise Blocked(Defect("reference", "torch.autograd.grad through the Function is outside the reference policy too: a backward defect, not torch.func's"), case)
    fail(verdict.summary.replace(" - reference|", " - reference| (torch.autograd.grad is within it)", 1), verdict.details)


def check_func(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    target.preflight(case)  # a defect eager already shows is its owner's (blocked by it)
    declared = target.spec.op.declares("vmap") and target.spec.op.declares("setup_context")
    _check_vmap(target, data, case, declared=declared)
    if declared and target.spec.op.kind == "autograd.Function":
        _check_vjp(target, case)


@contract("func", compares_values=True)
def test_func(conformance_target: Target) -> None:
    conformance_target.run(check_func)
