"""``refimpl crosscheck FILE.npz``: another implementation's outputs and gradients against ours.

The file's format is in :mod:`refimpl.interop.crosscheck`. Exit status: 0 when every
tensor agrees, 1 on a mismatch, 2 when the file cannot be checked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from refimpl.interop.crosscheck import crosscheck

    result, notes = crosscheck(args.file, rtol=args.rtol)
    print(result.table(f"refimpl crosscheck {args.file}"))
    for note in notes:
        print(f"note: {note}")
    return 0 if result.passed else 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "crosscheck",
        help="run our layer on another implementation's inputs and compare, tensor by tensor",
    )
    parser.add_argument("file", type=Path, help=".npz with config, param/, input/, output/, grad/")
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance for every tensor (default: by dtype, 1e-12 / 1e-10 in float64)",
    )
    parser.set_defaults(run=run)
