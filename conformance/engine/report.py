"""Failure messages: one format for every contract.

``<what>=<got>, but should be <expected> [<where>]`` on the first line (the array-api-tests
convention), then the mismatch in numbers (assert_close style), the case, a runnable repro
snippet and the pytest command that replays the example.
"""

from __future__ import annotations

import contextvars
import math
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from conformance.spec import Spec
from strategies.cases import Case

__all__ = [
    "ContractFailure",
    "TestContext",
    "UpstreamFailure",
    "advise",
    "contract_failure",
    "current_context",
    "describe_value",
    "fail",
    "finiteness_report",
    "mismatch_report",
    "suite_frame",
    "upstream",
    "user_frames",
]


class ContractFailure(AssertionError):
    """A Function broke a contract. ``str()`` is the whole user-facing report.

    The report ends with how to reproduce it: the path of the repro script once the runner
    has written one (``repro_path``), else an inline snippet, then the rerun command.
    """

    def __init__(self, contract: str, spec_name: str, summary: str, head: str, *, snippet: str = "", rerun: str = "") -> None:
        self.contract = contract
        self.spec_name = spec_name
        self.summary = summary
        self.head = head
        self.snippet = snippet
        self.rerun = rerun
        self.repro_path = ""
        self.dtype: torch.dtype | None = None  # the failing example's dtype, when known
        self.case_text = ""  # the failing example's case, described, when known
        # False for a structural finding (a missing or misshapen gradient, a wrong output count):
        # values that differ from themselves (undeclared randomness) cannot explain it.
        self.compares_values = True
        super().__init__(head)

    def report_text(self, *, include_repro: bool = True) -> str:
        lines = [self.head]
        if include_repro and self.repro_path:
            lines.append(f"  repro script: python {self.repro_path}")
        elif include_repro and self.snippet:
            lines.append("  repro:")
            lines.extend(f"    {line}" for line in self.snippet.splitlines())
        if include_repro and self.rerun:
            lines.append(f"  rerun: {self.rerun}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report_text()


class UpstreamFailure(ContractFailure):
    """A failure only a torch component causes (torch.compile), while eager is right on the same
    inputs: torch's bug, reported as such (it does not fail the run unless --upstream=fail)."""


@dataclass
class TestContext:
    """What a failure report needs to know about the running test (set by the runner)."""

    contract: str
    spec: Spec
    device: str
    nodeid: str = ""
    rerun: str = ""
    case: Case | None = None
    dtypes_seen: set[torch.dtype] = field(default_factory=set)
    # Examples on which the contract checked its property, and why the others could not (in
    # the order first given): a test none of whose examples checked anything is not a pass.
    checked: int = 0
    unchecked: dict[str, None] = field(default_factory=dict)
    # Examples the Triton interpreter could not run faithfully (bfloat16, a libdevice function
    # without a fallback): not checked, and "not run here" when no example was.
    interpreter_limits: dict[str, None] = field(default_factory=dict)
    # The first advice (performance or hygiene of correct code) an example gave: the test passes
    # with it, unless a defect fails it.
    advice: ContractFailure | None = None
    upstream: UpstreamFailure | None = None  # torch's bug noted while the contract went on checking

    def use_case(self, case: Case) -> None:
        """The case now being checked: failure reports describe it and rebuild it."""
        self.case = case
        self.dtypes_seen.add(case.dtype)


_context: contextvars.ContextVar[TestContext | None] = contextvars.ContextVar("conformance_context", default=None)


def current_context() -> TestContext | None:
    return _context.get()


def set_context(context: TestContext | None) -> contextvars.Token[TestContext | None]:
    return _context.set(context)


def reset_context(token: contextvars.Token[TestContext | None]) -> None:
    _context.reset(token)


def describe_value(value: Any) -> str:
    """Short description of a backward return entry: ``Tensor((4, 3), float32, cpu)``/``None``."""
    if isinstance(value, torch.Tensor):
        return f"Tensor({tuple(value.shape)}, {value.dtype}, {value.device})"
    return repr(value) if value is None or isinstance(value, (int, float, bool)) else type(value).__name__


def fail(
    summary: str, *details: str, contract: str | None = None, spec: Spec | None = None, case: Case | None = None,
    compares_values: bool = True,
) -> NoReturn:
    """Raise :class:`ContractFailure` with the standard report for the running test;
    ``compares_values=False`` for a structural finding (see ``ContractFailure.compares_values``)."""
    __tracebackhide__ = True
    failure = contract_failure(summary, *details, contract=contract, spec=spec, case=case)
    failure.compares_values = compares_values
    raise failure


def advise(summary: str, *details: str) -> None:
    """Record advice on correct code for the running test (the first one given is kept); the
    contract goes on checking correctness, and a defect it finds later still fails the test."""
    context = current_context()
    if context is not None and context.advice is None:
        context.advice = contract_failure(summary, *details)


def upstream_noted(summary: str, *details: str) -> None:
    """Record an upstream finding (torch's bug) for the running test the way :func:`advise`
    records advice: the contract goes on checking correctness, a defect it finds later still
    fails the test, and a test that passes is concluded as upstream."""
    context = current_context()
    if context is not None and context.upstream is None:
        found = contract_failure(summary, *details, kind=UpstreamFailure)
        assert isinstance(found, UpstreamFailure)
        context.upstream = found


def upstream(summary: str, *details: str) -> NoReturn:
    """Raise :class:`UpstreamFailure`: torch, not the Function, is wrong on this example."""
    __tracebackhide__ = True
    raise contract_failure(summary, *details, kind=UpstreamFailure)


def contract_failure(
    summary: str,
    *details: str,
    contract: str | None = None,
    spec: Spec | None = None,
    case: Case | None = None,
    kind: type[ContractFailure] = ContractFailure,
) -> ContractFailure:
    """The :class:`ContractFailure` (or ``kind``) :func:`fail` raises, for a caller that must carry it."""
    context = current_context()
    contract = contract or (context.contract if context else "?")
    spec = spec or (context.spec if context else None)
    case = case or (context.case if context else None)
    fn_name = f"{spec.display_name} ({spec.name!r})" if spec is not None else "?"
    lines = [f"[{contract}] {fn_name}: {summary}"]
    lines.extend(f"  {line}" for detail in details if detail for line in detail.splitlines())
    if case is not None:
        lines.append(f"  case: {case.describe()}")
    failure = kind(
        contract, spec.name if spec else "?", summary, "\n".join(lines),
        snippet=case.repro() if case is not None else "", rerun=context.rerun if context is not None else "",
    )
    failure.dtype = case.dtype if case is not None else None
    failure.case_text = case.describe() if case is not None else ""
    return failure


def _index(flat_index: int, shape: Sequence[int]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return tuple(reversed(index))


def mismatch_report(actual: torch.Tensor, expected: torch.Tensor, *, allowed: float, baseline: float | None = None) -> str:
    """assert_close-style numbers for ``|actual - expected| <= allowed`` (absolute budget).

    Reports the mismatched count and share, the greatest absolute difference and its index,
    the baseline error when given, and the allowed budget.
    """
    actual64 = actual.detach().to("cpu", torch.float64)
    expected64 = expected.detach().to("cpu", torch.float64)
    both_finite = torch.isfinite(actual64) & torch.isfinite(expected64)
    diff = torch.where(both_finite, (actual64 - expected64).abs(), torch.zeros_like(actual64))
    nan_mismatch = ~both_finite & ~(
        (actual64 == expected64) | (torch.isnan(actual64) & torch.isnan(expected64))
    )
    mismatched = (diff > allowed) | nan_mismatch
    total = actual64.numel()
    count = int(mismatched.sum())
    share = 100.0 * count / total if total else 0.0
    lines = [f"Mismatched elements: {count} / {total} ({share:.1f}%)"]
    if total:
        flat = diff.reshape(-1)
        where = int(flat.argmax())
        lines.append(
            f"Greatest absolute difference: {float(flat[where]):.6g} at index {_index(where, actual64.shape)} "
            f"(actual {float(actual64.reshape(-1)[where]):.6g}, expected {float(expected64.reshape(-1)[where]):.6g})"
        )
        if bool(nan_mismatch.any()):
            first = int(nan_mismatch.reshape(-1).nonzero()[0])
            lines.append(
                f"Non-finite mismatch at index {_index(first, actual64.shape)}: actual "
                f"{float(actual64.reshape(-1)[first])}, expected {float(expected64.reshape(-1)[first])}"
            )
    if baseline is not None:
        lines.append(f"Baseline error (reference in the same dtype): {baseline:.6g}")
    lines.append(f"Allowed: {allowed:.6g}" if math.isfinite(allowed) else "Allowed: inf")
    return "\n".join(lines)


def finiteness_report(actual: torch.Tensor, expected: torch.Tensor, differs: torch.Tensor, *, shown: int = 5) -> str:
    """Where ``actual`` and the float64 ``expected`` differ in finiteness (``differs``): the count
    and the first ``shown`` positions with both values. Differences between finite values are the
    reference contract's to report, so none are listed here."""
    total = differs.numel()
    positions = differs.reshape(-1).nonzero().reshape(-1).tolist()
    share = 100.0 * len(positions) / total if total else 0.0
    lines = [f"Positions whose finiteness differs from the float64 reference: {len(positions)} / {total} ({share:.1f}%)"]
    flat_actual, flat_expected = actual.reshape(-1), expected.reshape(-1)
    for flat in positions[:shown]:
        lines.append(
            f"  at {_index(flat, actual.shape)}: actual {float(flat_actual[flat])}, float64 reference {float(flat_expected[flat]):.6g}"
        )
    if len(positions) > shown:
        lines.append(f"  ... and {len(positions) - shown} more")
    return "\n".join(lines)


SUITE_PARTS = ("/conformance/", "/strategies/")
LIBRARY_PARTS = ("/hypothesis/", "/torch/")


def _within(frame: traceback.FrameSummary, parts: tuple[str, ...]) -> bool:
    return any(part in frame.filename for part in parts)


def user_frames(error: BaseException, limit: int = 4) -> str:
    """The innermost frames of ``error``'s traceback outside this suite, Hypothesis and torch:
    where in the user's code it was raised."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not _within(f, SUITE_PARTS + LIBRARY_PARTS)]
    if not frames:
        return ""
    return "raised at:\n" + "".join(traceback.format_list(frames[-limit:])).rstrip()


def suite_frame(error: BaseException) -> str:
    """``file:line`` in this suite where ``error`` came from, when no frame of the user's code is
    in its traceback and its innermost frame outside torch and Hypothesis is the suite's: a bug of
    the suite, not a finding about the Function. "" otherwise."""
    frames = traceback.extract_tb(error.__traceback__)
    if any(not _within(f, SUITE_PARTS + LIBRARY_PARTS) for f in frames):
        return ""
    ours = [f for f in frames if not _within(f, LIBRARY_PARTS)]
    if not ours or not _within(ours[-1], SUITE_PARTS):
        return ""
    return f"{ours[-1].filename}:{ours[-1].lineno}"
