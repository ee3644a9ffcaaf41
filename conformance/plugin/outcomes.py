"""The Functions x devices x contracts outcome matrix and its reports (terminal, JSON, Markdown, HTML).

The plugin records one `Cell` per contract test; this module only lays the cells out. Keeping it
free of pytest lets the reports be built and tested from a hand-made matrix. The outcome
vocabulary is :class:`conformance.engine.verdict.Outcome`'s; the HTML page is
:mod:`conformance.plugin.html_report`'s, and :mod:`conformance.plugin.reports` writes the files.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from conformance.engine.author_code import Executed, Gap, Region, gaps_of
from conformance.engine.verdict import TIERS, Outcome, Verdict, tier_of, unreported_defects
from conformance.engine.watchdog import RunEnding

__all__ = [
    "FAILURE_OUTCOMES",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "Cell",
    "NotRunGroup",
    "OutcomeMatrix",
    "RunInfo",
    "test_key",
]

SCHEMA_VERSION = 3  # the JSON report's format (3: tiers); the first format (before "schema_version") counts as 1

OUTCOMES = tuple(outcome.value for outcome in Outcome)
FAILURE_OUTCOMES = ("failed", "error", "xpassed")  # what makes a run red, and what the failures list shows
INFORM_OUTCOMES = ("advice", "upstream")  # findings that do not fail the run: one line each after the failures

# One short symbol per outcome for the terminal table (pytest's own letters where it has one).
SYMBOLS: Mapping[str, str] = MappingProxyType({
    "passed": ".", "advice": "a", "upstream": "u", "failed": "F", "error": "E", "xfailed": "x", "xpassed": "X", "blocked": "b", "waived": "w",
    "not_applicable": "-", "not_run_here": "~", "skipped": "s",
})
# A readable word per outcome for Markdown and HTML cells; upper case marks what needs attention.
LABELS: Mapping[str, str] = MappingProxyType({
    "passed": "pass", "advice": "advice", "upstream": "upstream (torch)", "failed": "FAIL", "error": "ERROR",
    "xfailed": "xfail", "xpassed": "XPASS", "blocked": "blocked", "waived": "waived", "not_applicable": "n/a", "not_run_here": "not run here",
    "skipped": "skip",
})
# How a count reads in a totals line ("3 failed", "2 n/a").
TOTAL_WORDS: Mapping[str, str] = MappingProxyType({
    "passed": "passed", "advice": "advice", "upstream": "upstream", "failed": "failed", "error": "error", "xfailed": "xfailed", "xpassed": "xpassed",
    "blocked": "blocked", "waived": "waived", "not_applicable": "n/a", "not_run_here": "not run here",
    "skipped": "skipped",
})
# The word that starts a line of the failures list.
FAILURE_WORDS: Mapping[str, str] = MappingProxyType({"failed": "FAIL", "error": "ERROR", "xpassed": "XPASS"})
# The word that starts a line of advice or an upstream finding.
INFORM_WORDS: Mapping[str, str] = MappingProxyType({"advice": "ADVICE", "upstream": "UPSTREAM"})
# What each tier means, for legends (the README's legend is tested against it).
TIER_MEANINGS: Mapping[str, str] = MappingProxyType({
    "defect": "wrong values or gradients, a crash on valid input, a memory or global-state error: fails",
    "advice": "performance or hygiene of correct code (a graph break, a recompile, unneeded work): "
              "informs; fails under --advice=fail",
    "upstream": "only torch.compile (or another torch component) is wrong, eager is right: torch's bug, "
                "with a torch-side repro; fails under --upstream=fail",
})

TERMINAL_WIDTH = 120
MAX_LABEL = 40  # longer row labels are shortened in the terminal table (never in the files)
SHORT_REASON = 160  # below -v, longer reasons are cut in the terminal failures list


def test_key(contract: str, param_id: str) -> str:
    """The key of one contract test in expectation files and reports: ``contract[name-device]``."""
    return f"{contract}[{param_id}]"


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space: cells and list lines are one line."""
    return " ".join(text.split())


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


@dataclass(frozen=True)
class Cell:
    """The outcome of one contract test for one Function on one device."""

    outcome: str  # one of OUTCOMES
    reason: str = ""  # one line: failure summary, skip reason, xfail reason, "blocked by grad_meta: ..."
    duration: float = 0.0  # seconds, the test's call phase
    repro: str = ""  # path of the repro script written for a failure ("" if none)
    message: str = ""  # the full failure report (multi-line) for failed/error cells
    rerun: str = ""  # the command that replays this test
    owner: str = ""  # the contract whose defect blocks this one (blocked cells)
    tier: str = ""  # defect, advice or upstream for a finding (see Outcome); "" when nothing was found

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Cell.outcome must be one of {', '.join(OUTCOMES)}; got {self.outcome!r}")
        if self.tier not in ("", *TIERS):
            raise ValueError(f"Cell.tier must be one of {', '.join(TIERS)} or empty; got {self.tier!r}")
        if self.owner and self.outcome != "blocked":
            raise ValueError(f"Cell.owner names the contract blocking a blocked cell; got {self.owner!r} on {self.outcome!r}")

    @property
    def finding(self) -> str:
        """The cell's tier: its own, else its outcome's (a failed cell is a defect)."""
        return tier_of(Outcome(self.outcome), self.tier)

    @property
    def summary(self) -> str:
        """The one-line reason, else the first line of the message: what the failures list shows."""
        if self.reason.strip():
            return one_line(self.reason)
        first = next((line for line in self.message.splitlines() if line.strip()), "")
        return one_line(first)

    @property
    def short_label(self) -> str:
        """The Markdown cell text: `blocked by grad_meta` rather than the whole blocking defect."""
        if self.outcome == "blocked" and self.owner:
            return f"blocked by {self.owner}"
        return LABELS[self.outcome]


@dataclass(frozen=True)
class RunInfo:
    """What a reader needs to trust or reproduce the run: options, machine, versions, command."""

    seed: int
    profile: str
    max_examples: int | None
    impl: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...] | None
    device_description: str  # e.g. "cpu only (CUDA not available)" or "cuda: NVIDIA H100"
    triton: str  # "interpreted" | "native" | "not installed"
    versions: dict[str, str]  # torch, hypothesis, pytest, python, triton, autograd-conformance
    command: str  # the pytest invocation
    header: tuple[str, ...] = ()  # free-text lines the plugin prints in its report header
    shard: str = ""  # "K/N" for one slice of a sharded run (--shard); "" for a whole run

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": int(self.seed),
            "profile": str(self.profile),
            "max_examples": None if self.max_examples is None else int(self.max_examples),
            "impl": str(self.impl),
            "devices": [str(d) for d in self.devices],
            "dtypes": None if self.dtypes is None else [str(d) for d in self.dtypes],
            "device_description": str(self.device_description),
            "triton": str(self.triton),
            "versions": {str(k): str(v) for k, v in sorted(self.versions.items())},
            "command": str(self.command),
            "header": [str(line) for line in self.header],
            "shard": str(self.shard),
        }

    def summary_lines(self) -> list[tuple[str, str]]:
        """(label, value) pairs in reading order, shared by the Markdown and HTML headers."""
        versions = ", ".join(f"{name} {version}" for name, version in sorted(self.versions.items()))
        return [
            ("seed", str(self.seed)),
            ("profile", self.profile),
            ("max examples", "profile's" if self.max_examples is None else str(self.max_examples)),
            ("impl", self.impl),
            ("devices", ", ".join(self.devices)),
            ("dtypes", "spec's" if self.dtypes is None else ", ".join(self.dtypes)),
            ("machine", self.device_description),
            ("triton", self.triton),
            ("versions", versions),
            ("command", self.command),
            *([("shard", self.shard)] if self.shard else []),
        ]


@dataclass(frozen=True)
class NotRunGroup:
    """Rows whose every cell is `not_run_here`, collapsed to one line under the table."""

    rows: tuple[str, ...]  # row labels, "name-device"
    devices: tuple[str, ...]
    tests: int
    reasons: tuple[str, ...]  # distinct one-line reasons, most frequent first

    def line(self, *, names: str) -> str:
        """'N rows not run here (cuda): NAMES; REASONS' with NAMES formatted by the caller."""
        noun = "row" if len(self.rows) == 1 else "rows"
        reasons = "; ".join(self.reasons) or "no reason given"
        return f"{len(self.rows)} {noun} not run here ({', '.join(self.devices)}; {self.tests} tests): {names}; {reasons}"


class OutcomeMatrix:
    """One `Cell` per (Function, device, contract); rows are "name-device", columns are contracts."""

    def __init__(self) -> None:
        # (function, device) -> {contract: cell}: indexed by row, so a report is linear in the cells.
        self._rows: dict[tuple[str, str], dict[str, Cell]] = {}
        # --author-coverage: per Function, its code's regions and what of them ran (else empty).
        self.author_code: dict[str, tuple[tuple[Region, ...], Executed]] = {}
        # per Function, what the coverage phase's corners reached (sizes, Scalar values, dtypes)
        self.coverage_phase: dict[str, str] = {}

    def author_gaps(self) -> dict[str, list[Gap]]:
        """Per Function measured, the lines and branch ways of its own code no example ran."""
        return {name: gaps_of(regions, executed) for name, (regions, executed) in sorted(self.author_code.items())}

    # ------------------------------------------------------------------ recording

    def record(self, function: str, device: str, contract: str, cell: Cell) -> None:
        """Record the outcome of one phase; a failed/error phase is never overwritten by a later one,
        so an error in setup or teardown outranks a passed call (and the first failure stays the cause)."""
        for name, value in (("function", function), ("device", device), ("contract", contract)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"OutcomeMatrix.record: {name} must be a non-empty string; got {value!r}")
        if not isinstance(cell, Cell):
            raise TypeError(f"OutcomeMatrix.record: cell must be a Cell; got {cell!r}")
        row = self._rows.setdefault((function, device), {})
        previous = row.get(contract)
        if previous is not None and previous.outcome in ("failed", "error"):
            return
        row[contract] = cell

    def one_failure_per_ending(self, endings: Mapping[tuple[str, str], Sequence[RunEnding]]) -> list[tuple[str, str, str]]:
        """One run-ending act, one failure, whatever ran first: in each row, a failed cell of a
        contract that noted an ending (a hang, an exit, a death; ``endings`` per (function, device),
        in contract order) becomes blocked by the first contract that noted one -- two xdist workers
        may have met the act at once, where a serial run blocked the later contract. Returns the
        cells changed, as (function, device, contract). Call once, when every cell is in."""
        made = []
        for (function, device), noted in endings.items():
            row = self._rows.get((function, device), {})
            if not noted:
                continue
            first, later = noted[0], {ending.contract: ending for ending in noted[1:]}
            for contract, cell in sorted(row.items()):
                # A later noter's failure, and a cell blocked by a later noter's act (run order
                # decided who noted first in time): both point at the first in contract order.
                by_later_act = cell.outcome == "blocked" and cell.owner in later and later[cell.owner].summary in cell.reason
                if (contract in later and cell.outcome == "failed") or by_later_act:
                    verdict = Verdict(Outcome.BLOCKED, first.summary, owner=first.contract, case=first.case, rerun=cell.rerun)
                    row[contract] = Cell(
                        outcome="blocked", reason=verdict.describe(), duration=cell.duration, rerun=cell.rerun, owner=first.contract,
                    )
                    made.append((function, device, contract))
        return made

    def report_unowned_defects(self) -> list[tuple[str, str, str]]:
        """Turn each blocked cell whose owner did not fail in its row into the failure that reports
        its defect (:func:`~conformance.engine.verdict.unreported_defects`: one per defect, where
        chains of blocks end at the same owner); the other cells blocked by that defect are blocked
        by that failure instead (one defect, one failure). Returns the failures made, as
        (function, device, contract). Call once, when every cell is in."""
        made = []
        for (function, device), row in self._rows.items():
            unreported = unreported_defects({contract: (Outcome(cell.outcome), cell.owner) for contract, cell in row.items()})
            for contract, cell in sorted(row.items()):
                if contract not in unreported:
                    continue
                reporter, why = unreported[contract].reporter, unreported[contract].why
                if reporter != contract:
                    if cell.owner != reporter:
                        reason = cell.reason.replace(f"blocked by {cell.owner}: ", f"blocked by {reporter}: ", 1)
                        row[contract] = replace(cell, owner=reporter, reason=reason)
                    continue
                defect = _blocking_defect(cell)
                reason = f"{defect} [found by {contract}, blocked by {cell.owner}, but {why}: {contract} reports it]"
                row[contract] = Cell(
                    outcome="failed", reason=reason, duration=cell.duration, message=f"{reason}\n{cell.reason}",
                    rerun=cell.rerun, tier="defect",
                )
                made.append((function, device, contract))
        return made

    def name_chain_roots(self) -> list[tuple[str, str, str]]:
        """A blocked cell whose owner is blocked in turn names the failure its chain ends at
        (stability blocked by reference, itself blocked by gradcheck, which failed: blocked by
        gradcheck, through reference), so that every blocked cell names the one failure of its
        defect. Chains that end at no failure are :meth:`report_unowned_defects`' (call it first).
        Returns the cells changed, as (function, device, contract)."""
        made = []
        for (function, device), row in self._rows.items():
            for contract, cell in sorted(row.items()):
                if cell.outcome != "blocked" or not cell.owner:
                    continue
                chain = [cell.owner]
                while (step := row.get(chain[-1])) is not None and step.outcome == "blocked" and step.owner and step.owner not in (*chain, contract):
                    chain.append(step.owner)
                end = row.get(chain[-1])
                if len(chain) < 2 or end is None or end.outcome != "failed":
                    continue
                seen = cell.reason.removeprefix(f"blocked by {cell.owner}: ")
                row[contract] = replace(cell, owner=chain[-1], reason=f"blocked by {chain[-1]} (through {', '.join(chain[:-1])}): {seen}")
                made.append((function, device, contract))
        return made

    def __len__(self) -> int:
        return sum(map(len, self._rows.values()))

    def __bool__(self) -> bool:
        return bool(self._rows)

    # ------------------------------------------------------------------ queries

    def cell(self, function: str, device: str, contract: str) -> Cell | None:
        return self._rows.get((function, device), {}).get(contract)

    def cells(self) -> list[tuple[str, str, str, Cell]]:
        """Every recorded cell as (function, device, contract, cell), sorted."""
        return [(f, d, c, cell) for f, d in self.rows() for c, cell in self.row_cells(f, d).items()]

    def contracts(self) -> list[str]:
        return sorted({contract for row in self._rows.values() for contract in row})

    def rows(self) -> list[tuple[str, str]]:
        """(function, device) of every row, sorted."""
        return sorted(self._rows)

    def row_cells(self, function: str, device: str) -> dict[str, Cell]:
        """A row's cells by contract, sorted (a copy: the matrix changes only through record)."""
        return dict(sorted(self._rows.get((function, device), {}).items()))

    def totals(self) -> dict[str, int]:
        """outcome -> count, with every outcome present (0 when none), in OUTCOMES order."""
        counts = Counter(cell.outcome for row in self._rows.values() for cell in row.values())
        return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}

    def failures(self) -> list[tuple[str, str, str, Cell]]:
        """The failed, error and xpassed cells as (function, device, contract, cell), sorted."""
        return [entry for entry in self.cells() if entry[3].outcome in FAILURE_OUTCOMES]

    def shown_rows(self) -> list[tuple[str, str]]:
        """The rows the tables show: all but those whose every cell is not_run_here."""
        collapsed = {row for group in self.not_run_groups() for row in group.rows}
        return [(f, d) for f, d in self.rows() if row_label(f, d) not in collapsed]

    def column_cells(self, contract: str) -> list[Cell]:
        """One contract's cells over the shown rows: what a column-totals cell counts."""
        cells = (self._rows[row].get(contract) for row in self.shown_rows())
        return [cell for cell in cells if cell is not None]

    def not_run_groups(self) -> list[NotRunGroup]:
        """Rows whose every cell is not_run_here, grouped by their reasons (usually one group: CUDA absent)."""
        by_reasons: dict[tuple[str, ...], list[tuple[str, str, int]]] = defaultdict(list)
        for function, device in self.rows():
            cells = list(self.row_cells(function, device).values())
            if cells and all(cell.outcome == "not_run_here" for cell in cells):
                reasons = Counter(one_line(cell.reason) for cell in cells if cell.reason.strip())
                ordered = tuple(reason for reason, _ in sorted(reasons.items(), key=lambda item: (-item[1], item[0])))
                by_reasons[ordered].append((function, device, len(cells)))
        return [
            NotRunGroup(
                rows=tuple(row_label(f, d) for f, d, _ in members),
                devices=tuple(sorted({d for _, d, _ in members})),
                tests=sum(n for _, _, n in members),
                reasons=reasons,
            )
            for reasons, members in sorted(by_reasons.items())
        ]

    def reason_groups(self, outcomes: Iterable[str]) -> list[tuple[str, str, list[str]]]:
        """(outcome, reason, sorted test keys) for the given outcomes, most tests first: one line per
        distinct reason instead of one per test."""
        wanted = set(outcomes)
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for function, device, contract, cell in self.cells():
            if cell.outcome in wanted:
                groups[(cell.outcome, one_line(cell.reason) or "no reason given")].append(
                    test_key(contract, row_label(function, device))
                )
        order = {outcome: i for i, outcome in enumerate(OUTCOMES)}
        return [
            (outcome, reason, keys)
            for (outcome, reason), keys in sorted(groups.items(), key=lambda item: (order[item[0][0]], -len(item[1]), item[0][1]))
        ]

    # ------------------------------------------------------------------ terminal

    def totals_line(self) -> str:
        totals = self.totals()
        parts = [f"{count} {TOTAL_WORDS[outcome]}" for outcome, count in totals.items() if count]
        verdict = "FAILED" if any(totals[o] for o in FAILURE_OUTCOMES) else "ok"
        return f"autograd-conformance: {len(self)} contract tests, {verdict}: " + (", ".join(parts) or "none")

    def informing(self) -> list[tuple[str, str, str, Cell]]:
        """The advice and upstream cells as (function, device, contract, cell), sorted."""
        return [entry for entry in self.cells() if entry[3].outcome in INFORM_OUTCOMES]

    def failure_lines(self, *, verbosity: int = 0) -> list[str]:
        """One line per failure, then one per advice and upstream finding."""
        lines = []
        for function, device, contract, cell in self.failures() + self.informing():
            reason = cell.summary if verbosity >= 1 else shorten(cell.summary, SHORT_REASON)
            word = FAILURE_WORDS.get(cell.outcome) or INFORM_WORDS[cell.outcome]
            if cell.outcome in FAILURE_OUTCOMES and cell.tier in INFORM_OUTCOMES:
                word += f" ({cell.tier})"
            line = f"{word} {test_key(contract, row_label(function, device))}"
            if reason:
                line += f": {reason}"
            if cell.repro:
                line += f" (repro: {cell.repro})"
            lines.append(line)
        return lines

    def terminal_lines(self, *, verbosity: int) -> list[str]:
        """The terminal summary after the run: like pytest's short summary, but per contract.

        -qq: one totals line; -q: totals and the failures list; default: the table, its legend, the
        grouped not-run-here reasons, totals and failures; -v: also the grouped skip / n/a / blocked
        reasons and failure reasons in full."""
        if not self._rows:
            return ["autograd-conformance: no contract tests recorded"]
        if verbosity <= -2:
            return [self.totals_line()]
        # What could not run here is said even under -q: a skip count alone hides a CPU-only CI.
        not_run = [
            f"{len(keys)} {'test' if len(keys) == 1 else 'tests'} not run here: {reason}"
            for _, reason, keys in self.reason_groups(["not_run_here"])
        ]
        if verbosity == -1:
            return [self.totals_line(), *not_run, *self.failure_lines(verbosity=verbosity)]
        lines = [*self._terminal_table(), self.totals_line(), *not_run]
        if verbosity >= 1:
            for outcome, reason, keys in self.reason_groups(["xfailed", "blocked", "waived", "not_applicable", "skipped"]):
                lines.append(f"{len(keys)} {TOTAL_WORDS[outcome]}: {reason}")
        lines.extend(self.failure_lines(verbosity=verbosity))
        return lines

    def _terminal_table(self) -> list[str]:
        """Numbered contract columns with a key below: 14 contracts fit in ~80 columns, names stay whole."""
        contracts = self.contracts()
        shown = self.shown_rows()
        labels = [shorten(row_label(f, d), MAX_LABEL) for f, d in shown]
        width = max([len("Function-device"), *map(len, labels)])
        lines = [f"{'Function-device':<{width}} " + "".join(f"{i:>2} " for i in range(1, len(contracts) + 1)).rstrip()]
        for (function, device), label in zip(shown, labels):
            cells = self.row_cells(function, device)
            symbols = "".join(f" {SYMBOLS[cells[c].outcome] if c in cells else ' '} " for c in contracts)
            lines.append(f"{label:<{width}} {symbols}".rstrip())
        for group in self.not_run_groups():
            noun = "row" if len(group.rows) == 1 else "rows"
            reason = "reason" if len(group.reasons) <= 1 else "reasons"
            lines.append(
                f"+ {len(group.rows)} {noun} not run here: {_terminal_names(group, self)} ({group.tests} tests; {reason} below)"
            )
        key = "  ".join(f"{i} {c}" for i, c in enumerate(contracts, start=1))
        lines += textwrap.wrap("columns: " + key, TERMINAL_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        legend = "  ".join(f"{SYMBOLS[o]} {LABELS[o]}" for o in OUTCOMES)
        lines += textwrap.wrap("legend: " + legend, TERMINAL_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        return lines

    # ------------------------------------------------------------------ files

    def to_json(self, run: RunInfo) -> dict[str, Any]:
        """The machine-readable report: sorted throughout, so the same seed gives the same file but for durations."""
        contracts = self.contracts()
        results = []
        for function, device, contract, cell in self.cells():
            entry: dict[str, Any] = {
                "id": test_key(contract, row_label(function, device)),
                "function": function,
                "device": device,
                "contract": contract,
                "outcome": cell.outcome,
                "reason": cell.reason,
                "duration": round(float(cell.duration), 6),
                "repro": cell.repro,
                "rerun": cell.rerun,
                "tier": cell.finding or None,
            }
            if cell.owner:
                entry["owner"] = cell.owner
            if cell.outcome in FAILURE_OUTCOMES or cell.outcome in INFORM_OUTCOMES:
                entry["message"] = cell.message
            results.append(entry)
        matrix = {
            row_label(f, d): {c: cell.outcome for c, cell in self.row_cells(f, d).items()} for f, d in self.rows()
        }
        report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "run": run.to_json(),
            "totals": self.totals(),
            "contracts": contracts,
            "matrix": matrix,
            "results": results,
        }
        if self.coverage_phase:
            report["coverage_phase"] = dict(sorted(self.coverage_phase.items()))
        if self.author_code:
            report["author_code"] = author_code_json(self.author_code, self.author_gaps())
        return report

    def markdown(self, run: RunInfo) -> str:
        return "\n".join(_markdown_lines(self, run)) + "\n"


def _blocking_defect(cell: Cell) -> str:
    """The defect's summary in a blocked cell's reason (``blocked by X: <defect>; see X; case: ...``)."""
    text = cell.reason.removeprefix(f"blocked by {cell.owner}: ")
    return text.split(f"; see {cell.owner}", 1)[0]


def row_label(function: str, device: str) -> str:
    """A row's label, as pytest spells the parameter id: ``name-device``."""
    return f"{function}-{device}"


def _terminal_names(group: NotRunGroup, matrix: OutcomeMatrix) -> str:
    """'every Function' when a device's rows are all collapsed (CUDA absent), else the names, cut short."""
    parts = []
    for device in group.devices:
        everyone = {f for f, d in matrix.rows() if d == device}
        collapsed = [label for label in group.rows if label.endswith(f"-{device}")]
        if len(collapsed) == len(everyone):
            parts.append(f"all {device} rows")
        else:
            names = ", ".join(collapsed[:4]) + (f", +{len(collapsed) - 4} more" if len(collapsed) > 4 else "")
            parts.append(names)
    return "; ".join(parts)


# ---------------------------------------------------------------------- Markdown


def md_escape(text: str) -> str:
    """Text from user code inside Markdown: one line, and nothing that closes a table cell or becomes HTML."""
    text = one_line(text)
    for char in "\\`*|":
        text = text.replace(char, "\\" + char)
    text = text.replace("](", "]\\(")  # "[text](url)" from user code stays text, plain brackets stay readable
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in `text`, so a message cannot end its own block."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _compact_counts(cells: Iterable[Cell], *, markdown: bool = True) -> str:
    """'12 pass, **1 FAIL**, 1 n/a': a row's or column's totals in one short cell."""
    counts = Counter(cell.outcome for cell in cells)
    parts = []
    for outcome in OUTCOMES:
        if counts[outcome]:
            text = f"{counts[outcome]} {LABELS[outcome]}"
            parts.append(f"**{text}**" if markdown and outcome in FAILURE_OUTCOMES else text)
    return ", ".join(parts)


def _md_cell(cell: Cell | None) -> str:
    if cell is None:
        return ""
    label = md_escape(cell.short_label)
    return f"**{label}**" if cell.outcome in FAILURE_OUTCOMES else label


def _coverage_phase_markdown(matrix: OutcomeMatrix) -> Iterator[str]:
    if not matrix.coverage_phase:
        return
    yield ""
    yield "## What the coverage phase reached"
    yield ""
    for name, line in sorted(matrix.coverage_phase.items()):
        yield f"- `{md_escape(name)}`: {md_escape(line)}"
    yield ""


def _author_markdown(matrix: OutcomeMatrix) -> Iterator[str]:
    gaps = matrix.author_gaps()
    if not gaps:
        return
    yield ""
    yield "## Author code no example ran (--author-coverage)"
    yield ""
    for name, found in gaps.items():
        if not found:
            yield f"- `{md_escape(name)}`: every line and branch of its code ran"
            continue
        yield f"- `{md_escape(name)}`: {len(found)} never ran"
        for gap in found:
            yield f"  - {md_escape(gap.describe())}"
    yield ""


def _markdown_lines(matrix: OutcomeMatrix, run: RunInfo) -> Iterator[str]:
    totals = matrix.totals()
    failing = sum(totals[o] for o in FAILURE_OUTCOMES)
    yield "# autograd-conformance report"
    yield ""
    yield from (f"{md_escape(line)}  " for line in run.header)
    if run.header:
        yield ""
    for label, value in run.summary_lines():
        text = f"`{value}`" if label == "command" and "`" not in value else md_escape(value)
        yield f"- **{label}:** {text}"
    yield ""
    verdict = f"**{failing} failing**" if failing else "all conformant"
    yield f"**Totals** ({len(matrix)} contract tests, {verdict}): " + ", ".join(
        f"{count} {TOTAL_WORDS[o]}" for o, count in totals.items() if count
    )
    yield ""
    contracts = matrix.contracts()
    yield "| Function-device | " + " | ".join(md_escape(c) for c in contracts) + " | row totals |"
    yield "|---" * (len(contracts) + 2) + "|"
    for function, device in matrix.shown_rows():
        cells = matrix.row_cells(function, device)
        row = [_md_cell(cells.get(c)) for c in contracts]
        yield f"| {md_escape(row_label(function, device))} | " + " | ".join(row) + f" | {_compact_counts(cells.values())} |"
    column_totals = [_compact_counts(matrix.column_cells(contract)) for contract in contracts]
    yield "| **column totals** | " + " | ".join(column_totals) + " | |"
    for group in matrix.not_run_groups():
        yield ""
        yield "_" + md_escape(group.line(names=", ".join(group.rows))) + "_"
    yield ""
    yield (
        "Cells: `pass`, `advice` (passes; performance or hygiene of correct code), `upstream (torch)` (only "
        "torch.compile or another torch component is wrong: torch's bug), `FAIL`, `ERROR`, `xfail` (expected "
        "deviation), `XPASS` (expected deviation passed), "
        "`blocked by <contract>` (another contract's defect stops this one), `waived` (by the spec), "
        "`n/a` (does not apply), `not run here` (needs a device or tool this machine lacks), `skip`."
    )
    failures = matrix.failures() + matrix.informing()
    yield ""
    yield "## Failures, advice and upstream findings"
    yield ""
    if not failures:
        yield "None."
    for function, device, contract, cell in failures:
        key = test_key(contract, row_label(function, device))
        yield f"### {FAILURE_WORDS.get(cell.outcome) or INFORM_WORDS[cell.outcome]} {md_escape(key)}"
        yield ""
        yield md_escape(cell.summary) or "(no reason given)"
        if cell.repro or cell.rerun:
            yield ""
        if cell.repro:
            yield f"- repro: `{cell.repro}`" if "`" not in cell.repro else f"- repro: {md_escape(cell.repro)}"
        if cell.rerun:
            yield f"- rerun: `{cell.rerun}`" if "`" not in cell.rerun else f"- rerun: {md_escape(cell.rerun)}"
        if cell.message.strip():
            fence = _fence(cell.message)
            yield ""
            yield f"{fence}text"
            yield cell.message.rstrip("\n")
            yield fence
        yield ""
    yield from _coverage_phase_markdown(matrix)
    yield from _author_markdown(matrix)
    groups = matrix.reason_groups(["xfailed", "blocked", "waived", "not_applicable", "not_run_here", "skipped"])
    yield "## Reasons"
    yield ""
    if not groups:
        yield "None: every test ran."
        return
    yield "| outcome | tests | reason | which |"
    yield "|---|---|---|---|"
    for outcome, reason, keys in groups:
        which = ", ".join(md_escape(k) for k in keys[:6]) + (f", +{len(keys) - 6} more" if len(keys) > 6 else "")
        yield f"| {LABELS[outcome]} | {len(keys)} | {md_escape(reason)} | {which} |"


# ---------------------------------------------------------------------- author code (--author-coverage)


def author_code_json(
    measured: Mapping[str, tuple[tuple[Region, ...], Executed]], gaps: Mapping[str, list[Gap]]
) -> dict[str, Any]:
    """Per Function: its regions, what of their files ran (so shards merge by union), and its gaps."""
    return {
        name: {
            "regions": [
                {"label": r.label, "file": r.file, "lines": sorted(r.lines), "branches": sorted([a, b] for a, b in r.branches)}
                for r in regions
            ],
            "executed": Executed(
                {f: v for f, v in executed.lines.items() if f in {r.file for r in regions}},
                {f: v for f, v in executed.arcs.items() if f in {r.file for r in regions}},
            ).to_json(),
            "gaps": [
                {"region": g.region, "file": g.file, "line": g.line, "last": g.last or g.line, "target": g.target,
                 "branch": g.branch or None, "source": g.source, "text": g.describe()}
                for g in gaps[name]
            ],
        }
        for name, (regions, executed) in sorted(measured.items())
    }


def author_code_from_json(data: Mapping[str, Any]) -> dict[str, tuple[tuple[Region, ...], Executed]]:
    """What :func:`author_code_json` wrote, back (regions and executed; the gaps are recomputed)."""
    return {
        str(name): (
            tuple(
                Region(str(r["label"]), str(r["file"]), frozenset(int(x) for x in r["lines"]),
                       frozenset((int(a), int(b)) for a, b in r["branches"]))
                for r in entry["regions"]
            ),
            Executed.from_json(entry["executed"]),
        )
        for name, entry in data.items()
    }


def author_gap_lines(gaps: Mapping[str, list[Gap]], *, limit: int = 4) -> list[str]:
    """One terminal line per Function with gaps (the first few named, file:line)."""
    lines = []
    for name, found in gaps.items():
        if not found:
            continue
        shown = "; ".join(g.describe() for g in found[:limit])
        more = f"; +{len(found) - limit} more" if len(found) > limit else ""
        lines.append(f"{name}: {len(found)} never ran: {shown}{more}")
    return lines
