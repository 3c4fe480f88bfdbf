"""Checks at the public boundary: clear ``TypeError``/``ValueError`` messages, nothing silent.

Every message says what was wrong and how to fix it. These run once per public
call on whole arrays (the finiteness check is one reduction), never inside the
math.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refimpl.backend import get_array_module, is_array

__all__ = ["check_array", "check_finite", "check_params", "check_same_dtype"]


def check_array(value: Any, name: str, *, ndim: int | None = None, shape: tuple | None = None,
                floating: bool = True) -> None:
    """``value`` is a backend array of the given rank/shape (``None`` in ``shape`` = any)."""
    if not is_array(value):
        raise TypeError(
            f"{name} must be an array (numpy.ndarray or cupy.ndarray), got "
            f"{type(value).__name__}; wrap it with numpy.asarray"
        )
    if floating and value.dtype.kind != "f":
        raise TypeError(
            f"{name} must be a floating-point array, got dtype {value.dtype}; "
            f"convert with {name}.astype(numpy.float64) (or float32)"
        )
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    if shape is not None:
        expected = tuple(shape)
        if len(expected) != value.ndim or any(
            e is not None and e != s for e, s in zip(expected, value.shape, strict=True)
        ):
            pretty = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
            raise ValueError(f"{name} must have shape {pretty}, got {tuple(value.shape)}")


def check_finite(value: Any, name: str) -> None:
    """No NaN or Inf in ``value`` (one reduction; a device sync on CuPy)."""
    xp = get_array_module(value)
    if not bool(xp.isfinite(value).all()):
        bad = int((~xp.isfinite(value)).sum())
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN or Inf); clean the input "
            "(e.g. numpy.nan_to_num) or find where it overflowed"
        )


def check_same_dtype(values: Mapping[str, Any], reference: Any, reference_name: str) -> None:
    """Every array in ``values`` has ``reference``'s dtype: nothing is silently cast."""
    for name, value in values.items():
        if value.dtype != reference.dtype:
            raise TypeError(
                f"dtype mismatch: {reference_name} is {reference.dtype} but {name} is "
                f"{value.dtype}; cast the parameters or the input so both have one dtype "
                f"(e.g. {{k: v.astype({reference_name}.dtype) for k, v in params.items()}})"
            )


def check_params(params: Any, shapes: Mapping[str, tuple], owner: str) -> None:
    """``params`` has exactly the keys of ``shapes``, each a finite float array of that shape."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    missing = [k for k in shapes if k not in params]
    unexpected = [k for k in params if k not in shapes]
    if missing or unexpected:
        raise ValueError(
            f"{owner} parameters do not match its configuration: missing {missing}, "
            f"unexpected {unexpected}; create them with init_params (expected keys: "
            f"{list(shapes)})"
        )
    for name, shape in shapes.items():
        check_array(params[name], f"params[{name!r}]", shape=shape)
        check_finite(params[name], f"params[{name!r}]")
