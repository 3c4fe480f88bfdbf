"""Checks of configuration fields (sizes, probabilities, flags, choices): one line naming the
owner and the field, e.g. ``"TrainConfig epochs must be a positive int, got nan"``.

Every configuration dataclass checks its fields with these at construction, so a value that
cannot mean anything (a string ``"False"`` for a flag, a NaN epoch count, a size past what the
kernels index) is refused where it is given, not deep inside the first call that reads it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

import numpy as np

from refimpl.kernels.limits import check_count

__all__ = [
    "check_bool",
    "check_choice",
    "check_nonnegative_int",
    "check_nonnegative_number",
    "check_optional_bool",
    "check_positive_int",
    "check_probability",
    "shown",
]


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters: a message quoting
    ``10**400`` or a long array stays one readable line.

    Parameters
    ----------
    value : Any
        The value to show.
    limit : int, default 60
        The most characters, ``"..."`` included.

    Returns
    -------
    str
        One line.
    """
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_nonnegative_number(value: Any, name: str, allow_zero: bool = True) -> None:
    """A finite real ``>= 0`` (``> 0`` without ``allow_zero``), for configuration fields.

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"BatchNorm eps"``.
    allow_zero : bool, default True
        Whether 0 is accepted.
    """
    bound = ">= 0" if allow_zero else "> 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not _finite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise ValueError(f"{name} must be a finite number {bound}, got {shown(value)}")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range (10**400): infinite as a float
        return False


def check_positive_int(value: Any, name: str) -> None:
    """An int from 1 to 2**31 - 1 (Python or NumPy, not a bool), for sizes in configuration
    fields: the kernels index with int32 (:mod:`refimpl.kernels.limits`).

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"TransformerConv heads"``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {shown(value)}")
    check_count(int(value), name)


def check_nonnegative_int(value: Any, name: str) -> None:
    """An int ``>= 0`` (Python or NumPy, not a bool), for counts that may be zero and seeds
    (``default_rng([seed, k])``).

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"TrainConfig seed"``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {shown(value)}")


def check_probability(value: Any, name: str) -> None:
    """A real in ``[0, 1)`` (not a bool; NaN fails), for dropout probabilities.

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"GAT attn_dropout"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a probability in [0, 1), got {shown(value)}")


def check_bool(value: Any, name: str) -> bool:
    """``True`` or ``False`` (a Python or NumPy bool), for flags in configuration fields: a
    string such as ``"False"`` or a number would be read by its truth value, silently.
    Returns it as a Python bool (a NumPy bool is no JSON value, for configs written out).

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"GATConv concat"``.

    Returns
    -------
    bool
        ``value`` as a Python bool.
    """
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {shown(value)}")
    return bool(value)


def check_optional_bool(value: Any, name: str) -> bool | None:
    """``None``, ``True`` or ``False`` (a tri-state configuration field; NumPy bools too).

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        Whose field it is, for the message, e.g. ``"PairNorm eps_inside_sqrt"``.

    Returns
    -------
    bool or None
        ``value`` as ``None`` or a Python bool.
    """
    if value is None:
        return None
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be None, True or False, got {shown(value)}")
    return bool(value)


def check_choice(value: Any, choices: Collection[Any], name: str) -> None:
    """One of ``choices`` (names; ``None`` where listed), a list refused in these words, not
    Python's "unhashable type".

    Parameters
    ----------
    value : Any
        The value given.
    choices : collection
        The accepted names (and ``None`` when it is accepted).
    name : str
        Whose field it is, for the message, e.g. ``"TrainConfig init"``.
    """
    if not ((value is None and None in choices) or (isinstance(value, str) and value in choices)):
        listed = ", ".join(map(repr, sorted(choices, key=str)))
        raise ValueError(f"{name} must be one of {listed}, got {shown(value)}")
