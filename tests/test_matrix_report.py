"""The outcome matrix and its reports, built by hand (no plugin run): terminal lines, JSON, Markdown,
and HTML rendered by a real headless Chromium when one is installed."""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conformance.plugin import outcomes
from conformance.plugin.html_report import anchor_id, render_html
from conformance.plugin.outcomes import OUTCOMES, Cell, OutcomeMatrix, RunInfo
from conformance.plugin.reports import write_reports

CONTRACTS = (
    "determinism", "devices", "grad_meta", "gradcheck", "gradgradcheck", "inplace", "layouts",
    "needs_input_grad", "reference", "return_count", "saved_tensors", "stability", "undefined_grads",
    "unneeded_grads",
)
FUNCTIONS = ("scaled_softmax", "layer_norm_with_a_rather_long_name", "bias_grad_summed", "fused_attention")
NO_CUDA = "CUDA is not available on this machine (torch.cuda.is_available() is False)"
EVIL = 'grad mismatch <script>alert("x")</script> & more'
REPRO = "conformance-repros/grad_meta-bias_grad_summed-cpu.py"
RERUN = "pytest 'conformance/test_grad_meta.py::test_grad_meta[bias_grad_summed-cpu]' --seed=0"


def run_info() -> RunInfo:
    return RunInfo(
        seed=7, profile="ci", max_examples=10, impl="tests/zoo/core_bugs.py", devices=("cpu", "cuda"),
        dtypes=("float32", "float64"), device_description="cpu only (CUDA not available)", triton="interpreted",
        versions={"torch": "2.13.0", "hypothesis": "6.100.0", "pytest": "9.2.0", "python": "3.11.2",
                  "triton": "3.7.1", "autograd-conformance": "0.1.0"},
        command="pytest conformance --impl=tests/zoo/core_bugs.py --seed=7 --profile=ci",
        header=("autograd-conformance: 4 Functions registered",),
    )


def sample() -> OutcomeMatrix:
    """Every outcome kind, a failure whose message carries HTML, and a CUDA row set that never ran."""
    matrix = OutcomeMatrix()
    for function in FUNCTIONS:
        for contract in CONTRACTS:
            matrix.record(function, "cpu", contract, Cell("passed", duration=0.25))
            matrix.record(function, "cuda", contract, Cell("not_run_here", NO_CUDA))
    matrix.record("bias_grad_summed", "cpu", "grad_meta", Cell(
        "failed", "grad['b'].shape=(), but should be (4,)", 0.5, REPRO,
        f"[grad_meta] BiasGradSummed: {EVIL}\n  case: torch.float64 on cpu\n  rerun: {RERUN}", RERUN,
    ))
    matrix.record("bias_grad_summed", "cpu", "reference", Cell("blocked", "blocked by grad_meta: grad['b'].shape=()", owner="grad_meta"))
    matrix.record("bias_grad_summed", "cpu", "layouts", Cell("blocked", "blocked by grad_meta: grad['b'].shape=()", owner="grad_meta"))
    matrix.record("scaled_softmax", "cpu", "gradgradcheck", Cell("error", "fixture 'tmp' raised", message="Traceback\n  boom"))
    matrix.record("scaled_softmax", "cpu", "undefined_grads", Cell("not_applicable", "single-output spec"))
    matrix.record("layer_norm_with_a_rather_long_name", "cpu", "undefined_grads", Cell("not_applicable", "single-output spec"))
    matrix.record("scaled_softmax", "cpu", "devices", Cell("skipped", "the -cpu id has nothing to compare against"))
    matrix.record("fused_attention", "cpu", "unneeded_grads", Cell("waived", 'waived by spec "fused": one kernel'))
    matrix.record("fused_attention", "cpu", "stability", Cell("xfailed", "expected deviation: fp16 overflow"))
    matrix.record("fused_attention", "cpu", "determinism", Cell("xpassed", "expected deviation: atomics"))
    return matrix


# ---------------------------------------------------------------------- the API


def test_cell_rejects_unknown_outcome_and_echoes_it() -> None:
    with pytest.raises(ValueError, match=r"'passd'"):
        Cell("passd")
    assert {Cell(o).outcome for o in OUTCOMES} == set(OUTCOMES)


def test_failed_setup_or_teardown_outranks_a_passed_call() -> None:
    matrix = OutcomeMatrix()
    matrix.record("f", "cpu", "gradcheck", Cell("error", "setup failed"))
    matrix.record("f", "cpu", "gradcheck", Cell("passed"))
    matrix.record("f", "cpu", "reference", Cell("passed"))
    matrix.record("f", "cpu", "reference", Cell("error", "teardown failed"))
    assert matrix.cell("f", "cpu", "gradcheck") == Cell("error", "setup failed")
    assert matrix.cell("f", "cpu", "reference") == Cell("error", "teardown failed")
    with pytest.raises(ValueError, match="device"):
        matrix.record("f", "", "gradcheck", Cell("passed"))


def test_totals_and_failures() -> None:
    matrix = sample()
    totals = matrix.totals()
    assert list(totals) == list(OUTCOMES)
    assert sum(totals.values()) == len(FUNCTIONS) * 2 * len(CONTRACTS) == len(matrix)
    assert totals["not_run_here"] == 56 and totals["failed"] == 1 and totals["blocked"] == 2
    assert totals["passed"] == 56 - 10
    assert [(f, d, c, cell.outcome) for f, d, c, cell in matrix.failures()] == [
        ("bias_grad_summed", "cpu", "grad_meta", "failed"),
        ("fused_attention", "cpu", "determinism", "xpassed"),
        ("scaled_softmax", "cpu", "gradgradcheck", "error"),
    ]


# ---------------------------------------------------------------------- terminal


def test_terminal_default_table_fits_and_groups_not_run_here() -> None:
    lines = sample().terminal_lines(verbosity=0)
    text = "\n".join(lines)
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("autograd-conformance:"))]
    assert max(map(len, table)) <= 120, text
    header = lines[0].split()
    assert header[0] == "Function-device" and header[1:] == [str(i) for i in range(1, 15)]
    row = next(line for line in lines if line.startswith("bias_grad_summed-cpu"))
    # columns: 1 determinism, 2 devices, 3 grad_meta, 7 layouts, 9 reference
    assert row.split()[1:] == [".", ".", "F", ".", ".", ".", "b", ".", "b", ".", ".", ".", ".", "."]
    assert not any(line.startswith(f"{f}-cuda") for line in lines for f in FUNCTIONS)  # collapsed, not half the table
    assert "+ 4 rows not run here: all cuda rows (56 tests; reason below)" in lines
    assert f"56 tests not run here: {NO_CUDA}" in lines
    assert sum("not run here:" in line for line in lines) == 2  # one collapsed-rows line, one per reason
    assert "columns: 1 determinism  2 devices  3 grad_meta" in text and "14 unneeded_grads" in text
    assert "legend: . pass  a advice  u upstream (torch)  F FAIL  E ERROR  x xfail  X XPASS  b blocked" in text
    assert ("autograd-conformance: 112 contract tests, FAILED: 46 passed, 1 failed, 1 error, 1 xfailed, 1 xpassed, "
            "2 blocked, 1 waived, 2 n/a, 56 not run here, 1 skipped") in lines
    assert f"FAIL grad_meta[bias_grad_summed-cpu]: grad['b'].shape=(), but should be (4,) (repro: {REPRO})" in lines
    assert "ERROR gradgradcheck[scaled_softmax-cpu]: fixture 'tmp' raised" in lines
    assert "XPASS determinism[fused_attention-cpu]: expected deviation: atomics" in lines


def test_terminal_quiet_levels() -> None:
    matrix = sample()
    quiet = matrix.terminal_lines(verbosity=-1)
    assert quiet[0].startswith("autograd-conformance: 112 contract tests, FAILED")
    assert quiet[1].startswith("56 tests not run here: CUDA is not available")
    assert [line.split()[0] for line in quiet[2:]] == ["FAIL", "XPASS", "ERROR"]
    assert matrix.terminal_lines(verbosity=-2) == [quiet[0]]
    verbose = matrix.terminal_lines(verbosity=1)
    assert "2 n/a: single-output spec" in verbose and "1 waived: waived by spec \"fused\": one kernel" in verbose


def test_terminal_cuts_long_reasons_below_verbose_and_groups_distinct_not_run_reasons() -> None:
    matrix = OutcomeMatrix()
    long_reason = "x" * 400
    matrix.record("f", "cpu", "reference", Cell("failed", long_reason))
    for i in range(300):
        matrix.record(f"f{i:03d}", "cuda", "reference", Cell("not_run_here", NO_CUDA))
    matrix.record("g", "cpu", "devices", Cell("not_run_here", "needs two GPUs"))
    matrix.record("g", "cpu", "reference", Cell("passed"))
    lines = matrix.terminal_lines(verbosity=0)
    assert f"300 tests not run here: {NO_CUDA}" in lines and "1 test not run here: needs two GPUs" in lines
    assert sum("tests not run here" in line or "test not run here" in line for line in lines) == 2
    fail = next(line for line in lines if line.startswith("FAIL"))
    assert fail.endswith("…") and len(fail) < 200
    assert long_reason in matrix.terminal_lines(verbosity=1)[-1]


# ---------------------------------------------------------------------- files


def test_json_report(tmp_path: Path) -> None:
    paths = write_reports(sample(), tmp_path / "out" / "conformance", run_info())
    assert [p.name for p in paths] == ["conformance.json", "conformance.md", "conformance.html"]
    data = json.loads(paths[0].read_text())
    assert data["schema_version"] == 3
    assert data["run"]["seed"] == 7 and data["run"]["max_examples"] == 10 and data["run"]["devices"] == ["cpu", "cuda"]
    assert data["run"]["versions"]["torch"] == "2.13.0" and data["run"]["header"] == ["autograd-conformance: 4 Functions registered"]
    assert data["totals"]["failed"] == 1 and set(data["totals"]) == set(OUTCOMES)
    assert len(data["results"]) == 112  # every cell, the collapsed CUDA rows included
    assert data["matrix"]["bias_grad_summed-cpu"]["grad_meta"] == "failed"
    assert data["matrix"]["fused_attention-cuda"]["reference"] == "not_run_here"
    failed = next(r for r in data["results"] if r["outcome"] == "failed")
    assert failed["repro"] == REPRO and failed["rerun"] == RERUN and "<script>" in failed["message"]
    assert "message" not in next(r for r in data["results"] if r["outcome"] == "passed")
    keys = [(r["function"], r["device"], r["contract"]) for r in data["results"]]
    assert keys == sorted(keys)


def test_json_is_deterministic_but_for_durations(tmp_path: Path) -> None:
    first, second = sample(), OutcomeMatrix()
    for function, device, contract, cell in reversed(first.cells()):
        second.record(function, device, contract, dataclasses.replace(cell, duration=9.0))
    a = write_reports(first, tmp_path / "a", run_info())[0].read_text()
    b = write_reports(second, tmp_path / "b", run_info())[0].read_text()
    assert a != b
    strip = re.compile(r'"duration": [0-9.]+')
    assert strip.sub("", a) == strip.sub("", b)


def test_markdown_report(tmp_path: Path) -> None:
    markdown = write_reports(sample(), tmp_path / "r", run_info())[1].read_text()
    lines = markdown.splitlines()
    header = next(line for line in lines if line.startswith("| Function-device |"))
    assert header.split(" | ")[1:4] == ["determinism", "devices", "grad_meta"]
    row = next(line for line in lines if line.startswith("| bias_grad_summed-cpu |")).split(" | ")
    assert row[3] == "**FAIL**" and row[9] == "blocked by grad_meta" and row[-1] == "11 pass, **1 FAIL**, 2 blocked |"
    assert not any(line.startswith(f"| {f}-cuda") for line in lines for f in FUNCTIONS)
    assert "_4 rows not run here (cuda; 56 tests): bias\\_grad\\_summed-cuda" not in markdown  # no "_" escaping
    assert any(line.startswith("_4 rows not run here (cuda; 56 tests): bias_grad_summed-cuda, fused_attention-cuda")
               for line in lines)
    totals_row = next(line for line in lines if line.startswith("| **column totals** |")).split(" | ")
    assert totals_row[3] == "3 pass, **1 FAIL**"  # grad_meta over the four cpu rows
    assert "- **seed:** 7" in lines and "- **command:** `pytest conformance --impl=tests/zoo/core_bugs.py --seed=7 --profile=ci`" in lines
    failures = markdown.split("## Failures", 1)[1].split("## Reasons", 1)[0]
    assert "### FAIL grad_meta[bias_grad_summed-cpu]" in failures and "grad['b'].shape=(), but should be (4,)" in failures
    assert f"- repro: `{REPRO}`" in failures and f"- rerun: `{RERUN}`" in failures
    assert "```text\n[grad_meta] BiasGradSummed: grad mismatch <script>" in failures  # verbatim inside a fence
    reasons = markdown.split("## Reasons", 1)[1]
    assert "| n/a | 2 | single-output spec |" in reasons
    assert f"| not run here | 56 | {NO_CUDA} |" in reasons


def test_markdown_escapes_user_text_in_tables() -> None:
    matrix = OutcomeMatrix()
    matrix.record("a|b", "cpu", "reference", Cell("skipped", "x | <b>y</b> & [z](http://e.com)\nw"))
    markdown = matrix.markdown(run_info())
    assert "| a\\|b-cpu | skip |" in markdown and "x \\| &lt;b&gt;y&lt;/b&gt; &amp; [z]\\(http://e.com) w |" in markdown


class _Dom(html.parser.HTMLParser):
    """Collects ids, links, script elements and text: enough to check a document without a browser."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.scripts = 0
        self.pre: list[str] = []
        self.text: list[str] = []
        self._in_pre = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and values.get("href"):
            self.hrefs.append(str(values["href"]))
        self.scripts += tag == "script"
        self._in_pre = self._in_pre or tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_pre:
            self.pre.append(data)


def _parse(document: str) -> _Dom:
    dom = _Dom()
    dom.feed(document)
    return dom


def test_html_report_escapes_and_links(tmp_path: Path) -> None:
    document = write_reports(sample(), tmp_path / "r", run_info())[2].read_text()
    assert "<script" not in document and "https://" not in document and "<link" not in document
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in document
    dom = _parse(document)
    assert dom.scripts == 0
    target = anchor_id("grad_meta[bias_grad_summed-cpu]")
    assert f"#{target}" in dom.hrefs and target in dom.ids
    assert all(href[1:] in dom.ids for href in dom.hrefs if href.startswith("#"))
    assert len([h for h in dom.hrefs if h.startswith("#t-")]) == 3  # FAIL, ERROR, XPASS cells
    assert any(EVIL in text for text in dom.pre)  # the full message, intact once unescaped
    text = " ".join(dom.text)
    for needle in (REPRO, RERUN, "cpu only (CUDA not available)", "interpreted", "torch 2.13.0", "4 rows not run here"):
        assert needle in text
    assert 'title="grad_meta[bias_grad_summed-cpu]: FAIL - grad[&#x27;b&#x27;].shape=(), but should be (4,) (0.50 s)"' in document
    assert "fused_attention-cuda" not in document.split("<tbody>", 1)[1].split("</tbody>", 1)[0]


def test_empty_matrix_reports() -> None:
    matrix = OutcomeMatrix()
    assert matrix.terminal_lines(verbosity=0) == ["autograd-conformance: no contract tests recorded"]
    assert "None." in matrix.markdown(run_info()) and "Failures (0)" in render_html(matrix, run_info())


# ---------------------------------------------------------------------- a real browser


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


PROBE = """<script>
const fail = document.querySelector('td.o-failed');
const pass = document.querySelector('td.o-passed');
const head = document.querySelector('th.c span');
document.body.dataset.failBg = getComputedStyle(fail).backgroundColor;
document.body.dataset.passBg = getComputedStyle(pass).backgroundColor;
document.body.dataset.headWidth = String(head.getBoundingClientRect().width);
document.body.dataset.headHeight = String(head.getBoundingClientRect().height);
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (apt-get install chromium): the HTML is not rendered here")
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    assert browser is not None
    report = write_reports(sample(), tmp_path / "report", run_info())[2]
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]

    dom = subprocess.run([*flags, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=60, check=True).stdout
    parsed = _parse(dom)
    target = anchor_id("grad_meta[bias_grad_summed-cpu]")
    assert target in parsed.ids and f"#{target}" in parsed.hrefs
    assert parsed.scripts == 0  # the message's <script> stayed text
    assert any("<script>alert" in text for text in parsed.pre)
    text = " ".join(" ".join(parsed.text).split())
    assert "46 passed" in text and "1 failed" in text and "56 not run here" in text and "3 failing" in text

    # The styles really apply: a copy with a probe script reports computed colours and header geometry.
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    probed = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=60, check=True).stdout
    body = re.search(r"<body([^>]*)>", probed)
    assert body is not None
    assert 'data-fail-bg="rgb(220, 38, 38)"' in body.group(1) and 'data-pass-bg="rgb(220, 252, 231)"' in body.group(1)
    width = float(re.search(r'data-head-width="([0-9.]+)"', body.group(1)).group(1))  # type: ignore[union-attr]
    height = float(re.search(r'data-head-height="([0-9.]+)"', body.group(1)).group(1))  # type: ignore[union-attr]
    assert height > width  # contract names stand vertically, so 14 columns stay narrow

    png = tmp_path / "report.png"
    subprocess.run([*flags, "--hide-scrollbars", f"--screenshot={png}", "--window-size=1400,1600", report.as_uri()],
                   capture_output=True, timeout=60, check=True)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    assert int.from_bytes(data[16:20], "big") == 1400


def test_module_keeps_test_key() -> None:
    assert outcomes.test_key("gradcheck", "f-cpu") == "gradcheck[f-cpu]"
