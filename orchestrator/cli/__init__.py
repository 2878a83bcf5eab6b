"""`orchestrator` command line: one subcommand per module in this package.

User errors (`placement.errors.UserError` and argparse misuse) print one line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from placement.errors import UserError

#: Subcommand modules, each with `add_parser(subparsers)` and `run(args) -> int`.
COMMANDS = ("plan", "profile", "train", "layerwise", "crossover")


class _Parser(argparse.ArgumentParser):
    """argparse that reports misuse in one line (no usage dump), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="orchestrator",
                     description="Plan and run hybrid data x model parallel training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"orchestrator.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UserError as err:
        print(f"orchestrator {args.command}: error: {err}", file=sys.stderr)
        return 2
