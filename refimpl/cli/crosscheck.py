"""``refimpl crosscheck FILE.npz``: another implementation's outputs and gradients against ours.

The file's format is in :mod:`refimpl.interop.crosscheck`. Exit status: 0 when every
tensor agrees, 1 on a mismatch, 2 when the file cannot be checked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from refimpl.cli.types import non_negative_float

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from refimpl.interop.crosscheck import crosscheck

    result, notes = crosscheck(args.file, rtol=args.rtol)
    print(result.table(f"refimpl crosscheck {args.file}"))
    for note in notes:
        print(f"note: {note}")
    return 0 if result.passed else 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL

    defaults = ", ".join(
        f"{_number(FORWARD_RTOL[dtype])} / {_number(GRADIENT_RTOL[dtype])} in {dtype}"
        for dtype in GRADIENT_RTOL
    )
    parser = commands.add_parser(
        "crosscheck",
        help="run our layer on another implementation's inputs and compare, tensor by tensor",
    )
    parser.add_argument("file", type=Path, help=".npz with config, param/, input/, output/, grad/")
    parser.add_argument(
        "--rtol",
        type=non_negative_float,  # nan would pass every comparison, a negative one none
        default=None,
        help="relative tolerance for every tensor, a finite number >= 0 (0: exact agreement; "
        f"default: by dtype, outputs / gradients: {defaults})",
    )
    parser.set_defaults(run=run)


def _number(value: float) -> str:
    """``1e-12``, ``1e-4``: a tolerance as people write it."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
