"""The ``refimpl`` command line: ``demo``, ``train``, ``sweep``, ``plot``, ``golden`` (export or
verify golden vectors, :mod:`refimpl.interop.golden`) and ``crosscheck`` (another
implementation's outputs and gradients against ours, :mod:`refimpl.interop.crosscheck`).

Exit codes: 0 done; 1 a check failed or training diverged; 2 bad input (options, files,
a missing optional dependency, a folder that cannot be written, not enough memory);
3 an error inside refimpl (a bug: please report it); 130 interrupted (Ctrl-C).
Every error is one line on stderr; ``REFIMPL_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from refimpl import __version__
from refimpl.cli import crosscheck, demo, golden, plot, sweep, train
from refimpl.cli.errors import OneLineParser, report_errors
from refimpl.cli.runs import explicit_options, interrupted_message
from refimpl.train.run_lock import lock_scope

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    """Entry point of the ``refimpl`` console script.

    Parameters
    ----------
    argv : sequence of str or None, default None
        The arguments after ``refimpl`` (e.g. ``["train", "--model", "gat"]``); ``None`` reads
        ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status: 0 done, 1 a check failed or training diverged, 2 bad input or no
        command (one ``error:`` line on stderr), 3 an internal error, 130 interrupted (Ctrl-C).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    args.explicit = explicit_options(_parser, argv)
    prog = f"refimpl {args.command}"

    def on_interrupt() -> str:
        return interrupted_message(prog, args)

    with lock_scope():  # the run folders this command locks are released as it ends
        return report_errors(prog, lambda: args.run(args), on_interrupt)


if __name__ == "__main__":
    sys.exit(main())
