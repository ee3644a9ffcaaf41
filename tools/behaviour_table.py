"""The (Function, contract, device, outcome) table of the suite on every zoo file and the main job.

A refactoring that must preserve behaviour records the table before and after and compares them:

    python tools/behaviour_table.py record before.tsv            # every zoo file and the main job, seeds 0 and 1
    python tools/behaviour_table.py record after.tsv --only core_bugs,main
    python tools/behaviour_table.py compare before.tsv after.tsv # exit 1 and list each difference

Each source runs in its own process at ``--profile=ci --device=cpu`` with its seed; the table is read
from the run's JSON report, never from pytest's text.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "zoo"
SEEDS = (0, 1)
COLUMNS = ("source", "seed", "function", "contract", "device", "outcome")
# Options a zoo file needs to run to a verdict in reasonable time: its hangs cost a timeout per example
# and contract, so it runs as tests/test_hostile.py runs it.
EXTRA = {
    "hostile": ("--isolate", "--example-timeout=10", "--max-examples=2", "--contracts=return_count,gradcheck,global_state"),
}

Row = tuple[str, str, str, str, str, str]


def sources() -> list[str]:
    """Every zoo file by stem, then ``main`` (the default target, reference_ops)."""
    return [*sorted(path.stem for path in ZOO.glob("*.py") if not path.name.startswith("_")), "main"]


def command(source: str, seed: int, report: Path) -> list[str]:
    impl = [] if source == "main" else [f"--impl={ZOO / (source + '.py')}"]
    return [
        sys.executable, "-m", "pytest", str(REPO / "conformance"), *impl, "--profile=ci", f"--seed={seed}",
        "--device=cpu", "-p", "no:cacheprovider", "-q", f"--conformance-report={report}", *EXTRA.get(source, ()),
    ]  # fmt: skip


def run_one(source: str, seed: int) -> tuple[list[Row], str]:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        start = time.monotonic()
        done = subprocess.run(command(source, seed, report), cwd=folder, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - start
        path = report.with_suffix(".json")
        if not path.exists():
            tail = (done.stdout + done.stderr)[-2000:]
            return [(source, str(seed), "<run>", "<run>", "-", f"no report (exit {done.returncode})")], tail
        results = json.loads(path.read_text())["results"]
        rows = [(source, str(seed), r["function"], r["contract"], r["device"], r["outcome"]) for r in results]
        return rows, f"{source} seed {seed}: {len(rows)} cells, exit {done.returncode}, {elapsed:.0f} s"


def record(path: Path, only: Sequence[str], jobs: int) -> None:
    chosen = list(only) or sources()  # in the order given: the sources that matter most first
    unknown = sorted(set(only) - set(sources()))
    if unknown:
        raise SystemExit(f"--only names unknown sources {unknown}; known: {', '.join(sources())}")
    work = [(source, seed) for source in chosen for seed in SEEDS]
    rows: list[Row] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for found, line in pool.map(lambda job: run_one(*job), work):
            rows.extend(found)
            print(line, flush=True)
            write(path, sorted(rows))  # after each source: an interrupted run keeps what it finished


def write(path: Path, rows: list[Row]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(COLUMNS)
        writer.writerows(rows)


def read(path: Path) -> dict[tuple[str, ...], str]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        next(reader)
        return {tuple(row[:5]): row[5] for row in reader}


def differences(before: dict[tuple[str, ...], str], after: dict[tuple[str, ...], str]) -> Iterator[str]:
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, "<absent>"), after.get(key, "<absent>")
        if old != new:
            yield "\t".join((*key, f"{old} -> {new}"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="run every source and write the table")
    rec.add_argument("table", type=Path)
    rec.add_argument("--only", type=lambda text: [s for s in text.split(",") if s], default=[])
    rec.add_argument("--jobs", type=int, default=2, help="sources run at once (default 2)")
    cmp_ = commands.add_parser("compare", help="list every cell whose outcome differs")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.table, args.only, args.jobs)
        return 0
    found = list(differences(read(args.before), read(args.after)))
    print("\n".join(found) if found else "identical")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
