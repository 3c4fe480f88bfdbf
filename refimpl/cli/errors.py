"""One-line errors for the command lines (``refimpl`` and ``python -m proofs_check``): a usage
error without the usage of every option first, and an exception's message on one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

from refimpl.files import printable

__all__ = ["OneLineParser", "one_line"]


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
