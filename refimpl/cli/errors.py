"""One-line errors for the command lines (``refimpl``, ``python -m proofs_check`` and the
scripts): a usage error without the usage of every option first, an exception's message on
one line, and the exit status each kind of error gets."""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from collections.abc import Callable
from typing import NoReturn

from refimpl.files import printable

__all__ = ["BAD_INPUT", "OneLineParser", "one_line", "report_errors"]

# What bad input, a bad file or the environment raises on its way in: exit 2, its message.
BAD_INPUT = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OSError,  # FileNotFoundError, FileExistsError, PermissionError, a full disk
    EOFError,
    zipfile.BadZipFile,
    ImportError,  # an optional dependency (CuPy, matplotlib, torch) is missing
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (not the usage of every option first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def one_line(err: BaseException) -> str:
    """The exception's message on one line; its type where the message alone says little
    (an ``ImportError``, a ``KeyError``'s bare key)."""
    # escaped: a message may quote a file's content (a key, a name), which must not reach
    # the terminal as control characters or escape sequences
    text = printable(" ".join(str(err).split())) or type(err).__name__
    if isinstance(err, ValueError | FileNotFoundError | FileExistsError | ConnectionError):
        return text
    return f"{type(err).__name__}: {text}"


def report_errors(
    prog: str, call: Callable[[], int | None], on_interrupt: Callable[[], str] | None = None
) -> int:
    """Run ``call`` and turn what it raises into one line on stderr and an exit status.

    Parameters
    ----------
    prog : str
        The command's name, first on every line (``"refimpl train"``).
    call : callable
        The command; its return value is the exit status where it is an int (anything else,
        a script's summary say: 0).
    on_interrupt : callable or None, default None
        The line printed on Ctrl-C (where the run's checkpoint is); None: "interrupted".

    Returns
    -------
    int
        0 (or what ``call`` returned), 2 bad input (:data:`BAD_INPUT`) or out of memory, 3 an
        internal error (with the way to its traceback: ``REFIMPL_DEBUG=1`` re-raises), 130
        interrupted.
    """
    try:
        status = call()
    except KeyboardInterrupt:
        line = on_interrupt() if on_interrupt is not None else f"{prog}: interrupted"
        print(line, file=sys.stderr)
        return 130
    except MemoryError as err:
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(
            f"{prog}: error: out of memory ({err or 'MemoryError'}); try a smaller "
            "problem, float32 or --batch-size",
            file=sys.stderr,
        )
        return 2
    except BAD_INPUT as err:
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug: still one line, with the way to the traceback
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(
            f"{prog}: internal error: {one_line(err)}; rerun with REFIMPL_DEBUG=1 for the "
            "traceback and report it",
            file=sys.stderr,
        )
        return 3
    return status if isinstance(status, int) else 0
