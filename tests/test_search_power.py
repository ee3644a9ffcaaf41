"""The coverage phase finds bugs that live in one corner of the input space (tests/zoo/corner_bugs.py):
each is caught by its owner under the dev profile (its corners, then random examples), and each
correct twin passes. The
10-seed tables at dev and ci (every bug caught on every seed) are in the issue's closing note;
tests/strategies/test_coverage.py checks the corners themselves."""

from __future__ import annotations

import pytest

from tests.conftest import ZOO
from tests.zoo_runs import CORNER_OWNERS

# bug -> (owner, what the failing case must show: the corner that reaches it); a wrong gradient with the
# forward right is gradcheck's (reference meets it too, and is blocked by it)
CORNER_BUGS = {
    "causal_offset_short_queries": ("reference", "causal=True"),
    # A corner's forced size is tried smaller after a failure: reported at the first failing step.
    "tail_dropped_above_64": ("reference", "x: tensor(65,)"),
    "odd_length_pairs": ("gradcheck", ""),
    "single_row_fast_path": ("gradcheck", "x: tensor(1,"),
    "softmax_dim_not_last": ("gradcheck", ""),
    "negative_dim": ("return_count", "dim=-"),
    "zero_size_batch": ("return_count", "x: tensor(0,"),
    "per_token_grad_as_scalar": ("gradcheck", ""),
    "head_dim_not_multiple_of_16": ("gradcheck", "x: tensor(17, 1)"),
    "varlen_empty_sequence": ("gradcheck", ""),
    "rare_flag_branch": ("gradcheck", "mode='max'"),
    "ignore_index_present": ("gradcheck", "set to [-100]"),
    # The *batch group's many-rows corner (129 rows), tried again at fewer: 17 is past blocks of 4 rows.
    "row_blocks_last_only": ("gradcheck", "x: tensor(17, 1)"),
    # The same corner computes every gradient (every input requires grad there): dx's tail rows.
    "row_tail_unwritten": ("unwritten_memory", "x: tensor(17, 1)"),
    # The simplest vmap draw batches the first input last (every corner makes it).
    "vmap_out_dims_where_it_came_in": ("func", "in_dims=(1, None)"),
    # The n = 17 corner with ascending values: the maximum in the one-element last block.
    "online_max_in_last_block": ("reference", "x: tensor(17,)"),
    # L <= n: the big corner of L raises n with it.
    "bounded_dim_past_three": ("gradcheck", "w: tensor(17,)"),
    # Left padding masks key 0: under causal the first query sees no key (missed at dev seeds 0-2 before).
    "causal_left_padding_leak": ("reference", "left_padding; causal=True"),
    # The first rank-2 *batch corner is (2, 1): squeeze() drops the unit batch dim (missed at dev seeds 0-2 before).
    "squeeze_drops_unit_batch_dim": ("gradcheck", "x: tensor(2, 1, 1)"),
}


@pytest.fixture
def corners(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("corner_bugs")


@pytest.mark.parametrize("name", sorted(CORNER_BUGS))
def test_a_corner_bug_fails_its_owner_and_its_twin_passes(corners, name: str) -> None:  # type: ignore[no-untyped-def]
    owner, shows = CORNER_BUGS[name]
    text = corners.failed(owner, name)
    assert shows in text, text
    for contract in CORNER_OWNERS:
        outcome = corners.outcome(contract, f"{name}_ok")
        assert outcome in ("passed", "skipped"), f"{contract}[{name}_ok] {outcome}:\n{corners.verdict(contract, f'{name}_ok').text}"
    assert corners.outcome("reference", f"{name}_ok") == "passed"


def test_the_zoo_has_a_twin_for_every_bug(corners) -> None:  # type: ignore[no-untyped-def]
    assert corners.names() == set(CORNER_BUGS) | {f"{name}_ok" for name in CORNER_BUGS}


def test_verbose_runs_say_what_the_coverage_phase_reached(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "corner_bugs.py", "-v", "-k", "ignore_index_present_ok", contracts=("return_count",), max_examples=None)
    assert run.result is not None
    text = run.result.stdout.str()
    assert "what the coverage phase reached" in text
    line = next(line for line in text.splitlines() if line.startswith("ignore_index_present_ok: "))
    assert "corners: sizes up to 129 (n, c)" in line and "target sentinel fraction: 2/2 values" in line, line
    assert "c vs n: <, =, >" in line and "dtypes 2/2" in line, line


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_profile_meets_an_overflow_that_needs_extreme_magnitudes(conformance_run, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The corners leave what they do not force at its simplest; stability's extreme scales are a
    case kind of their own, and each dtype's case of an example takes the corner, so the default
    profile finds a naive softmax's overflow (benchmark figure 4 missed it on 3 of 3 runs)."""
    run = conformance_run(ZOO / "numeric_bugs.py", "-k", "naive_softmax or stable_softmax", f"--seed={seed}",
                          contracts=("stability",), max_examples=None)
    assert "float16" in run.failed("stability", "naive_softmax") or "float32" in run.failed("stability", "naive_softmax")
    run.passed("stability", "stable_softmax")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_profile_meets_an_overflow_at_the_dtypes_largest_magnitude(conformance_run, seed: int) -> None:  # type: ignore[no-untyped-def]
    """sqrt(sum(x * x)) overflows float32 from |x| ~ 2e19: the corners' scales 1 and 1e2 never reach
    it, the third corner scale (the dtype's largest, 1e30 in float32) does (soft-DTW at 1e10-1e100 in
    a new user's trial passed dev and ci before)."""
    run = conformance_run(ZOO / "numeric_bugs.py", "-k", "row_norm", f"--seed={seed}", contracts=("stability",), max_examples=None)
    assert "float32" in run.failed("stability", "naive_row_norm")
    run.passed("stability", "scaled_row_norm")
