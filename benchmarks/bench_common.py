"""What benchmarks/run.py needs besides its figures: running children, formatting, pytest's JUnit
times and the report's header."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- running children


@dataclass
class Child:
    command: list[str]
    rc: int
    wall: float
    cpu: float
    stdout: str
    stderr: str
    spawned: float  # time.time() just before the process started

    @property
    def summary(self) -> str:
        """pytest's last line (``594 passed, 990 skipped in 112.16s``) without the time."""
        lines = [line.strip("= ") for line in self.stdout.splitlines() if line.strip()]
        for line in reversed(lines):
            if re.search(r"\d+ (passed|failed|skipped|deselected|error|tests? collected)", line):
                return re.sub(r"\s+in [\d.]+s.*$", "", line)
        return f"rc={self.rc}"


# Dropped from every child's environment: what a user's shell does not set. Without bytecode
# caches (PYTHONDONTWRITEBYTECODE, set in some sandboxes) every pytest process recompiles the suite
# and pytest re-rewrites the Hypothesis plugin's modules: ~0.8 s a process, three processes under -n 2.
UNSET = ("OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items()
        if key not in UNSET and not key.startswith(("PYTEST_", "COV_CORE_"))
    }
    env.update(extra or {})
    return env


def run_child(command: Sequence[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 3600) -> Child:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    start = time.perf_counter()
    done = subprocess.run(list(command), cwd=cwd, env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Child(list(command), done.returncode, wall, cpu, done.stdout, done.stderr, spawned)


def pytest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q", *args]


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class ChildFailed(Exception):
    def __init__(self, child: Child, expected: str) -> None:
        tail = (child.stdout[-1500:] + "\n" + child.stderr[-1500:]).strip()
        super().__init__(f"{' '.join(child.command)} exited {child.rc} ({expected} expected):\n{tail}")


def checked(child: Child, allowed: Sequence[int] = (0,), expected: str = "0") -> Child:
    if child.rc not in allowed:
        raise ChildFailed(child, expected)
    return child


# ----------------------------------------------------------------------------- formatting


def fmt_seconds(value: float) -> str:
    if value < 0:
        return "-" + fmt_seconds(-value)
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 10:
        return f"{value:.1f} s"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def fmt_ratio(value: float) -> str:
    if value < 10:
        return f"{value:.2f}x"
    return f"{value:.1f}x" if value < 100 else f"{value:.0f}x"


def spread(values: Sequence[float], fmt: Callable[[float], str] = fmt_seconds) -> str:
    """``median (min–max)``, or the value alone for one run."""
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


# ----------------------------------------------------------------------------- figure 1


def junit_times(path: Path) -> dict[tuple[str, str], float]:
    """(contract, function) -> seconds (pytest's time per test case: setup + call + teardown)."""
    times: dict[tuple[str, str], float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        match = re.match(r"\w+\[(.+)-(cpu|cuda)\]$", name)
        contract = classname.rsplit(".", 1)[-1].removeprefix("test_")
        if match is None or not classname.rsplit(".", 1)[-1].startswith("test_"):
            continue
        times[(contract, match.group(1))] += float(case.get("time", 0) or 0)
    return times


# ----------------------------------------------------------------------------- report


def header(runs: int, quick: bool, started: datetime.datetime, load: tuple[float, ...]) -> list[str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    model = "unknown CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        nproc = str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return [
        "# autograd-conformance benchmark",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {model}; {os.cpu_count()} CPU cores, `nproc` = {nproc}; load average at start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)",
        f"- python {platform.python_version()}, torch {version('torch')}, triton {version('triton')}, "
        f"hypothesis {version('hypothesis')}, pytest {version('pytest')}, pytest-xdist {version('pytest-xdist')}",
        f"- checkout: {commit or '?'}{' (working tree modified)' if dirty else ''}; {' and '.join(UNSET)} removed from the "
        f"children's environment; {runs} run(s) per figure{'; --quick (cut-down smoke version)' if quick else ''}",
        "- cells: median (min–max) over the runs; CPU = user+sys of the pytest process and the children it waited for",
    ]
