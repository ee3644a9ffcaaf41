"""A test blocked by a defect whose owner did not fail is that defect's only report: it fails
(engine/verdict.owner_missed; the plugin's matrix at the end of the run, and check()).

Found by a new user's trial: an RMSNorm whose block loop kept only the last block's dweight. The
reference contract's own examples never had more than one block of rows and it passed; autocast's
check without autocast drew more rows, found the float32 defect, and was blocked by reference, so
the only evidence of the bug was a skip and the run exited 0.
"""

from __future__ import annotations

import pytest

from conformance.engine.verdict import Outcome, Unreported, owner_missed, unreported_defects
from conformance.plugin.outcomes import Cell, OutcomeMatrix
from tests.conftest import CONFORMANCE_DIR, ZOO

PASSED, FAILED, BLOCKED = Outcome.PASSED, Outcome.FAILED, Outcome.BLOCKED


def test_owner_missed_follows_the_owner_to_its_outcome() -> None:
    assert owner_missed("reference", {"reference": (FAILED, "")}) is None
    assert owner_missed("reference", {"reference": (Outcome.ERROR, "")}) is None
    assert owner_missed("reference", {"reference": (Outcome.XFAILED, "")}) is None  # the user expects it to fail
    assert owner_missed("reference", {"reference": (PASSED, "")}) == "reference passed on its own examples"
    assert owner_missed("reference", {"reference": (Outcome.NOT_APPLICABLE, "")}) == "reference not applicable on its own examples"
    assert owner_missed("reference", {}) == "reference did not run"
    # A chain of blocks ends where someone failed, or did not.
    assert owner_missed("grad_meta", {"grad_meta": (BLOCKED, "return_count"), "return_count": (FAILED, "")}) is None
    assert owner_missed("grad_meta", {"grad_meta": (BLOCKED, "return_count"), "return_count": (PASSED, "")}) == (
        "return_count passed on its own examples"
    )
    assert owner_missed("a", {"a": (BLOCKED, "b"), "b": (BLOCKED, "a")}) == "a is blocked in a circle"


def _blocked(owner: str, defect: str) -> Cell:
    return Cell("blocked", reason=f"blocked by {owner}: {defect}; see {owner}; case: x: tensor(5, 1)", owner=owner,
                rerun="python -m pytest ...")


def test_the_first_test_blocked_by_a_passing_owner_fails_and_the_others_are_blocked_by_it() -> None:
    matrix = OutcomeMatrix()
    defect = "FusedRMSNorm is wrong without autocast too: not autocast's defect"
    matrix.record("rms", "cpu", "reference", Cell("passed"))
    matrix.record("rms", "cpu", "autocast", _blocked("reference", defect))
    matrix.record("rms", "cpu", "compile", _blocked("reference", "compiled output differs"))
    # Another row, whose owner did fail: its blocked cell stays blocked.
    matrix.record("tanh", "cpu", "return_count", Cell("failed", reason="2 gradients, but should be 1"))
    matrix.record("tanh", "cpu", "grad_meta", _blocked("return_count", "2 gradients"))

    assert matrix.report_unowned_defects() == [("rms", "cpu", "autocast")]

    failed = matrix.cell("rms", "cpu", "autocast")
    assert failed is not None and failed.outcome == "failed" and failed.tier == "defect" and not failed.owner
    assert failed.reason.startswith(defect) and "reference passed on its own examples" in failed.reason, failed.reason
    assert "case: x: tensor(5, 1)" in failed.message and failed.rerun
    compile_cell = matrix.cell("rms", "cpu", "compile")
    assert compile_cell is not None and compile_cell.outcome == "blocked" and compile_cell.owner == "autocast"
    assert compile_cell.reason.startswith("blocked by autocast: compiled output differs"), compile_cell.reason
    still = matrix.cell("tanh", "cpu", "grad_meta")
    assert still is not None and still.outcome == "blocked" and still.owner == "return_count"
    assert matrix.totals()["failed"] == 2 and "FAILED" in matrix.totals_line()


def test_a_chain_of_blocks_whose_owner_did_not_run_has_one_reporter_the_nearest_to_the_owner() -> None:
    """check(contracts=["reference", "autocast"]) on a wrong backward: reference is blocked by
    gradcheck (not run), autocast by reference. One defect: reference reports it, autocast stays
    blocked by reference (both failed before: one report per blocked test)."""
    row = {"autocast": (BLOCKED, "reference"), "reference": (BLOCKED, "gradcheck"), "stability": (BLOCKED, "reference")}
    why = "gradcheck did not run"
    assert unreported_defects(row) == {
        "autocast": Unreported("reference", why), "reference": Unreported("reference", why), "stability": Unreported("reference", why),
    }
    # An owner that failed reports its chain; two defects of a row each get their own reporter.
    assert unreported_defects({"autocast": (BLOCKED, "reference"), "reference": (BLOCKED, "gradcheck"), "gradcheck": (FAILED, "")}) == {}
    two = unreported_defects({"layouts": (BLOCKED, "return_count"), "return_count": (PASSED, ""), "compile": (BLOCKED, "opcheck")})
    assert {c: u.reporter for c, u in two.items()} == {"layouts": "layouts", "compile": "compile"}

    # A circle (two defects, each contract blocked by the other's) has one reporter whatever else the
    # row holds: the circle's end is its first member by name (it was where a walk of len(row) steps stopped).
    circle = {"reference": (BLOCKED, "gradcheck"), "gradcheck": (BLOCKED, "reference"), "autocast": (BLOCKED, "reference")}
    for extra in ({}, {"layouts": (PASSED, "")}, {"layouts": (PASSED, ""), "func": (PASSED, "")}):
        assert {c: u.reporter for c, u in unreported_defects({**circle, **extra}).items()} == {
            "reference": "reference", "gradcheck": "reference", "autocast": "reference",
        }, extra

    matrix = OutcomeMatrix()
    matrix.record("scale", "cpu", "autocast", _blocked("reference", "ScaleForgotten is wrong without autocast too"))
    matrix.record("scale", "cpu", "reference", _blocked("gradcheck", "first derivatives are already wrong on this case"))
    assert matrix.report_unowned_defects() == [("scale", "cpu", "reference")]
    autocast = matrix.cell("scale", "cpu", "autocast")
    assert autocast is not None and autocast.outcome == "blocked" and autocast.owner == "reference", autocast
    reference = matrix.cell("scale", "cpu", "reference")
    assert reference is not None and reference.outcome == "failed" and "gradcheck did not run" in reference.reason, reference


def test_a_run_whose_only_report_of_a_defect_is_a_block_fails(pytester: pytest.Pytester) -> None:
    """grad_meta alone on a Function whose backward returns one gradient too many: return_count owns
    that defect and is not selected, so grad_meta's block is the defect's only report."""
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={ZOO / 'core_bugs.py'}", "--device=cpu", "--max-examples=2",
        "--contracts=grad_meta", "-k", "extra_grad", "-p", "no:cacheprovider",
    )
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text[-3000:]
    # The test reported a skip (blocked); the suite made it the defect's failure at the end, and
    # pytest's own counts and summary say so too (a new user read "1 skipped" beside a FAIL line).
    assert result.parseoutcomes().get("failed") == 1 and "skipped" not in result.parseoutcomes(), text[-3000:]
    assert "FAILED" in text.split("short test summary info", 1)[-1] and "test_grad_meta[extra_grad-cpu]" in text, text[-3000:]
    assert "[found by grad_meta, blocked by return_count, but return_count did not run" in text, text[-3000:]


def test_a_blocked_cell_whose_owner_is_blocked_names_the_failure_at_the_chains_end() -> None:
    """One defect, one failure: stability blocked by reference, itself blocked by gradcheck (which
    failed), says so (a new user read "blocked by reference" and looked for reference's failure)."""
    matrix = OutcomeMatrix()
    matrix.record("dot", "cpu", "gradcheck", Cell("failed", reason="analytical grad['w'] != numerical"))
    matrix.record("dot", "cpu", "reference", _blocked("gradcheck", "analytical grad['w'] != numerical"))
    matrix.record("dot", "cpu", "stability", _blocked("reference", "RowDot is outside the reference rule at ordinary magnitudes too"))
    matrix.record("dot", "cpu", "autocast", _blocked("reference", "RowDot is wrong without autocast too"))
    # A chain that ends at no failure is left to report_unowned_defects; a circle changes nothing.
    matrix.record("loop", "cpu", "reference", _blocked("gradcheck", "x"))
    matrix.record("loop", "cpu", "gradcheck", _blocked("reference", "y"))
    assert matrix.name_chain_roots() == [("dot", "cpu", "autocast"), ("dot", "cpu", "stability")]
    stability = matrix.cell("dot", "cpu", "stability")
    assert stability is not None and stability.outcome == "blocked" and stability.owner == "gradcheck", stability
    assert stability.reason.startswith(
        "blocked by gradcheck (through reference): RowDot is outside the reference rule at ordinary magnitudes too"
    ), stability.reason
    reference = matrix.cell("dot", "cpu", "reference")
    assert reference is not None and reference.owner == "gradcheck" and reference.reason.startswith("blocked by gradcheck: analytical")
    assert matrix.cell("loop", "cpu", "reference") == _blocked("gradcheck", "x")
