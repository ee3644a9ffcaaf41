"""Values drawn for finite differences keep their distance (from each other and from declared
kinks), and no generated tensor depends on torch's global defaults."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

from conformance import Scalar, Tensor
from conformance.engine.finite_differences import FD_EPS, FD_SPACING
from conformance.engine.global_state import preserved_global_state
from conformance.engine.repro import to_source
from conformance.spec import _build_spec
from reference_ops.elementwise import SoftThreshold
from reference_ops.reductions import Max
from strategies.cases import Case, apply_grad_layout, apply_layout, cases
from strategies.recipes import ScalarRecipe, TensorRecipe
from strategies.values import (
    DOMAINS,
    GRAD_OUTPUT_KINDS,
    MASK_KINDS,
    additive_mask_from_seed,
    grad_output_from_seed,
    index_from_seed,
    mask_from_seed,
    spread,
    tensor_from_seed,
)

FAST = settings(max_examples=40, database=None, deadline=None)
DOMAIN_CHOICES = (*DOMAINS, (0.5, 2.0), (-1.0, 1.0))


def _gaps_ok(values: torch.Tensor, spacing: float, kinks: tuple[float, ...]) -> None:
    flat = values.detach().reshape(-1).double()
    if flat.numel() > 1:
        assert float(flat.sort().values.diff().min()) >= spacing * (1 - 1e-9)
    for kink in kinks:
        assert float((flat - kink).abs().min()) >= spacing * (1 - 1e-9), kink


@FAST
@given(
    shape=st.sampled_from([(7,), (3, 5), (2, 4, 6), (512,)]),
    seed=st.integers(0, 2**31 - 1),
    domain=st.sampled_from(DOMAIN_CHOICES),
    scale=st.sampled_from([1.0, 0.5, 2.0, 1e-2, 10.0]),
    kinks=st.sampled_from([(), (0.5,), (-0.5, 0.5), (0.0, 1.0)]),
)
def test_spaced_values_keep_apart_from_each_other_and_the_kinks_and_stay_in_the_domain(
    shape: tuple[int, ...], seed: int, domain: Any, scale: float, kinks: tuple[float, ...]
) -> None:
    plain = tensor_from_seed(shape, torch.float64, seed=seed, domain=domain, scale=scale)
    spaced = tensor_from_seed(shape, torch.float64, seed=seed, domain=domain, scale=scale, spacing=FD_SPACING, kinks=kinks)
    _gaps_ok(spaced, FD_SPACING, kinks)
    # The order of the elements is kept (a tie keeps the order of the flat index).
    assert torch.equal(plain.reshape(-1).argsort(stable=True), spaced.reshape(-1).argsort(stable=True))
    if domain == "positive":
        assert float(spaced.min()) >= 0.25 * scale
    elif domain == "nonzero":
        assert float(spaced.abs().min()) >= 0.25 * scale
    elif domain == "unit" or isinstance(domain, tuple):
        low, high = (0.0, 1.0) if domain == "unit" else domain
        assert low < float(spaced.min()) and float(spaced.max()) < high
    # Same arguments, same tensor.
    assert torch.equal(spaced, tensor_from_seed(shape, torch.float64, seed=seed, domain=domain, scale=scale, spacing=FD_SPACING, kinks=kinks))


def test_spread_moves_only_what_is_too_close() -> None:
    values = torch.tensor([0.5, 0.5 + 3e-7, -2.0, 1.0 - 1e-8, 3.0], dtype=torch.float64)
    spaced = spread(values, 1e-4, kinks=(1.0,))
    assert spaced[2] == -2.0 and spaced[4] == 3.0  # already far from everything: untouched
    assert float(spaced[1] - spaced[0]) >= 1e-4 * (1 - 1e-9)  # the near-tie is pulled apart
    assert float(1.0 - spaced[3]) >= 1e-4 * (1 - 1e-9)  # and the near-kink value pushed off the kink, on its side
    assert torch.equal(spread(spaced, 1e-4, kinks=(1.0,)), spaced)  # nothing left to move


def test_spread_in_a_segment_too_short_spaces_evenly() -> None:
    values = torch.linspace(0.4, 0.6, 9, dtype=torch.float64)
    spaced = spread(values, 0.1, bounds=(0.45, 0.55, ()))
    assert float(spaced.min()) >= 0.45 and float(spaced.max()) <= 0.55
    assert float(spaced.diff().min()) > 0  # as far apart as the segment allows, order kept


def test_near_tie_and_near_kink_fail_plain_gradcheck_and_pass_when_spread() -> None:
    """Why spacing exists: a correct max (a near-tie in a row) and soft-threshold (a value at the
    threshold) fail torch.autograd.gradcheck on values closer than its step; the same values
    spread by the contracts' FD_SPACING pass at the same tolerances."""
    near_tie = torch.tensor([[0.3, 0.7, 0.7 + 4e-7, -1.0]], dtype=torch.float64)
    near_kink = torch.tensor([0.5 + 2e-7, -1.3, 0.9, -0.5 - 5e-7], dtype=torch.float64)
    for apply, values, kinks in (
        (Max.apply, near_tie, ()),
        (lambda x: SoftThreshold.apply(x, 0.5), near_kink, (0.5, -0.5)),
    ):
        with pytest.raises(GradcheckError):
            torch.autograd.gradcheck(apply, (values.clone().requires_grad_(),), eps=FD_EPS, atol=1e-5, rtol=1e-3)
        spaced = spread(values, FD_SPACING, kinks=kinks)
        assert torch.autograd.gradcheck(apply, (spaced.requires_grad_(),), eps=FD_EPS, atol=1e-5, rtol=1e-3)


class _Clip(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clip: float) -> torch.Tensor:
        return x.clamp(-clip, clip)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output, None


CLIP_SPEC = _build_spec(
    _Clip, spec_name="clip_probe", reference=lambda x, clip: x.clamp(-clip, clip), dtypes=(torch.float64,),
    inputs=[Tensor("x", "*batch n", kinks=("clip", "-clip", 0.0)), Scalar("clip", st.sampled_from([0.5, 1.0]))],
    devices=("cpu",), double_backward=True, surrogate=None, mutates=(), nondeterministic=False, tolerances={},
    origin=__name__,
)


@FAST
@given(data=st.data())
def test_cases_drawn_with_spacing_resolve_scalar_kinks_and_rebuild_from_source(data: st.DataObject) -> None:
    case = data.draw(cases(CLIP_SPEC, spacing=FD_SPACING, constant_rows=True, value_patterns=("ties", "random")))
    (x, clip) = case.recipes
    assert x.spacing == FD_SPACING and not x.constant_rows and x.pattern == "random"
    assert x.kinks == (clip.value, -clip.value, 0.0)
    _gaps_ok(case.args()[0], FD_SPACING, x.kinks)
    # The repro script's literal Case rebuilds the same tensors.
    rebuilt = eval(to_source(case), {"torch": torch, "Case": Case, "TensorRecipe": TensorRecipe, "ScalarRecipe": ScalarRecipe, "spec": CLIP_SPEC})
    assert torch.equal(rebuilt.args()[0], case.args()[0])
    snippet: dict[str, Any] = {}
    exec(case.repro().split("\nout = ")[0], snippet)
    assert torch.equal(snippet["x"].detach(), case.args()[0].detach())


def test_no_element_lies_on_a_declared_kink_in_the_dtype_it_is_built_in() -> None:
    """bfloat16's grid puts a drawn 1.99 on clamp's bound 2.0, where no gradient is right or wrong
    (a new user's correct clamp failed reference there): such an element moves one rounding step
    off the kink, to the side of its float64 value; every other element is as drawn."""
    plain = tensor_from_seed((64,), torch.bfloat16, seed=0, scale=2.0)
    kinked = tensor_from_seed((64,), torch.bfloat16, seed=0, scale=2.0, kinks=(2.0,))
    exact = tensor_from_seed((64,), torch.float64, seed=0, scale=2.0)
    on = plain == 2.0
    assert on.any()  # seed 0 rounds one element onto the kink: the case this test is about
    assert not (kinked == 2.0).any()
    assert torch.equal(kinked[~on], plain[~on])
    steps = torch.where(exact[on] < 2.0, torch.tensor(1.9921875, dtype=torch.float64), torch.tensor(2.015625, dtype=torch.float64))
    assert torch.equal(kinked[on].double(), steps)
    # Off 0 by the smallest normal number, not a subnormal (which hardware may flush back to 0).
    zeros = tensor_from_seed((6,), torch.float16, seed=0, pattern="ties", scale=0.1, kinks=(0.0,))
    assert not (zeros == 0).any() and bool((zeros.abs() >= torch.finfo(torch.float16).tiny).all()), zeros


@FAST
@given(data=st.data())
def test_cases_carry_the_declared_kinks_without_spacing_too(data: st.DataObject) -> None:
    case = data.draw(cases(CLIP_SPEC))
    (x, clip) = case.recipes
    assert x.spacing == 0.0 and x.kinks == (clip.value, -clip.value, 0.0)
    assert f"kinks={x.kinks!r}" in case.repro()  # the repro rebuilds the element moved off a kink, not the one on it


def _every_generated_tensor() -> list[torch.Tensor]:
    built = [tensor_from_seed((3, 4), torch.float32, seed=7, domain=d, pattern=p) for d in DOMAINS for p in ("random", "ties")]
    built.append(tensor_from_seed((3, 4), torch.float64, seed=7, pattern="near_zero"))
    built.append(tensor_from_seed((9,), torch.float64, seed=7, domain="nonzero", spacing=FD_SPACING, kinks=(0.5,)))
    built += [mask_from_seed((2, 3, 4), seed=7, kind=k, density=0.5) for k in MASK_KINDS]
    built += [additive_mask_from_seed((3, 4), torch.float32, seed=7, kind=k) for k in MASK_KINDS]
    built.append(index_from_seed((5,), seed=7, high=4))
    built += [grad_output_from_seed((3, 4), torch.float32, seed=7, kind=k) for k in GRAD_OUTPUT_KINDS]
    base = tensor_from_seed((2, 3, 4, 5), torch.float32, seed=7)
    built += [apply_layout(base, layout) for layout in ("transposed", "sliced", "offset", "channels_last", "permuted", "swapped")]
    built += [apply_grad_layout(base, base, layout) for layout in ("like_output", "swapped", "narrow")]
    return built


@pytest.mark.parametrize(
    "change",
    [
        lambda: torch.set_default_dtype(torch.float64),
        lambda: torch.set_default_dtype(torch.float16),
        lambda: torch.set_default_device("meta"),
        lambda: torch.manual_seed(1234),
    ],
    ids=["default_dtype_float64", "default_dtype_float16", "default_device_meta", "global_rng"],
)
def test_generated_tensors_do_not_depend_on_torch_defaults(change: Any) -> None:
    """Every builder names its dtype and device: a spec module that changes torch's defaults
    cannot change the examples (or what a repro script rebuilds from the same seed)."""
    expected = _every_generated_tensor()
    with preserved_global_state():
        change()
        got = _every_generated_tensor()
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected)):
        assert (a.dtype, a.device, a.shape, a.stride()) == (b.dtype, b.device, b.shape, b.stride()), index
        assert torch.equal(a, b), index
