"""Run zoo files over several seeds and print, per Function, what each seed's run said: the
evidence that a correct Function passes on every seed and that a buggy twin is caught by its owner
on every seed (issue "Right on everyone's code").

    python tools/seed_table.py tests/zoo/everyones_code_correct.py --seeds 10 --profile ci

One pytest run per (file, seed) with --conformance-report; the table has one row per Function:
the seeds on which nothing failed, and the contracts that failed with the seeds they failed on.
Extra arguments after ``--`` go to pytest (``-- -n 2 --contracts=stability``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

FAILING = ("failed", "error")


def run_seed(zoo: Path, seed: int, profile: str, extra: list[str], out: Path) -> list[dict[str, str]]:
    report = out / f"{zoo.stem}-seed{seed}"
    command = [
        sys.executable, "-m", "pytest", "conformance", f"--impl={zoo}", f"--profile={profile}", f"--seed={seed}",
        "--device=cpu", f"--conformance-report={report}", "-q", "-p", "no:cacheprovider", *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    results: list[dict[str, str]] = json.loads(Path(f"{report}.json").read_text())["results"]
    return results


def table(zoo_files: list[Path], seeds: int, profile: str, extra: list[str]) -> str:
    rows = ["| Function | seeds with no failure | failed (contract: seeds) | advice (contract: seeds) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as folder:
        for zoo in zoo_files:
            clean: dict[str, int] = defaultdict(int)
            failed: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            advice: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            for seed in range(seeds):
                by_function: dict[str, bool] = defaultdict(bool)
                for result in run_seed(zoo, seed, profile, extra, Path(folder)):
                    function = result["function"]
                    by_function.setdefault(function, False)
                    if result["outcome"] in FAILING:
                        by_function[function] = True
                        failed[function][result["contract"]].append(seed)
                    elif result.get("tier") == "advice":
                        advice[function][result["contract"]].append(seed)
                for function, any_failed in by_function.items():
                    clean[function] += not any_failed
            for function in sorted(clean):
                def shown(found: dict[str, list[int]]) -> str:
                    return "; ".join(f"{c}: {len(s)}/{seeds}" for c, s in sorted(found.items())) or "-"
                rows.append(f"| `{function}` | {clean[function]}/{seeds} | {shown(failed[function])} | {shown(advice[function])} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("zoo", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--profile", choices=("dev", "ci", "thorough"), default="ci")
    args, extra = parser.parse_known_args()
    print(table(args.zoo, args.seeds, args.profile, [e for e in extra if e != "--"]))


if __name__ == "__main__":
    main()
