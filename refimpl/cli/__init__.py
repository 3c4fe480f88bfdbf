"""The ``refimpl`` command line: ``demo``, ``train``, ``sweep``, ``plot``, ``golden`` (export or
verify golden vectors, :mod:`refimpl.interop.golden`) and ``crosscheck`` (another
implementation's outputs and gradients against ours, :mod:`refimpl.interop.crosscheck`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from refimpl import __version__
from refimpl.cli import crosscheck, demo, golden, plot, sweep, train

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="refimpl",
        description="Reference implementation of graph attention with hand-written backward "
        "passes and executable theorem checks.",
    )
    parser.add_argument("--version", action="version", version=f"refimpl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (demo, train, sweep, plot, golden, crosscheck):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``refimpl`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as err:  # bad input: its message, not a traceback
        print(f"refimpl {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
