"""Expectations files (known deviations) and the Functions x contracts report."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFORMANCE_DIR, ZOO


def _run(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={ZOO / 'core_bugs.py'}", "--device=cpu", "--max-examples=3",
        "--contracts=grad_meta", "-p", "no:cacheprovider", *extra,
    )


def test_expected_deviation_xfails_and_stale_entries_are_reported(pytester: pytest.Pytester) -> None:
    expectations = pytester.path / "expectations.json"
    expectations.write_text(json.dumps({
        "grad_meta[wrong_dtype_grad-cpu]": "fp32 accumulation buffer, fix tracked in #12",
        "grad_meta[missing_transpose-cpu]": "a deviation that no longer exists",
        "gradcheck[renamed_op-cpu]": "an op that was renamed",
    }))
    result = _run(pytester, f"--expectations={expectations}", "-rx")
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed") == 1 and outcomes.get("failed") == 2  # the two unreduced-gradient bugs
    text = result.stdout.str()
    assert "expected deviation: fp32 accumulation buffer" in text
    assert "grad_meta[missing_transpose-cpu]: passed, the deviation is gone" in text
    assert "gradcheck[renamed_op-cpu]: matches no collected test" in text


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", '{"grad_meta[x-cpu]": ""}'])
def test_bad_expectations_file_is_a_usage_error(pytester: pytest.Pytester, content: str) -> None:
    path = pytester.path / "bad.json"
    path.write_text(content)
    result = _run(pytester, f"--expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--expectations={path}" in result.stderr.str()


def test_report_matrix(pytester: pytest.Pytester) -> None:
    report = pytester.path / "out" / "conformance"
    _run(pytester, f"--conformance-report={report}")
    data = json.loads((report.parent / "conformance.json").read_text())
    assert data["results"]["wrong_dtype_grad-cpu"]["grad_meta"] == "failed"
    assert data["results"]["missing_transpose-cpu"]["grad_meta"] == "passed"
    assert any("6 Functions registered" in line for line in data["header"])
    markdown = (report.parent / "conformance.md").read_text()
    assert "| wrong_dtype_grad-cpu | **FAIL** |" in markdown
