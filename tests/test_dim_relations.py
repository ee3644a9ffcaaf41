"""Stated dim relations hold in every contract (issue 28): complex_gate (``f`` even and ``f <= n``,
asserted by its forward) passes every contract of its run, compile's growing sizes and
stability's "single" family included; its twin with one wrong index in backward is caught by the
contracts that own wrong gradients, on a shrunk case that itself meets the relations."""

from __future__ import annotations

import re

import pytest

from conformance.engine.verdict import Outcome
from tests.zoo_runs import ZOO_RUNS

CONTRACTS = ZOO_RUNS["dim_relations"].contracts
GRADIENT_OWNERS = {"gradcheck", "reference"}


@pytest.fixture
def run(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("dim_relations")


def _outcomes(run, name: str) -> dict[str, Outcome]:  # type: ignore[no-untyped-def]
    return {c: v.recorded.outcome for (c, fn, _), v in run.verdicts.items() if fn == name}


def test_correct_function_with_related_dims_passes_every_contract(run) -> None:  # type: ignore[no-untyped-def]
    outcomes = _outcomes(run, "complex_gate")
    assert set(outcomes) == set(CONTRACTS), outcomes
    # Every contract ran and found nothing wrong (advice on correct code would not fail the run).
    failures = {c: run.verdict(c, "complex_gate").text for c, o in outcomes.items() if o not in {Outcome.PASSED, Outcome.ADVICE}}
    assert not failures, "\n\n".join(f"{c}:\n{text}" for c, text in failures.items())


def test_wrong_index_in_backward_is_caught_by_the_gradient_contracts(run) -> None:  # type: ignore[no-untyped-def]
    name = "complex_gate_tail_index_bug"
    failed = {c for c, o in _outcomes(run, name).items() if o is Outcome.FAILED}
    assert failed == {"gradcheck"}, _outcomes(run, name)
    blocked = run.verdict("reference", name).recorded  # the same wrong gradient: one defect, one failure
    assert blocked.outcome is Outcome.BLOCKED and blocked.owner == "gradcheck", blocked
    for contract in set(CONTRACTS) - GRADIENT_OWNERS:  # forward is right: nothing else is at fault
        verdict = run.verdict(contract, name)
        if contract == "stability" and verdict.outcome == "skipped":
            # It meets the wrong gradient at extreme magnitudes, and at ordinary ones too, where finite
            # differences reject it as well: gradcheck's defect, one failure (no longer by way of reference).
            assert "blocked by gradcheck: " in verdict.text, verdict.text
            continue
        run.passed(contract, name)
    for contract in failed:
        text = run.failed(contract, name)
        assert "grad['x']" in text, text
        shapes = re.search(r"x: tensor\(([0-9, ]+)\).*?w: tensor\((\d+),\)", text)
        assert shapes, text
        n, f = int(shapes.group(1).rstrip(", ").split(",")[-1]), int(shapes.group(2))
        assert f % 2 == 0 and 2 <= f <= n, text  # the shrunk case meets the declared relations
