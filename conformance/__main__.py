"""``python -m conformance write mypkg.module:MyFunction --example "x=torch.randn(4, 8)"``: print a
ready-to-edit spec module for a Function (see :mod:`conformance.embed.ghostwriter`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.embed.ghostwriter import GhostwriterError, main_write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="print a register(...) spec module inferred from an example call")
    write.add_argument("target", help="the Function or custom op, as module:Name (e.g. mypkg.kernels:RMSNormFunction)")
    write.add_argument("--example", action="append", default=[], metavar="ARGS",
                       help='example arguments by name, as Python: "x=torch.randn(4, 8), eps=1e-6" (repeatable)')
    write.add_argument("--example-file", type=Path, metavar="PATH", help="a file holding the same name=value text")
    write.add_argument("--name", help="the spec's name (default: the target's name in snake_case)")
    write.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the module there instead of printing it")
    options = parser.parse_args(argv)
    examples = list(options.example)
    if options.example_file is not None:
        try:
            examples.append(options.example_file.read_text(encoding="utf-8").strip())
        except OSError as error:
            parser.error(f"--example-file={options.example_file}: {error}")
    if not examples:
        parser.error('give the example arguments: --example "x=torch.randn(4, 8)" or --example-file PATH')
    sys.path.insert(0, "")  # like `python -m`: the caller's folder's modules import
    try:
        return main_write(options.target, examples, name=options.name, output=options.output, echo=print)
    except GhostwriterError as error:
        print(f"python -m conformance write: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
