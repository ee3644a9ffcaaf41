"""Merging the JSON reports of a sharded run (``--shard=K/N`` on N machines) into one matrix.

    python -m conformance.plugin.merge OUTPUT shard-1.json shard-2.json shard-3.json

writes OUTPUT.json, OUTPUT.md and OUTPUT.html, prints the terminal matrix, and exits 1 when a
cell failed (as the unsharded run would have), 0 otherwise, 2 when the reports do not make one run.
The reports must be every slice 1..N of one run: same seed, profile, example count, impl, devices and
dtypes, and no test in two of them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.plugin.outcomes import (
    FAILURE_OUTCOMES,
    SCHEMA_VERSION,
    Cell,
    OutcomeMatrix,
    RunInfo,
    author_code_from_json,
)
from conformance.plugin.reports import write_reports

__all__ = ["MergeError", "main", "merge_reports"]

# What shapes the verdicts: slices of one run agree on all of them.
SAME_IN_EVERY_SLICE = ("seed", "profile", "max_examples", "impl", "devices", "dtypes")
_CELL_FIELDS = ("outcome", "reason", "duration", "repro", "message", "rerun", "owner", "tier")


class MergeError(ValueError):
    """The reports given do not make up one sharded run."""


def merge_reports(reports: Sequence[dict[str, Any]], names: Sequence[str]) -> tuple[OutcomeMatrix, RunInfo]:
    """The matrix and run description of the whole run, from its slices' parsed JSON reports
    (``names`` say which file each came from, for errors)."""
    if not reports:
        raise MergeError("no reports given; pass the JSON report of every slice")
    for report, name in zip(reports, names):
        version = report.get("schema_version")
        if version != SCHEMA_VERSION:
            raise MergeError(f"{name}: schema_version={version!r}, but should be {SCHEMA_VERSION} (a report of this version)")
    runs = [report["run"] for report in reports]
    _check_same_run(runs, names)
    _check_every_slice(runs, names)
    matrix = OutcomeMatrix()
    seen: dict[tuple[str, str, str], str] = {}
    for report, name in zip(reports, names):
        for entry in report["results"]:
            key = (entry["function"], entry["device"], entry["contract"])
            if key in seen:
                raise MergeError(f"{name}: {entry['id']} is also in {seen[key]}; a test belongs to one slice")
            seen[key] = name
            fields = {field: entry[field] for field in _CELL_FIELDS if entry.get(field) is not None}
            matrix.record(*key, Cell(**fields))
        matrix.coverage_phase.update(report.get("coverage_phase", {}))
        for name, (regions, executed) in author_code_from_json(report.get("author_code", {})).items():
            if name in matrix.author_code:
                matrix.author_code[name][1].update(executed)  # a Function's cpu and cuda rows in two slices
            else:
                matrix.author_code[name] = (regions, executed)
    return matrix, _whole_run(runs)


def _check_same_run(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
    for field in SAME_IN_EVERY_SLICE:
        for run, name in zip(runs[1:], names[1:]):
            if run.get(field) != runs[0].get(field):
                raise MergeError(
                    f"{name}: {field}={run.get(field)!r}, but should be {runs[0].get(field)!r} as in {names[0]} "
                    "(slices of one run share it)"
                )


def _check_every_slice(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
    slices: dict[int, str] = {}
    count = None
    for run, name in zip(runs, names):
        match = re.fullmatch(r"(\d+)/(\d+)", str(run.get("shard", "")))
        if match is None:
            raise MergeError(f"{name}: shard={run.get('shard', '')!r}, but should be K/N (a report of a --shard=K/N run)")
        k, n = int(match[1]), int(match[2])
        if count is not None and n != count:
            raise MergeError(f"{name}: shard {k}/{n}, but should be one of {count} slices as in {names[0]}")
        if k in slices:
            raise MergeError(f"{name}: shard {k}/{n} is also {slices[k]}")
        count, slices[k] = n, name
    missing = [f"{k}/{count}" for k in range(1, (count or 0) + 1) if k not in slices]
    if missing:
        raise MergeError(f"slices {', '.join(missing)} are missing; pass the JSON report of every slice")


def _whole_run(runs: Sequence[dict[str, Any]]) -> RunInfo:
    first = runs[0]
    machines = dict.fromkeys(str(run["device_description"]) for run in runs)
    command = re.sub(r"\s+--shard[= ]\S+", "", str(first["command"]))
    return RunInfo(
        seed=first["seed"],
        profile=first["profile"],
        max_examples=first["max_examples"],
        impl=first["impl"],
        devices=tuple(first["devices"]),
        dtypes=None if first["dtypes"] is None else tuple(first["dtypes"]),
        device_description="; ".join(machines),
        triton=first["triton"],
        versions=dict(first["versions"]),
        command=f"{command} (merged from {len(runs)} slices)",
        header=tuple(first.get("header", ())),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.plugin.merge",
        description="Merge the JSON reports of a --shard=K/N run's slices into one report and matrix.",
    )
    parser.add_argument("output", type=Path, help="write OUTPUT.json, OUTPUT.md and OUTPUT.html")
    parser.add_argument("reports", type=Path, nargs="+", help="the JSON report of every slice (--conformance-report)")
    args = parser.parse_args(argv)
    try:
        parsed = [json.loads(path.read_text(encoding="utf-8")) for path in args.reports]
        matrix, run = merge_reports(parsed, [str(path) for path in args.reports])
    except (OSError, ValueError, KeyError, TypeError) as error:  # MergeError is a ValueError
        print(f"conformance merge: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    for line in matrix.terminal_lines(verbosity=0):
        print(line)
    written = write_reports(matrix, args.output, run)
    print(f"autograd-conformance: merged report written to {', '.join(str(path) for path in written)}")
    return 1 if any(matrix.totals()[outcome] for outcome in FAILURE_OUTCOMES) else 0


if __name__ == "__main__":
    sys.exit(main())
