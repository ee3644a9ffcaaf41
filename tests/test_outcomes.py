"""Expectations files (known deviations), their staleness serially and under xdist, strict mode,
and the report files a run writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CONFORMANCE_DIR, ZOO

GRAD_META = (str(CONFORMANCE_DIR), f"--impl={ZOO / 'core_bugs.py'}", "--device=cpu", "--max-examples=3", "--contracts=grad_meta")

ENTRIES = {
    "grad_meta[wrong_dtype_grad-cpu]": "fp32 accumulation buffer, fix tracked in #12",
    "grad_meta[missing_transpose-cpu]": "a deviation that no longer exists",
    "gradcheck[renamed_op-cpu]": "an op that was renamed",
    # Not collected by --contracts=grad_meta, but a real test of a registered Function: not stale.
    "gradcheck[extra_grad-cpu]": "a test this run does not select",
}


def _run(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(*GRAD_META, "-p", "no:cacheprovider", *extra)


def _write(pytester: pytest.Pytester, entries: object) -> Path:
    path = pytester.path / "expectations.json"
    path.write_text(json.dumps(entries))
    return path


def test_expected_deviation_xfails_and_stale_entries_are_reported(pytester: pytest.Pytester) -> None:
    result = _run(pytester, f"--expectations={_write(pytester, ENTRIES)}", "-rx")
    outcomes = result.parseoutcomes()
    # the two unreduced-gradient bugs, and the two return-count bugs grad_meta reports (their owner
    # is not selected): pytest's counts are the suite's
    assert outcomes.get("xfailed") == 1 and outcomes.get("failed") == 4
    assert outcomes.get("xpassed") == 1  # missing_transpose passes grad_meta
    text = result.stdout.str()
    assert "expected deviation grad_meta[wrong_dtype_grad-cpu]: fp32 accumulation buffer" in text
    assert "grad_meta[missing_transpose-cpu]: passed, the deviation is gone" in text
    assert "gradcheck[renamed_op-cpu]: matches no test of the registered Functions" in text
    assert "gradcheck[extra_grad-cpu]" not in text.split("stale expectations")[1]
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def _stale_lines(result: pytest.RunResult, path: Path) -> list[str]:
    prefix = f"{path}: "
    return sorted(line.removeprefix(prefix) for line in result.stdout.str().splitlines() if line.startswith(prefix))


def test_staleness_is_the_same_serially_and_under_xdist(pytester: pytest.Pytester) -> None:
    """Workers collect and run; the controller decides staleness from reports (issue: under -n 2
    every matched entry used to be reported as matching nothing)."""
    path = _write(pytester, ENTRIES)
    serial = pytester.runpytest_subprocess(*GRAD_META, f"--expectations={path}")
    parallel = pytester.runpytest_subprocess(*GRAD_META, f"--expectations={path}", "-n", "2")
    assert _stale_lines(serial, path) == _stale_lines(parallel, path) == [
        "grad_meta[missing_transpose-cpu]: passed, the deviation is gone",
        "gradcheck[renamed_op-cpu]: matches no test of the registered Functions",
    ]
    # xdist's controller does not count deselected items; every verdict is the same.
    assert {**serial.parseoutcomes(), "deselected": 0} == {**parallel.parseoutcomes(), "deselected": 0}


def test_strict_expectations_fail_the_run_on_a_stale_entry(pytester: pytest.Pytester) -> None:
    # Only a stale entry, no failing test selected: the run would pass without strict mode.
    path = _write(pytester, {"grad_meta[renamed_op-cpu]": "renamed since"})
    lenient = _run(pytester, f"--expectations={path}", "-k", "missing_transpose")
    assert lenient.ret == pytest.ExitCode.OK
    strict = _run(pytester, f"--expectations={path}", "--strict-expectations", "-k", "missing_transpose")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    assert "stale expectations (strict: the run fails)" in strict.stdout.str()


def test_strict_expectations_fail_an_xpass(pytester: pytest.Pytester) -> None:
    path = _write(pytester, {"grad_meta[missing_transpose-cpu]": "gone"})
    result = _run(pytester, f"--expectations={path}", "--strict-expectations", "-k", "missing_transpose")
    assert result.parseoutcomes().get("failed") == 1
    assert "XPASS(strict)" in result.stdout.str()


def test_entries_select_by_function_contract_and_dtype(pytester: pytest.Pytester) -> None:
    path = _write(pytester, [
        # wrong_dtype_grad returns float32 gradients: wrong for float64 inputs, where it shrinks to.
        {"function": "wrong_dtype_grad", "dtype": "float64", "reason": "fp32 grads by design"},
        # unreduced_bias_grad fails in float64 too: an entry for float16 must not hide that.
        {"function": "unreduced_bias_grad", "dtype": "float16", "reason": "fp16 only"},
        # Every contract of one Function.
        {"function": "unreduced_broadcast_mul", "reason": "known, tracked in #7"},
    ])
    result = _run(pytester, f"--expectations={path}", "-rxf")
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == 2 and outcomes.get("failed") == 3, outcomes  # with the two return-count bugs
    text = result.stdout.str()
    assert "expected deviation [function=wrong_dtype_grad, dtype=float64]: fp32 grads by design" in text
    assert "FAILED" in text and "unreduced_bias_grad" in text.split("short test summary")[1]


def test_a_dtype_entry_whose_dtype_passes_is_stale_and_fails_when_strict(pytester: pytest.Pytester) -> None:
    path = _write(pytester, [{"function": "missing_transpose", "contract": "grad_meta", "dtype": "float64", "reason": "old"}])
    result = _run(pytester, f"--expectations={path}", "-k", "missing_transpose")
    assert result.ret == pytest.ExitCode.OK
    assert "[contract=grad_meta, function=missing_transpose, dtype=float64]: passed, the deviation is gone" in result.stdout.str()
    strict = _run(pytester, f"--expectations={path}", "--strict-expectations", "-k", "missing_transpose")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    assert "expected deviation [contract=grad_meta, function=missing_transpose, dtype=float64] did not occur" in strict.stdout.str()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[1, 2]", "entry 0 is a int, not an object"),
        ("{not json", "not valid JSON"),
        ('{"grad_meta[x-cpu]": ""}', "'grad_meta[x-cpu]' has no reason"),
        ('{"grad_meta": "why"}', "key 'grad_meta' is not of the form contract[name-device]"),
        ('[{"reason": "why"}]', "entry 0 selects every test"),
        ('[{"function": "f"}]', "entry 0 has no reason"),
        ('[{"function": "f", "dtype": "float8", "reason": "r"}]', "dtype 'float8' is not one of"),
        ('[{"functon": "f", "reason": "r"}]', "entry 0 has unknown keys ['functon']"),
        ('"text"', "got a JSON str"),
    ],
)
def test_bad_expectations_file_is_a_usage_error(pytester: pytest.Pytester, content: str, problem: str) -> None:
    path = pytester.path / "bad.json"
    path.write_text(content)
    result = _run(pytester, f"--expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--expectations={path}" in result.stderr.str() and problem in result.stderr.str()


def test_report_files(pytester: pytest.Pytester) -> None:
    report = pytester.path / "out" / "conformance"
    _run(pytester, f"--conformance-report={report}", "--seed=7", "--profile=ci")
    data = json.loads((report.parent / "conformance.json").read_text())
    assert data["schema_version"] == 3
    assert data["run"]["seed"] == 7 and data["run"]["profile"] == "ci" and data["run"]["devices"] == ["cpu"]
    assert data["run"]["triton"].split(" (")[0] in ("interpreted", "native", "not installed")
    assert data["matrix"]["wrong_dtype_grad-cpu"]["grad_meta"] == "failed"
    assert data["matrix"]["missing_transpose-cpu"]["grad_meta"] == "passed"
    failed = next(c for c in data["results"] if c["function"] == "wrong_dtype_grad")
    assert failed["reason"].startswith("grad['x'].dtype=torch.float32, but should be torch.float64")
    assert Path(failed["repro"]).is_file() and Path(failed["repro"]).parent == report.parent / "conformance.repro"
    assert "--seed=7" in failed["rerun"] and "--profile=ci" in failed["rerun"]
    assert "| wrong_dtype_grad-cpu | **FAIL** |" in (report.parent / "conformance.md").read_text()
    assert "wrong_dtype_grad" in (report.parent / "conformance.html").read_text()


def test_a_whole_functions_entry_is_met_while_one_of_its_tests_deviates(pytester: pytest.Pytester) -> None:
    # A new user's trial: a Function-wide entry, as the README shows, was called stale ("passed,
    # the deviation is gone") while its failing contract was xfailed, each passing contract was an
    # XPASS, and --strict-expectations failed every one of them.
    path = _write(pytester, [{"function": "wrong_dtype_grad", "reason": "fp32 grads by design, #3"},
                             {"function": "missing_transpose", "reason": "fixed since"}])
    args = (str(CONFORMANCE_DIR), f"--impl={ZOO / 'core_bugs.py'}", "--device=cpu", "--max-examples=3",
            "--contracts=grad_meta,return_count", "-p", "no:cacheprovider", f"--expectations={path}", "--strict-expectations")
    met = pytester.runpytest_inprocess(*args, "-k", "wrong_dtype_grad")
    assert met.ret == pytest.ExitCode.OK, met.stdout.str()
    outcomes = met.parseoutcomes()
    assert outcomes.get("xfailed") == 1 and not outcomes.get("failed"), outcomes  # grad_meta deviates; return_count passes
    text = met.stdout.str()
    assert "[function=wrong_dtype_grad]: passed, the deviation is gone" not in text, text
    assert "XPASS return_count" not in text and "wrong_dtype_grad-cpu  x  ." in text, text  # the matrix: a pass
    gone = pytester.runpytest_inprocess(*args, "-k", "missing_transpose")
    assert "[function=missing_transpose]: passed, the deviation is gone" in gone.stdout.str()
    assert gone.ret == pytest.ExitCode.TESTS_FAILED  # strict: a stale entry fails the run
