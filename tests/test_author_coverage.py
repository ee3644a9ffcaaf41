"""--author-coverage: the lines and branches of each Function's own code that no example ran, named
by file and line in the terminal summary and the JSON, Markdown and HTML reports, serially and under
xdist; the pieces (regions, gaps, runs of lines, union of shards) on fake records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engine.author_code import Executed, Gap, Region, gaps_of
from conformance.plugin.outcomes import author_code_from_json, author_code_json
from tests.conftest import CONFORMANCE_DIR, ZOO

GAPS = ZOO / "author_code_gaps.py"
BRANCH = (
    "author_code_gaps.py:36 [backward] never ran: return _chunked_expand(g, ctx.shape); "
    "the branch at author_code_gaps.py:35 never went there: if math.prod(ctx.shape) > 1 << 20"
)
HELPER = "author_code_gaps.py:21-24 [helper _chunked_expand] never ran: out = g.new_empty(shape)"


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(CONFORMANCE_DIR), f"--impl={GAPS}", "--device=cpu", "--author-coverage",
         "--contracts=gradcheck,reference,return_count", "-p", "no:cacheprovider", "-q",
         f"--conformance-report={tmp_path / 'report'}", *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.parametrize("mode", [(), ("-n", "2")], ids=["serial", "xdist-2"])
def test_a_branch_no_budget_reaches_is_named_by_file_and_line(tmp_path: Path, mode: tuple[str, ...]) -> None:
    done = _run(tmp_path, *mode)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.split("author code no example ran", 1)[-1]
    assert BRANCH in summary and HELPER in summary, done.stdout[-3000:]
    assert "chunked_sum: 2 never ran" in summary and "scaled_rows" not in summary, summary
    whole = json.loads((tmp_path / "report.json").read_text())
    assert whole["coverage_phase"]["chunked_sum"].startswith("5 corners: sizes up to 129 (n); *batch ranks 0, 1, 2, (2, 1), 129 rows")  # the profile's corners
    report = whole["author_code"]
    assert report["scaled_rows"]["gaps"] == []  # every line ran: under xdist too (the workers' records arrived)
    assert {r["label"] for r in report["scaled_rows"]["regions"]} == {"forward", "backward"}  # and it was measured
    texts = [gap["text"] for gap in report["chunked_sum"]["gaps"]]
    assert any(t.startswith(BRANCH) for t in texts) and any(t.startswith(HELPER) for t in texts), texts
    markdown = (tmp_path / "report.md").read_text()
    assert BRANCH.replace(">", "&gt;").replace("<", "&lt;") in markdown and "## What the coverage phase reached" in markdown
    html = (tmp_path / "report.html").read_text()
    assert 'id="author-code"' in html and html.count('class="missed"') == 5  # lines 21-24 and 36
    assert html.count('class="partial"') == 1  # the branch line 35, one way of which never ran


def test_with_isolate_it_is_a_usage_error(tmp_path: Path) -> None:
    done = _run(tmp_path, "--isolate")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--author-coverage with --isolate" in done.stderr


REGION = Region("backward", "/src/k.py", frozenset({10, 11, 12, 14, 15}), frozenset({(11, 12), (11, 14)}))


def test_gaps_are_runs_of_statements_and_branch_ways_never_taken() -> None:
    ran = Executed({"/src/k.py": {10, 11, 14}}, {"/src/k.py": {(10, 11), (11, 14)}})
    gaps = gaps_of([REGION], ran)
    # line 12 never ran, and the branch at 11 never went there: one gap naming both
    assert [(g.line, g.last, g.target, g.branch) for g in gaps] == [(12, 12, None, 11), (15, 15, None, 0)]
    taken_elsewhere = Executed({"/src/k.py": {10, 11, 12, 14, 15}}, {"/src/k.py": {(10, 11), (11, 14)}})
    assert [(g.line, g.target) for g in gaps_of([REGION], taken_elsewhere)] == [(11, 12)]  # 12 ran, not from 11
    everything = Executed({"/src/k.py": set(REGION.lines)}, {"/src/k.py": set(REGION.branches)})
    assert gaps_of([REGION], everything) == []
    nothing = gaps_of([REGION], Executed())
    assert [(g.line, g.last) for g in nothing] == [(10, 15)]  # one run; an unrun branch line is its lines' gap
    assert Gap("helper f", "/src/k.py", 3, last=5).describe().startswith("k.py:3-5 [helper f] never ran")


def test_shards_merge_by_union_of_what_ran() -> None:
    one = Executed({"/src/k.py": {10, 11}}, {"/src/k.py": {(11, 12)}})
    other = Executed({"/src/k.py": {12, 14, 15}}, {"/src/k.py": {(11, 14)}})
    stored = json.loads(json.dumps(author_code_json({"k": ((REGION,), one)}, {"k": gaps_of([REGION], one)})))
    regions, executed = author_code_from_json(stored)["k"]
    assert regions == (REGION,) and executed.lines == one.lines and executed.arcs == one.arcs
    executed.update(other)
    assert gaps_of(regions, executed) == []
