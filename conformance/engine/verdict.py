"""What one contract test concluded, as one typed value that crosses processes.

The runner (:mod:`conformance.engine.runner`) writes a :class:`Verdict` into the test item's
``user_properties`` under :data:`VERDICT_PROPERTY`, serialised as one JSON string: user
properties travel with every report, also from pytest-xdist workers and forked children, and a
string survives every serialiser on the way. The plugin reads it back with
:meth:`Verdict.from_json` (:meth:`Verdict.of` finds it); nothing is parsed out of the prose a
user reads (skip messages, pytest's long report).

The outcome vocabulary (:class:`Outcome`) is the report's: the outcome matrix, its JSON report
and its labels are keyed by :attr:`Outcome.value`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SKIP_OUTCOMES", "TIERS", "VERDICT_PROPERTY", "Outcome", "Unreported", "Verdict", "owner_missed", "tier_of",
    "unreported_defects",
]

# The key of the serialised verdict in ``item.user_properties``.
VERDICT_PROPERTY = "conformance_verdict"


class Outcome(enum.Enum):
    """How a contract test ended, in the report's words (the matrix's and JSON report's values)."""

    PASSED = "passed"
    ADVICE = "advice"  # passed, with advice on correct code (performance, hygiene)
    UPSTREAM = "upstream"  # only a torch component (torch.compile) is wrong, eager is right
    FAILED = "failed"
    ERROR = "error"  # failed outside the test's call phase (setup, teardown)
    XFAILED = "xfailed"  # an expected deviation (expectations file) occurred
    XPASSED = "xpassed"  # an expected deviation did not occur
    BLOCKED = "blocked"  # another contract's defect stops this one (see Verdict.owner)
    WAIVED = "waived"  # the spec waives this contract
    NOT_APPLICABLE = "not_applicable"  # the contract says nothing about this Function
    NOT_RUN_HERE = "not_run_here"  # this machine or run cannot check it
    SKIPPED = "skipped"  # skipped by something other than the suite


# Outcomes of a test that pytest reports as skipped.
SKIP_OUTCOMES = frozenset({Outcome.BLOCKED, Outcome.WAIVED, Outcome.NOT_APPLICABLE, Outcome.NOT_RUN_HERE, Outcome.SKIPPED})

_TEXT_FIELDS = ("reason", "owner", "case", "repro", "rerun", "message", "tier")

# What kind of finding a verdict is: a defect (wrong numbers, a crash on valid input, a memory or
# global-state error) fails; advice (performance or hygiene of correct code) and upstream (torch's
# own bug) inform, unless --advice=fail / --upstream=fail promote them to failures.
TIERS = ("defect", "advice", "upstream")
_OUTCOME_TIERS = {Outcome.FAILED: "defect", Outcome.ERROR: "defect", Outcome.ADVICE: "advice", Outcome.UPSTREAM: "upstream"}


def tier_of(outcome: Outcome, tier: str = "") -> str:
    """The tier of a finding: ``tier`` when given (advice promoted to a failure stays advice),
    else the outcome's own ("" for a verdict that found nothing)."""
    return tier or _OUTCOME_TIERS.get(outcome, "")


# What an owner's test must end as for the tests it blocks to stay blocked: it reported a defect
# (failed, errored), or the user's expectations file says it fails (xfailed).
_OWNING_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ERROR, Outcome.XFAILED})


def owner_missed(owner: str, row: Mapping[str, tuple[Outcome, str]]) -> str | None:
    """Why nobody reports the defect that blocked a test, or None when its owner's test failed.

    ``row`` holds, for each contract that ran on the same Function and device, its outcome and,
    when blocked, its owner. One defect, one failure: the owner fails and the others are blocked;
    but the owner draws its own examples and may never meet the defect another contract found (a
    wrong float32 backward found by autocast's check without autocast, on a case the reference
    contract did not draw). Then the blocked test is the only report of the defect, and it must
    fail. A chain of blocks is followed to its end."""
    seen: set[str] = set()
    while owner not in seen:
        seen.add(owner)
        entry = row.get(owner)
        if entry is None:
            return f"{owner} did not run"
        outcome, next_owner = entry
        if outcome is Outcome.BLOCKED and next_owner:
            owner = next_owner
            continue
        if outcome in _OWNING_OUTCOMES:
            return None
        return f"{owner} {outcome.value.replace('_', ' ')} on its own examples"
    return f"{owner} is blocked in a circle"


@dataclass(frozen=True)
class Unreported:
    """A blocked test whose defect no owner reports (:func:`owner_missed`): ``reporter`` is the one
    test of its row that reports it instead, ``why`` why its own owner does not."""

    reporter: str
    why: str


def unreported_defects(row: Mapping[str, tuple[Outcome, str]]) -> dict[str, Unreported]:
    """For each blocked contract of ``row`` (as for :func:`owner_missed`) whose defect no owner
    reports, who reports it. One defect, one failure: the blocked tests whose chains of blocks end
    at the same owner share one reporter, the one nearest that owner (reference blocked by
    gradcheck before autocast blocked by reference), first by name; the others stay blocked by it."""
    chains: dict[str, list[tuple[int, str, str]]] = {}  # chain's end -> (steps to it, contract, why)
    for contract, (outcome, owner) in sorted(row.items()):
        if outcome is not Outcome.BLOCKED or not owner:
            continue
        why = owner_missed(owner, row)
        if why is None:
            continue
        chain = [owner]  # the owners followed, from this contract's own
        while (entry := row.get(chain[-1])) is not None and entry[0] is Outcome.BLOCKED and entry[1] and entry[1] not in chain:
            chain.append(entry[1])
        if entry is not None and entry[0] is Outcome.BLOCKED and entry[1] in chain:
            # A circle: its end is its first member by name, whatever the row's length.
            end = min(chain[chain.index(entry[1]):])
            chain = chain[: chain.index(end) + 1]
        chains.setdefault(chain[-1], []).append((len(chain) - 1, contract, why))
    found = {}
    for members in chains.values():
        reporter = min(members)[1]
        found.update({contract: Unreported(reporter, why) for _, contract, why in members})
    return found


@dataclass(frozen=True)
class Verdict:
    """One contract test's conclusion.

    ``reason`` is one line: a failure's summary, a skip's reason, or (for :attr:`Outcome.BLOCKED`)
    the blocking defect's summary, whose owner contract is ``owner``. ``message`` is a failure's
    whole report. ``case`` describes the example concerned, ``repro`` is the path of a failure's
    repro script, ``rerun`` the command that replays the test. ``unmet_expectations`` are the
    labels of dtype expectations whose dtype was checked and passed (they are stale). ``tier`` is
    set only where it differs from the outcome's own (:func:`tier_of`): a failure promoted from
    advice or upstream by ``--advice=fail`` / ``--upstream=fail``.
    """

    outcome: Outcome
    reason: str = ""
    owner: str = ""
    case: str = ""
    repro: str = ""
    rerun: str = ""
    message: str = ""
    unmet_expectations: tuple[str, ...] = ()
    tier: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, Outcome):
            raise TypeError(f"Verdict.outcome must be an Outcome; got {self.outcome!r}")
        for name in _TEXT_FIELDS:
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Verdict.{name} must be a str; got {getattr(self, name)!r}")
        if not isinstance(self.unmet_expectations, tuple) or not all(isinstance(e, str) for e in self.unmet_expectations):
            raise TypeError(f"Verdict.unmet_expectations must be a tuple of str; got {self.unmet_expectations!r}")
        if self.tier and (self.tier not in TIERS or self.outcome is not Outcome.FAILED):
            raise ValueError(f"Verdict.tier is set only on a failure promoted from {TIERS[1:]}; got {self!r}")
        if (self.outcome is Outcome.BLOCKED) != bool(self.owner):
            raise ValueError(f"Verdict: a blocked verdict names its owner contract, no other does; got {self!r}")

    @property
    def finding(self) -> str:
        """The tier of what this verdict found: defect, advice, upstream, or ""."""
        return tier_of(self.outcome, self.tier)

    @property
    def skipped(self) -> bool:
        return self.outcome in SKIP_OUTCOMES

    def describe(self) -> str:
        """The one line a reader sees (the skip message, the report's reason): for a blocked test,
        the owner, the defect, the case and the rerun command; else the reason."""
        if self.outcome is not Outcome.BLOCKED:
            return self.reason
        case = f"; case: {self.case}" if self.case else ""
        rerun = f"; rerun: {self.rerun}" if self.rerun else ""
        return f"blocked by {self.owner}: {self.reason}; see {self.owner}{case}{rerun}"

    # ---------------------------------------------------------------- serialisation

    def to_json(self) -> str:
        data: dict[str, Any] = {"outcome": self.outcome.value}
        data.update({name: getattr(self, name) for name in _TEXT_FIELDS if getattr(self, name)})
        if self.unmet_expectations:
            data["unmet_expectations"] = list(self.unmet_expectations)
        return json.dumps(data, ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        """The verdict :meth:`to_json` wrote; ``ValueError`` for anything else."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a serialised Verdict ({error}): {text!r:.200}") from None
        if not isinstance(data, dict):
            raise ValueError(f"not a serialised Verdict (a JSON {type(data).__name__}): {text!r:.200}")
        unknown = sorted(set(data) - {"outcome", "unmet_expectations", *_TEXT_FIELDS})
        if unknown:
            raise ValueError(f"not a serialised Verdict (unknown keys {unknown}): {text!r:.200}")
        try:
            outcome = Outcome(data.get("outcome"))
        except ValueError:
            raise ValueError(f"not a serialised Verdict (outcome {data.get('outcome')!r}): {text!r:.200}") from None
        unmet = data.get("unmet_expectations", [])
        if not isinstance(unmet, list):
            raise ValueError(f"not a serialised Verdict (unmet_expectations {unmet!r}): {text!r:.200}")
        try:
            return cls(outcome, unmet_expectations=tuple(unmet), **{k: data.get(k, "") for k in _TEXT_FIELDS})
        except TypeError as error:
            raise ValueError(f"not a serialised Verdict ({error}): {text!r:.200}") from None

    @classmethod
    def of(cls, properties: Iterable[tuple[str, object]]) -> Verdict | None:
        """The last verdict among a test's ``user_properties`` (a later conclusion replaces an
        earlier one), else None."""
        found = None
        for name, value in properties:
            if name == VERDICT_PROPERTY:
                found = value
        if found is None:
            return None
        if not isinstance(found, str):
            raise ValueError(f"{VERDICT_PROPERTY} must be a JSON string; got {found!r:.200}")
        return cls.from_json(found)

    def as_property(self) -> tuple[str, str]:
        """The ``(name, value)`` pair to append to ``item.user_properties``."""
        return VERDICT_PROPERTY, self.to_json()
