"""Writing the outcome matrix's report files: PATH.json, PATH.md and PATH.html."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.plugin.html_report import render_html
from conformance.plugin.outcomes import OutcomeMatrix, RunInfo

__all__ = ["write_reports"]


def write_reports(matrix: OutcomeMatrix, path: str | Path, run: RunInfo) -> list[Path]:
    """Write PATH.json, PATH.md and PATH.html (parent folders created); return the three paths."""
    base = str(path)
    paths = [Path(f"{base}.json"), Path(f"{base}.md"), Path(f"{base}.html")]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    paths[0].write_text(json.dumps(matrix.to_json(run), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text(matrix.markdown(run), encoding="utf-8")
    paths[2].write_text(render_html(matrix, run), encoding="utf-8")
    return paths
