"""Checks at the public boundary: clear ``TypeError``/``ValueError`` messages, nothing silent.

Every message says what was wrong and how to fix it. These run once per public
call on whole arrays (the finiteness check is one reduction, a device sync on
CuPy), never inside the math. All blocks and layers share them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

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
]


class NonFiniteError(ValueError):
    """An array held NaN or infinity where finite values are required."""


def check_array(
    value: Any,
    name: str,
    *,
    ndim: int | None = None,
    shape: tuple | None = None,
    floating: bool = True,
) -> ModuleType:
    """``value`` is a backend array of the given rank or shape (``None`` in ``shape`` = any).

    Returns the array module of ``value``.
    """
    refuse_array_subclass(value, name)  # numpy.matrix, numpy.ma: what to pass instead
    if not is_array(value):
        raise TypeError(
            f"{name} must be an array (NumPy, CuPy or strict), got {type(value).__name__}; "
            "convert with refimpl.backend.asarray"
        )
    if floating and value.dtype.kind != "f":
        raise TypeError(
            f"{name} must be a floating-point array, got dtype {value.dtype}; "
            "convert with .astype(float)"
        )
    if shape is not None:
        expected = tuple(shape)
        if len(expected) != value.ndim or any(
            e is not None and e != s for e, s in zip(expected, value.shape, strict=True)
        ):
            pretty = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
            raise ValueError(f"{name} must have shape {pretty}, got {tuple(value.shape)}")
    elif ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    return get_array_module(value)


def all_finite(value: Any) -> bool:
    """Whether ``value`` holds no NaN or infinity.

    First one sum, which makes no array of flags (one byte per entry for
    ``isfinite(value).all()``): a NaN or infinity makes the sum NaN or
    infinite, so a finite sum clears ``value``. A non-finite sum (which finite entries
    can give by overflowing) falls through to the entrywise check, which decides."""
    xp = get_array_module(value)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow here is not an error
        if bool(xp.isfinite(xp.sum(value))):
            return True
    return bool(xp.isfinite(value).all())


def check_finite(value: Any, name: str) -> None:
    """No NaN or infinity in ``value`` (:func:`all_finite`), else :class:`NonFiniteError`."""
    if all_finite(value):
        return
    count = int((~get_array_module(value).isfinite(value)).sum())
    raise NonFiniteError(
        f"{name} contains NaN or infinity ({count} of {value.size} entries); "
        "check the step that produced it (learning rate, division by zero, log of zero)"
    )


def check_input(value: Any, name: str = "x", **shape_kwargs: Any) -> ModuleType:
    """A finite floating-point array (of the given ``ndim``/``shape``); returns its module."""
    xp = check_array(value, name, **shape_kwargs)
    check_finite(value, name)
    return xp


def check_sparse_input(x: Any, name: str, in_features: int) -> ModuleType:
    """Sparse input features: a CSR matrix (N, in_features) of floats, whole
    (:func:`check_csr_structure`) and with finite stored values. Returns its array module."""
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


def check_csr_structure(x: Any, name: str) -> None:
    """``x.indptr``, ``x.indices`` and ``x.data`` describe a CSR matrix of ``x.shape`` that
    stores each entry once: SciPy's and cuSPARSE's kernels read them unchecked, so a wrong
    ``indptr`` reads memory out of bounds (a segfault) and a wrong column index reads garbage.

    Vectorised, on every backend. Unsorted column indices are accepted (every product sums a
    row in any order); a duplicate entry is refused, as dropout masks stored values.
    """
    what, (rows, columns) = f"{name} (CSR)", x.shape
    indptr, indices, data = x.indptr, x.indices, x.data
    fix = f"rebuild {name} with csr_matrix((data, indices, indptr), shape=...), arrays unedited"
    for part, array in (("indptr", indptr), ("indices", indices), ("data", data)):
        if not is_array(array) or array.ndim != 1:
            got = f"shape {tuple(array.shape)}" if is_array(array) else type(array).__name__
            raise TypeError(f"{what} {part} must be a 1-D array, got {got}; {fix}")
        if part != "data" and not (array.dtype.kind in "iu" and np.can_cast(array.dtype, "i8")):
            raise TypeError(
                f"{what} {part} has dtype {array.dtype}; index arrays must hold integers "
                f"(int32 or int64, as SciPy makes them): {fix}"
            )
    xp = get_array_module(x, indptr, indices, data)  # TypeError if on two backends
    stored = indices.shape[0]
    if indptr.shape[0] != rows + 1 or data.shape[0] != stored:
        raise ValueError(
            f"{what} has {indptr.shape[0]} indptr entries for {rows} rows (needs {rows + 1}), "
            f"{stored} column indices and {data.shape[0]} values (needs as many); {fix}"
        )
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0 or last != stored:
        raise ValueError(f"{what} indptr runs from {first} to {last}, not 0 to {stored} (the "
                         f"number of stored entries); {fix}")  # fmt: skip
    steps = indptr[1:] >= indptr[:-1]  # (rows,) no subtraction: unsigned indices cannot wrap
    if not bool(steps.all()):
        row = int(xp.flatnonzero(~steps)[0])
        raise ValueError(f"{what} indptr is not non-decreasing at row {row} ({int(indptr[row])} "
                         f"then {int(indptr[row + 1])}); {fix}")  # fmt: skip
    outside = (indices < 0) | (indices >= columns)  # (nnz,)
    if bool(outside.any()):
        entry = int(xp.flatnonzero(outside)[0])
        raise ValueError(f"{what} has column index {int(indices[entry])} at stored entry "
                         f"{entry}, outside [0, {columns}); {fix}")  # fmt: skip
    # each row's indices rising (canonical) rule out duplicates in one pass over a byte an
    # entry; otherwise a sort of the (row, column) keys finds them. Pairs across rows pass.
    rising, starts = indices[1:] > indices[:-1], indptr[1:-1]  # (nnz - 1,), (rows - 1,)
    rising[starts[(starts > 0) & (starts < stored)] - 1] = True
    if bool(rising.all()):
        return
    # (nnz,) each entry's row by searchsorted: cupy.repeat takes no array of counts before 14
    row_of = xp.searchsorted(indptr, xp.arange(stored), side="right") - 1
    keys = xp.sort(row_of * columns + indices.astype(xp.int64))  # < rows * columns < 2**63
    twice = xp.flatnonzero(keys[1:] == keys[:-1])
    if twice.shape[0]:
        row, column = divmod(int(keys[int(twice[0])]), columns)
        raise ValueError(
            f"{what} stores row {row}, column {column} more than once; merge duplicates with "
            f"{name}.sum_duplicates() (each entry stored once: dropout masks stored values)"
        )


def check_cotangent(
    d_out: Any, shape: tuple[int, ...], dtype: Any, *like: Any, name: str = "d_y"
) -> ModuleType:
    """``d_out`` matches the forward output's shape, dtype and backend (of ``like``) and is
    finite: a NaN or infinity in it would make every gradient non-finite without a word,
    so it is refused as forward refuses a non-finite input (:class:`NonFiniteError`)."""
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
    NumPy scalar) of ``like``'s dtype and backend. Returns it, a NumPy scalar as a float."""
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


def check_same_dtype(values: Mapping[str, Any], reference: Any, reference_name: str) -> None:
    """Every parameter in ``values`` has ``reference``'s dtype: nothing is silently cast."""
    for name, value in values.items():
        if value.dtype != reference.dtype:
            raise TypeError(
                f"{reference_name} has dtype {reference.dtype} but params[{name!r}] has dtype "
                f"{value.dtype}; cast {reference_name} or the parameters so that all share "
                "one float dtype"
            )


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


def check_graph_rows(x: Any, graph: Any) -> None:
    """``graph`` is a :class:`refimpl.Graph` on one node set with one node per row of ``x``."""
    from refimpl.graph import Graph  # graph.py sits above this module's users

    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    if graph.is_bipartite:
        raise ValueError(
            f"the graph is bipartite ({graph.num_nodes} sources, {graph.num_dst_nodes} "
            "targets): pass x as a pair (x_src, x_dst), to a layer that takes one (GATConv, "
            "TransformerConv)"
        )
    if x.shape[0] != graph.num_nodes:
        raise ValueError(
            f"x has {x.shape[0]} rows but the graph has {graph.num_nodes} nodes; "
            "x must hold one feature row per node"
        )


def check_bipartite_inputs(x: Any, graph: Any, owner: str) -> None:
    """``x`` is a pair ``(x_src, x_dst)`` of arrays with one row per source and per target
    node of ``graph``."""
    from refimpl.graph import Graph

    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a refimpl.Graph, got {type(graph).__name__}")
    for side, name in zip(x, ("x_src", "x_dst"), strict=False):
        refuse_array_subclass(side, name)
    if len(x) != 2 or not all(is_array(side) or is_sparse(side) for side in x):
        raise TypeError(f"{owner}: x must be one array or a pair of arrays (x_src, x_dst)")
    for side, rows, what in ((x[0], graph.num_nodes, "sources"),
                             (x[1], graph.num_dst_nodes, "targets")):  # fmt: skip
        if getattr(side, "ndim", 0) != 2 or side.shape[0] != rows:
            name = "x_src" if what == "sources" else "x_dst"
            raise ValueError(
                f"{name} has shape {tuple(side.shape)} but the graph has {rows} {what}; "
                f"{name} must hold one feature row per node (Graph(edge_index, num_src, "
                "num_dst_nodes=num_dst) for a bipartite graph)"
            )
    get_array_module(*x)  # TypeError if on two backends
    if x[0].dtype != x[1].dtype:
        raise TypeError(f"x_src has dtype {x[0].dtype} but x_dst {x[1].dtype}; cast one")


def check_optional_input(
    value: Any, name: str, option: str, width: int | None, rows: int, x: Any, owner: str
) -> None:
    """An input a block takes exactly when configured for it (``edge_attr`` with ``edge_dim``,
    ``pe`` with ``pe_dim``): absent when ``width`` is None, else a finite ``(rows, width)``
    array on ``x``'s backend with ``x``'s dtype."""
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


def check_keys(given: Mapping[str, Any], expected: list[str], problem: str, fix: str) -> None:
    """``given`` has exactly the keys ``expected``; else a ValueError listing the difference."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{problem}: missing {missing}, unexpected {unexpected}; {fix} "
            f"(expected keys: {expected})"
        )


def check_rng(rng: Any, name: str) -> None:
    """``None`` or a generator: ``numpy.random.Generator`` (``numpy.random.default_rng(seed)``)
    or CuPy's, which draws on the device. An int seed or a ``RandomState`` is refused here, not
    met later as an ``AttributeError``. ``name`` says whose, e.g. ``"TransformerConv rng"``."""
    cupy_generator = type(rng).__module__.startswith("cupy.") and hasattr(rng, "random")
    if not (rng is None or isinstance(rng, np.random.Generator) or cupy_generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator or None, got {type(rng).__name__}; "
            "make one with numpy.random.default_rng(seed)"
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
    """A block's parameters and its input ``x`` (N, in_features), called ``name`` in messages:
    keys, shapes, finiteness, one backend, one dtype. Returns the array module. ``sparse``:
    the block also takes ``x`` as a CSR matrix (sparse input features)."""
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
    """``params`` has exactly the keys of ``shapes``, each a finite float array of that shape."""
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
