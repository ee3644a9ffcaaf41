"""Kernels only the richer spec language can describe: the reference_ops that use it pass on
several seeds, and zoo bugs that live in what it generates (zero-length and partial varlen
sequences, ignored targets, broadcast rotary tables) are caught by the contract that owns them,
with the shrunk example showing the trigger."""

from __future__ import annotations

import re

import pytest

from conformance.engine.verdict import Outcome, owner_missed

SPEC_LANGUAGE_OPS = ("rotary", "gate_up", "cross_entropy_ignore_index", "varlen_attention", "sdpa_additive_mask")
# A wrong gradient or value: gradcheck (float64 finite differences) and reference own it.
VALUE_CONTRACTS = {"reference", "gradcheck"}


@pytest.mark.parametrize("seed", [1])  # the main job (.ci/run) runs seed 0
def test_reference_ops_using_the_spec_language_pass_on_another_seed(conformance_run, seed: int) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run("reference_ops", f"--seed={seed}", "-k", " or ".join(SPEC_LANGUAGE_OPS), max_examples=5)
    assert run.names() == set(SPEC_LANGUAGE_OPS)
    failures = {key: v.text for key, v in run.verdicts.items() if v.outcome == "failed"}
    assert not failures, "\n\n".join(f"{k}:\n{text}" for k, text in failures.items())
    for name in SPEC_LANGUAGE_OPS:
        for contract in ("reference", "layouts", "needs_input_grad", "stability", "out_of_bounds"):
            run.passed(contract, name)
        if name != "cross_entropy_ignore_index":  # reduces to a scalar: no layouts to vary on the output
            run.passed("grad_meta", name)


@pytest.fixture
def spec_language_zoo(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("spec_language_bugs")


def _failed(run, name: str) -> set[str]:  # type: ignore[no-untyped-def]
    """Contracts ``name`` failed; every other verdict passed, n/a, or blocked by one of them (or by a
    contract blocked by one of them)."""
    failed = {c for (c, fn, _), v in run.verdicts.items() if fn == name and v.outcome == "failed"}
    row = {c: (v.recorded.outcome, v.recorded.owner) for (c, fn, _), v in run.verdicts.items() if fn == name}
    for contract, (outcome, owner) in row.items():
        if outcome is Outcome.BLOCKED:
            assert owner_missed(owner, row) is None, (contract, owner, row)
    return failed


def _lengths(text: str) -> list[int]:
    match = re.search(r"cu_seqlens: offsets \[[0-9, ]*\] \(lengths \[([0-9, ]*)\]\)", text)
    assert match, text
    return [int(x) for x in match.group(1).split(", ")]


def test_varlen_kernel_mishandling_an_empty_sequence_is_caught(spec_language_zoo) -> None:  # type: ignore[no-untyped-def]
    failed = _failed(spec_language_zoo, "varlen_empty_sequence_bug")
    assert "reference" in failed and failed <= VALUE_CONTRACTS
    lengths = _lengths(spec_language_zoo.failed("reference", "varlen_empty_sequence_bug"))
    assert 0 in lengths[:-1] and sum(lengths) > 0  # shrunk to an empty sequence before real rows


def test_varlen_kernel_dropping_the_last_partial_sequence_is_caught(spec_language_zoo) -> None:  # type: ignore[no-untyped-def]
    failed = _failed(spec_language_zoo, "varlen_last_sequence_bug")
    assert "reference" in failed and failed <= VALUE_CONTRACTS
    lengths = _lengths(spec_language_zoo.failed("reference", "varlen_last_sequence_bug"))
    assert sum(lengths) % 4 != 0  # a total that is not a multiple of the kernel's 4-row block


def test_cross_entropy_counting_ignored_targets_is_caught_by_the_reference(spec_language_zoo) -> None:  # type: ignore[no-untyped-def]
    # Forward and backward agree with each other, so gradcheck passes: only the reference sees it.
    assert _failed(spec_language_zoo, "cross_entropy_counts_ignored") == {"reference"}
    spec_language_zoo.passed("gradcheck", "cross_entropy_counts_ignored")
    text = spec_language_zoo.failed("reference", "cross_entropy_counts_ignored")
    assert "set to [-100]" in text and "index" in text


def test_rotary_backward_assuming_a_full_table_is_caught_on_a_broadcast_table(spec_language_zoo) -> None:  # type: ignore[no-untyped-def]
    failed = _failed(spec_language_zoo, "rotary_unbroadcast_backward")
    assert failed == {"gradcheck"}, failed  # reference meets the same wrong gradient: blocked by gradcheck
    blocked = spec_language_zoo.verdict("reference", "rotary_unbroadcast_backward")
    assert blocked.recorded.outcome is Outcome.BLOCKED and blocked.recorded.owner == "gradcheck", blocked.recorded
    text = blocked.text  # the skip line names reference's case
    case = re.search(r"x: tensor\((\d+), (\d+), 1?\d*, ?\d+\).*?cos: derived\(([0-9, ]+)\)", text)
    assert case, text
    batch, table = int(case.group(1)), tuple(int(x) for x in case.group(3).split(", "))
    assert batch > 1 and (len(table) == 3 or table[0] == 1), text  # broadcast over the batch
    # Where cos is not broadcast the same backward is right: the contracts drawing full tables pass.
    for contract in ("needs_input_grad", "layouts", "stability"):
        spec_language_zoo.passed(contract, "rotary_unbroadcast_backward")


@pytest.mark.parametrize("name", ["rotary", "varlen_attention", "cross_entropy_ignore_index", "sdpa_additive_mask"])
def test_repro_snippets_rebuild_the_new_input_kinds(name: str) -> None:
    import torch
    from hypothesis import HealthCheck, given, settings

    import reference_ops  # noqa: F401  (registers the specs)
    from conformance.spec import registered_spec
    from strategies import cases

    spec = registered_spec(name)

    @settings(max_examples=5, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases(spec, broadcast=True, layouts=("contiguous", "transposed")))
    def check(case) -> None:  # type: ignore[no-untyped-def]
        namespace: dict[str, object] = {}
        exec(case.repro(), namespace)  # builds the inputs, calls forward and backward
        for recipe, arg in zip(case.recipes, case.args(), strict=True):
            rebuilt = namespace[recipe.name]
            if isinstance(arg, torch.Tensor):
                assert isinstance(rebuilt, torch.Tensor) and torch.equal(rebuilt, arg), recipe.name
                assert rebuilt.stride() == arg.stride(), recipe.name
            else:
                assert rebuilt == arg, recipe.name

    check()
