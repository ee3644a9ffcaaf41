"""Expectations (known deviations) and the Functions x contracts report."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["Expectations", "OutcomeMatrix", "test_key"]


def test_key(contract: str, param_id: str) -> str:
    """The key of one contract test in expectation files and reports: ``contract[name-device]``."""
    return f"{contract}[{param_id}]"


@dataclass
class Expectations:
    """Known deviations: ``{"gradcheck[myop-cpu]": "reason", ...}`` loaded from a JSON file."""

    path: str
    reasons: dict[str, str]
    matched: set[str] = field(default_factory=set)
    passed_anyway: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, path: str) -> Expectations:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as error:
            raise pytest.UsageError(f"--expectations={path}: cannot read it ({error})") from None
        except json.JSONDecodeError as error:
            raise pytest.UsageError(f"--expectations={path}: not valid JSON ({error})") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in data.items()):
            raise pytest.UsageError(
                f"--expectations={path}: must be a JSON object mapping \"contract[name-device]\" to a non-empty reason, "
                'e.g. {"gradgradcheck[myop-cpu]": "second derivative not implemented yet"}'
            )
        return cls(path=path, reasons=data)

    def reason_for(self, key: str) -> str | None:
        reason = self.reasons.get(key)
        if reason is not None:
            self.matched.add(key)
        return reason

    def stale(self) -> list[str]:
        """Entries that matched no collected test, or whose test passed."""
        lines = [f"{key}: matches no collected test" for key in sorted(set(self.reasons) - self.matched)]
        lines += [f"{key}: passed, the deviation is gone" for key in sorted(self.passed_anyway)]
        return lines


@dataclass
class OutcomeMatrix:
    """Outcome of every contract test, for the JSON + Markdown report."""

    outcomes: dict[tuple[str, str], str] = field(default_factory=dict)  # (param id, contract) -> outcome

    def record(self, contract: str, param_id: str, outcome: str) -> None:
        previous = self.outcomes.get((param_id, contract))
        # A failed setup/teardown outranks a passed call.
        if previous in ("failed", "error") and outcome == "passed":
            return
        self.outcomes[(param_id, contract)] = outcome

    def write(self, path: str, header: Iterable[str] = ()) -> tuple[Path, Path]:
        rows = sorted({p for p, _ in self.outcomes})
        contracts = sorted({c for _, c in self.outcomes})
        json_path, md_path = Path(f"{path}.json"), Path(f"{path}.md")
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {"header": list(header), "results": {row: {c: self.outcomes.get((row, c), "") for c in contracts} for row in rows}},
                indent=2,
            )
        )
        symbol = {"passed": "pass", "failed": "**FAIL**", "skipped": "skip", "xfailed": "xfail", "xpassed": "XPASS", "": ""}
        symbol.update({o: o for o in {*self.outcomes.values()} if o.startswith(("blocked by ", "waived"))})
        lines = [*(f"{line}  " for line in header), "", "| Function-device | " + " | ".join(contracts) + " |"]
        lines.append("|---" * (len(contracts) + 1) + "|")
        for row in rows:
            cells = [symbol.get(self.outcomes.get((row, c), ""), self.outcomes.get((row, c), "")) for c in contracts]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        md_path.write_text("\n".join(lines) + "\n")
        return json_path, md_path
