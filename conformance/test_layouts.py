"""Contract layouts: memory layout never changes results.

Inputs are drawn transposed, sliced (stride 2), offset (non-zero storage offset), stride-0
expanded (where a row's values are all equal, so the same values can be expanded) and
channels-last (4-d); grad_outputs are drawn contiguous, non-contiguous and stride-0 expanded (as
``y.sum().backward()`` produces). The outputs and gradients must equal those of the same case with
every input contiguous and grad_outputs ``.contiguous()`` -- the same values in a plain layout.
Integer index outputs that pick equal values from an input (ties, as on a stride-0 constant row)
may break ties in any order; the gradients are then compared along the tied dim as multisets.

A kernel that reads ``data_ptr``/storage as if contiguous (``torch.as_strided`` with contiguous
strides, ``x.view(-1)`` on storage, a Triton/CUDA kernel indexed with ``i * n + j``) passes
gradcheck, which only ever feeds contiguous tensors, and silently returns wrong numbers here.

Functions declared ``nondeterministic=True`` run both calls with the same fixed RNG seed. On CUDA
both calls run with TF32 off: cuDNN picks another algorithm for another layout, with TF32 for one
and not the other (float32 convolutions 1e-3 apart), an approximation that is not the Function's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.engine.contract import contract
from conformance.engine.defects import Blocked, Defect, backward_raised, forward_raised, require_sound
from conformance.engine.evaluate import execute, run_reference
from conformance.engine.global_state import exact_cuda_math
from conformance.engine.harness import Execution, random_state
from conformance.engine.numerics import (
    FLOOR_ULPS,
    cheap_budget_first,
    exactly_equal,
    largest_magnitude,
    layout_tolerance,
    tie_dim,
    truth,
    ulp,
)
from conformance.engine.report import ContractFailure, fail
from conformance.engine.runner import Target
from conformance.engine.torch_text import writes_overlapping_memory
from strategies.cases import GRAD_LAYOUTS, LAYOUTS, Case, CaseOptions
from strategies.recipes import FloatingRecipe
from strategies.values import tensor_from_seed

# Every non-contiguous layout; degenerate ones (transposed 1-d, expanded non-constant rows,
# channels_last below 4-d) come back contiguous, so mixes of both still occur.
LAYOUTS_DRAWN = tuple(layout for layout in LAYOUTS if layout != "contiguous")
GRAD_OUTPUT_KINDS = ("noncontiguous", "expanded", "random")
NOISE_SEED = 20240611

# Same values in another layout can only change the *order* in which a kernel accumulates
# (e.g. BLAS picking another blocking for a transposed operand): the budget is
# :func:`conformance.engine.numerics.layout_tolerance` (rounding steps at the largest magnitude
# among the result, the floating inputs and, for gradients, the grad_outputs). Terms can also be
# far larger than every input and output (BatchNorm on constant rows: terms ~ g / sqrt(eps)
# cancelling to 0). So the budget also scales with the reference's own rounding error in this
# dtype, |reference(dtype) - reference(float64)|, which is ~ eps * |terms| * (the op's
# conditioning); for float64 it is measured in float32 and scaled by eps64 / eps32.


def _max_difference(a: Any, b: Any) -> float:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.is_floating_point():
        return 0.0
    a64, b64 = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    finite = torch.isfinite(a64) & torch.isfinite(b64)
    return float((a64 - b64)[finite].abs().max()) if bool(finite.any()) else 0.0


def _reference_noise(target: Target, case: Case, grad_outputs: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Per output/gradient label, the reference's own rounding error in the tested dtype."""
    spec = target.spec
    if spec.nondeterministic:
        return {}  # its random draws differ between dtypes
    probe_dtype = torch.float32 if case.dtype == torch.float64 else case.dtype
    factor = torch.finfo(case.dtype).eps / torch.finfo(probe_dtype).eps
    grad_func = spec.surrogate or spec.reference
    # Also with random grad_outputs of the same size: a constant (expanded) grad_output can make
    # the reference's own gradient cancel exactly, hiding how large the terms are.
    shuffled = tuple(
        tensor_from_seed(tuple(g.shape), torch.float64, seed=NOISE_SEED + i, scale=max(largest_magnitude([g]), 1e-30))
        for i, g in enumerate(grad_outputs)
    )
    noise: dict[str, float] = {}
    for probe_grads in (grad_outputs, shuffled):
        try:
            low_out, low_grads = run_reference(spec.reference, case, dtype=probe_dtype, device=case.device, grad_outputs_from=probe_grads)
            high_out, high_grads = run_reference(spec.reference, case, dtype=torch.float64, device=case.device, grad_outputs_from=probe_grads)
            if grad_func is not spec.reference:
                _, low_grads = run_reference(grad_func, case, dtype=probe_dtype, device=case.device, grad_outputs_from=probe_grads)
                _, high_grads = run_reference(grad_func, case, dtype=torch.float64, device=case.device, grad_outputs_from=probe_grads)
        except Exception:
            return noise  # a reference that cannot run in this dtype: keep the magnitude-based budget
        found = {f"outputs[{i}]": _max_difference(lo, hi) for i, (lo, hi) in enumerate(zip(low_out, high_out))}
        found.update({f"grad[{n!r}]": _max_difference(low_grads[n], high_grads.get(n)) for n in low_grads})
        for what, difference in found.items():
            noise[what] = max(noise.get(what, 0.0), factor * difference)
    return noise


def _term_floors(target: Target, case: Case, grad_outputs: dict[int, torch.Tensor]) -> dict[str, float]:
    """Per output/gradient label: twice the reference contract's rounding-step floor at the
    truth's term bound (:mod:`conformance.engine.terms`). Each layout's run may be that far from the
    truth, so the two may be that far apart: a LayerNorm of a constant row is made of terms
    ~300x larger than the result, and a one-step change in how ``mean`` sums them (PyTorch's own
    ``mean`` rounds differently on stride-0 and transposed memory) moves the result by ~300 steps."""
    spec = target.spec
    if spec.nondeterministic:
        return {}
    names = [r.name for r in case.recipes]
    args = case.args()
    try:
        exact = truth(spec, case, args, names, grad_outputs, terms=True)
    except Exception:
        return {}  # a reference that cannot run here: keep the magnitude-based budget
    floors = {f"outputs[{p}]": 2 * FLOOR_ULPS * ulp(float(t.max()), case.dtype) for p, t in exact.output_terms.items() if t.numel()}
    floors.update({f"grad[{n!r}]": 2 * FLOOR_ULPS * ulp(float(t.max()), case.dtype) for n, t in exact.grad_terms.items() if t.numel()})
    return floors


def _describe_layouts(case: Case, args: list[Any], grad_outputs: tuple[torch.Tensor, ...]) -> str:
    parts = [
        f"{r.name}: {r.layout}, stride {tuple(a.stride())}"
        for r, a in zip(case.recipes, args)
        if isinstance(r, FloatingRecipe) and isinstance(a, torch.Tensor)
    ]
    parts += [f"grad_output[{i}]: stride {tuple(g.stride())}" for i, g in enumerate(grad_outputs)]
    return "; ".join(parts)


def _run(case: Case, target: Target, grad_outputs: Any = None) -> Execution:
    # The contiguous and strided runs share grad_seed; without TF32, which cuDNN uses for some
    # layouts and not others, float32 results of a correct Function agree to rounding.
    with random_state(target.spec, case), exact_cuda_math():
        return execute(case, grad_outputs=grad_outputs)


def _blocked_if_written_in_place(error: BaseException, case: Case, summary: str) -> None:
    """torch refuses to write into an expanded (stride-0) tensor: the Function writes into its
    input or grad_output, which is the inplace contract's defect at every layout."""
    if writes_overlapping_memory(error):
        raise Blocked(Defect("inplace", summary), case) from None


def check_layouts(target: Target, data: st.DataObject) -> None:
    case = target.draw_case(data)
    case = _with_an_input_moved(replace(case, grad_layout=data.draw(st.sampled_from(GRAD_LAYOUTS), label="grad_output layout")))
    contiguous_case = replace(case, recipes=tuple(replace(r, layout="contiguous") if isinstance(r, FloatingRecipe) else r for r in case.recipes))
    baseline = _run(contiguous_case, target, grad_outputs=lambda outs: tuple(g.contiguous() for g in case.grad_outputs(outs)))
    require_sound(target.contract, baseline)  # broken even on contiguous tensors: another contract's finding
    try:
        strided = _run(case, target)
    except Exception as error:
        cause = error.__cause__ or error  # a ForwardError wraps the Function's own error
        _blocked_if_written_in_place(cause, case, forward_raised(cause, target.spec.display_name))
        fail(
            f"forward raised {type(cause).__name__} on non-contiguous inputs, but runs on contiguous ones with the same values",
            f"layouts: {_describe_layouts(case, case.args(), ())}",
            f"{type(cause).__name__}: {cause}",
            "Call .contiguous() on inputs a kernel indexes as if contiguous (or use .reshape, not .view).",
        )
    layouts = _describe_layouts(case, strided.args, strided.grad_outputs)
    if strided.backward_error is not None:
        backward_error = strided.backward_error
        _blocked_if_written_in_place(backward_error, case, backward_raised(backward_error, target.spec.display_name))
        fail(
            f"backward raised {type(backward_error).__name__} with non-contiguous inputs or grad_output, but runs on contiguous ones",
            f"layouts: {layouts}",
            f"{type(backward_error).__name__}: {backward_error}",
            "grad_output can be non-contiguous or stride-0 (y.sum().backward() passes an expanded "
            "grad_output): call grad_output.contiguous() before indexing it as contiguous memory.",
        )
    if not any(_strided(t) for t in [*strided.args, *strided.grad_outputs]):
        target.not_checked(
            "every input and grad_output drawn came out in the plain layout (layouts that need more dims "
            "or sizes above 1, or no Tensor input and no gradient), so there was nothing to compare"
        )
        return
    try:
        cheap_budget_first(lambda full_budget: _judge(target, contiguous_case, baseline, strided, layouts, full_budget))
    except ContractFailure:
        # A Function that writes into memory it was lent (on stride-0 memory torch only warns,
        # and every element then aliases the one written): the inplace contract's defect.
        written = strided.written_in_place(case.args())
        if written:
            summary = f"{target.spec.display_name} wrote into {', '.join(written)} in place"
            raise Blocked(Defect("inplace", summary), case) from None
        raise
    target.checked()


def _judge(target: Target, contiguous_case: Case, baseline: Execution, strided: Execution, layouts: str, full_budget: bool) -> None:
    """Fail unless the strided run's outputs and gradients equal the contiguous baseline's; the
    full budget adds the reference's own noise and the truth's term floors (measured then only)."""
    fn_name = target.spec.display_name
    noise, floors = {}, {}
    if full_budget:
        noise = _reference_noise(target, contiguous_case, baseline.grad_outputs)
        floors = _term_floors(target, contiguous_case, dict(zip(baseline.diff_positions, baseline.grad_outputs_before)))
    values = not target.spec.nondeterministic
    input_scale = largest_magnitude(baseline.args)
    grad_scale = max(input_scale, largest_magnitude(baseline.grad_outputs))
    tied: int | None = None  # the dim of an index output whose tie order differs between the layouts
    for position, (got, want) in enumerate(zip(strided.outputs, baseline.outputs)):
        what = f"outputs[{position}]"
        if _differs(got, want) and (dim := tie_dim(got, want, baseline.args)) is not None:
            tied = dim  # every tie order is valid, and the gradient follows the order picked
            continue
        _compare(got, want, what, layouts, f"{fn_name}.forward", input_scale, noise.get(what, 0.0), floors.get(what, 0.0), values=values)
    for name, want in baseline.grads.items():
        got = strided.grads.get(name)
        if (got is None) != (want is None):
            fail(f"grad[{name!r}] is {'None' if got is None else 'a tensor'} with non-contiguous layouts, but {'None' if want is None else 'a tensor'} with contiguous ones", f"layouts: {layouts}")
        if got is not None and want is not None:
            what = label = f"grad[{name!r}]"
            if tied is not None and got.ndim > tied:
                # Tied elements swap their gradients: compare each line along the tied dim as a multiset.
                label += f" (sorted along dim {tied}: the index output broke ties in another order)"
                got, want = got.sort(dim=tied).values, want.sort(dim=tied).values
            _compare(got, want, label, layouts, f"{fn_name}.backward", grad_scale, noise.get(what, 0.0), floors.get(what, 0.0), values=values)


def _differs(got: Any, want: Any) -> bool:
    return isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and not torch.equal(got.cpu(), want.cpu())


def _with_an_input_moved(case: Case) -> Case:
    """``case`` as drawn when a layout moved some input's memory; else with its first floating
    input of one dim or more at a storage offset, the layout every such tensor can take (drawn
    layouts come back plain on small sizes, and an example in which every input is plain checks
    only the grad_output's layout, often nothing)."""
    args = case.args()
    if any(_strided(arg) for arg in args):
        return case
    for position, (recipe, arg) in enumerate(zip(case.recipes, args)):
        if isinstance(recipe, FloatingRecipe) and isinstance(arg, torch.Tensor) and arg.ndim >= 1 and arg.numel():
            recipes = list(case.recipes)
            recipes[position] = replace(recipe, layout="offset")
            return replace(case, recipes=tuple(recipes))
    return case


def _strided(value: Any) -> bool:
    """True for a tensor whose memory differs from the plain layout (strides or offset)."""
    return isinstance(value, torch.Tensor) and (not value.is_contiguous() or value.storage_offset() != 0)


def _compare(
    got: Any,
    want: Any,
    what: str,
    layouts: str,
    where: str,
    scale: float,
    noise: float = 0.0,
    floor: float = 0.0,
    *,
    values: bool = True,
) -> None:
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        return
    if not values:
        # Declared random: torch.rand_like on a transposed input fills it in memory order, so the
        # same seed gives other logical values; only the metadata must agree.
        if (tuple(got.shape), got.dtype, got.device) != (tuple(want.shape), want.dtype, want.device):
            fail(
                f"{what} is {tuple(got.shape)} {got.dtype} {got.device} with non-contiguous layouts, but "
                f"{tuple(want.shape)} {want.dtype} {want.device} with contiguous ones [{where}]",
                f"layouts: {layouts}",
            )
        return
    if exactly_equal(got, want):
        return
    rtol, atol = layout_tolerance(want, scale, noise)
    atol += floor
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as error:
        fail(
            f"{what} with non-contiguous layouts != {what} with contiguous layouts and the same values [{where}]",
            f"layouts: {layouts}",
            str(error).strip(),
            "Usual causes: the kernel reads memory as if it were contiguous (data_ptr/storage indexing, "
            "as_strided with contiguous strides): call .contiguous() on its inputs and on grad_output; or "
            "forward branches on a copy: inside forward x.contiguous() of a non-contiguous x is a new tensor "
            "with requires_grad=False (grad mode is off there), so work keyed on x.requires_grad is skipped, "
            "and what is written into the copy never reaches x.",
        )


@contract("layouts", case=CaseOptions(layouts=LAYOUTS_DRAWN, grad_output_kinds=GRAD_OUTPUT_KINDS, constant_rows=True), compares_values=True)
def test_layouts(conformance_target: Target) -> None:
    conformance_target.run(check_layouts)
