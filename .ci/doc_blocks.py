"""The commands and files the README and docs/ show, so that CI and tests run exactly those.

A fenced block preceded by ``<!-- doc-run: NAME -->`` is a shell block named NAME; one preceded
by ``<!-- doc-file: FILE -->`` is the content of FILE; one preceded by ``<!-- doc-excerpt: PATH -->``
is quoted verbatim from the repository file PATH. ``.ci/run`` executes some named blocks;
tests/test_docs.py executes the others, checks that every shell block is named and run and that
every excerpt is still in its file.

    python3 .ci/doc_blocks.py run NAME      # print shell block NAME
    python3 .ci/doc_blocks.py file FILE     # print the content of FILE
    python3 .ci/doc_blocks.py list          # every named block: kind, name, where
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TAG = re.compile(r"<!--\s*doc-(run|file|excerpt):\s*(\S+)\s*-->")
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    kind: str  # "run" | "file" | "excerpt" | "" (an untagged fenced block)
    name: str
    language: str
    text: str
    where: str  # path:line


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def blocks(root: Path = ROOT) -> list[Block]:
    """Every fenced block of the README and docs/, with the tag on the line before it (if any)."""
    found = []
    for path in documents(root):
        lines = path.read_text().splitlines()
        index = 0
        while index < len(lines):
            fence = _FENCE.match(lines[index])
            if not fence:
                index += 1
                continue
            tag = _TAG.search(lines[index - 1]) if index else None
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            found.append(Block(
                kind=tag.group(1) if tag else "", name=tag.group(2) if tag else "",
                language=fence.group(1), text="\n".join(lines[index + 1:end]) + "\n",
                where=f"{path.relative_to(root)}:{index + 1}",
            ))
            index = end + 1
    return found


def named(kind: str, name: str, root: Path = ROOT) -> Block:
    matches = [b for b in blocks(root) if b.kind == kind and b.name == name]
    if len(matches) != 1:
        raise SystemExit(f"doc-{kind}: {name!r} is named by {len(matches)} blocks in the README and docs/, not 1")
    return matches[0]


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for block in blocks():
            print(f"{block.kind or '-'}\t{block.name or '-'}\t{block.language}\t{block.where}")
        return 0
    if len(argv) != 2 or argv[0] not in ("run", "file"):
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(named(argv[0], argv[1]).text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
