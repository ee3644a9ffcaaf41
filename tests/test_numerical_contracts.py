"""The reference and stability contracts catch the numerically buggy Functions in
tests/zoo/numeric_bugs.py, pass their correct counterparts and the bundled reference ops, and
the tolerance policy's pieces (rounding-step floor, representable range, resampled baseline)
behave as documented in conformance/engine/numerics.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import conformance
from conformance import SpecError, Tensor, register
from conformance.engine.numerics import (
    RESAMPLE_PAIRS,
    Comparison,
    cheap_budget_first,
    checked_positions,
    compare_budget,
    compare_finiteness,
    compare_plain,
    layout_tolerance,
    multiplier,
    neighbours,
    plain_leaves,
    tie_dim,
    ulp,
)
from conformance.engine.report import ContractFailure, fail
from conformance.engine.terms import TermMagnitudes
from conformance.engine.verdict import Outcome
from conformance.spec import MAX_TOLERANCE, registered
from strategies.values import tensor_from_seed
from tests.conftest import ZOO
from tests.zoo_runs import NUMERIC


@pytest.fixture
def numeric_bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("numeric_bugs")


# --------------------------------------------------------------------------- bugs are caught


def test_a_wrong_python_number_beside_right_tensors_fails_reference(zoo_run) -> None:  # type: ignore[no-untyped-def]
    """A count returned as a Python int is compared with the reference's (found by a trial: it was
    never compared, and a wrong count passed every contract); the correct twin passes."""
    run = zoo_run("non_tensor_outputs")
    text = run.failed("reference", "relu_firing_per_row")
    assert "output[1]=" in text and "but should be" in text and "a non-tensor output: equal to the reference's" in text, text
    for contract in ("reference", "gradcheck", "layouts", "determinism"):
        run.passed(contract, "relu_firing")
    run.passed("gradcheck", "relu_firing_per_row")


def test_non_tensor_outputs_are_compared_by_the_plain_rule() -> None:
    """Equal to the truth or to the baseline (the reference in the tested dtype); a float within
    k times the baseline's error plus two rounding steps; tuples item by item; other objects not at all."""
    def compare(got: object, want: object, base: object, dtype: torch.dtype = torch.float32) -> object:
        return compare_plain(got, want, base, dtype, k=2, what="output[1]", where="F.forward")

    assert compare(3, 3, 3) is None and compare(4, 3, 4) is None  # the baseline's count moved with rounding
    assert "output[1]=12345, but should be 3" in compare(12345, 3, 3).summary  # type: ignore[union-attr]
    assert compare(1.0000001, 1.0, 1.0) is None and compare(1.01, 1.0, 1.0) is not None
    assert compare(1.05, 1.0, 1.1, torch.float16) is None  # within k x the reference's own float16 error
    assert compare(0.4000000059604645, 0.4, 0.4, torch.float64) is None  # float32 precision: float64's assert_close rule
    assert compare(0.4001, 0.4, 0.4, torch.float64) is not None
    assert "output[1][1]=5" in compare((1, 5), (1, 2), (1, 2)).summary  # type: ignore[union-attr]
    assert compare(float("nan"), float("nan"), 0.0) is None and compare(False, True, True) is not None
    assert compare(torch.tensor(3), 3, 3) is not None  # a tensor where the reference returns an int
    assert compare(object(), object(), None) is None  # an opaque object: not a value to compare
    assert compare(3, None, None) is None  # the reference's None: that output is not compared
    assert "output[1]=a ndarray, but should be 3" in compare(np.ones(2), 3, 3).summary  # type: ignore[union-attr]  # a failure, not a crash
    assert compare(10**400, 1.5, 1.5) is not None  # an int too large for a float: a failure, not an OverflowError
    assert compare_plain(1e-9, 0.0, 0.0, torch.float32, k=2, what="o", where="w", floor_at=1.0) is None  # the call's scale
    assert plain_leaves((1, torch.ones(1))) and not plain_leaves((torch.ones(1), None))  # nested tensors alone: nothing compared


def test_naive_logsumexp_fails_stability_at_large_logits(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    text = numeric_bugs.failed("stability", "naive_logsumexp")
    assert "[stability] NaiveLogSumExp" in text
    assert "but should be finite (float64 reference:" in text and "extreme inputs" in text


def test_naive_softmax_fails_stability_at_large_logits(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    text = numeric_bugs.failed("stability", "naive_softmax")
    assert "=nan, but should be finite" in text and "NaiveSoftmax.forward" in text


def test_float16_backward_reduction_fails_reference_in_float32(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    text = numeric_bugs.failed("reference", "softmax_half_reduction")
    assert "max|grad['x'] - reference|=" in text and "float32" in text
    assert "Mismatched elements:" in text and "Allowed:" in text and "Baseline error" in text
    # Finite, and as imprecise at ordinary magnitudes as at extreme ones: reference's defect alone.
    stability = numeric_bugs.verdict("stability", "softmax_half_reduction")
    assert stability.outcome == "skipped" and "blocked by reference: " in stability.text, stability.text


def test_layernorm_forgetting_eps_in_backward_fails_stability(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    # Constant rows (zero variance) are checked in every example: rsqrt(0) = inf, inf * 0 = NaN.
    text = numeric_bugs.failed("stability", "layer_norm_no_eps_backward")
    assert "grad['x']" in text and "but should be finite" in text
    assert "LayerNormNoEpsBackward.backward" in text


def test_a_backward_dividing_by_the_input_fails_stability_at_a_row_of_zeros(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    # Random values are never exactly 0: the degenerate family's rows of zeros meet the 0/0 (a trial's
    # cumprod backward went uncaught on every seed before).
    text = numeric_bugs.failed("stability", "prod_dividing_by_input")
    assert "grad['x']" in text and "=nan, but should be finite" in text, text
    assert "exactly 0" in text and "ProdDividingByInput.backward" in text, text
    numeric_bugs.passed("reference", "prod_dividing_by_input")


def test_masked_attention_nan_rows_fails_stability(numeric_bugs) -> None:  # type: ignore[no-untyped-def]
    # Every example also checks the degenerate family, whose masks fully mask a row.
    text = numeric_bugs.failed("stability", "masked_attention_nan_rows")
    assert "output[0]" in text and "=nan, but should be finite (float64 reference: 0)" in text


def test_a_half_precision_accumulator_that_overflows_to_zeros_fails_stability(zoo_run) -> None:  # type: ignore[no-untyped-def]
    # Finite but wrong: rsqrt(inf) = 0 zeroes the row. Ordinary magnitudes never overflow.
    run = zoo_run("half_accumulation")
    text = run.failed("stability", "rms_norm_half_accumulator")
    assert "max|output[0] - reference|=" in text or "max|grad[" in text, text
    assert "float16, extreme inputs" in text and "Baseline error" in text
    run.passed("reference", "rms_norm_half_accumulator")
    for contract in ("stability", "reference"):
        run.passed(contract, "rms_norm_float32_accumulator")


def test_a_half_precision_accumulator_over_many_rows_fails_reference(zoo_run) -> None:  # type: ignore[no-untyped-def]
    # The corner with many rows draws constant grad_outputs: their sum's rounding adds up in a
    # half accumulator. The float32 twin adds the rows one after the other too, and passes.
    run = zoo_run("half_accumulation")
    text = run.failed("reference", "bias_add_half_accumulator")
    assert "max|grad['bias'] - reference|=" in text and "for float32 sums of up to" in text, text
    run.passed("stability", "bias_add_half_accumulator")
    for contract in ("stability", "reference"):
        run.passed(contract, "bias_add_float32_accumulator")


def test_a_half_precision_running_sum_along_a_named_dim_fails_reference(zoo_run) -> None:  # type: ignore[no-untyped-def]
    # The time dim l takes a corner of its own: 129 steps in bfloat16 with constant grad_outputs.
    run = zoo_run("half_accumulation")
    text = run.failed("reference", "channel_bias_half_accumulator")
    assert "max|grad['bias'] - reference|=" in text and "bfloat16" in text, text
    for contract in ("stability", "reference"):
        run.passed(contract, "channel_bias_float32_accumulator")


def test_an_output_of_another_dtype_than_the_references_fails_reference(zoo_run) -> None:  # type: ignore[no-untyped-def]
    # Right values in float32 for float16 inputs, where the reference (torch.logsumexp) gives float16.
    run = zoo_run("half_accumulation")
    text = run.failed("reference", "logsumexp_float32_result")
    assert "output[0].dtype=torch.float32, but should be torch.float16 like the reference's" in text, text
    for contract in ("stability", "reference"):
        run.passed(contract, "logsumexp_input_dtype_result")


# --------------------------------------------------------------------------- correct ones pass


@pytest.mark.parametrize(
    "name", ["stable_logsumexp", "stable_softmax", "layer_norm_ok", "masked_attention_ok", "double_minus_x", "prod_of_others",
             # finite where its formula reference is 0/0 (a row of zeros): no defect
             "guarded_unit_normalize",
             # NaN at its kink x == t (t a Scalar, 0.0): the zero rows stay off a kink named by a Scalar
             "distance_to_shift",
             # |x| scaled by the row's largest element: finite up to the dtype's largest magnitudes
             "scaled_row_norm"]
)
def test_correct_counterparts_pass(numeric_bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    numeric_bugs.passed("reference", name)
    if name != "double_minus_x":  # 3x overflows before 2x does: not a stability claim
        numeric_bugs.passed("stability", name)


def test_reference_ops_pass_numerical_contracts(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run("reference_ops", contracts=NUMERIC, max_examples=2)
    for (contract, name, device), verdict in run.verdicts.items():
        if device == "cpu":
            assert verdict.outcome == "passed", f"{contract}[{name}-{device}]:\n{verdict.text}"


# --------------------------------------------------------------------------- the policy's pieces


def test_floor_lets_an_exact_reference_pass() -> None:
    """2x is exact in float16 (baseline error 0); 3x - x is not. Without the floor, a pure
    multiplier would demand bit-exactness (flash-attention issue #1231)."""
    x = tensor_from_seed((256,), torch.float16, seed=3, scale=10.0)
    truth, baseline, impl = x.double() * 2, x * 2, x * 3 - x
    assert float((baseline.double() - truth).abs().max()) == 0.0
    assert float((impl.double() - truth).abs().max()) > 0.0
    assert compare_budget(impl, truth, baseline, torch.float16, k=2, what="output[0]", where="test") is None
    wrong = impl + ulp(float(truth.abs().max()), torch.float16) * 3  # 3 rounding steps everywhere
    assert compare_budget(wrong, truth, baseline, torch.float16, k=2, what="output[0]", where="test") is not None


def _term_bound(function) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """The largest term bound of ``function()``'s result and the longest chain of additions."""
    mode = TermMagnitudes()
    with mode:
        result = function()
    return float(mode.of(result).max()), mode.accumulation


def test_term_bounds_follow_masks_and_losses() -> None:
    """A loss made of logits of size ~2 is computed from terms that size, however its reference is
    written: F.cross_entropy (torch's nll_loss decomposition: torch.where(mask, x, 0)), a bool mask
    multiplied in. Both once started afresh from |loss| (0.4, a trial's false failure)."""
    logits = torch.tensor([[2.0763, -0.7480], [0.3, 1.2]], dtype=torch.float64)
    target = torch.tensor([0, 1])
    keep = torch.tensor([True, False])
    log_probs = lambda: torch.log_softmax(logits, -1)  # noqa: E731
    gathered, _ = _term_bound(lambda: (-log_probs().gather(1, target[:, None])).sum())
    assert gathered > 2.0
    for written in (
        lambda: torch.nn.functional.cross_entropy(logits, target, reduction="sum"),
        lambda: torch.nn.functional.cross_entropy(logits, torch.tensor([0, -100])),
        lambda: (log_probs()[:, 0] * keep).sum(),
        lambda: torch.where(keep, log_probs()[:, 0], 0.0).sum(),
    ):
        assert _term_bound(written)[0] > 2.0


def test_the_longest_chain_of_additions_is_counted() -> None:
    """A sum of n terms may take n - 1 additions in sequence, a product k - 1 over its inner dim;
    chained, they add up. Elementwise ops add none."""
    x = torch.ones(6, 5, dtype=torch.float64)
    assert _term_bound(lambda: x * 2 + 1)[1] == 0
    assert _term_bound(lambda: x.sum(0))[1] == 5
    assert _term_bound(lambda: x.sum())[1] == 29
    assert _term_bound(lambda: x @ torch.ones(5, 3, dtype=torch.float64))[1] == 4
    assert _term_bound(lambda: (x @ torch.ones(5, 3, dtype=torch.float64)).sum(0))[1] == 4 + 5


def test_any_float32_summation_order_is_within_budget_a_half_accumulator_is_not() -> None:
    """Constant terms do not cancel: summed one after the other, float32 is off by up to (n - 1)
    float32 steps of the total (beyond plain PyTorch's pairwise sum and the floor: this failed a
    correct kernel before), a float16 accumulator by many float16 steps."""
    rows = torch.full((1000, 1), 0.1, dtype=torch.float64)
    truth = rows.sum(0)
    sequential = torch.zeros(1, dtype=torch.float32)
    for row in rows.to(torch.float32):
        sequential += row
    baseline = rows.to(torch.float32).sum(0)
    budget = dict(terms=truth.abs(), k=3, what="grad['bias']", where="test")
    assert compare_budget(sequential, truth, baseline, torch.float32, **budget) is not None  # type: ignore[arg-type]
    assert compare_budget(sequential, truth, baseline, torch.float32, accumulation=999, **budget) is None  # type: ignore[arg-type]
    half = torch.zeros(1, dtype=torch.float16)
    for row in rows.to(torch.float16):
        half += row
    found = compare_budget(half, truth, rows.to(torch.float16).sum(0), torch.float16, accumulation=999, **budget)  # type: ignore[arg-type]
    assert found is not None and "for float32 sums of up to 1000 terms in any order" in found.summary, found


class _TinyScaleZeroGrad(torch.autograd.Function):
    """y = 1e-5 x with a zero gradient: every value of the call is below float16's smallest normal
    number (6.1e-5), where an allowance of that size once let it pass every contract."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x * 1e-5

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return torch.zeros_like(g)


def test_a_wrong_gradient_of_values_below_float16s_smallest_normal_number_fails(clean_registry) -> None:  # type: ignore[no-untyped-def]
    result = conformance.check(_TinyScaleZeroGrad, inputs=[Tensor("x", "*batch n")], reference=lambda x: x * 1e-5,
                               dtypes=(torch.float16,), contracts=["reference"], device="cpu", raise_on_failure=False)
    assert result.outcome("reference") == "failed", str(result)


def test_nan_where_the_truth_is_finite_is_stabilitys_and_blocks_reference_and_gradcheck(conformance_run) -> None:  # type: ignore[no-untyped-def]
    """One defect, one failure: a fully masked row's NaN (reference met it as output != reference)
    and a zero-variance row's NaN gradient (gradcheck met it as a NaN Jacobian entry) failed
    reference or gradcheck beside stability."""
    names = ("masked_attention_nan_rows", "layer_norm_no_eps_backward")
    run = conformance_run(ZOO / "numeric_bugs.py", "-k", " or ".join(names), "--profile=ci", contracts=("reference", "stability", "gradcheck"), max_examples=None)
    blocked = 0
    for name in names:
        row = {c: v.recorded for (c, fn, _), v in run.verdicts.items() if fn == name}
        assert [c for c, r in row.items() if r.outcome is Outcome.FAILED] == ["stability"], row
        for contract, recorded in row.items():
            if recorded.outcome is Outcome.BLOCKED:
                blocked += 1
                assert recorded.owner == "stability" and "but should be finite" in recorded.reason, (contract, recorded)
    assert blocked >= 2, "reference and gradcheck met the NaN before (seed 0, profile ci)"


def test_ulp_is_the_spacing_of_the_dtype() -> None:
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for value in (1.0, 3.0, 1000.0, 1e-3):
            one = torch.tensor(value, dtype=dtype)
            assert ulp(float(one), dtype) == float(torch.nextafter(one, torch.tensor(math.inf, dtype=dtype)) - one)
    assert ulp(0.0, torch.float16) == float(torch.finfo(torch.float16).eps * torch.finfo(torch.float16).tiny)


def test_values_beyond_the_dtype_range_are_not_checked() -> None:
    truth = torch.tensor([90000.0, 1.0], dtype=torch.float64)  # 300**2 does not fit float16
    impl = torch.tensor([math.inf, 1.0], dtype=torch.float16)
    assert checked_positions(truth, torch.float16).tolist() == [False, True]
    assert compare_finiteness(impl, truth, torch.float16, what="output[0]", where="test") is None
    nan = torch.tensor([math.inf, math.nan], dtype=torch.float16)
    found = compare_finiteness(nan, truth, torch.float16, what="output[0]", where="test")
    assert found is not None and "output[0][1]=nan, but should be finite (float64 reference: 1)" in found.summary
    # The details list the position that differs, not the unchecked overflow at [0].
    assert "1 / 2 (50.0%)" in found.details and "at (1,): actual nan" in found.details and "(0,)" not in found.details


def test_where_plain_pytorch_overflows_too_the_dtype_is_at_fault() -> None:
    truth = torch.tensor([2e37, 1.0], dtype=torch.float64)  # representable, but x*w overflowed
    impl = torch.tensor([math.nan, 1.0], dtype=torch.bfloat16)
    baseline = torch.tensor([math.nan, 1.0], dtype=torch.bfloat16)
    assert compare_finiteness(impl, truth, torch.bfloat16, what="o", where="t") is not None
    assert compare_finiteness(impl, truth, torch.bfloat16, baseline=baseline, what="o", where="t") is None


def test_nonfinite_truth_must_be_matched_in_low_precision() -> None:
    truth = torch.tensor([-math.inf, 1.0], dtype=torch.float64)
    impl = torch.tensor([-65504.0, 1.0], dtype=torch.float16)
    found = compare_finiteness(impl, truth, torch.float16, what="grad['x']", where="t")
    assert found is not None and "=-65504.0, but should be -inf like the float64 reference" in found.summary


def test_another_non_finite_value_is_excused_only_where_plain_pytorch_gives_one_too() -> None:
    """Past float64's range the truth's own inf or NaN is an artifact as often as a definition, and
    float32's own op gives NaN where it has -inf (cumprod of 1e30s: a new user's correct one
    failed on the kind alone). Where plain PyTorch agrees with the truth, another value still
    fails: NaN for the -inf of a fully masked row's log-sum-exp."""
    truth = torch.tensor([-math.inf, math.inf, math.nan, 1.0], dtype=torch.float64)
    impl = torch.tensor([math.nan, -math.inf, math.inf, 1.0], dtype=torch.float32)
    native = torch.tensor([math.nan, math.nan, math.inf, 1.0], dtype=torch.float32)
    assert compare_finiteness(impl, truth, torch.float32, baseline=native, what="grad['x']", where="t") is None
    found = compare_finiteness(impl, truth, torch.float32, what="grad['x']", where="t")
    assert found is not None and "grad['x'][0]=nan, but should be -inf like the float64 reference" in found.summary
    agreeing = torch.tensor([-math.inf, math.inf, math.nan, 1.0], dtype=torch.float32)
    found = compare_finiteness(impl, truth, torch.float32, baseline=agreeing, what="o", where="t")
    assert found is not None and "3 of 4 non-finite positions differ" in found.summary
    finite = torch.tensor([math.nan, 3.0e38, math.inf, 1.0], dtype=torch.float32)
    found = compare_finiteness(finite, truth, torch.float32, baseline=native, what="o", where="t")
    assert found is not None and "o[1]=3" in found.summary


def test_resampled_baseline_raises_the_budget() -> None:
    truth = torch.tensor([1.0], dtype=torch.float64)
    impl = torch.tensor([1.0 + 2**-20], dtype=torch.float32)
    baseline = torch.tensor([1.0], dtype=torch.float32)
    assert compare_budget(impl, truth, baseline, torch.float32, k=3, what="o", where="t") is not None
    other = (torch.tensor([1.0 + 2**-21], dtype=torch.float32), torch.tensor([1.0], dtype=torch.float64))
    assert compare_budget(impl, truth, baseline, torch.float32, resampled=[other], k=3, what="o", where="t") is None


def test_neighbours_move_each_element_at_most_one_step_and_mirror_each_other() -> None:
    x = tensor_from_seed((100,), torch.bfloat16, seed=1)
    moved, mirrored = neighbours(x, torch.Generator().manual_seed(0))
    spacing = torch.tensor([ulp(abs(float(v)), torch.bfloat16) for v in x]).double()
    for other in (moved, mirrored):
        steps = (other.double() - x.double()).abs()
        assert bool((steps <= spacing).all()) and bool((steps > 0).any())
    up, down = moved.double() > x.double(), moved.double() < x.double()
    assert bool((mirrored.double()[up] < x.double()[up]).all()) and bool((mirrored.double()[down] > x.double()[down]).all())
    assert torch.equal(mirrored[moved == x], x[moved == x])


def test_neighbours_keep_infinities_and_step_on_a_coarser_grid() -> None:
    x = torch.tensor([0.0, -math.inf, math.inf, 1.0, 70000.0] * 8, dtype=torch.float32)
    for step_dtype in (None, torch.bfloat16, torch.float16):
        for other in neighbours(x, torch.Generator().manual_seed(1), step_dtype):
            assert not bool(other.isnan().any()), (step_dtype, other)
            assert torch.equal(other[x.isinf()], x[x.isinf()]), step_dtype
    moved, _ = neighbours(x, torch.Generator().manual_seed(1), torch.bfloat16)
    ones = x == 1.0
    assert set((moved[ones] - 1.0).abs().tolist()) <= {0.0, 2.0**-8, 2.0**-7}  # bfloat16's steps at 1
    assert torch.equal(neighbours(x, torch.Generator().manual_seed(1), torch.float16)[0][x == 70000.0], x[x == 70000.0])


def test_a_truth_on_a_kink_is_measured_from_both_sides() -> None:
    """Sparsemax in bfloat16 lands exactly on a support boundary (z = [8.8125, 7.8125]: the second
    element is in the support on one side only). The gradient there from autograd is neither
    one-sided limit; a correct backward that takes one limit is within the sensitivity a mirrored
    pair of neighbours measures, and would not be with one side only."""
    z = torch.tensor([8.8125, 7.8125, -2.0], dtype=torch.bfloat16)
    go = torch.tensor([-1.03125, 1.9140625, 0.5], dtype=torch.bfloat16)

    def truth(zs: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
        z64 = zs.double().requires_grad_()
        ordered = torch.sort(z64, descending=True).values
        cumulative = ordered.cumsum(0)
        size = int((1 + torch.arange(1, 4) * ordered > cumulative).sum())
        tau = (cumulative[size - 1] - 1) / size
        torch.autograd.backward(torch.clamp(z64 - tau, min=0), gs.double())
        assert z64.grad is not None
        return z64.grad

    at_kink = truth(z, go)
    assert at_kink.tolist() == [-1.9140625, 1.9140625, 0.0]  # clamp passes the gradient at its bound
    one_limit = torch.tensor([0.0, 0.0, 0.0], dtype=torch.bfloat16)  # support {0}: the gradient is 0
    generator = torch.Generator().manual_seed(3)
    pairs = [(neighbours(z, generator), neighbours(go, generator)) for _ in range(RESAMPLE_PAIRS)]
    resampled = [(truth(zs[side], gs[side]).to(torch.bfloat16), truth(zs[side], gs[side])) for zs, gs in pairs for side in (0, 1)]
    assert compare_budget(one_limit, at_kink, at_kink.to(torch.bfloat16), torch.bfloat16, resampled=resampled, k=3,
                          what="g", where="t") is None
    one_side = [pair for pair in resampled if float(pair[1][0]) != 0.0]
    assert one_side and compare_budget(one_limit, at_kink, at_kink.to(torch.bfloat16), torch.bfloat16,
                                       resampled=one_side, k=3, what="g", where="t") is not None


def test_tolerance_override_and_cap(clean_registry) -> None:  # type: ignore[no-untyped-def]
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x * 2

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g * 2

    register(
        Twice, name="numerics_twice_override", inputs=[Tensor("x", "n")], reference=lambda x: x * 2,
        dtypes=(torch.float32, torch.float16), tolerances={torch.float16: {"grad": 5}},
    )
    spec = next(s for s in registered() if s.name == "numerics_twice_override")
    assert multiplier(spec, torch.float16, "grad") == 5
    assert multiplier(spec, torch.float16, "output") == 2
    assert multiplier(spec, torch.float32, "grad") == 3
    with pytest.raises(SpecError, match="tolerances"):
        register(
            Twice, name="numerics_twice_too_loose", inputs=[Tensor("x", "n")], reference=lambda x: x * 2,
            dtypes=(torch.float16,), tolerances={torch.float16: {"grad": MAX_TOLERANCE * 2}},
        )


# --------------------------------------------------------------------------- the cheap budget first


def test_the_full_budget_is_measured_only_for_a_value_the_cheap_one_rejects() -> None:
    calls: list[bool] = []

    def passing(full: bool) -> str:
        calls.append(full)
        return "checked"

    assert cheap_budget_first(passing) == "checked" and calls == [False]
    calls.clear()

    def raising(full: bool) -> None:
        calls.append(full)
        fail(f"outside the {'full' if full else 'cheap'} budget")

    with pytest.raises(ContractFailure, match="outside the full budget"):
        cheap_budget_first(raising)
    assert calls == [False, True]
    calls.clear()

    def returning(full: bool) -> Comparison | None:
        calls.append(full)
        return None if full else Comparison("outside the cheap budget", "")

    assert cheap_budget_first(returning) is None and calls == [False, True]


def _close_tensors(size: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A float64 truth, and in ``dtype``: an implementation, a baseline and a neighbour pair, each
    a few rounding steps (some far more) away; values sometimes non-finite or out of range."""
    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(size, generator=generator, dtype=torch.float64) * 10 ** float(torch.randint(-3, 4, (), generator=generator))
    eps = torch.finfo(dtype).eps
    def near(scale: float) -> torch.Tensor:
        return (truth * (1 + scale * eps * torch.randn(size, generator=generator, dtype=torch.float64))).to(dtype)
    impl, base, moved = near(8.0), near(2.0), near(4.0)
    if seed % 3 == 0:
        impl[0] = truth[0] * 2  # far outside any budget
    if seed % 5 == 0:
        base[-1] = math.inf  # plain PyTorch overflows there
    moved_truth = truth * (1 + eps * torch.randn(size, generator=generator, dtype=torch.float64))
    terms = truth.abs() * 10 ** float(torch.randint(0, 4, (), generator=generator))
    return truth, impl, base, moved, moved_truth, terms


@settings(max_examples=200, deadline=None, derandomize=True)
@given(size=st.integers(1, 16), seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_a_value_within_the_cheap_budget_is_within_the_full_one(size: int, seed: int, dtype: torch.dtype) -> None:
    # cheap_budget_first relies on it: term bounds, resamples and the baseline only widen a budget.
    truth, impl, base, moved, moved_truth, terms = _close_tensors(size, seed, dtype)
    cheap = compare_budget(impl, truth, base, dtype, k=2, what="o", where="t")
    full = compare_budget(impl, truth, base, dtype, resampled=[(moved, moved_truth)], terms=terms, k=2, what="o", where="t")
    assert cheap is not None or full is None, full
    stricter = compare_finiteness(impl, truth, dtype, what="o", where="t")
    assert stricter is not None or compare_finiteness(impl, truth, dtype, baseline=base, what="o", where="t") is None
    rtol, atol = layout_tolerance(impl, 1.0)
    wider_rtol, wider_atol = layout_tolerance(impl, 1.0, noise=float(terms.max()))
    assert wider_rtol >= rtol and wider_atol >= atol


def _clamp_squared_grad(ctx, grad, slope: float):  # type: ignore[no-untyped-def]
    (x,) = ctx.saved_tensors
    lo, hi = ctx.bounds
    inside = (x > lo) & (x < hi)
    return torch.where(inside, slope * x.clamp(lo, hi) * grad, torch.zeros_like(grad)), None, None


class _ClampSquared(torch.autograd.Function):
    """clamp(x, lo, hi)**2 with the derivative 0 on the bounds (torch's clamp takes the inside one)."""

    @staticmethod
    def forward(ctx, x, lo, hi):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        ctx.bounds = (lo, hi)
        return x.clamp(lo, hi) ** 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return _clamp_squared_grad(ctx, grad, 2.0)


class _ClampSquaredWrong(_ClampSquared):
    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return _clamp_squared_grad(ctx, grad, 2.5)  # 2.5 x where the derivative is 2 x


CLAMP_SQUARED = {
    "inputs": [Tensor("x", "*batch n", kinks=("lo", "hi")), conformance.Scalar("lo", st.sampled_from([-1.0, 0.0])),
               conformance.Scalar("hi", st.sampled_from([0.5, 2.0]))],
    "reference": lambda x, lo, hi: x.clamp(lo, hi) ** 2,
    "dtypes": (torch.float64, torch.float32, torch.float16, torch.bfloat16),
    "device": "cpu", "contracts": ["reference"], "profile": "thorough", "seed": 2,
}


def test_a_correct_subgradient_at_a_declared_kink_passes_where_bfloat16_rounds_onto_it() -> None:
    """A new user's trial: at the thorough profile, seed 2, a bfloat16 element rounded onto
    clamp's bound 2.0, where this Function's derivative (0) and torch's (inside) differ and both
    are right; reference failed it. No element is built on a declared kink now; a wrong gradient
    off the kinks still fails."""
    assert conformance.check(_ClampSquared, **CLAMP_SQUARED).passed
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_ClampSquaredWrong, **CLAMP_SQUARED)
    assert [f.contract for f in raised.value.failures] == ["reference"], str(raised.value)


def test_a_reductions_indices_that_pick_another_tied_element_are_a_tie_order() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, 2.0]])
    first, last = torch.tensor([1, 0]), torch.tensor([2, 3])
    assert tie_dim(last, first, [x]) == 1  # max(dim=-1)'s indices, the dim removed
    assert tie_dim(last.unsqueeze(1), first.unsqueeze(1), [x]) == 1  # keepdim=True
    assert tie_dim(torch.tensor([1, 1]), first, [x]) is None  # 1.0 is not 2.0: another answer


def _last_maximum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values = x.amax(-1)
    positions = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return values, torch.where(x == values.unsqueeze(-1), positions, -1).amax(-1)


class _MaxPickingTheLastTie(torch.autograd.Function):
    """max over the last dim that picks the last of tied maxima (torch.max picks another): correct."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = _last_maximum(x)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.shape = x.shape
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: torch.Tensor, grad_indices: torch.Tensor | None) -> torch.Tensor:
        (indices,) = ctx.saved_tensors
        return grad_values.new_zeros(ctx.shape).scatter_(-1, indices.unsqueeze(-1), grad_values.unsqueeze(-1))


@pytest.mark.parametrize("seed", [2, 6, 7])
def test_a_max_that_breaks_ties_otherwise_than_the_reference_passes_reference(clean_registry, seed: int) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: bfloat16 draws tie by chance (these seeds of the ci profile: 3 of 12), and
    # the indices were compared exactly, so this correct Function failed reference.
    result = conformance.check(
        _MaxPickingTheLastTie, inputs=[Tensor("x", "*batch n")], reference=lambda x: torch.max(x, -1),
        dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16), double_backward=False,
        contracts=["reference"], device="cpu", profile="ci", seed=seed,
    )
    assert [r.verdict.outcome for r in result.results] == [Outcome.PASSED], result


class _ScaleByExp(torch.autograd.Function):
    """x * exp(w), w broadcast over x's rows; w's gradient summed after the product, row by row."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        e = w.exp()
        ctx.save_for_backward(x, e)
        return x * e

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, e = ctx.saved_tensors
        return grad * e, (grad * x * e).reshape(-1, e.shape[-1]).sum(0)


@pytest.mark.parametrize("seed", [2, 3])
def test_a_nan_where_the_truth_is_only_float64s_overflow_passes_stability(clean_registry, seed: int) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: exp(925) overflows float64 too; sum(g * x * inf) is NaN where the
    # reference's sum(g * x) * inf is -inf, and stability failed a correct Function (7 of 12 seeds).
    # At ordinary magnitudes the truth is finite there: not a definition (a masked row's -inf is one).
    result = conformance.check(
        _ScaleByExp, inputs=[Tensor("x", "*batch n"), Tensor("w", "n")], reference=lambda x, w: x * w.exp(),
        dtypes=(torch.float64, torch.float32), contracts=["stability"], device="cpu", profile="ci", seed=seed,
    )
    assert [r.verdict.outcome for r in result.results] == [Outcome.PASSED], result


class _ClampBetweenLearnedBounds(torch.autograd.Function):
    """clamp(x, lo, hi) with tensor bounds; at x == hi the gradient goes to x, as torch.clamp's
    does (the reference's minimum(maximum(x, lo), hi) splits it in half: both are right)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, lo, hi)
        return torch.minimum(torch.maximum(x, lo), hi)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, lo, hi = ctx.saved_tensors
        below, above = x < lo, x > hi
        inside = ~(below | above)
        return (grad * inside).sum_to_size(x.shape), (grad * below).sum_to_size(lo.shape), (grad * above).sum_to_size(hi.shape)


@pytest.mark.parametrize("seed", [0, 1])
def test_ties_that_bfloat16_rounding_makes_between_inputs_pass_reference(clean_registry, seed: int) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: an ascending x against bounds meets them exactly in bfloat16 (not in the
    # float64 draws); the random neighbouring steps left some tie in place, and reference failed
    # a correct Function on every seed. Each input moved alone breaks every such tie.
    result = conformance.check(
        _ClampBetweenLearnedBounds,
        inputs=[Tensor("x", "*batch n"), Tensor("lo", "n", domain=(-2.0, -0.5)), Tensor("hi", "n", domain=(0.5, 2.0))],
        reference=lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi),
        dtypes=(torch.float64, torch.float32, torch.float16, torch.bfloat16),
        contracts=["reference"], device="cpu", profile="ci", seed=seed,
    )
    assert [r.verdict.outcome for r in result.results] == [Outcome.PASSED], result
