"""Argument types for the command line: a value out of range is refused by argparse, in one
line that names the option (``argument --lr: must be a finite number > 0, got nan``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = [
    "DefaultsHelpFormatter",
    "finite_float",
    "fraction",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
]


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _checked(kind: type, test: Callable[[float], bool], what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text, kind)
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


finite_float = _checked(float, lambda v: True, "a finite number")
positive_float = _checked(float, lambda v: v > 0, "a finite number > 0")
non_negative_float = _checked(float, lambda v: v >= 0, "a finite number >= 0")
fraction = _checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
positive_int = _checked(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows every default: ``(default: X)`` after an option's help unless the
    text already says its default or there is none to show (None, an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        if default is True:
            shown = "on"
        elif isinstance(default, list):
            shown = " ".join(map(str, default))
        else:
            shown = str(default)
        return f"{text} (default: {shown})".lstrip()
