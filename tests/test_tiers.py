"""Decisive verdicts: defects fail, advice and upstream findings inform, and one crash is one
failure (the owner fails, every other contract that meets it says "blocked by" the owner).

tiers_correct.py holds correct Functions written the way third-party libraries write them; each
passes every contract, with advice or an upstream finding where one is due. tiers_bugs.py holds
one defect each."""

from __future__ import annotations

import json

import pytest

from conformance.engine.verdict import Outcome
from tests.conftest import ZOO

# Correct Function -> the findings it must get (contract -> tier); every other test passes or is n/a.
FINDINGS: dict[str, dict[str, Outcome]] = {
    "log_scan": {"compile": Outcome.ADVICE},
    "pow2_pad_norm": {"compile": Outcome.ADVICE},
    "classmethod_swish": {"compile": Outcome.ADVICE},
    "inplace_affine": {"compile": Outcome.UPSTREAM},
    "undeclared_softplus": {"gradgradcheck": Outcome.ADVICE},
    "undeclared_softplus_float32": {"gradgradcheck": Outcome.ADVICE},  # judged against the reference's double backward
    "float32_inside_undeclared": {"gradgradcheck": Outcome.ADVICE},  # float64 finite differences see only rounding noise
    "linear_recurrence": {"compile": Outcome.ADVICE},  # its by-product grad x is no unneeded work
    "synthesis_bank": {},  # dlow and dhigh are halves of one transposed convolution
    "frozen_bias_linear": {"unneeded_grads": Outcome.ADVICE},  # grad b for a bias declared requires_grad=False
    # bfloat16 gradients for float32 inputs, as native autocast's; both gradients every time
    "docs_autocast_matmul": {"autocast": Outcome.ADVICE, "unneeded_grads": Outcome.ADVICE},
    "bag_sum": {"compile": Outcome.UPSTREAM},  # Dynamo fails internally under fullgraph (repeat_interleave's size)
    "classmethod_super_swish": {"compile": Outcome.UPSTREAM},  # ... and here with graph breaks allowed too
}


@pytest.fixture
def correct(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("tiers_correct")


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("tiers_bugs")


def _recorded(run, name: str) -> dict[str, Outcome]:  # type: ignore[no-untyped-def]
    return {c: v.recorded.outcome for (c, fn, _), v in run.verdicts.items() if fn == name}


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_correct_third_party_code_never_fails_and_gets_its_finding(correct, name: str) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(correct, name)
    for contract, tier in FINDINGS[name].items():
        assert outcomes.pop(contract) is tier, (name, contract)
        assert correct.verdict(contract, name).outcome == "passed"  # pytest: advice and upstream do not fail the run
    assert set(outcomes.values()) <= {Outcome.PASSED, Outcome.NOT_APPLICABLE}, (name, outcomes)


@pytest.mark.parametrize("name", ["linear_recurrence", "synthesis_bank"])
def test_by_product_gradients_are_not_unneeded_work(correct, name: str) -> None:  # type: ignore[no-untyped-def]
    correct.passed("unneeded_grads", name)


def test_real_extra_gradient_work_is_advice_naming_the_ops(bugs) -> None:  # type: ignore[no-untyped-def]
    advice = bugs.verdict("unneeded_grads", "attention_unneeded_dk_dv").recorded
    assert advice.outcome is Outcome.ADVICE, advice
    assert "computed, but not needed: extra work aten." in advice.reason and "requires_grad: [" in advice.reason
    outcomes = _recorded(bugs, "attention_unneeded_dk_dv")
    assert set(outcomes.values()) <= {Outcome.PASSED, Outcome.NOT_APPLICABLE, Outcome.ADVICE}, outcomes  # correct code
    bugs.passed("needs_input_grad", "attention_unneeded_dk_dv")


def test_compile_advice_names_the_cause(correct) -> None:  # type: ignore[no-untyped-def]
    storm = correct.verdict("compile", "log_scan").recorded
    assert "compiled 3 variants for 3 calls" in storm.reason and "performance advice" in storm.reason
    assert "calls: torch.float64 on cpu; x: tensor(" in storm.message and "by design" in storm.message
    graph_break = correct.verdict("compile", "pow2_pad_norm").recorded
    assert "a graph break" in graph_break.reason and "numpy function unsupported" in graph_break.message
    own = correct.verdict("compile", "classmethod_swish").recorded
    assert "ClassmethodSwish.forward is a @classmethod" in own.message and "@staticmethod" in own.message


def test_a_torch_bug_is_named_as_torchs_with_a_torch_only_repro(correct) -> None:  # type: ignore[no-untyped-def]
    found = correct.verdict("compile", "inplace_affine").recorded
    assert found.reason.startswith("torch's bug: backend='aot_eager' is wrong where eager and Dynamo's trace alone")
    assert "Workaround:" in found.message and "mark_dirty" in found.message
    script = found.message.split("this Function):\n", 1)[1].split("\n  case:", 1)[0]
    assert "conformance" not in script.replace("conformance_zoo", "").split("spec_from_file_location", 1)[0]
    assert "torch.compile(run, backend='aot_eager')" in script and found.repro.endswith(".py")


def test_dynamos_internal_error_under_fullgraph_is_torchs_not_a_graph_break(correct) -> None:  # type: ignore[no-untyped-def]
    """It was worded as the Function's graph break, performance advice (a new user's trial)."""
    found = correct.verdict("compile", "bag_sum").recorded
    assert found.reason.startswith("torch's bug: Dynamo failed internally under fullgraph=True (InternalTorchDynamoError"), found.reason
    assert "PendingUnbackedSymbolNotFound" in found.message and "without fullgraph=True works" in found.message


def test_dynamos_internal_error_with_graph_breaks_allowed_is_torchs_not_a_defect(correct) -> None:  # type: ignore[no-untyped-def]
    """A new user's trial (entmax's classmethod forwards) saw it fail as the Function's defect."""
    found = correct.verdict("compile", "classmethod_super_swish").recorded
    assert found.reason.startswith("torch's bug: Dynamo failed internally (InternalTorchDynamoError) with graph breaks allowed"), found.reason
    assert "ClassmethodSuperSwish.forward is a @classmethod" in found.message and "torch.compiler.disable" in found.message


def test_a_right_undeclared_double_backward_is_advice(correct) -> None:  # type: ignore[no-untyped-def]
    advice = correct.verdict("gradgradcheck", "undeclared_softplus").recorded
    assert "finds it right on this example, but the spec declares double_backward=False" in advice.reason
    assert "@once_differentiable" in advice.message


def test_a_silently_wrong_undeclared_double_backward_is_a_defect(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "silent_wrong_double_backward")
    assert "silently WRONG, but the spec declares double_backward=False" in text
    assert bugs.verdict("gradgradcheck", "silent_wrong_double_backward").recorded.finding == "defect"


def test_without_float64_an_undeclared_double_backward_is_judged_by_the_reference(bugs, correct) -> None:  # type: ignore[no-untyped-def]
    """No float64, no gradgradcheck: the double backward that runs is compared with the reference's
    (a Triton kernel's float32 backward returning a saved intermediate was advice, "numbers not checked")."""
    text = bugs.failed("gradgradcheck", "silent_wrong_double_backward_float32")
    assert "silently WRONG, but the spec declares double_backward=False" in text and "vs the reference's double backward" in text
    assert "d(weighted sum of the gradients)/d'x'" in text and "float32" in text, text
    advice = correct.verdict("gradgradcheck", "undeclared_softplus_float32").recorded
    assert "matches the reference's on this example" in advice.reason, advice.reason


def test_a_gradient_detached_only_at_unit_grad_output_is_a_defect(bugs) -> None:  # type: ignore[no-untyped-def]
    """A fast path for grad_output == 1 (what loss.backward() passes) returning a gradient computed in
    forward: random grad_outputs never meet it."""
    text = bugs.failed("gradgradcheck", "detached_at_unit_grad_output")
    assert "requires_grad=False under create_graph=True with grad_output all ones" in text, text
    for contract in ("reference", "gradcheck", "saved_tensors", "needs_input_grad"):
        bugs.passed(contract, "detached_at_unit_grad_output")


def test_advice_fails_only_under_the_option(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "tiers_correct.py", "--advice=fail", contracts=("gradgradcheck",))
    text = run.failed("gradgradcheck", "undeclared_softplus")
    assert "advice fails this run: --advice=fail" in text
    recorded = run.verdict("gradgradcheck", "undeclared_softplus").recorded
    assert recorded.outcome is Outcome.FAILED and recorded.finding == "advice"


def test_a_forward_that_raises_on_1d_input_is_one_failure(bugs) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(bugs, "crash_on_1d")
    assert [c for c, o in outcomes.items() if o is Outcome.FAILED] == ["return_count"]
    blocked = [c for c, o in outcomes.items() if o is Outcome.BLOCKED]
    assert len(blocked) >= 15, outcomes
    for contract in blocked:
        recorded = bugs.verdict(contract, "crash_on_1d").recorded
        assert recorded.owner == "return_count" and "forward raised IndexError" in recorded.reason
    assert set(outcomes.values()) <= {Outcome.FAILED, Outcome.BLOCKED, Outcome.NOT_APPLICABLE}


@pytest.mark.parametrize("wrong", [True, False])
def test_a_crash_in_one_dtype_leaves_the_others_checked(bugs, wrong: bool) -> None:  # type: ignore[no-untyped-def]
    """A float64 crash blocked every dtype of every contract, hiding a float32 defect (a new user's
    flash attention, whose float64 fill overflows, hid two planted bugs)."""
    name = "float64_crash_wrong_float32" if wrong else "float64_crash_right_float32"
    outcomes = _recorded(bugs, name)
    assert "forward raised RuntimeError" in bugs.failed("return_count", name)
    recorded = bugs.verdict("reference", name).recorded
    if wrong:
        assert recorded.outcome is Outcome.FAILED and "float32" in recorded.reason and "grad['x']" in recorded.reason, recorded
    else:
        assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "return_count", recorded
    assert outcomes["gradcheck"] is Outcome.BLOCKED  # float64 only: every example crashes


def test_a_crash_blocks_only_its_examples_in_every_contract(bugs) -> None:  # type: ignore[no-untyped-def]
    """The block was raised from inside the runner's own exception handler and escaped it: every
    contract but reference and stability still ended at the first crashing example (a review)."""
    assert "forward raised RuntimeError (1-D input not supported)" in bugs.failed("return_count", "crash_on_1d_wrong_grad")
    assert "analytical grad['x'] != numerical" in bugs.failed("gradcheck", "crash_on_1d_wrong_grad")
    blocked = bugs.verdict("saved_tensors", "crash_on_1d_wrong_grad").recorded
    assert blocked.outcome is Outcome.BLOCKED and blocked.owner == "return_count", blocked  # nothing of its own


def test_a_crash_on_a_stride_0_grad_output_is_layouts_alone(bugs) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(bugs, "crash_on_expanded_grad")
    assert [c for c, o in outcomes.items() if o is Outcome.FAILED] == ["layouts"]
    for contract in ("out_of_bounds", "unwritten_memory"):
        recorded = bugs.verdict(contract, "crash_on_expanded_grad").recorded
        assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "layouts", recorded
    bugs.passed("gradcheck", "crash_on_expanded_grad")
    bugs.passed("reference", "crash_on_expanded_grad")


def test_an_unreduced_gradient_with_wrong_values_also_fails_the_value_contracts(bugs) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(bugs, "unreduced_wrong_bias")
    assert sorted(c for c, o in outcomes.items() if o is Outcome.FAILED) == ["grad_meta", "gradcheck"]
    blocked = bugs.verdict("reference", "unreduced_wrong_bias").recorded  # the wrong values are gradcheck's
    assert blocked.outcome is Outcome.BLOCKED and blocked.owner == "gradcheck", blocked
    assert "analytical grad['b'] != numerical" in bugs.failed("gradcheck", "unreduced_wrong_bias")


def test_an_unreduced_gradient_with_right_values_fails_grad_meta_only(bugs) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(bugs, "unreduced_right_bias")
    assert [c for c, o in outcomes.items() if o is Outcome.FAILED] == ["grad_meta"], outcomes
    for judge in ("gradcheck", "reference"):
        bugs.passed(judge, "unreduced_right_bias")


def test_an_undeclared_write_into_an_input_is_inplaces_and_blocks_what_it_explains(bugs) -> None:  # type: ignore[no-untyped-def]
    outcomes = _recorded(bugs, "scales_input_through_reshape")
    assert [c for c, o in outcomes.items() if o is Outcome.FAILED] == ["inplace"], outcomes
    assert "input 'x' was modified in place by forward" in bugs.failed("inplace", "scales_input_through_reshape")
    recorded = bugs.verdict("compile", "scales_input_through_reshape").recorded
    assert recorded.outcome is Outcome.BLOCKED and recorded.owner == "inplace", recorded  # not "torch's bug"
    assert Outcome.UPSTREAM not in outcomes.values(), outcomes


def test_every_failure_is_at_most_40_lines(bugs) -> None:  # type: ignore[no-untyped-def]
    for (contract, name, _), verdict in bugs.verdicts.items():
        if verdict.outcome == "failed":
            assert len(verdict.text.splitlines()) <= 40, (contract, name, verdict.text)


def test_the_json_report_gives_each_cell_its_tier(pytester, tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = tmp_path / "tiers"
    result = pytester.runpytest_inprocess(
        str(ZOO.parent.parent / "conformance"), f"--impl={ZOO / 'tiers_correct.py'}", "--device=cpu",
        "--contracts=gradgradcheck", "--max-examples=3", "-p", "no:cacheprovider", f"--conformance-report={report}",
    )
    assert result.ret == 0
    data = json.loads((tmp_path / "tiers.json").read_text())
    tiers = {entry["function"]: entry["tier"] for entry in data["results"] if entry["device"] == "cpu"}
    assert tiers["undeclared_softplus"] == tiers["undeclared_softplus_float32"] == "advice" and tiers["log_scan"] is None
    assert data["totals"]["advice"] == 3  # undeclared_softplus, its float32 twin, float32_inside_undeclared
    text = result.stdout.str()
    assert "ADVICE gradgradcheck[undeclared_softplus-cpu]: double backward runs" in text
    assert "a advice" in text and "u upstream (torch)" in text  # the legend
