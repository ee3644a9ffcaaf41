"""Performance figures of autograd-conformance (issue 16): one command, a Markdown report.

    python benchmarks/run.py                 # every figure, 3 runs each (about 40 minutes on 2 cores)
    python benchmarks/run.py --quick --runs 1  # a cut-down smoke version (about a minute)
    python benchmarks/run.py --only 3 --json numbers.json

Every pytest run is a subprocess (``sys.executable -m pytest conformance -p no:cacheprovider -q
...``) started from the repository root with OMP_NUM_THREADS, PYTHONDONTWRITEBYTECODE (and PYTEST_*
variables) removed from its environment: the figures are what a user gets without environment variables. Each is
timed twice: wall clock, and CPU time (user + sys of the child and the children it waited for,
from ``resource.getrusage(RUSAGE_CHILDREN)``), because the machine may be shared. Cells show
the median over ``--runs`` runs and the min-max range. What each figure measures, and its
caveats, are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import (  # benchmarks/ is sys.path[0] when run as a script
    Child,
    ChildFailed,
    checked,
    child_env,
    fmt_ratio,
    fmt_seconds,
    header,
    junit_times,
    median,
    progress,
    pytest_command,
    run_child,
    spread,
    table,
)

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PLUGIN_ENTRY_POINT = "autograd_conformance_plugin"  # [project.entry-points.pytest11] in pyproject.toml
TRITON_ORIGIN = "reference_ops.triton"

FIGURES = {
    "1": "default",
    "2": "overhead",
    "3": "gradcheck",
    "4": "failures",
    "5": "startup",
    "6": "memory",
}
TITLES = {"1": "1. Default run", "2": "2. Suite vs bare loop", "3": "3. gradcheck cost vs numel",
          "4": "4. Time to first failure", "5": "5. Start-up", "6": "6. Memory checks cost"}

# --quick: a smoke version for tests/test_benchmark.py -- it checks the script works, not speed.
QUICK_SUITE = ["--max-examples=2", "--contracts=grad_meta,gradcheck", "--device=cpu", "-k", "square or triton_softmax or linear"]
NUMELS = [16, 64, 128, 256, 512, 1024, 4096, 16384, 65536, 262144]
QUICK_NUMELS = [16, 256, 1024]
# Figure 1's main-job rows: the README's main job (`--profile=ci`) serially, with its coverage phase
# and without it (an explicit --max-examples=10, ci's count, runs no corners): what the corners cost.
MAIN_JOB = ["--profile=ci"]
NO_CORNERS = ["--max-examples=10"]
QUICK_MAIN_JOB = ["--profile=ci", "--contracts=grad_meta", "--device=cpu", "-k", "square"]
SLOW_MODE_UP_TO = 1024
STARTUP_PAIRS = 10  # figure 5 (a): at least this many pairs of runs outside --quick  # figure 3 also times slow mode up to this numel (what the threshold saves)


@dataclass(frozen=True)
class Bug:
    impl: str
    name: str
    contract: str
    extra: tuple[str, ...] = ()


# Figure 4: known bugs from tests/zoo/, each run with the contract that owns its failure.
BUGS = (
    Bug("tests/zoo/core_bugs.py", "unreduced_bias_grad", "grad_meta"),
    Bug("tests/zoo/gradcheck_bugs.py", "five_percent_off", "gradcheck"),
    Bug("tests/zoo/numeric_bugs.py", "naive_softmax", "stability"),
    # Found only on multi-block rows with a partial tail: the meta-test uses 20 examples. Its forward
    # drops the tail: reference's defect (gradcheck meets it as a wrong Jacobian and is blocked by it).
    Bug("tests/zoo/partial_block_bug.py", "tail_dropping_row_sum", "reference", ("--max-examples=20",)),
    Bug("tests/zoo/real_world_bugs.py", "layer_norm_f32_bug", "stability"),
)
QUICK_BUGS = BUGS[:1]


# ----------------------------------------------------------------------------- context


@dataclass
class Bench:
    runs: int
    quick: bool
    tmp: Path
    raw: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # spec name -> module that registered it

    def suite_args(self) -> list[str]:
        return list(QUICK_SUITE) if self.quick else []

    def spec_origins(self) -> dict[str, str]:
        """Which module registered each default (reference_ops) Function: from a recorder run if
        figure 2 ran, else one small subprocess."""
        if not self.origins:
            code = (
                "import json, os, torch\n"
                "if not torch.cuda.is_available(): os.environ.setdefault('TRITON_INTERPRET', '1')\n"
                "import reference_ops\n"
                "from conformance.spec import registered\n"
                "print(json.dumps({s.name: s.origin for s in registered()}))\n"
            )
            child = checked(run_child([sys.executable, "-c", code]))
            self.origins = json.loads(child.stdout.strip().splitlines()[-1])
        return self.origins


# ----------------------------------------------------------------------------- figure 1


def figure_default(bench: Bench) -> list[str]:
    serial, xdist, junit = [], [], []
    for run in range(bench.runs):
        progress(f"figure 1: serial run {run + 1}/{bench.runs}")
        xml = bench.tmp / f"serial-{run}.xml"
        serial.append(checked(run_child(pytest_command(*bench.suite_args(), f"--junitxml={xml}"))))
        junit.append(junit_times(xml))
        progress(f"figure 1: -n 2 run {run + 1}/{bench.runs}")
        xdist.append(checked(run_child(pytest_command(*bench.suite_args(), "-n", "2"))))
    main_job, no_corners, main_xdist = [], [], []
    main_args = QUICK_MAIN_JOB if bench.quick else MAIN_JOB
    for run in range(bench.runs):
        progress(f"figure 1: main job (--profile=ci), serial, run {run + 1}/{bench.runs}, with and without corners, and -n 2")
        main_job.append(checked(run_child(pytest_command(*main_args))))
        no_corners.append(checked(run_child(pytest_command(*main_args, *NO_CORNERS))))
        main_xdist.append(checked(run_child(pytest_command(*main_args, "-n", "2"))))
    if bench.quick:
        threads2 = serial[-1]  # --quick reuses a serial run for this row: the smoke test checks the script, not numbers
    else:
        progress("figure 1: serial run with --threads=2")
        threads2 = checked(run_child(pytest_command(*bench.suite_args(), "--threads=2")))

    serial_wall = median([c.wall for c in serial])
    serial_cpu = median([c.cpu for c in serial])
    rows = [
        ["serial (default)", spread([c.wall for c in serial]), spread([c.cpu for c in serial]),
         spread([c.cpu / c.wall for c in serial], fmt_ratio), serial[-1].summary],
        ["`-n 2` (xdist)", spread([c.wall for c in xdist]), spread([c.cpu for c in xdist]),
         spread([c.cpu / c.wall for c in xdist], fmt_ratio), xdist[-1].summary],
        ["serial, `--threads=2` (1 run)" + (" (--quick: the serial run's)" if bench.quick else ""),
         fmt_seconds(threads2.wall), fmt_seconds(threads2.cpu),
         fmt_ratio(threads2.cpu / threads2.wall), threads2.summary],
        [f"main job `{' '.join(main_args)}`, serial", spread([c.wall for c in main_job]),
         spread([c.cpu for c in main_job]), spread([c.cpu / c.wall for c in main_job], fmt_ratio), main_job[-1].summary],
        [f"the same with `{' '.join(NO_CORNERS)}` (no coverage phase)", spread([c.wall for c in no_corners]),
         spread([c.cpu for c in no_corners]), spread([c.cpu / c.wall for c in no_corners], fmt_ratio), no_corners[-1].summary],
        [f"main job `{' '.join(main_args)} -n 2`", spread([c.wall for c in main_xdist]),
         spread([c.cpu for c in main_xdist]), spread([c.cpu / c.wall for c in main_xdist], fmt_ratio), main_xdist[-1].summary],
    ]
    command = " ".join(["pytest conformance -p no:cacheprovider -q", *bench.suite_args()])
    lines = [f"Command: `{command}` (default profile `dev`, default `--impl=reference_ops`), {bench.runs} run(s) each.", ""]
    lines += table(["mode", "wall", "CPU (user+sys)", "CPU / wall", "tests"], rows)
    speedups = [s.wall / x.wall for s, x in zip(serial, xdist)]
    lines += [
        "",
        f"- `-n 2` speed-up (serial wall / xdist wall, run by run): {spread(speedups, fmt_ratio)}; "
        f"CPU cost of `-n 2` vs serial: {fmt_ratio(median([c.cpu for c in xdist]) / serial_cpu)}.",
        f"- Thread policy: `--threads=2` vs the default 1 thread: CPU {fmt_ratio(threads2.cpu / serial_cpu)}, "
        f"wall {fmt_ratio(threads2.wall / serial_wall)} (one run against the serial median).",
        f"- Main job `-n 2` speed-up (serial wall / xdist wall, run by run): "
        f"{spread([s.wall / x.wall for s, x in zip(main_job, main_xdist)], fmt_ratio)}.",
        f"- The coverage phase in the main job: CPU with corners / without, run by run: "
        f"{spread([a.cpu / b.cpu for a, b in zip(main_job, no_corners)], fmt_ratio)}.",
    ]

    # Per contract and per Function, from the serial runs' JUnit times (median over runs).
    keys = sorted(set().union(*junit))
    per_test = {key: median([times.get(key, float("nan")) for times in junit]) for key in keys}
    total = sum(per_test.values()) or float("nan")
    by_contract: dict[str, list[float]] = defaultdict(list)
    by_function: dict[str, list[float]] = defaultdict(list)
    for (contract, function), seconds in per_test.items():
        by_contract[contract].append(seconds)
        by_function[function].append(seconds)
    origins = bench.spec_origins()
    lines += ["", f"Per contract (sum of pytest's per-test times, median over the serial runs; all tests: {fmt_seconds(total)}), top 10:", ""]
    top_contracts = sorted(by_contract.items(), key=lambda item: -sum(item[1]))[:10]
    lines += table(["contract", "tests", "time", "share", "per test"], [
        [c, len(v), fmt_seconds(sum(v)), f"{100 * sum(v) / total:.1f}%", fmt_seconds(sum(v) / len(v))] for c, v in top_contracts
    ])
    lines += ["", "Per Function (all contracts, both device ids), top 10:", ""]
    top_functions = sorted(by_function.items(), key=lambda item: -sum(item[1]))[:10]
    lines += table(["Function", "registered in", "time", "share"], [
        [f, origins.get(f, "?"), fmt_seconds(sum(v)), f"{100 * sum(v) / total:.1f}%"] for f, v in top_functions
    ])
    triton = {f: sum(v) for f, v in by_function.items() if origins.get(f, "").startswith(TRITON_ORIGIN)}
    lines += ["", (
        f"- Triton share: {len(triton)} of {len(by_function)} Functions ({', '.join(sorted(triton)) or 'none'}) are "
        f"registered in `{TRITON_ORIGIN}` and take {fmt_seconds(sum(triton.values()))} = "
        f"{100 * sum(triton.values()) / total:.1f}% of the test time (Triton runs "
        f"{'interpreted' if os.environ.get('TRITON_INTERPRET', '1') == '1' else 'natively'} without CUDA)."
    )]
    bench.raw["1"] = {
        "serial": [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in serial],
        "xdist": [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in xdist],
        "threads2": {"wall": threads2.wall, "cpu": threads2.cpu, "summary": threads2.summary},
        "main_job": [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in main_job],
        "main_job_no_corners": [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in no_corners],
        "main_job_xdist": [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in main_xdist],
        "per_test_median": {f"{c}[{f}]": s for (c, f), s in per_test.items()},
        "triton_functions": triton,
    }
    return lines


# ----------------------------------------------------------------------------- figure 2

WARM_UP = "first test of the run"
REPLAY_SHARE = 0.10  # a contract whose non-replayable in-run torch time exceeds this share uses the fallback


def _bare(row: dict[str, float]) -> tuple[float, float, str, float]:
    """(bare wall, bare CPU, method, share of the in-run torch time not replayed) of one
    contract's sums in one run."""
    in_run = row["replayable"] + row["not_replayed"]
    if not in_run:
        return 0.0, 0.0, "nothing evaluated", 0.0
    share = row["not_replayed"] / in_run
    if share <= REPLAY_SHARE:
        return row["bare_wall"] + row["not_replayed"], row["bare_cpu"] + row["not_replayed_cpu"], "replay", share
    return in_run, row["replayable_cpu"] + row["not_replayed_cpu"], "in-run torch time (no faithful replay)", share


def _methods(found: list[tuple[str, float]]) -> str:
    """One method cell for the runs of a row: ``replay + 3–5% in-run``."""
    parts = []
    for method in sorted({m for m, _ in found}):
        shares = [100 * share for m, share in found if m == method]
        if method == "replay" and max(shares) >= 0.5:
            low, high = round(min(shares)), round(max(shares))
            method += f" + {low}% in-run" if low == high else f" + {low}–{high}% in-run"
        parts.append(method)
    return "; ".join(parts)


def figure_overhead(bench: Bench) -> list[str]:
    pythonpath = os.pathsep.join([str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])])
    runs = []
    for run in range(bench.runs):
        progress(f"figure 2: recorded run {run + 1}/{bench.runs}")
        out = bench.tmp / f"recorded-{run}.json"
        env = child_env({"PYTHONPATH": pythonpath, "BENCH_RECORDER_OUT": str(out), "BENCH_RECORDER_MODE": "replay"})
        child = checked(run_child(pytest_command(*bench.suite_args(), "-p", "bench_recorder"), env=env))
        data = json.loads(out.read_text())
        runs.append((child, data))
        if data.get("origins"):
            bench.origins = bench.origins or data["origins"]

    # Per run and contract: sums over its tests.
    per_run: list[dict[str, dict[str, float]]] = []
    notes: dict[str, set[str]] = defaultdict(set)
    for _, data in runs:
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for index, test in enumerate(data["tests"]):
            if not test["contract"]:
                continue
            # The first test pays the process's one-time warm-up (lazy imports, first autograd and
            # dispatch-mode calls): its own row, so that it does not inflate its contract's ratio.
            contract = WARM_UP if index == 0 else test["contract"]
            row = sums[contract]
            row["tests"] += 1
            row["cases"] += test["examples"]
            row["suite"] += sum(test["durations"].values()) - test["bookkeeping"]
            row["suite_cpu"] += test["cpu"] - test["bookkeeping"]
            row["bookkeeping"] += test["bookkeeping"]
            row["replayable"] += sum(entry[1] for entry in test["replayed"].values()) - test["replay_error_seconds"]
            row["replayable_cpu"] += sum(entry[2] for entry in test["replayed"].values()) - test["replay_error_cpu"]
            row["not_replayed"] += sum(entry[1] for entry in test["not_replayed"].values()) + test["replay_error_seconds"]
            row["not_replayed_cpu"] += sum(entry[2] for entry in test["not_replayed"].values()) + test["replay_error_cpu"]
            row["bare_wall"] += test["replay_wall"]
            row["bare_cpu"] += test["replay_cpu"]
            row["errors"] += test["replay_errors"]
            for kind in test["not_replayed"]:
                notes[contract].add(kind)
            if test["replay_error_sample"]:
                notes[contract].add("replay raised: " + test["replay_error_sample"][:80])
        per_run.append(sums)

    contracts = [*sorted(set().union(*per_run) - {WARM_UP}), WARM_UP]
    header = ["contract", "tests", "suite wall", "suite CPU", "in torch calls (run)", "bare wall", "bare CPU",
              "suite / bare (wall)", "suite / bare (CPU)", "method"]
    rows: list[list[Any]] = []
    test_count = 0
    totals: dict[str, list[float]] = defaultdict(list)
    for contract in contracts:
        values: dict[str, list[float]] = defaultdict(list)
        methods: list[tuple[str, float]] = []
        for sums in per_run:
            if contract not in sums:
                continue
            row = sums[contract]
            wall, cpu, method, share = _bare(row)
            methods.append((method, share))
            values["suite"].append(row["suite"])
            values["suite_cpu"].append(row["suite_cpu"])
            values["inside"].append(row["replayable"] + row["not_replayed"])
            values["bare"].append(wall)
            values["bare_cpu"].append(cpu)
            values["ratio"].append(row["suite"] / wall if wall else float("nan"))
            values["ratio_cpu"].append(row["suite_cpu"] / cpu if cpu else float("nan"))
        tests = int(per_run[0][contract]["tests"]) if contract in per_run[0] else 0
        test_count += tests
        rows.append([contract, tests, spread(values["suite"]), spread(values["suite_cpu"]), spread(values["inside"]),
                     spread(values["bare"]), spread(values["bare_cpu"]), spread(values["ratio"], fmt_ratio),
                     spread(values["ratio_cpu"], fmt_ratio), _methods(methods)])
    for sums in per_run:
        bare = [_bare(row) for row in sums.values()]
        totals["suite"].append(sum(row["suite"] for row in sums.values()))
        totals["suite_cpu"].append(sum(row["suite_cpu"] for row in sums.values()))
        totals["bare"].append(sum(b[0] for b in bare))
        totals["bare_cpu"].append(sum(b[1] for b in bare))
        totals["bookkeeping"].append(sum(row["bookkeeping"] for row in sums.values()))
    process = [child.wall - data.get("replay_seconds", 0.0) for child, data in runs]
    process_cpu = [child.cpu - data.get("replay_seconds", 0.0) for child, data in runs]  # the replay runs on one core

    def ratios(top: list[float], bottom: list[float]) -> str:
        return spread([t / b for t, b in zip(top, bottom) if b], fmt_ratio)

    rows.append(["**all tests**", test_count, spread(totals["suite"]), spread(totals["suite_cpu"]), "",
                 spread(totals["bare"]), spread(totals["bare_cpu"]), ratios(totals["suite"], totals["bare"]),
                 ratios(totals["suite_cpu"], totals["bare_cpu"]), ""])
    rows.append(["**whole pytest process** (with start-up, collection, summary)", "", spread(process), spread(process_cpu), "",
                 spread(totals["bare"]), spread(totals["bare_cpu"]), ratios(process, totals["bare"]),
                 ratios(process_cpu, totals["bare_cpu"]), ""])
    command = " ".join(["pytest conformance -p no:cacheprovider -q", *bench.suite_args(), "-p bench_recorder"])
    lines = [f"Command: `{command}` (benchmarks/ on PYTHONPATH), {bench.runs} run(s); serial, default 1 thread.", ""]
    lines += table(header, rows)
    lines += [
        "",
        "- suite: the contract's tests, pytest's setup+call+teardown (wall) and this process's CPU time from test start "
        "to end, minus the recorder's own bookkeeping "
        f"({spread(totals['bookkeeping'])} in all). in torch calls (run): wall time inside the outermost evaluation "
        "calls (execute, run_reference, evaluate_spec, gradcheck, gradgradcheck, Function.apply, autograd.grad/backward, a torch.compile-d callable) "
        "during the run, probes included.",
        "- method `replay`: bare = the same evaluations (same Cases, same grad_output tensors, same gradcheck "
        "arguments) replayed once after the run in a plain loop, timed call by call with inputs built beforehand: "
        "Function.apply + torch.autograd.grad, plain reference calls, gradcheck on an unprobed closure; no pytest, "
        f"Hypothesis, probe, term bounds or checks. `+ N% in-run`: calls that cannot be replayed (at most "
        f"{100 * REPLAY_SHARE:.0f}% of the contract's in-run torch time) are counted at their in-run time.",
        "- method `in-run torch time`: the contract drives the Function itself (probed apply, autograd.grad on its "
        "own graphs) for more than that share, so no faithful replay exists: bare = time inside the torch-level calls "
        "during the run (probe overhead included, so its ratio is understated).",
        "- whole pytest process: the child's wall and CPU time minus the replay's.",
    ]
    for contract in contracts:
        if notes.get(contract):
            lines.append(f"- {contract}, not replayed: {', '.join(sorted(notes[contract]))}.")
    first = runs[0][1]["tests"][0] if runs and runs[0][1]["tests"] else None
    if first is not None:
        lines.append(
            f"- {WARM_UP}: {first['nodeid'].split('::')[-1]}, kept out of its contract's row: it pays the process's "
            "one-time warm-up (lazy imports, e.g. torch._dynamo on the first dispatch mode; first autograd calls), "
            "which the replay, run after the suite, does not."
        )
    bench.raw["2"] = {"per_run": [{c: dict(v) for c, v in sums.items()} for sums in per_run],
                      "process_wall": process, "process_cpu": process_cpu}
    return lines


# ----------------------------------------------------------------------------- figure 3


def figure_gradcheck(bench: Bench) -> list[str]:
    numels = QUICK_NUMELS if bench.quick else NUMELS
    slow_up_to = 256 if bench.quick else SLOW_MODE_UP_TO
    progress(f"figure 3: gradcheck at numels {numels}")
    child = checked(run_child([sys.executable, str(BENCH / "gradcheck_cost.py"), "--numels", ",".join(map(str, numels)),
                               "--repeats", str(bench.runs), "--slow-up-to", str(slow_up_to)]))
    data = json.loads(child.stdout.strip().splitlines()[-1])
    rows = []
    for row in data["rows"]:
        suite = row["suite"]
        per_element = [w / row["numel"] for w in suite["wall"]]
        slow = row.get("slow")
        rows.append([
            row["numel"], row["in_out_numel"], row["suite_mode"], spread(suite["wall"]), spread(suite["cpu"]),
            spread(per_element), spread(slow["wall"]) if slow else "—",
        ])
    lines = [
        f"`torch.autograd.gradcheck` as the gradcheck contract calls it (function_of_tensors closure, eps=FD_EPS, its "
        f"atol/rtol per mode) on reference_ops `{data['function']}` (one float64 input of n elements), 1 thread; fast "
        f"mode when in+out numel > GRADCHECK_FAST_MODE_ELEMENTS = {data['threshold']} (conformance/engine/finite_differences.py). "
        f"{bench.runs} timed call(s) per row after one warm-up call.",
        "",
    ]
    lines += table(["numel", "in+out numel", "suite's mode", "time per call", "CPU per call", "time per element",
                    f"slow mode instead (n ≤ {slow_up_to})"], rows)
    fast = [r for r in data["rows"] if r["suite_mode"] == "fast"]
    if len(fast) >= 2:
        a, b = fast[0], fast[-1]
        growth = median(b["suite"]["wall"]) / median(a["suite"]["wall"])
        lines += ["", f"- Above the threshold: numel x{b['numel'] / a['numel']:.0f} ({a['numel']} -> {b['numel']}) costs "
                      f"x{growth:.1f} time per call."]
        if len(fast) >= 3:
            c = fast[-2]
            slope = (median(b["suite"]["wall"]) - median(c["suite"]["wall"])) / (b["numel"] - c["numel"])
            lines.append(f"- Marginal cost per element between n={c['numel']} and n={b['numel']}: {fmt_seconds(slope)} "
                         f"(the linear part); below that, the per-call overhead dominates.")
    slow_rows = [r for r in data["rows"] if r["suite_mode"] == "slow"]
    if slow_rows and fast:
        s, f = slow_rows[-1], fast[0]
        lines.append(f"- At the threshold: slow mode at n={s['numel']} costs {fmt_seconds(median(s['suite']['wall']))} per call, "
                     f"fast mode at n={f['numel']} {fmt_seconds(median(f['suite']['wall']))}.")
    bench.raw["3"] = data
    return lines


# ----------------------------------------------------------------------------- figure 4


def figure_failures(bench: Bench) -> list[str]:
    pythonpath = os.pathsep.join([str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])])
    rows, raw = [], {}
    for bug in QUICK_BUGS if bench.quick else BUGS:
        samples: dict[str, list[float]] = defaultdict(list)
        found = 0
        for run in range(bench.runs):
            progress(f"figure 4: {bug.name} run {run + 1}/{bench.runs}")
            out = bench.tmp / f"failure-{bug.name}-{run}.json"
            env = child_env({"PYTHONPATH": pythonpath, "BENCH_RECORDER_OUT": str(out), "BENCH_RECORDER_MODE": "failures"})
            command = pytest_command(f"--impl={bug.impl}", "-k", bug.name, f"--contracts={bug.contract}", "--device=cpu",
                                     *bug.extra, "-p", "bench_recorder")
            child = checked(run_child(command, env=env), allowed=(0, 1), expected="0 or 1")
            tests = json.loads(out.read_text())["tests"]
            failing = [t for t in tests if t["outcome"] == "failed" and t["first_failure"] is not None]
            samples["wall"].append(child.wall)
            samples["cpu"].append(child.cpu)
            if not failing:
                continue
            found += 1
            test = failing[0]
            samples["to_first"].append(test["first_failure"] - child.spawned)
            samples["before_test"].append(test["start"] - child.spawned)
            samples["in_test"].append(test["first_failure"] - test["start"])
            samples["shrink"].append(test["end"] - test["first_failure"])
            samples["shrink_share"].append((test["end"] - test["first_failure"]) / child.wall)
            samples["examples"].append(test["examples"])
        raw[bug.name] = {"bug": bug.__dict__, "found": found, **samples}
        share = spread([100 * s for s in samples["shrink_share"]], lambda v: f"{v:.0f}%") if found else "—"
        rows.append([
            f"`{bug.name}` ({Path(bug.impl).name})", bug.contract + (" " + " ".join(bug.extra) if bug.extra else ""),
            f"{found}/{bench.runs}", spread(samples["wall"]), spread(samples["to_first"]) if found else "not found",
            spread(samples["before_test"]) if found else "—", spread(samples["in_test"]) if found else "—",
            spread(samples["shrink"]) if found else "—", share,
            spread(samples["examples"], lambda v: f"{v:.0f}") if found else "—",
        ])
    lines = [
        "`pytest conformance -p no:cacheprovider -q --impl=tests/zoo/FILE.py -k NAME --contracts=CONTRACT --device=cpu` "
        "(default profile; `-p bench_recorder` stamps when the first failing example raised).",
        "",
    ]
    lines += table(["bug", "contract", "found", "process wall", "to first failure (from process start)",
                    "start-up + collection", "test start -> first failure", "first failure -> test end (shrink, repro)",
                    "shrink share of wall", "cases drawn"], rows)
    lines += ["", "- test start -> first failure includes the process's one-time warm-up paid by its first test "
              "(see figure 2); cases drawn: Case draws in the failing test, shrinking included."]
    bench.raw["4"] = raw
    return lines


# ----------------------------------------------------------------------------- figure 5


def figure_startup(bench: Bench) -> list[str]:
    project = bench.tmp / "unrelated-project"
    project.mkdir(exist_ok=True)
    (project / "test_trivial.py").write_text("def test_trivial():\n    assert 1 + 1 == 2\n")
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    active, disabled, collect = [], [], []
    # The plugin's cost is small against a 1-2 s pytest start-up: more pairs than --runs (cheap).
    pairs = bench.runs if bench.quick else max(bench.runs, STARTUP_PAIRS)
    for run in range(pairs):
        progress(f"figure 5: start-up pair {run + 1}/{pairs}")
        active.append(checked(run_child(base, cwd=project)))
        disabled.append(checked(run_child([*base, "-p", f"no:{PLUGIN_ENTRY_POINT}"], cwd=project)))
    for _ in range(bench.runs):
        collect.append(checked(run_child(pytest_command("--collect-only"))))
    loaded = "autograd-conformance" in checked(run_child([*base, "--help"], cwd=project)).stdout
    rows = [
        ["(a) unrelated project, plugin active (entry point)", spread([c.wall for c in active]), spread([c.cpu for c in active]),
         active[-1].summary],
        [f"same, `-p no:{PLUGIN_ENTRY_POINT}`", spread([c.wall for c in disabled]), spread([c.cpu for c in disabled]),
         disabled[-1].summary],
        ["difference (plugin's cost), pair by pair", spread([a.wall - d.wall for a, d in zip(active, disabled)]),
         spread([a.cpu - d.cpu for a, d in zip(active, disabled)]), ""],
        [f"(b) `pytest conformance --collect-only -q` (repo root), {bench.runs} run(s)", spread([c.wall for c in collect]), spread([c.cpu for c in collect]),
         collect[-1].summary],
    ]
    lines = [f"(a) A temporary project with one trivial test, {pairs} alternating pair(s) of runs; the plugin "
             f"{'is' if loaded else 'is NOT'} registered in this environment (`pytest --help` shows its options).", ""]
    lines += table(["what", "wall", "CPU", "result"], rows)
    bench.raw["5"] = {
        "active": [(c.wall, c.cpu) for c in active],
        "disabled": [(c.wall, c.cpu) for c in disabled],
        "collect_only": [(c.wall, c.cpu) for c in collect],
        "plugin_registered": loaded,
    }
    return lines


MEMORY_CONTRACTS = ("unwritten_memory", "out_of_bounds", "saved_memory")


def figure_memory(bench: Bench) -> list[str]:
    """The default run three ways: as shipped; without the three memory contracts; and without
    them and with the allocation checks of every evaluation replaced by a no-op
    (benchmarks/no_memory_checks.py)."""
    skip = "--skip-contracts=" + ",".join(MEMORY_CONTRACTS)
    env = child_env({"PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH", "")]))})
    variants = {
        "as shipped": pytest_command(*bench.suite_args()),
        "without the memory contracts": pytest_command(*bench.suite_args(), skip),
        "without them and without allocation checks": pytest_command(*bench.suite_args(), skip, "-p", "no_memory_checks"),
    }
    runs: dict[str, list[Child]] = {name: [] for name in variants}
    for run in range(bench.runs):
        for name, command in variants.items():  # interleaved, so load drifts hit every variant alike
            progress(f"figure 6: {name}, run {run + 1}/{bench.runs}")
            runs[name].append(checked(run_child(command, env=env)))
    shipped, no_contracts, bare = (median([c.cpu for c in runs[name]]) for name in variants)
    rows = [[name, spread([c.wall for c in children]), spread([c.cpu for c in children]), children[-1].summary]
            for name, children in runs.items()]
    shown = " ".join(["pytest conformance -p no:cacheprovider -q", *bench.suite_args()])
    lines = [f"Command: `{shown}`, {bench.runs} run(s) of each variant, interleaved.", ""]
    lines += table(["variant", "wall", "CPU (user+sys)", "tests"], rows)
    lines += [
        "",
        f"- The three memory contracts (`{'`, `'.join(MEMORY_CONTRACTS)}`): {fmt_seconds(shipped - no_contracts)} CPU, "
        f"{100 * (shipped - no_contracts) / shipped:.0f}% of the run.",
        f"- Poisoned, canary-margined allocations in every evaluation of every other contract: "
        f"{fmt_seconds(no_contracts - bare)} CPU, {100 * (no_contracts - bare) / shipped:.0f}% of the run.",
    ]
    bench.raw["6"] = {name: [{"wall": c.wall, "cpu": c.cpu, "summary": c.summary} for c in children]
                      for name, children in runs.items()}
    return lines


# ----------------------------------------------------------------------------- report


FIGURE_FUNCTIONS: dict[str, Callable[[Bench], list[str]]] = {
    "1": figure_default,
    "2": figure_overhead,
    "3": figure_gradcheck,
    "4": figure_failures,
    "5": figure_startup,
    "6": figure_memory,
}
ORDER = ("2", "1", "3", "4", "5", "6")  # figure 2 first: its recorder run names each Function's module for figure 1


def selected(only: str | None) -> list[str]:
    if not only:
        return list(FIGURES)
    names = {name: number for number, name in FIGURES.items()}
    chosen = []
    for item in only.split(","):
        item = item.strip()
        number = item if item in FIGURES else names.get(item)
        if number is None:
            raise SystemExit(f"--only: unknown figure {item!r}; choose from {', '.join(f'{k} ({v})' for k, v in FIGURES.items())}")
        chosen.append(number)
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median and min-max); default 3")
    parser.add_argument("--quick", action="store_true", help="cut-down smoke version (few contracts and Functions, 2 examples)")
    parser.add_argument("--only", metavar="FIGURE", help="comma-separated figures: " + ", ".join(f"{k} ({v})" for k, v in FIGURES.items()))
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers to PATH")
    options = parser.parse_args(argv)
    if options.runs < 1:
        parser.error("--runs must be >= 1")
    figures = selected(options.only)
    started = datetime.datetime.now(datetime.timezone.utc)
    load = os.getloadavg()
    sections: dict[str, list[str]] = {}
    failed = False
    with tempfile.TemporaryDirectory(prefix="autograd-conformance-bench-") as tmp:
        bench = Bench(runs=options.runs, quick=options.quick, tmp=Path(tmp))
        for number in (n for n in ORDER if n in figures):
            begun = time.perf_counter()
            try:
                body = FIGURE_FUNCTIONS[number](bench)
            except (ChildFailed, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as error:
                failed = True
                body = [f"**not measured**: {type(error).__name__}: {error}"]
            progress(f"figure {number} done in {time.perf_counter() - begun:.0f} s")
            sections[number] = [f"## {TITLES[number]}", "", *body, ""]
    lines = [*header(bench.runs, bench.quick, started, load), ""]
    for number in figures:
        lines += sections[number]
    end_load = os.getloadavg()
    lines.append(f"Load average at the end: {end_load[0]:.2f} / {end_load[1]:.2f} / {end_load[2]:.2f}; "
                 f"total {fmt_seconds((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds())}.")
    print("\n".join(lines))
    if options.json:
        Path(options.json).write_text(json.dumps({"started": started.isoformat(), "runs": options.runs, "quick": options.quick,
                                                  "figures": bench.raw}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
