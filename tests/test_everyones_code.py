"""Right on everyone's code (issue 28): correct Functions written third-party style that the suite
once failed for the wrong reason pass every contract, and each buggy twin is failed by the
contract that owns its defect, the others blocked by it or passing."""

from __future__ import annotations

import pytest

from conformance.engine.verdict import Outcome
from tests.conftest import ZOO

# Correct Function -> the advice it gets (contract set); every other test passes or is n/a.
CORRECT: dict[str, set[str]] = {
    "inplace_square": {"compile"},  # mark_dirty: a graph break, advice
    "narrow_rows": {"compile"},  # a view of the input as the output
    "sort_rows": set(),  # tie order differs by layout
    "row_norms_numpy": {"compile"},  # a numpy output
    "straight_through_sign": {"gradgradcheck"},  # a surrogate jvp
    "sort_values_jvp": {"gradgradcheck"},  # no tangent for the indices
    "linear_no_custom_fwd": {"unneeded_grads"},  # computes grad w whatever needs_input_grad says
    "permute_columns": set(),  # an integer Derived input (a permutation)
    "scale_optional_bias": set(),  # an optional tensor passed as None
    "sparsemax": set(),  # a step Jacobian in bfloat16
    "gelu_tanh_under_autocast": set(),  # an approximation under autocast, no custom_fwd
    "rms_scale_float32_eps": set(),  # float64 a few rounding steps off the reference (eps in float32)
    "add_into_inplace": set(),  # a bfloat16 gradient for a float32 input that loses nothing
    "kl_div_log_target": set(),  # a loss of ~1e8 whose entries' derivatives are ~1: finite differences mostly rounding
    "max_pool_last_tie": set(),  # a tied window's gradient to its last element, the reference's to its first
    "masked_logcumsumexp": {"compile"},  # 0 gradient under a -inf output, where torch's backward gives NaN
    "quant_codes": set(),  # int8 codes that round the other way in bfloat16, as plain PyTorch's do
    "clip_grad": set(),  # a gradient nonlinear in grad_output: a surrogate with a hook
    "stop_grad_target": set(),  # no gradient for one input by design: a surrogate that detaches it
    "index_add_rows": set(),  # raises on mixed bfloat16/float32 inputs under autocast, as torch's index_add does
    "inverse": set(),  # raises on the singular matrices an expanded layout makes, as its reference does
    "spd_logdet": set(),  # a Cholesky that raises where its matrix is singular in float32 at large magnitudes
}

# Twin -> (the contract that fails it, what its message says).
TWINS: dict[str, tuple[str, str]] = {
    "inplace_square_sign_bits": ("stability", "but should be finite"),
    "narrow_rows_data": ("inplace", "behind autograd's back"),
    "sort_rows_contiguous": ("layouts", "with non-contiguous layouts != outputs[0] with contiguous layouts"),
    "straight_through_sign_jvp": ("forward_ad", "tangent[0]"),
    "sort_values_unpermuted_jvp": ("forward_ad", "jvp"),
    "vmap_wrong_forward": ("reference", "output[0] != reference"),
    "linear_mixed_backward": ("autocast", "backward raised RuntimeError after a forward under autocast"),
    "permute_columns_uninverted": ("gradcheck", "analytical grad['x'] != numerical"),
    "sparsemax_mean_over_row": ("gradcheck", "analytical grad['z'] != numerical"),
    "gelu_tanh_under_autocast_halved": ("autocast", "max|output[0] - reference|"),
    "max_pool_mask_grad": ("reference", "sum of grad['x'] over the"),
    "clip_grad_unsigned": ("gradcheck", "grad['x'] != autograd gradient of the declared surrogate"),
    "linear_dtype_check": ("autocast", "forward raised TypeError under autocast, but should run"),
    "logsumexp_softmax_in_place": ("inplace", "input 'x' was modified in place by backward"),
    "stop_grad_target_leak": ("gradcheck", "grad['t']=a nonzero tensor, but should be zero (the surrogate's is None)"),
}


@pytest.fixture
def correct(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("everyones_code_correct")


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("everyones_code_bugs")


def _recorded(run, name: str) -> dict[str, Outcome]:  # type: ignore[no-untyped-def]
    return {c: v.recorded.outcome for (c, fn, _), v in run.verdicts.items() if fn == name}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_code_the_suite_once_failed_passes_every_contract(correct, name: str) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(correct, name)
    assert len(outcomes) >= 20, outcomes
    advice = {c for c, o in outcomes.items() if o is Outcome.ADVICE}
    assert advice <= CORRECT[name], (name, advice)
    assert set(outcomes.values()) <= {Outcome.PASSED, Outcome.NOT_APPLICABLE, Outcome.ADVICE}, (name, outcomes)


@pytest.mark.parametrize("name", ["inplace_square", "narrow_rows", "sort_rows", "straight_through_sign", "sort_values_jvp", "linear_no_custom_fwd",
                                  "gelu_tanh_under_autocast", "scale_optional_bias", "add_into_inplace", "kl_div_log_target",
                                  "max_pool_last_tie", "masked_logcumsumexp", "quant_codes", "index_add_rows",
                                  "inverse", "spd_logdet"])
def test_the_contract_that_once_failed_it_now_checks_it(correct, name: str) -> None:  # type: ignore[no-untyped-def]
    contract = {
        "inplace_square": "stability", "narrow_rows": "inplace", "sort_rows": "layouts",
        "straight_through_sign": "forward_ad", "sort_values_jvp": "forward_ad", "linear_no_custom_fwd": "autocast",
        "gelu_tanh_under_autocast": "autocast", "scale_optional_bias": "inplace", "add_into_inplace": "autocast",
        "kl_div_log_target": "gradcheck", "max_pool_last_tie": "reference", "masked_logcumsumexp": "stability",
        "quant_codes": "reference", "index_add_rows": "autocast", "inverse": "reference", "spd_logdet": "out_of_bounds",
    }[name]
    correct.passed(contract, name)  # passed, not n/a: the contract ran its checks


@pytest.mark.parametrize("name", sorted(TWINS))
def test_each_twin_fails_its_owner_alone(bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    owner, says = TWINS[name]
    assert says in bugs.failed(owner, name)
    outcomes = _recorded(bugs, name)
    failed = sorted(c for c, o in outcomes.items() if o is Outcome.FAILED)
    assert failed == [owner], (name, outcomes)


def test_a_masked_minus_inf_output_is_no_gradcheck_failure(correct) -> None:  # type: ignore[no-untyped-def]
    # Its central differences are NaN (-inf - -inf): such entries count as 0 on both sides.
    correct.passed("gradcheck", "masked_logcumsumexp")


def test_a_forward_bug_blocks_func_instead_of_blaming_the_vmap_rule(bugs) -> None:  # type: ignore[no-untyped-def]
    recorded = bugs.verdict("func", "vmap_wrong_forward").recorded
    assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "reference", recorded
    assert "each sample alone" in recorded.reason
    # autocast judges an undecorated Function's values too, and finds the forward bug in float32 first;
    # a wrong forward is a wrong Jacobian for gradcheck's finite differences too
    for contract in ("autocast", "gradcheck"):
        recorded = bugs.verdict(contract, "vmap_wrong_forward").recorded
        assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "reference", (contract, recorded)


def test_a_wrong_backward_is_gradchecks_and_blocks_reference(bugs) -> None:  # type: ignore[no-untyped-def]
    """One defect, one failure: reference meets the same wrong gradient (and finite differences of
    its case reject it too)."""
    for name in ("permute_columns_uninverted", "sparsemax_mean_over_row"):
        recorded = bugs.verdict("reference", name).recorded
        assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "gradcheck", (name, recorded)
        assert "!= reference" in recorded.reason and "finite differences in float64 reject it too" in recorded.reason, recorded


def test_a_numpy_output_function_compiles_and_its_compile_only_twin_fails(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "everyones_code_bugs.py", "-k", "row_norms_numpy_compiled", contracts=("compile",))
    text = run.failed("compile", "row_norms_numpy_compiled")
    assert "compiled output[0] != reference (eager is within it)" in text and "assert_close" in text, text


def test_a_sole_tensor_output_beside_non_tensor_outputs_is_named_so(correct) -> None:  # type: ignore[no-untyped-def]
    # row_norms_numpy returns a tensor and a numpy array: undefined_grads has nothing to leave unused.
    verdict = correct.verdict("undefined_grads", "row_norms_numpy")
    assert verdict.recorded.outcome is Outcome.NOT_APPLICABLE
    assert "has a single tensor output (its other outputs are not tensors)" in verdict.recorded.reason, verdict.recorded.reason


@pytest.fixture
def domain_and_writes_run(conformance_run):  # type: ignore[no-untyped-def]
    # made once per session: runs are cached by their arguments
    return conformance_run(
        ZOO / "everyones_code_bugs.py", "-k", "spd_logdet_minus_shift or logsumexp_softmax_in_place",
        contracts=("return_count", "stability", "layouts", "inplace", "gradgradcheck"),
    )


def test_a_linalg_error_at_every_magnitude_is_a_crash(domain_and_writes_run) -> None:  # type: ignore[no-untyped-def]
    """Its correct twin (spd_logdet) raises only on cases outside the op's domain and passes; this
    one raises on every case, ordinary magnitudes too: return_count fails, the others are blocked."""
    run = domain_and_writes_run
    assert "forward raised _LinAlgError" in run.failed("return_count", "spd_logdet_minus_shift")
    for contract in ("stability", "layouts"):
        recorded = run.verdict(contract, "spd_logdet_minus_shift").recorded
        assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "return_count", (contract, recorded)


def test_a_double_backward_refused_over_a_saved_input_backward_wrote_is_blocked_by_inplace(domain_and_writes_run) -> None:  # type: ignore[no-untyped-def]
    run = domain_and_writes_run
    assert "input 'x' was modified in place by backward" in run.failed("inplace", "logsumexp_softmax_in_place")
    recorded = run.verdict("gradgradcheck", "logsumexp_softmax_in_place").recorded
    assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "inplace", recorded
