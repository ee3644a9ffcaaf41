"""No vacuous passes: a pass means the contract checked its property on at least one example.

tests/zoo/vacuous.py holds Functions every contract could once "pass" without checking
anything: a backward that always raises, forwards returning a list, a dict or None, and specs
with no differentiable input. Each gets an honest verdict in every contract: a failure, "blocked
by" the contract that owns the defect, a skip saying why there is nothing to check, or a pass
that the runner only grants when an example really checked something (``Target.checked``).
"""

from __future__ import annotations

import pytest

from conformance.engine import report
from conformance.engine.runner import RunOptions, Target
from conformance.engine.verdict import Outcome, Verdict
from tests.conftest import CONFORMANCE_DIR

CONTRACTS = sorted(p.stem.removeprefix("test_") for p in CONFORMANCE_DIR.glob("test_*.py"))
BACKWARD = ("return_count", "grad_meta", "saved_tensors", "gradcheck", "gradgradcheck")
NO_DIFFERENTIABLE_INPUT = "declares no differentiable input"
NO_SAVES_PROMISE = "makes no promise about what forward keeps for backward"
NOTHING_ALLOCATED = "made no uninitialised allocation"
SINGLE_OUTPUT = "has a single tensor output"
CPU_ID = "devices compares cpu against cuda"


# Decided from the target before any example: opcheck checks custom ops.
NOT_A_CUSTOM_OP = {"opcheck": ("n/a", "is an autograd.Function")}


def _broken_forward(kind: str) -> dict[str, tuple[str, str]]:
    owner = ("failed", f"forward returned {kind}")
    blocked = ("blocked", f"blocked by return_count: forward returned {kind}")
    verdicts = {c: owner if c == "return_count" else ("n/a", CPU_ID) if c == "devices" else blocked for c in CONTRACTS}
    verdicts["saved_memory"] = ("n/a", NO_SAVES_PROMISE)  # decided from the spec, before any example
    verdicts.update(NOT_A_CUSTOM_OP)
    return verdicts


def _no_differentiable_input(*checked: str, why: dict[str, str]) -> dict[str, tuple[str, str]]:
    verdicts = {c: ("passed", "") for c in checked}
    verdicts.update({c: ("n/a", NO_DIFFERENTIABLE_INPUT) for c in (*BACKWARD, "autocast")})
    verdicts["unneeded_grads"] = ("n/a", "so no gradient can be unneeded")
    verdicts["undefined_grads"] = ("n/a", SINGLE_OUTPUT)
    verdicts["devices"] = ("n/a", CPU_ID)
    verdicts["saved_memory"] = ("n/a", NO_SAVES_PROMISE)
    verdicts["unwritten_memory"] = ("n/a", NOTHING_ALLOCATED)
    verdicts["out_of_bounds"] = ("passed", "")  # forward's inputs sat between canaries
    verdicts.update(NOT_A_CUSTOM_OP)
    verdicts["forward_ad"] = ("n/a", "no direction to differentiate along")
    verdicts["compile"] = ("passed", "")  # compiled outputs against eager's
    verdicts["func"] = ("passed", "")  # no vmap rule declared: vmap must (and does) refuse
    verdicts.update({c: ("n/a", reason) for c, reason in why.items()})
    return verdicts


# Function -> contract -> (outcome, a phrase of its report). "passed" only where a check ran.
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "backward_always_raises": {  # one crash, one failure: on plain inputs it is return_count's
        **{c: ("blocked", "blocked by return_count: backward raised NotImplementedError (backward of double is not implemented yet), but should return gradients") for c in CONTRACTS},
        "return_count": ("failed", "backward raised NotImplementedError (backward of double is not implemented yet), but should return gradients"),
        "undefined_grads": ("n/a", SINGLE_OUTPUT),
        "devices": ("n/a", CPU_ID),
        "saved_memory": ("n/a", NO_SAVES_PROMISE),
        **NOT_A_CUSTOM_OP,
    },
    "forward_returns_list": _broken_forward("a list [Tensor("),
    "forward_returns_dict": _broken_forward("a dict {'y': Tensor("),
    "forward_returns_none": _broken_forward("None"),
    # Forward-only properties are real checks: outputs need no grad when nothing requires grad,
    # inputs untouched, values against the reference, bitwise repeatable, no global state leaked.
    "masked_index": _no_differentiable_input(
        "needs_input_grad", "inplace", "reference", "determinism", "global_state",
        why={
            "stability": "no floating-point output or gradient",  # int64 output: finiteness says nothing
            "layouts": "came out in the plain layout",  # Index/Mask inputs are never strided
        },
    ),
    "constant_product": _no_differentiable_input(
        "needs_input_grad", "inplace", "reference", "determinism", "global_state", "stability", "layouts", why={}
    ),
}


@pytest.fixture
def vacuous(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("vacuous")


def _outcome(verdict) -> str:  # type: ignore[no-untyped-def]
    status = Verdict.of(verdict.properties.items())
    if verdict.outcome == "skipped" and status is not None and status.outcome is Outcome.NOT_APPLICABLE:
        return "n/a"
    if verdict.outcome == "skipped" and status is not None and status.outcome is Outcome.BLOCKED:
        return "blocked"
    return str(verdict.outcome)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_contract_gives_an_honest_verdict(vacuous, name: str) -> None:  # type: ignore[no-untyped-def]
    expected = EXPECTED[name]
    assert sorted(expected) == CONTRACTS, "a contract without an expected verdict: add it to EXPECTED"
    wrong = []
    for contract in CONTRACTS:
        verdict = vacuous.verdict(contract, name)
        outcome, phrase = expected[contract]
        if _outcome(verdict) != outcome or phrase not in verdict.text:
            wrong.append(f"{contract}: {_outcome(verdict)}, but should be {outcome} with {phrase!r}:\n{verdict.text[-800:]}")
    assert not wrong, "\n\n".join(wrong)


def test_a_pass_is_only_given_for_a_checked_example(vacuous) -> None:  # type: ignore[no-untyped-def]
    """n/a skips say what there was nothing to check, in one line."""
    verdict = vacuous.verdict("gradcheck", "constant_product")
    assert (
        "Skipped: nothing to check: 'constant_product' declares no differentiable input (only Index/Mask/Scalar "
        "inputs or Tensors with requires_grad=False), so backward never runs"
    ) in verdict.text, verdict.text
    text = vacuous.failed("return_count", "forward_returns_dict")
    assert "autograd tracks only tensors that forward returns directly or as elements of a tuple" in text
    assert "case: " in text and "repro script: python " in text


@pytest.fixture
def probe_spec(clean_registry):  # type: ignore[no-untyped-def]
    import torch

    from conformance import Tensor, register
    from conformance.spec import registered

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return 2 * x

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return 2 * g

    register(Twice, name="twice_probe", inputs=[Tensor("x", "n")], reference=lambda x: 2 * x)
    return registered()[-1]


def _target(spec, contract: str) -> Target:  # type: ignore[no-untyped-def]
    return Target(spec=spec, device="cpu", contract=contract, options=RunOptions(max_examples=3))


def test_the_runner_turns_zero_checked_examples_into_a_reasoned_skip(probe_spec) -> None:  # type: ignore[no-untyped-def]
    target = _target(probe_spec, "probe")

    def never_checks(t: Target, data) -> None:  # type: ignore[no-untyped-def]
        t.draw_case(data)
        t.not_checked("the probe has nothing to look at")

    with pytest.raises(pytest.skip.Exception, match="nothing to check: the probe has nothing to look at$"):
        target.run(never_checks)
    assert Verdict.of(target.user_properties) == Verdict(
        Outcome.NOT_APPLICABLE, "nothing to check: the probe has nothing to look at"
    )


def test_one_checked_example_is_enough_for_a_pass(probe_spec) -> None:  # type: ignore[no-untyped-def]
    seen: list[report.TestContext] = []

    def checks_once(t: Target, data) -> None:  # type: ignore[no-untyped-def]
        t.draw_case(data)
        assert t.context is not None
        if t.context.checked:
            t.not_checked("already checked")
        else:
            t.checked()
        seen.append(t.context)

    _target(probe_spec, "probe").run(checks_once)
    assert seen and seen[-1].checked == 1 and list(seen[-1].unchecked) == ["already checked"]


def test_a_contract_that_checks_nothing_and_says_nothing_is_a_suite_bug(probe_spec) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pytest.fail.Exception, match=r"\[probe\] no example checked anything and the contract gave no reason"):
        _target(probe_spec, "probe").run(lambda t, data: None)
