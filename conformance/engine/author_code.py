"""The author's code no example ran: lines and branches of each Function's own code.

A Function's *regions* are its own functions -- forward, setup_context, backward, jvp, vmap (a
custom op's kernels and registered backward) -- and the helpers they call by name that live in the
author's files (the Function's module, or its package), followed transitively. :class:`Tracer`
records, with coverage.py, which lines and arcs of those files ran while the contract tests ran;
:func:`gaps_of` compares each region with that record: a statement that never ran, or a branch
(a line with two or more ways out) one of whose ways was never taken. Nothing of the suite,
torch or Hypothesis is measured, and what ran at import (``def`` lines) is not counted.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from conformance.spec import Spec

__all__ = ["Executed", "Gap", "Region", "Tracer", "author_files", "gaps_of", "regions_of"]


@dataclass(frozen=True)
class Region:
    """One function of the author's code: its label ("backward", "helper _segment_sums"), file,
    the first lines of its statements, and the arcs out of its branch lines."""

    label: str
    file: str
    lines: frozenset[int]
    branches: frozenset[tuple[int, int]]


@dataclass(frozen=True)
class Gap:
    """A statement (``target`` None) or a branch's way out (to ``target``; negative: leaving the
    function) of ``region`` that no example ran."""

    region: str
    file: str
    line: int
    target: int | None = None
    source: str = ""
    last: int = 0  # a run of statements that never ran: its last line (0: the one line)
    branch: int = 0  # the branch line one of whose ways leads to this run and was never taken (0: none)
    branch_source: str = ""

    def describe(self) -> str:
        name = Path(self.file).name
        where = f"{name}:{self.line}" + (f"-{self.last}" if self.last > self.line else "")
        if self.target is None:
            via = f"; the branch at {name}:{self.branch} never went there: {self.branch_source}" if self.branch else ""
            return f"{where} [{self.region}] never ran: {self.source}{via}"
        way = "the way out of the function" if self.target < 0 else f"the jump to line {self.target}"
        return f"{where} [{self.region}] branch never took {way}: {self.source}"


@dataclass
class Executed:
    """Lines and arcs that ran, by file (a union over processes and shards)."""

    lines: dict[str, set[int]] = field(default_factory=dict)
    arcs: dict[str, set[tuple[int, int]]] = field(default_factory=dict)

    def update(self, other: Executed) -> None:
        for file, lines in other.lines.items():
            self.lines.setdefault(file, set()).update(lines)
        for file, arcs in other.arcs.items():
            self.arcs.setdefault(file, set()).update(arcs)

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": {f: sorted(v) for f, v in sorted(self.lines.items())},
            "arcs": {f: sorted([a, b] for a, b in v) for f, v in sorted(self.arcs.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Executed:
        return cls(
            lines={str(f): {int(x) for x in v} for f, v in data.get("lines", {}).items()},
            arcs={str(f): {(int(a), int(b)) for a, b in v} for f, v in data.get("arcs", {}).items()},
        )


class Tracer:
    """coverage.py on the author's files only (branch coverage), for the run's process."""

    def __init__(self, files: Iterable[str]) -> None:
        import coverage  # only a run that asks for it pays the import

        self.files = sorted(set(files))
        if not self.files:
            raise ValueError("Tracer needs the author's files: coverage.py with no include measures everything")
        self._coverage = coverage.Coverage(data_file=None, branch=True, include=self.files, config_file=False)

    def start(self) -> None:
        self._coverage.start()

    def stop(self) -> Executed:
        """Stop measuring; what ran in the author's files."""
        self._coverage.stop()
        data = self._coverage.get_data()
        executed = Executed()
        for file in data.measured_files():
            executed.lines[file] = set(data.lines(file) or ())
            executed.arcs[file] = set(data.arcs(file) or ())
        return executed


def author_files(spec: Spec) -> set[str]:
    """The files of ``spec``'s regions."""
    return {region.file for region in regions_of(spec)}


def regions_of(spec: Spec) -> tuple[Region, ...]:
    """The Function's own functions and the author's helpers they call, each once."""
    home = _author_root(spec)
    seen: set[types.CodeType] = set()
    regions: list[Region] = []
    pending: list[tuple[str, Callable[..., Any]]] = list(spec.op.user_code().items())
    while pending:
        label, function = pending.pop(0)
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is None or code in seen or not _is_author_file(code.co_filename, home):
            continue
        seen.add(code)
        regions.append(_region(label, code))
        namespace = getattr(inspect.unwrap(function), "__globals__", {})
        for name in sorted(_names_used(code)):
            helper = namespace.get(name)
            if inspect.isfunction(helper):
                pending.append((f"helper {name}", helper))
    return tuple(r for r in regions if r.lines)


def gaps_of(regions: Iterable[Region], executed: Executed) -> list[Gap]:
    """Every statement and branch way of ``regions`` that never ran, in file and line order."""
    gaps: list[Gap] = []
    for region in regions:
        ran = executed.lines.get(region.file, set())
        arcs = executed.arcs.get(region.file, set())
        runs = _runs(sorted(region.lines), ran)
        leads_to: dict[int, int] = {}  # first line of a run -> the branch line whose untaken way leads there
        for start, end in sorted(region.branches - arcs):
            if start not in ran:
                continue  # the branch line itself never ran: its run says so
            if any(run[0] == end for run in runs):
                leads_to.setdefault(end, start)  # one gap: the run, naming the branch that never went there
            elif end < 0 or end in ran:
                gaps.append(Gap(region.label, region.file, start, end, source=_source_line(region.file, start)))
        for run in runs:
            branch = leads_to.get(run[0], 0)
            gaps.append(Gap(
                region.label, region.file, run[0], source=_source_line(region.file, run[0]), last=run[-1],
                branch=branch, branch_source=_source_line(region.file, branch) if branch else "",
            ))
    return sorted(gaps, key=lambda g: (g.file, g.line, g.target if g.target is not None else -10**9))


# ----------------------------------------------------------------------------- internals


def _runs(statements: list[int], ran: set[int]) -> list[list[int]]:
    """Maximal runs of consecutive statements none of which ran."""
    runs: list[list[int]] = []
    previous_missed = False
    for line in statements:
        missed = line not in ran
        if missed and previous_missed:
            runs[-1].append(line)
        elif missed:
            runs.append([line])
        previous_missed = missed
    return runs


def _author_root(spec: Spec) -> str:
    """The folder of the Function's package (its top-level package), or its own file's for a
    module loaded by path or a lone module."""
    module = sys.modules.get(spec.op.module)
    file = getattr(module, "__file__", None) or spec.source_file
    if not file:
        return ""
    top = spec.op.module.split(".")[0]
    found = importlib.util.find_spec(top) if not top.startswith("_conformance_impl_") else None
    if found is not None and found.submodule_search_locations:
        return str(Path(next(iter(found.submodule_search_locations))).resolve())
    return str(Path(file).resolve())


def _is_author_file(file: str, home: str) -> bool:
    if not home or file.startswith("<"):
        return False
    resolved = str(Path(file).resolve())
    return resolved == home or resolved.startswith(home.rstrip("/") + "/")


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes(constant)


def _names_used(code: types.CodeType) -> set[str]:
    return {name for inner in _codes(code) for name in inner.co_names}


def _region(label: str, code: types.CodeType) -> Region:
    parser = _parser(code.co_filename)
    lines = {
        parser.first_line(line)
        for inner in _codes(code)
        for _, _, line in inner.co_lines()
        if line is not None and line != inner.co_firstlineno
    } & set(parser.statements)
    exits = parser.exit_counts()
    branches = frozenset(arc for arc in parser.arcs() if arc[0] in lines and exits.get(arc[0], 0) > 1)
    return Region(label, str(Path(code.co_filename).resolve()), frozenset(lines), branches)


@cache
def _parser(file: str) -> Any:
    from coverage.parser import PythonParser

    parser = PythonParser(filename=file)
    parser.parse_source()
    return parser


@cache
def _source_lines(file: str) -> tuple[str, ...]:
    try:
        return tuple(Path(file).read_text(encoding="utf-8").splitlines())
    except OSError:
        return ()


def _source_line(file: str, line: int) -> str:
    lines = _source_lines(file)
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
