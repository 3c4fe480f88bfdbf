"""Checks at the public boundary: clear ``TypeError``/``ValueError`` messages, nothing silent.

Every message says what was wrong and how to fix it. These run once per public
call on whole arrays (the finiteness check is one reduction, a device sync on
CuPy unless a training step defers it: :func:`finite_queues`), never inside the math.
All blocks and layers share them. The checks that read no values (types, shapes, keys,
structure) are defined in :mod:`refimpl.array_checks` and exported here too.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from refimpl.array_checks import (
    check_array,
    check_bipartite_inputs,
    check_csr_structure,
    check_graph_rows,
    check_keys,
    check_rng,
    check_same_dtype,
)
from refimpl.backend import get_array_module, is_array, is_sparse, refuse_array_subclass

__all__ = [
    "NonFiniteError",
    "all_finite",
    "check_array",
    "check_bipartite_inputs",
    "check_block_inputs",
    "check_cotangent",
    "check_csr_structure",
    "check_finite",
    "check_graph_rows",
    "check_input",
    "check_keys",
    "check_optional_input",
    "check_params",
    "check_rng",
    "check_same_dtype",
    "check_scalar_cotangent",
    "check_sparse_input",
    "finite_queues",
]


class NonFiniteError(ValueError):
    """An array held NaN or infinity where finite values are required."""


_DEFERRALS = threading.local()  # per thread: another thread's checks are not deferred here


def finite_queues() -> list[list[Any]]:
    """This thread's open deferrals (:func:`refimpl.train.guards.deferred_step`), innermost
    last: each a list of what the step reads at its end in one launch and one sync
    (:func:`refimpl.kernels.finite.finite_read`): float device arrays that must be finite,
    and :class:`refimpl.train.guards.DeferredRead` values (the loss, the optimiser's flag)."""
    if not hasattr(_DEFERRALS, "queues"):
        _DEFERRALS.queues = []
    return _DEFERRALS.queues


def all_finite(value: Any) -> bool:
    """Whether ``value`` holds no NaN or infinity.

    First one sum, which makes no array of flags (one byte per entry for
    ``isfinite(value).all()``): a NaN or infinity makes the sum NaN or
    infinite, so a finite sum clears ``value``. A non-finite sum (which finite entries
    can give by overflowing) falls through to the entrywise check, which decides.
    Inside a deferral (:func:`finite_queues`) a device array is queued itself, not read, and
    the answer is True: the deferral checks every queued array in one read and reruns a
    failed step.

    Parameters
    ----------
    value : array
        A floating-point array of any backend.

    Returns
    -------
    bool
        True when every entry is finite (or the check is deferred).
    """
    xp = get_array_module(value)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow here is not an error
        queues = finite_queues() if xp is not np else None
        if queues:
            if value.dtype.kind not in "iub":  # integers and booleans are finite
                queues[-1].append(value)  # its entries checked at the read, no sum queued
            return True
        if bool(xp.isfinite(xp.sum(value))):
            return True
    return bool(xp.isfinite(value).all())


def check_finite(value: Any, name: str) -> None:
    """No NaN or infinity in ``value`` (:func:`all_finite`), else :class:`NonFiniteError`.

    Parameters
    ----------
    value : array
        A floating-point array of any backend.
    name : str
        Its name in the message, e.g. ``"x"``.
    """
    if all_finite(value):
        return
    count = int((~get_array_module(value).isfinite(value)).sum())
    raise NonFiniteError(
        f"{name} contains NaN or infinity ({count} of {value.size} entries); "
        "check the step that produced it (learning rate, division by zero, log of zero)"
    )


def check_input(value: Any, name: str = "x", **shape_kwargs: Any) -> ModuleType:
    """A finite floating-point array (of the given ``ndim``/``shape``).

    Parameters
    ----------
    value : Any
        The value to check.
    name : str, default "x"
        Its name in the messages.
    **shape_kwargs : Any
        ``ndim=`` or ``shape=``, as :func:`check_array` takes them.

    Returns
    -------
    module
        The array module of ``value``.
    """
    xp = check_array(value, name, **shape_kwargs)
    check_finite(value, name)
    return xp


def check_sparse_input(x: Any, name: str, in_features: int) -> ModuleType:
    """Sparse input features: a CSR matrix (N, in_features) of floats, whole
    (:func:`check_csr_structure`) and with finite stored values.

    Parameters
    ----------
    x : sparse matrix
        The features given, CSR on any backend.
    name : str
        Its name in the messages, e.g. ``"x"``.
    in_features : int
        The width it must have.

    Returns
    -------
    module
        The array module of ``x``.
    """
    if getattr(x, "format", None) != "csr":
        raise TypeError(
            f"{name} is a sparse matrix in {getattr(x, 'format', '?')!r} format; sparse input "
            f"features must be CSR: convert with {name}.tocsr()"
        )
    if x.ndim != 2 or x.shape[1] != in_features:
        raise ValueError(f"{name} must have shape (N, {in_features}), got {tuple(x.shape)}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must hold floats, got dtype {x.dtype}; cast with .astype")
    check_csr_structure(x, name)
    check_finite(x.data, f"{name} (its stored values)")
    return get_array_module(x)


def check_cotangent(
    d_out: Any, shape: tuple[int, ...], dtype: Any, *like: Any, name: str = "d_y"
) -> ModuleType:
    """``d_out`` matches the forward output's shape, dtype and backend (of ``like``) and is
    finite: a NaN or infinity in it would make every gradient non-finite without a word,
    so it is refused as forward refuses a non-finite input (:class:`NonFiniteError`).

    Parameters
    ----------
    d_out : Any
        The cotangent given.
    shape : tuple of int
        The forward output's shape.
    dtype : dtype
        The forward's dtype.
    *like : array
        Arrays of the forward (its input, its cache) whose backend ``d_out`` must share.
    name : str, default "d_y"
        Its name in the messages.

    Returns
    -------
    module
        The array module of ``d_out``.
    """
    refuse_array_subclass(d_out, name)
    if not is_array(d_out) or tuple(d_out.shape) != tuple(shape):
        got = tuple(d_out.shape) if is_array(d_out) else type(d_out).__name__
        raise ValueError(f"{name} must be an array of the output's shape {tuple(shape)}, got {got}")
    if d_out.dtype != dtype:
        raise TypeError(
            f"{name} has dtype {d_out.dtype} but the forward ran in {dtype}; cast {name} to {dtype}"
        )
    xp = get_array_module(d_out, *like)  # TypeError if d_out is on another backend
    check_finite(d_out, name)
    return xp


def check_scalar_cotangent(d_loss: Any, like: Any, name: str = "d_loss") -> Any:
    """The cotangent of a scalar loss: a finite Python number, or a finite 0-d array (or
    NumPy scalar) of ``like``'s dtype and backend.

    Parameters
    ----------
    d_loss : Any
        The cotangent given (1.0 to start backpropagation).
    like : array
        An array of the loss (its dtype and backend).
    name : str, default "d_loss"
        Its name in the messages.

    Returns
    -------
    float or array
        ``d_loss``; a NumPy scalar as a Python float.
    """
    if type(d_loss) in (int, float):  # exact types: Python numbers never upcast an array
        if not math.isfinite(d_loss):
            raise NonFiniteError(
                f"{name} must be finite, got {d_loss!r} (the gradient of the loss itself is 1.0)"
            )
        return d_loss
    refuse_array_subclass(d_loss, name)
    if not (is_array(d_loss) or isinstance(d_loss, np.generic)):
        raise TypeError(f"{name} must be a number or a 0-d array, got {type(d_loss).__name__}")
    if d_loss.ndim != 0:
        raise ValueError(
            f"{name} must be a scalar (0-d array or number), got shape {tuple(d_loss.shape)}"
        )
    if d_loss.dtype != like.dtype:
        raise TypeError(
            f"{name} has dtype {d_loss.dtype} but the loss was computed in {like.dtype}; "
            f"pass a Python float or cast {name}"
        )
    if is_array(d_loss):
        get_array_module(d_loss, like)  # TypeError if it lives on another backend
        check_finite(d_loss, name)
        return d_loss
    # a NumPy scalar of the right dtype: exact as a Python float, and checked as one
    return check_scalar_cotangent(float(d_loss), like, name)


def check_like(
    values: Mapping[str, Any], reference: Any, reference_name: str, owner: str = "", hint: str = ""
) -> None:
    """Every array in ``values`` is on ``reference``'s backend and has its dtype.

    For inputs that are not parameters (noise, projections): nothing is moved or
    cast silently. ``hint`` is put before the fix in the message.
    """
    get_array_module(reference, *values.values())  # TypeError if on two backends
    prefix = f"{owner}: " if owner else ""
    for name, value in values.items():
        if value.dtype != reference.dtype:
            raise TypeError(
                f"{prefix}{name} has dtype {value.dtype} but {reference_name} has "
                f"{reference.dtype}; {hint}cast it with refimpl.backend.asarray(..., "
                f"dtype={reference_name}.dtype): nothing is cast silently"
            )


def check_optional_input(
    value: Any, name: str, option: str, width: int | None, rows: int, x: Any, owner: str
) -> None:
    """An input a block takes exactly when configured for it (``edge_attr`` with ``edge_dim``,
    ``pe`` with ``pe_dim``): absent when ``width`` is None, else a finite ``(rows, width)``
    array on ``x``'s backend with ``x``'s dtype.

    Parameters
    ----------
    value : Any
        The input given, or None.
    name : str
        Its name, e.g. ``"edge_attr"``.
    option : str
        The configuration field that enables it, e.g. ``"edge_dim"``.
    width : int or None
        That field's value.
    rows : int
        The rows it must have (one per edge, or per node).
    x : array
        The block's input.
    owner : str
        The block, for the messages (e.g. ``"GATConv"``).
    """
    refuse_array_subclass(value, name)
    if value is not None and not is_array(value):
        raise TypeError(
            f"{name} must be an array or None, got {type(value).__name__}; {owner}.forward "
            f"takes (params, x, graph, {name}), the rest (training, rng, ...) by keyword"
        )
    if width is None:
        if value is not None:
            raise ValueError(
                f"{name} was given but this {owner} has no {option}: {option}=None; construct "
                f"it with {option}={value.shape[-1]} to use {name}, or drop {name}"
            )
        return
    if value is None:
        raise ValueError(
            f"this {owner} has {option}={width} and needs {name} of shape ({rows}, {width}), "
            f"one row each: pass {name}=, or construct it with {option}=None"
        )
    check_input(value, name, shape=(rows, width))
    get_array_module(x, value)  # TypeError if on two backends
    if value.dtype != x.dtype:
        raise TypeError(
            f"{name} has dtype {value.dtype} but x has {x.dtype}; cast {name} to x's dtype: "
            "nothing is cast silently"
        )


def check_block_inputs(
    params: Any,
    shapes: Mapping[str, tuple],
    owner: str,
    x: Any,
    in_features: int,
    name: str = "x",
    sparse: bool = False,
) -> ModuleType:
    """A block's parameters and its input: keys, shapes, finiteness, one backend, one dtype.

    Parameters
    ----------
    params : Any
        The parameters given: a dict of arrays, as :func:`check_params` checks it.
    shapes : mapping of str to tuple
        The block's ``param_shapes()``.
    owner : str
        The block, for the messages (e.g. ``"Linear"``).
    x : Any
        The input given, ``(N, in_features)``.
    in_features : int
        The width ``x`` must have.
    name : str, default "x"
        The input's name in the messages.
    sparse : bool, default False
        Whether the block also takes ``x`` as a CSR matrix (sparse input features).

    Returns
    -------
    module
        The array module of ``x``.
    """
    check_params(params, shapes, owner)
    if is_sparse(x):
        if not sparse:
            raise TypeError(
                f"{owner} takes {name} as a dense array; sparse input features (CSR) are taken "
                f"by Linear, GATConv and the GAT model: pass {name}.toarray()"
            )
        xp = check_sparse_input(x, name, in_features)
    else:
        xp = check_input(x, name, shape=(None, in_features))
    get_array_module(x, *params.values())  # TypeError if x and params are on two backends
    check_same_dtype(params, x, name)
    return xp


def check_params(params: Any, shapes: Mapping[str, tuple], owner: str) -> None:
    """``params`` has exactly the keys of ``shapes``, each a finite float array of that shape.

    Parameters
    ----------
    params : Any
        The parameters given.
    shapes : mapping of str to tuple
        The block's ``param_shapes()``.
    owner : str
        The block, for the messages (e.g. ``"Linear"``).
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    check_keys(
        params,
        list(shapes),
        f"{owner} parameters do not match its configuration",
        "create them with init_params",
    )
    for name, shape in shapes.items():
        check_input(params[name], f"params[{name!r}]", shape=shape)
