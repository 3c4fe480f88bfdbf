"""Checks at the public boundary that read no values: types, shapes, keys, structure.

Each raises one ``TypeError`` or ``ValueError`` line saying what was wrong and how to fix it.
:mod:`refimpl.validation` exports them beside the checks of values (finiteness) and the
composite checks of a block's inputs, which build on them; the optimisers of
:mod:`refimpl.optim` check their parameters, gradients and state with the last three.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from refimpl.backend import get_array_module, is_array, is_sparse, refuse_array_subclass

__all__ = [
    "check_array",
    "check_bipartite_inputs",
    "check_csr_structure",
    "check_grads",
    "check_graph_rows",
    "check_keys",
    "check_like_param",
    "check_param_arrays",
    "check_rng",
    "check_same_dtype",
]


def check_array(
    value: Any,
    name: str,
    *,
    ndim: int | None = None,
    shape: tuple | None = None,
    floating: bool = True,
) -> ModuleType:
    """``value`` is a backend array of the given rank or shape.

    Parameters
    ----------
    value : Any
        The value to check.
    name : str
        Its name in the messages, e.g. ``"x"``.
    ndim : int or None, default None
        The rank it must have; None: any (ignored when ``shape`` is given).
    shape : tuple or None, default None
        The shape it must have, ``None`` in an entry for any size there; None: any shape.
    floating : bool, default True
        Whether it must hold floats.

    Returns
    -------
    module
        The array module of ``value``.
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


def check_csr_structure(x: Any, name: str) -> None:
    """``x.indptr``, ``x.indices`` and ``x.data`` describe a CSR matrix of ``x.shape`` that
    stores each entry once: SciPy's and cuSPARSE's kernels read them unchecked, so a wrong
    ``indptr`` reads memory out of bounds (a segfault) and a wrong column index reads garbage.

    Vectorised, on every backend. Unsorted column indices are accepted (every product sums a
    row in any order); a duplicate entry is refused, as dropout masks stored values.

    Parameters
    ----------
    x : sparse matrix
        A CSR matrix of any backend.
    name : str
        Its name in the messages, e.g. ``"x"``.
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


def check_same_dtype(values: Mapping[str, Any], reference: Any, reference_name: str) -> None:
    """Every parameter in ``values`` has ``reference``'s dtype: nothing is silently cast.

    Parameters
    ----------
    values : mapping of str to array
        The parameters, by name.
    reference : array
        The input whose dtype they must share.
    reference_name : str
        Its name in the message, e.g. ``"x"``.
    """
    for name, value in values.items():
        if value.dtype != reference.dtype:
            raise TypeError(
                f"{reference_name} has dtype {reference.dtype} but params[{name!r}] has dtype "
                f"{value.dtype}; cast {reference_name} or the parameters so that all share "
                "one float dtype"
            )


def check_graph_rows(x: Any, graph: Any) -> None:
    """``graph`` is a :class:`refimpl.Graph` on one node set with one node per row of ``x``.

    Parameters
    ----------
    x : array or sparse matrix
        The node features, ``(N, ...)``.
    graph : Any
        The value given as the graph.
    """
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
    node of ``graph``, on one backend, with one dtype.

    Parameters
    ----------
    x : tuple
        The value given as the pair of features, dense arrays or CSR matrices.
    graph : Any
        The value given as the (bipartite) graph.
    owner : str
        The layer, for the messages (e.g. ``"GATConv"``).
    """
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


def check_keys(given: Mapping[str, Any], expected: list[str], problem: str, fix: str) -> None:
    """``given`` has exactly the keys ``expected``; else a ValueError listing the difference.

    Parameters
    ----------
    given : mapping
        The mapping to check.
    expected : list of str
        The keys it must have.
    problem : str
        The start of the message, what does not match.
    fix : str
        How to fix it, after the difference.
    """
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
    met later as an ``AttributeError``.

    Parameters
    ----------
    rng : Any
        The value given as the generator.
    name : str
        Whose it is, for the message, e.g. ``"TransformerConv rng"``.
    """
    cupy_generator = type(rng).__module__.startswith("cupy.") and hasattr(rng, "random")
    if not (rng is None or isinstance(rng, np.random.Generator) or cupy_generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator or None, got {type(rng).__name__}; "
            "make one with numpy.random.default_rng(seed)"
        )


def check_param_arrays(params: Any) -> ModuleType:
    """``params`` is a dict of float arrays on one backend (an optimiser's parameters).

    Parameters
    ----------
    params : Any
        The value given as the parameters.

    Returns
    -------
    module
        The parameters' array module.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    for name, w in params.items():
        if not isinstance(name, str):
            raise TypeError(f"parameter names must be strings, got {name!r}")
        if not is_array(w) or w.dtype.kind != "f":
            kind = w.dtype if is_array(w) else type(w).__name__
            raise TypeError(f"params[{name!r}] must be a floating-point array, got {kind}")
    return get_array_module(*params.values())  # TypeError if backends are mixed


def check_grads(params: Mapping[str, Any], grads: Any) -> None:
    """``grads`` has exactly the keys of ``params``, each of the same shape, dtype and backend.

    Parameters
    ----------
    params : mapping of str to array
        The parameters, already checked (:func:`check_param_arrays`).
    grads : Any
        The value given as their gradients.
    """
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads must be a dict of arrays, got {type(grads).__name__}")
    _check_same_keys(params, grads, "grads")
    for name, w in params.items():
        check_like_param(grads[name], w, f"grads[{name!r}]", name)


def _check_same_keys(
    params: Mapping[str, Any], other: Mapping[str, Any], what: str, prefix: str = ""
) -> None:
    expected = {prefix + k for k in params}
    missing = sorted(expected - set(other))
    unexpected = sorted(set(other) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{what} keys must match the parameters: missing {missing}, unexpected {unexpected}"
        )


def check_like_param(value: Any, w: Any, what: str, name: str) -> None:
    """``value`` is an array of parameter ``w``'s shape, dtype and backend (its gradient, a
    moment of an optimiser's state).

    Parameters
    ----------
    value : Any
        The value to check.
    w : array
        The parameter.
    what : str
        ``value``'s name in the messages, e.g. ``"grads['layer0.W']"``.
    name : str
        The parameter's name.
    """
    if not is_array(value):
        raise TypeError(f"{what} must be an array, got {type(value).__name__}")
    if tuple(value.shape) != tuple(w.shape):
        raise ValueError(
            f"{what} has shape {tuple(value.shape)} but params[{name!r}] has {tuple(w.shape)}"
        )
    if value.dtype != w.dtype:
        raise TypeError(
            f"{what} has dtype {value.dtype} but params[{name!r}] has {w.dtype}; cast one of them"
        )
    try:
        get_array_module(value, w)
    except TypeError as err:
        raise TypeError(
            f"{what} lives on another backend than params[{name!r}]; for a loaded state call "
            "opt.load_state(state, params)"
        ) from err
