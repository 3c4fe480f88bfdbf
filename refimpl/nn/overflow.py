"""An overflow inside a layer, said in one line.

A layer's boundary refuses NaN and infinity in its inputs, parameters and cotangent
(:mod:`refimpl.validation`), so a non-finite output or gradient was made inside: finite
values whose products left the dtype's range (features times 1e200 in float64, or near
float32's largest numbers; a softmax of infinite scores gives NaN), or a statistic that
overflowed where the layer divides by it (LayerNorm's variance, LipschitzNorm's denominators:
a finite but wrong result). The layers check their outputs and those statistics with
:func:`check_overflow` and run their backward through :func:`backward_checked`, raising
:class:`~refimpl.validation.NonFiniteError` that says what overflowed and how to avoid it;
the models name the layer it happened in. One reduction per array checked (a device sync on
CuPy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from refimpl.validation import NonFiniteError, all_finite

__all__ = ["backward_checked", "check_overflow"]


def check_overflow(values: Any, where: str, dtype: Any) -> None:
    """Every array in ``values`` (an array, or tuples, lists and dicts of them; None skipped)
    is finite, else :class:`NonFiniteError`: ``where`` (``"TransformerConv.forward: its
    output"``) overflowed ``dtype``, computed from inputs checked finite before.

    Parameters
    ----------
    values : array, or tuples, lists and dicts of arrays
        What the layer computed.
    where : str
        What is named in the message, e.g. ``"GATConv.forward: its output"``.
    dtype : dtype
        The dtype the layer ran in (the fix the message suggests depends on it).
    """
    if not all(map(all_finite, _leaves(values))):
        raise _overflow(where, dtype)


def backward_checked(backward: Callable[[], tuple], owner: str, dtype: Any) -> tuple[Any, Any]:
    """``backward()`` (``owner``'s backward steps on checked inputs and cotangent) and its
    ``(d_inputs, d_params)``, every gradient checked (:func:`check_overflow`); an inner block
    that refused an overflowed cotangent first is reported as the same overflow.

    Parameters
    ----------
    backward : callable
        The backward steps, called with no argument; returns ``(d_inputs, d_params)``.
    owner : str
        The layer named in the message.
    dtype : dtype
        The dtype the layer ran in.
    """
    where = f"{owner}.backward: a gradient"
    with np.errstate(over="ignore", invalid="ignore"):  # reported below, in one line
        try:
            gradients = backward()
        except NonFiniteError:
            raise _overflow(where, dtype) from None
    check_overflow(gradients, where, dtype)
    return gradients


def _overflow(where: str, dtype: Any) -> NonFiniteError:
    if np.dtype(dtype) != np.float64:
        fix = "run in float64 (cast the inputs and the parameters)"
    else:
        fix = "scale the inputs or the parameters down (float64 ends near 1.8e308)"
    return NonFiniteError(
        f"{where} overflowed {np.dtype(dtype)} though every input was finite; {fix}"
    )


def _leaves(value: Any) -> list[Any]:
    """The arrays in ``value``: itself, or those in its tuples, lists and dict values."""
    if isinstance(value, tuple | list):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return _leaves(list(value.values()))
    return [] if value is None else [value]
