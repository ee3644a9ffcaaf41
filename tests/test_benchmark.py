"""benchmarks/run.py works: the README's performance command, in its quick form, prints every
figure with numbers. It checks that the script runs, not how fast the suite is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_docs import DOC  # .ci/doc_blocks.py, loaded once

BLOCK = "benchmark"  # <!-- doc-run: benchmark --> in the README's "Performance" section
QUICK = "--quick --runs 1"
HEADERS = (
    "## 1. Default run",
    "## 2. Suite vs bare loop",
    "## 3. gradcheck cost vs numel",
    "## 4. Time to first failure",
    "## 5. Start-up",
    "## 6. Memory checks cost",
)
NUMBER = re.compile(r"\| -?\d[\d.]*(e[+-]?\d+)? (s|ms|µs)\b")  # a table cell holding a duration


def benchmark_command() -> str:
    """The README's shell block named ``benchmark``, parsed by .ci/doc_blocks.py."""
    found = [b for b in DOC.blocks(REPO) if b.kind == "run" and b.name == BLOCK]
    assert len(found) == 1, f"exactly one shell block named {BLOCK!r} in the docs, found {len(found)}"
    assert found[0].language == "bash"
    lines = [line for line in found[0].text.splitlines() if line.strip()]
    assert lines == ["python benchmarks/run.py"], f"the documented command changed: {lines}"
    return lines[0]


def test_benchmark_quick_run_prints_every_figure(tmp_path: Path) -> None:
    pytest.importorskip("xdist")  # figure 1 runs the suite with -n 2
    command = f"{benchmark_command()} {QUICK} --json {tmp_path / 'numbers.json'}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` is this environment's
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    report = done.stdout
    assert done.returncode == 0, report[-4000:] + done.stderr[-4000:]
    assert report.startswith("# autograd-conformance benchmark"), report[:500]
    assert re.search(r"- date: \d{4}-\d\d-\d\d", report) and "`nproc` = " in report and "torch " in report
    sections = re.split(r"^(?=## )", report, flags=re.M)
    for header in HEADERS:
        section = next((s for s in sections if s.startswith(header)), None)
        assert section is not None, f"no section {header!r} in:\n{report}"
        assert "**not measured**" not in section, section
        assert NUMBER.search(section), f"no numeric cell under {header!r}:\n{section}"
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert numbers["quick"] and set(numbers["figures"]) == {"1", "2", "3", "4", "5", "6"}
    assert numbers["figures"]["1"]["serial"][0]["wall"] > 0
    main_job = [numbers["figures"]["1"][key][0] for key in ("main_job", "main_job_no_corners", "main_job_xdist")]
    assert len(main_job) == 3 and all(run["cpu"] > 0 and "passed" in run["summary"] for run in main_job), main_job
    assert "no coverage phase" in report and "CPU with corners / without" in report and "Main job `-n 2` speed-up" in report
    assert all(bug["found"] == 1 for bug in numbers["figures"]["4"].values()), numbers["figures"]["4"]
    assert len(numbers["figures"]["6"]) == 3 and all(runs[0]["cpu"] > 0 for runs in numbers["figures"]["6"].values())


def test_children_run_as_a_users_shell_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures are what a user gets: no thread override, and bytecode caches on (a sandbox's
    PYTHONDONTWRITEBYTECODE made every measured process recompile the suite)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench_common = pytest.importorskip("bench_common")
    for name in ("OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("KEPT_FOR_THE_CHILD", "yes")
    env = bench_common.child_env({"EXTRA": "x"})
    assert not {"OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS"} & set(env), sorted(env)
    assert env["KEPT_FOR_THE_CHILD"] == "yes" and env["EXTRA"] == "x"
