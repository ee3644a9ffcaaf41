"""The HTML rendering of an `OutcomeMatrix`: one self-contained file a reviewer can open anywhere.

Inline CSS only, no scripts and no network assets, so it renders the same from a CI artifact, a mail
attachment or a sandboxed viewer. Everything that comes from user code (names, reasons, messages,
paths) passes through `esc`.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from conformance.plugin.outcomes import (
    FAILURE_OUTCOMES,
    FAILURE_WORDS,
    INFORM_OUTCOMES,
    INFORM_WORDS,
    LABELS,
    OUTCOMES,
    SCHEMA_VERSION,
    TOTAL_WORDS,
    Cell,
    OutcomeMatrix,
    RunInfo,
    one_line,
    row_label,
    test_key,
)

__all__ = ["anchor_id", "render_html"]

# What each colour means, for the legend (the colours themselves live in the CSS below).
MEANINGS: Mapping[str, str] = MappingProxyType({
    "passed": "the contract holds",
    "advice": "the contract holds; advice on performance or hygiene",
    "upstream": "only a torch component (torch.compile) is wrong, eager is right: torch's bug",
    "failed": "the contract is broken",
    "error": "setup, teardown or the check itself failed",
    "xfailed": "a known deviation (expectations file)",
    "xpassed": "a known deviation that no longer happens",
    "blocked": "another contract's defect stops this check",
    "waived": "the spec waives this contract",
    "not_applicable": "the contract does not apply to this Function",
    "not_run_here": "needs a device or tool this machine lacks",
    "skipped": "skipped for another reason",
})

CSS = """
:root { --fg: #0f172a; --muted: #64748b; --line: #e2e8f0; --bg: #f8fafc; --card: #ffffff; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; background: var(--bg); color: var(--fg);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 0; }
h2 { font-size: 17px; margin: 28px 0 10px; }
h3 { font-size: 15px; margin: 0 0 6px; display: flex; gap: 8px; align-items: center; }
code, pre, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
a { color: inherit; }
.top { display: flex; align-items: center; gap: 16px; flex-wrap: wrap; }
.verdict { padding: 4px 12px; border-radius: 999px; font-weight: 700; font-size: 14px; }
.verdict.bad { background: #dc2626; color: #fff; }
.verdict.good { background: #16a34a; color: #fff; }
.sub { color: var(--muted); margin: 4px 0 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 14px 18px; margin-top: 16px; }
.chips { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 16px; }
.chip { display: inline-flex; align-items: baseline; gap: 6px; padding: 3px 10px; border-radius: 999px;
        font-size: 13px; white-space: nowrap; }
.chip b { font-size: 15px; }
.chip.zero { opacity: .45; }
dl.run { display: grid; grid-template-columns: max-content minmax(0, 1fr) max-content minmax(0, 1fr);
         gap: 4px 16px; margin: 0; }
dl.run dd.wide { grid-column: span 3; }
dl.run dt { color: var(--muted); }
dl.run dd { margin: 0; overflow-wrap: anywhere; }
ul.header { margin: 10px 0 0; padding-left: 18px; color: var(--muted); }
.scroll { overflow-x: auto; }
table.matrix { border-collapse: separate; border-spacing: 2px; background: var(--card); }
table.matrix thead th { position: sticky; top: 0; background: var(--card); vertical-align: bottom; z-index: 1; }
table.matrix th.c { padding: 4px 0; font-weight: 600; font-size: 12.5px; }
table.matrix th.c span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; display: inline-block; }
table.matrix th.c small { color: var(--muted); font-weight: 400; }
table.matrix th.row { text-align: left; font-weight: 600; padding: 0 12px 0 6px; white-space: nowrap; }
table.matrix td { text-align: center; min-width: 54px; height: 30px; padding: 2px 5px; border-radius: 4px;
                  font-size: 12px; white-space: nowrap; line-height: 1.15; }
table.matrix td small { display: block; font-size: 10px; opacity: .85; }
table.matrix td a { display: block; text-decoration: none; font-weight: 700; }
table.matrix td a:hover { text-decoration: underline; }
table.matrix tbody tr:hover th.row { background: #eef2ff; }
table.matrix td.empty { background: #fff; border: 1px dashed var(--line); }
table.matrix td.rowtot { min-width: 150px; text-align: left; background: none; }
table.matrix tfoot th, table.matrix tfoot td { font-size: 11.5px; color: var(--muted); background: none; padding-top: 6px; }
table.matrix tfoot .bad { color: #b91c1c; font-weight: 700; display: block; }
.bar { display: flex; height: 10px; border-radius: 5px; overflow: hidden; width: 140px; background: var(--line); }
.bar span { display: block; height: 100%; }
.bar-label { font-size: 11px; color: var(--muted); }
.o-passed { background: #dcfce7; color: #166534; }
.o-advice { background: #bbf7d0; color: #14532d; outline: 2px dashed #16a34a; outline-offset: -3px; }
.o-upstream { background: #ede9fe; color: #5b21b6; }
.o-failed { background: #dc2626; color: #fff; }
.o-error { background: #881337; color: #fff; }
.o-xfailed { background: #fef3c7; color: #92400e; }
.o-xpassed { background: #ea580c; color: #fff; }
.o-blocked { background: #fcd34d; color: #78350f; }
.o-waived { background: #e0e7ff; color: #3730a3; }
.o-not_applicable { background: #f1f5f9; color: #64748b; }
.o-not_run_here { background: #e2e8f0; color: #64748b; }
.o-skipped { background: #e0f2fe; color: #075985; }
.bar .o-passed, .bar .o-advice { background: #22c55e; }
.bar .o-upstream { background: #a78bfa; }
.bar .o-xfailed { background: #fbbf24; }
.bar .o-waived { background: #818cf8; }
.bar .o-not_applicable, .bar .o-not_run_here { background: #cbd5e1; }
.bar .o-skipped { background: #7dd3fc; }
.notrun { margin: 10px 0 0; padding: 8px 12px; border-radius: 8px; background: #e2e8f0; color: #334155; }
.notrun summary { cursor: pointer; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin-top: 12px; font-size: 12px; color: var(--muted); }
.legend span.sw { display: inline-block; min-width: 44px; text-align: center; padding: 1px 6px; border-radius: 4px;
                  margin-right: 4px; font-size: 11.5px; }
.failure { background: var(--card); border: 1px solid var(--line); border-left: 5px solid #dc2626; border-radius: 8px;
           padding: 12px 16px; margin: 0 0 12px; scroll-margin-top: 12px; }
.failure.error { border-left-color: #881337; }
.failure.xpassed { border-left-color: #ea580c; }
.failure:target { box-shadow: 0 0 0 3px #fca5a5; }
.failure .reason { margin: 0 0 8px; font-weight: 600; }
.failure dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0 0 8px; }
.failure dt { color: var(--muted); }
.failure dd { margin: 0; overflow-wrap: anywhere; }
pre.source { background: #f8fafc; padding: 8px 12px; border-radius: 6px; overflow-x: auto; font-size: 12px; }
pre.source .missed { background: #fee2e2; display: block; }
pre.source .partial { background: #fef3c7; display: block; }
.failure pre { background: #0f172a; color: #e2e8f0; padding: 12px 14px; border-radius: 6px; overflow-x: auto;
               margin: 0; white-space: pre; max-height: 480px; }
.back { font-size: 12px; color: var(--muted); }
table.reasons { border-collapse: collapse; background: var(--card); width: 100%; }
table.reasons th, table.reasons td { border-bottom: 1px solid var(--line); padding: 6px 10px; text-align: left;
                                     vertical-align: top; }
table.reasons td.n, table.reasons th.n { width: 1%; text-align: right; font-variant-numeric: tabular-nums; }
table.reasons summary { cursor: pointer; color: var(--muted); }
table.reasons ul { margin: 4px 0 0; padding-left: 18px; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""


def esc(text: object) -> str:
    """HTML-escape anything (quotes too, so it is safe inside attributes)."""
    return html.escape(str(text), quote=True)


def anchor_id(key: str) -> str:
    """A stable, valid, unique id for a test key: readable slug plus a short hash (slugs can collide)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-")[:80]
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]
    return f"t-{slug}-{digest}"


def _title(key: str, cell: Cell) -> str:
    """The hover text of a cell: test key, outcome, reason, and duration when there is one."""
    text = f"{key}: {LABELS[cell.outcome]}"
    if cell.summary:
        text += f" - {cell.summary}"
    if cell.duration:
        text += f" ({cell.duration:.2f} s)"
    return text


def _cell_html(function: str, device: str, contract: str, cell: Cell | None) -> str:
    if cell is None:
        return '<td class="empty" title="not collected"></td>'
    key = test_key(contract, row_label(function, device))
    label = esc(LABELS[cell.outcome])
    if cell.outcome == "blocked" and cell.owner:
        label += f"<small>{esc(cell.owner)}</small>"
    if cell.outcome in FAILURE_OUTCOMES or cell.outcome in INFORM_OUTCOMES:
        label = f'<a href="#{anchor_id(key)}">{label}</a>'
    return f'<td class="o-{cell.outcome}" title="{esc(_title(key, cell))}">{label}</td>'


def _bar(cells: Iterable[Cell]) -> str:
    """A row's outcomes as a small stacked bar with the pass count beside it."""
    counts = Counter(cell.outcome for cell in cells)
    total = sum(counts.values())
    parts = "".join(f'<span class="o-{o}" style="flex:{counts[o]}"></span>' for o in OUTCOMES if counts[o])
    detail = ", ".join(f"{counts[o]} {LABELS[o]}" for o in OUTCOMES if counts[o])
    failing = sum(counts[o] for o in FAILURE_OUTCOMES)
    extra = f' · <b style="color:#b91c1c">{failing} failing</b>' if failing else ""
    return (
        f'<td class="rowtot" title="{esc(detail)}"><div class="bar">{parts}</div>'
        f'<span class="bar-label">{counts["passed"]}/{total} pass{extra}</span></td>'
    )


def _column_total(cells: list[Cell]) -> str:
    counts = Counter(cell.outcome for cell in cells)
    failing = sum(counts[o] for o in FAILURE_OUTCOMES)
    detail = ", ".join(f"{counts[o]} {LABELS[o]}" for o in OUTCOMES if counts[o])
    bad = f'<span class="bad">{failing} ✗</span>' if failing else ""
    return f'<td title="{esc(detail)}">{counts["passed"]}/{len(cells)}{bad}</td>'


def _run_info(run: RunInfo) -> Iterator[str]:
    yield '<section class="card" id="run"><dl class="run">'
    for label, value in run.summary_lines():
        shown = f"<code>{esc(value)}</code>" if label == "command" else esc(value)
        wide = ' class="wide"' if label in ("versions", "command") else ""
        yield f"<dt>{esc(label)}</dt><dd{wide}>{shown}</dd>"
    yield "</dl>"
    if run.header:
        yield '<ul class="header">' + "".join(f"<li>{esc(line)}</li>" for line in run.header) + "</ul>"
    yield "</section>"


def _matrix(matrix: OutcomeMatrix) -> Iterator[str]:
    contracts = matrix.contracts()
    shown = matrix.shown_rows()
    yield '<section id="matrix"><h2>Functions × contracts</h2><div class="scroll"><table class="matrix">'
    yield '<thead><tr><th class="row">Function-device</th>'
    yield "".join(f'<th class="c" title="{esc(c)}"><span>{esc(c)}</span></th>' for c in contracts)
    yield '<th class="row">row</th></tr></thead><tbody>'
    for function, device in shown:
        cells = matrix.row_cells(function, device)
        yield f'<tr><th class="row">{esc(row_label(function, device))}</th>'
        yield "".join(_cell_html(function, device, c, cells.get(c)) for c in contracts)
        yield _bar(cells.values()) + "</tr>"
    yield "</tbody><tfoot><tr><th class=\"row\">passed per contract</th>"
    for contract in contracts:
        yield _column_total(matrix.column_cells(contract))
    yield "<td></td></tr></tfoot></table></div>"
    for group in matrix.not_run_groups():
        noun = "row" if len(group.rows) == 1 else "rows"
        reasons = "; ".join(group.reasons) or "no reason given"
        yield (
            f'<details class="notrun"><summary><b>{len(group.rows)} {noun} not run here</b> '
            f"({esc(', '.join(group.devices))}; {group.tests} tests): {esc(reasons)}</summary>"
            f'<p class="mono">{esc(", ".join(group.rows))}</p></details>'
        )
    yield '<div class="legend">' + "".join(
        f'<span><span class="sw o-{o}">{esc(LABELS[o])}</span>{esc(MEANINGS[o])}</span>' for o in OUTCOMES
    ) + "</div></section>"


def _failures(matrix: OutcomeMatrix) -> Iterator[str]:
    failures = matrix.failures()
    informing = matrix.informing()
    yield f'<section id="failures"><h2>Failures ({len(failures)}), advice and upstream findings ({len(informing)})</h2>'
    if not failures and not informing:
        yield "<p>None.</p>"
    for function, device, contract, cell in failures + informing:
        key = test_key(contract, row_label(function, device))
        word = FAILURE_WORDS.get(cell.outcome) or INFORM_WORDS[cell.outcome]
        yield f'<article class="failure {cell.outcome}" id="{anchor_id(key)}">'
        yield f'<h3><span class="chip o-{cell.outcome}">{esc(word)}</span><span class="mono">{esc(key)}</span></h3>'
        yield f'<p class="reason">{esc(cell.summary or "(no reason given)")}</p><dl>'
        if cell.repro:
            yield f"<dt>repro</dt><dd><code>{esc(cell.repro)}</code></dd>"
        if cell.rerun:
            yield f"<dt>rerun</dt><dd><code>{esc(cell.rerun)}</code></dd>"
        if cell.duration:
            yield f"<dt>duration</dt><dd>{cell.duration:.2f} s</dd>"
        yield "</dl>"
        if cell.message.strip():
            yield f"<pre>{esc(cell.message.rstrip())}</pre>"
        yield '<a class="back" href="#matrix">back to the matrix</a></article>'
    yield "</section>"


def _reasons(matrix: OutcomeMatrix) -> Iterator[str]:
    groups = matrix.reason_groups(["xfailed", "blocked", "waived", "not_applicable", "not_run_here", "skipped"])
    yield '<section id="reasons"><h2>Reasons for tests that did not pass or fail</h2>'
    if not groups:
        yield "<p>None: every test ran.</p></section>"
        return
    yield '<table class="reasons"><thead><tr><th>outcome</th><th class="n">tests</th><th>reason</th></tr></thead><tbody>'
    for outcome, reason, keys in groups:
        which = "".join(f"<li class=\"mono\">{esc(k)}</li>" for k in keys)
        yield (
            f'<tr><td><span class="chip o-{outcome}">{esc(LABELS[outcome])}</span></td><td class="n">{len(keys)}</td>'
            f"<td>{esc(reason)}<details><summary>which tests</summary><ul>{which}</ul></details></td></tr>"
        )
    yield "</tbody></table></section>"


def render_html(matrix: OutcomeMatrix, run: RunInfo) -> str:
    """The whole report as one HTML document."""
    totals = matrix.totals()
    failing = sum(totals[o] for o in FAILURE_OUTCOMES)
    verdict = (
        f'<span class="verdict bad">{failing} failing</span>' if failing else '<span class="verdict good">all conformant</span>'
    )
    title = f"autograd-conformance: {failing} failing of {len(matrix)}" if failing else "autograd-conformance: conformant"
    chips = "".join(
        f'<span class="chip o-{o}{"" if totals[o] else " zero"}" title="{esc(MEANINGS[o])}">'
        f"<b>{totals[o]}</b>{esc(TOTAL_WORDS[o])}</span>"
        for o in OUTCOMES
    )
    functions = len({f for f, _ in matrix.rows()})
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f'<header class="top"><h1>autograd-conformance report</h1>{verdict}</header>',
        f'<p class="sub">{len(matrix)} contract tests: {functions} Functions × {len(run.devices)} devices × '
        f"{len(matrix.contracts())} contracts · seed {esc(run.seed)} · profile {esc(run.profile)} · "
        f"{esc(run.device_description)} · triton {esc(run.triton)}</p>",
        f'<div class="chips" id="totals">{chips}</div>',
        *_run_info(run),
        *_matrix(matrix),
        *_failures(matrix),
        *_reasons(matrix),
        *_coverage_phase(matrix),
        *_author_code(matrix),
        f"<footer>JSON schema_version {SCHEMA_VERSION}; command: <code>{esc(one_line(run.command))}</code></footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _coverage_phase(matrix: OutcomeMatrix) -> list[str]:
    """Per Function, what the coverage phase's corners reached."""
    if not matrix.coverage_phase:
        return []
    items = "".join(f"<li><b>{esc(name)}</b>: {esc(line)}</li>" for name, line in sorted(matrix.coverage_phase.items()))
    return [f'<section id="coverage-phase"><h2>What the coverage phase reached</h2><ul>{items}</ul></section>']


def _author_code(matrix: OutcomeMatrix) -> list[str]:
    """--author-coverage: each measured Function's own code, the lines no example ran marked."""
    if not matrix.author_code:
        return []
    parts = ['<section id="author-code"><h2>Author code no example ran</h2>']
    gaps = matrix.author_gaps()
    for name, (regions, _) in sorted(matrix.author_code.items()):
        found = gaps[name]
        missing = {(g.file, line) for g in found if g.target is None for line in range(g.line, max(g.line, g.last) + 1)}
        partial = {(g.file, g.line) for g in found if g.target is not None} | {(g.file, g.branch) for g in found if g.branch}
        parts.append(f"<h3>{esc(name)}: {len(found)} never ran</h3>" if found else f"<h3>{esc(name)}: all ran</h3>")
        if not found:
            continue
        parts.append("<ul>" + "".join(f"<li><code>{esc(g.describe())}</code></li>" for g in found) + "</ul>")
        for region in regions:
            if not any(g.file == region.file and g.line in region.lines | {a for a, _ in region.branches} for g in found):
                continue
            lines = _source(region.file)
            first, last = min(region.lines), max(region.lines)
            rows = []
            for number in range(first, min(last, len(lines)) + 1):
                mark = ' class="missed"' if (region.file, number) in missing else ""
                mark = ' class="partial"' if (region.file, number) in partial else mark
                rows.append(f"<span{mark}>{number:5d}  {esc(lines[number - 1])}</span>")
            parts.append(f"<p>{esc(region.label)} ({esc(region.file)})</p><pre class=\"source\">" + "\n".join(rows) + "</pre>")
    parts.append("</section>")
    return parts


def _source(file: str) -> list[str]:
    try:
        return Path(file).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
