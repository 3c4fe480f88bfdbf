"""Tables of bad inputs, one per kind of argument, so that every argument of every surface
gets the same treatment: wrong type, wrong dtype, wrong shape, NaN, infinity, huge,
negative, empty, out-of-range index, non-contiguous, read-only, zero-size.

Each :class:`Corruption` turns a valid value into a bad one (``apply``) and says which
valid value, if any, the bad one stands for (``repair``): a non-contiguous copy stands for
the same values, a list of floats for the array, a NaN for nothing. An input with a repair
may be refused or accepted, but if accepted its result must equal the reference on the
repaired value; an input without one must be refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

INVALID = object()  # what a repair returns where the corrupted value stands for nothing


@dataclass(frozen=True)
class Corruption:
    name: str
    apply: Callable[[Any], Any]
    repair: Callable[[Any], Any] | None = None  # clean value -> the valid value it stands for
    # False: an ill-conditioned input (scaled by 1e200) whose result any two correct
    # implementations round differently (catastrophic cancellation in the scores'
    # gradients), so only finiteness is asked of it: refused, or a finite result
    compare: bool = True


def applies(corruption: Corruption, value: Any) -> bool:
    """Whether ``corruption`` makes something of ``value`` (setting the first entry of an
    empty array does not): the harness's own errors are not the library's."""
    try:
        corruption.apply(value)
    except (IndexError, ValueError, TypeError, AttributeError):
        return False
    return True


def _same(a: Any) -> Any:
    return a


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values in a view that is not contiguous (every second column of a copy)."""
    wide = np.repeat(a[..., None], 2, axis=-1)
    return wide[..., 0]


def _set_first(a: np.ndarray, value: Any, dtype: Any = None) -> np.ndarray:
    a = a.astype(dtype or a.dtype, copy=True)
    a.flat[0] = value
    return a


def _masked(a: np.ndarray) -> np.ndarray:
    mask = np.zeros(a.shape, dtype=bool)
    mask.flat[0] = True
    return np.ma.masked_array(a, mask=mask)


def _rows(a: np.ndarray, change: int) -> np.ndarray:
    return a[:change] if change < 0 else np.concatenate([a, a[:change]], axis=0)


def _columns(a: np.ndarray, change: int) -> np.ndarray:
    return a[:, :change] if change < 0 else np.concatenate([a, a[:, :change]], axis=1)


def _2d(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function`` for 2-D arrays; a 1-D array gets a wrong shape by another route."""
    return lambda a: function(a) if a.ndim == 2 else a[None, :]


def _square_transpose(a: np.ndarray) -> Any:
    """A square matrix's transpose is a valid value (other numbers); any other is not."""
    return a.T if a.ndim == 2 and a.shape[0] == a.shape[1] else INVALID


# -- floating-point arrays: features, parameters, edge features, cotangents ----------------------
FLOAT_ARRAY = (
    Corruption("type: nested list", lambda a: a.tolist(), _same),
    Corruption("type: None", lambda a: None),
    Corruption("type: str", lambda a: "features"),
    Corruption("type: Python float", lambda a: 1.5),
    Corruption("type: 0-d array", lambda a: np.array(1.5)),
    Corruption(
        "type: numpy.matrix",
        lambda a: np.matrix(a) if a.ndim == 2 else np.matrix(a).T,
        lambda a: a if a.ndim == 2 else INVALID,
    ),
    Corruption("type: masked array, one entry masked", _masked),
    Corruption(
        "dtype: int64 (values truncated)",
        lambda a: a.astype(np.int64),
        lambda a: a.astype(np.int64).astype(a.dtype),
    ),
    Corruption("dtype: bool", lambda a: a > 0, lambda a: (a > 0).astype(a.dtype)),
    Corruption("dtype: complex128", lambda a: a.astype(np.complex128)),
    Corruption("dtype: object", lambda a: a.astype(object)),
    Corruption("dtype: str", lambda a: a.astype(str)),
    Corruption("dtype: float32 among float64", lambda a: a.astype(np.float32)),
    Corruption("dtype: float16", lambda a: a.astype(np.float16)),
    Corruption("dtype: big-endian float64", lambda a: a.astype(">f8"), _same),
    Corruption("shape: transposed", _2d(lambda a: a.T), _square_transpose),
    Corruption("shape: extra leading axis", lambda a: a[None]),
    Corruption("shape: flattened", lambda a: a.reshape(-1) if a.ndim > 1 else a[None, :]),
    Corruption("shape: one row fewer", lambda a: _rows(a, -1)),
    Corruption("shape: one row more", lambda a: _rows(a, 1)),
    Corruption("shape: one column fewer", _2d(lambda a: _columns(a, -1))),
    Corruption("shape: one column more", _2d(lambda a: _columns(a, 1))),
    Corruption("zero-size: no rows", lambda a: a[:0]),
    Corruption("NaN: one entry", lambda a: _set_first(a, np.nan)),
    Corruption("NaN: every entry", lambda a: np.full_like(a, np.nan)),
    Corruption("inf: one entry", lambda a: _set_first(a, np.inf)),
    Corruption("-inf: one entry", lambda a: _set_first(a, -np.inf)),
    Corruption("huge: times 1e200", lambda a: a * 1e200, lambda a: a * 1e200, compare=False),
    Corruption("large: times 1e50", lambda a: a * 1e50, lambda a: a * 1e50, compare=False),
    Corruption("negative: -|a|", lambda a: -np.abs(a), lambda a: -np.abs(a)),
    Corruption("zeros", np.zeros_like, np.zeros_like),
    Corruption("ties: every entry 1", np.ones_like, np.ones_like),
    Corruption("layout: non-contiguous view", _strided, _same),
    Corruption("layout: Fortran order", np.asfortranarray, _same),
    Corruption("layout: read-only", _read_only, _same),
)


# -- integer index arrays: edge_index (2, E), batch (N,) ---------------------------------------
INDEX_ARRAY = (
    Corruption("type: nested list", lambda a: a.tolist(), _same),
    Corruption("type: None", lambda a: None),
    Corruption("type: str", lambda a: "0 1"),
    Corruption("dtype: float, whole values", lambda a: a.astype(np.float64)),
    Corruption("dtype: float, one 0.5", lambda a: _set_first(a, 0.5, np.float64)),
    Corruption("dtype: float, one NaN", lambda a: _set_first(a, np.nan, np.float64)),
    Corruption("dtype: bool", lambda a: a > 0),
    Corruption("dtype: object", lambda a: a.astype(object)),
    Corruption("dtype: complex", lambda a: a.astype(np.complex128)),
    Corruption("dtype: int32", lambda a: a.astype(np.int32), _same),
    Corruption("dtype: int8", lambda a: a.astype(np.int8), _same),
    Corruption("dtype: uint8", lambda a: a.astype(np.uint8), _same),
    Corruption("dtype: uint64", lambda a: a.astype(np.uint64), _same),
    Corruption("dtype: big-endian int64", lambda a: a.astype(">i8"), _same),
    Corruption("range: one index -1", lambda a: _set_first(a, -1)),
    Corruption("range: one index = node count", lambda a: _set_first(a, a.max() + 1 + 50)),
    Corruption("range: one index 2**62", lambda a: _set_first(a, 2**62)),
    Corruption("range: uint64 2**64 - 1", lambda a: _set_first(a, 2**64 - 1, np.uint64)),
    Corruption("shape: transposed", _2d(lambda a: a.T)),
    Corruption("shape: flattened", lambda a: a.reshape(-1) if a.ndim > 1 else a[None, :]),
    Corruption("shape: extra leading axis", lambda a: a[None]),
    Corruption("shape: one row more", lambda a: _rows(a, 1)),
    Corruption("shape: 0-d", lambda a: np.array(0)),
    Corruption("layout: non-contiguous view", _strided, _same),
    Corruption("layout: Fortran order", np.asfortranarray, _same),
    Corruption("layout: read-only", _read_only, _same),
)


# -- sparse CSR features: the raw arrays changed behind SciPy's back ----------------------------
def _csr(matrix: sp.csr_matrix, **arrays: Any) -> sp.csr_matrix:
    """A copy of ``matrix`` with raw arrays replaced unchecked (as unpickling or a careless
    ``matrix.indices[...] = ...`` would leave them)."""
    out = matrix.copy()
    for name, value in arrays.items():
        setattr(out, name, value)
    return out


def dense_of(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple) -> Any:
    """The dense matrix a valid CSR triple stands for, written out (duplicates summed)."""
    dense = np.zeros(shape, dtype=np.float64)
    for row in range(shape[0]):
        for k in range(indptr[row], indptr[row + 1]):
            dense[row, indices[k]] += data[k]
    return dense


def _shuffled_rows(m: sp.csr_matrix) -> sp.csr_matrix:
    """Within every row the stored entries reversed: valid CSR, unsorted indices."""
    order = np.concatenate(
        [np.arange(m.indptr[r], m.indptr[r + 1])[::-1] for r in range(m.shape[0])]
    ).astype(np.int64)
    return _csr(m, indices=m.indices[order].copy(), data=m.data[order].copy())


def _duplicated_first(m: sp.csr_matrix) -> sp.csr_matrix:
    """The first row's first entry stored twice (SciPy sums duplicates)."""
    row = int(np.flatnonzero(np.diff(m.indptr))[0])
    at = m.indptr[row]
    indices = np.insert(m.indices, at, m.indices[at])
    data = np.insert(m.data, at, m.data[at])
    indptr = m.indptr.copy()
    indptr[row + 1 :] += 1
    return _csr(m, indices=indices, data=data, indptr=indptr)


def _swap_indptr(m: sp.csr_matrix) -> sp.csr_matrix:
    indptr = m.indptr.copy()
    row = int(np.flatnonzero(np.diff(indptr))[-1])
    indptr[row], indptr[row + 1] = indptr[row + 1], indptr[row]
    return _csr(m, indptr=indptr)


def _with(m: sp.csr_matrix, name: str, change: Callable[[np.ndarray], np.ndarray]) -> Any:
    return _csr(m, **{name: change(getattr(m, name).copy())})


def _dense_repair(corrupt: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The dense matrix the corrupted (still valid) CSR matrix stands for."""

    def repair(m: sp.csr_matrix) -> np.ndarray:
        bad = corrupt(m)
        return dense_of(bad.data.astype(np.float64), bad.indices, bad.indptr, bad.shape)

    return repair


SPARSE_CSR = (
    Corruption("csr: valid, unsorted indices", _shuffled_rows, _dense_repair(_shuffled_rows)),
    Corruption("csr: valid, duplicate entry", _duplicated_first, _dense_repair(_duplicated_first)),
    Corruption(
        "csr: valid, explicit zeros",
        lambda m: _with(m, "data", lambda d: d * 0),
        lambda m: np.zeros(m.shape),
    ),
    Corruption(
        "csr: valid, int32 indices",
        lambda m: _csr(m, indices=m.indices.astype(np.int32), indptr=m.indptr.astype(np.int32)),
        _dense_repair(_same),
    ),
    Corruption("csr: CSC format", lambda m: m.tocsc(), _dense_repair(_same)),
    Corruption("csr: COO format", lambda m: m.tocoo(), _dense_repair(_same)),
    Corruption("csr: indptr decreasing", _swap_indptr),
    Corruption("csr: indptr[0] = 1", lambda m: _with(m, "indptr", lambda p: _set_first(p, 1))),
    Corruption(
        "csr: indptr[-1] > nnz",
        lambda m: _with(m, "indptr", lambda p: np.append(p[:-1], p[-1] + 3)),
    ),
    Corruption("csr: indptr one short", lambda m: _with(m, "indptr", lambda p: p[:-1])),
    Corruption(
        "csr: index = column count",
        lambda m: _with(m, "indices", lambda i: _set_first(i, m.shape[1])),
    ),
    Corruption("csr: index 10**6", lambda m: _with(m, "indices", lambda i: _set_first(i, 10**6))),
    Corruption("csr: index -1", lambda m: _with(m, "indices", lambda i: _set_first(i, -1))),
    Corruption("csr: float indices", lambda m: _with(m, "indices", lambda i: i.astype(np.float64))),
    Corruption("csr: data one short", lambda m: _with(m, "data", lambda d: d[:-1])),
    Corruption("csr: data NaN", lambda m: _with(m, "data", lambda d: _set_first(d, np.nan))),
    Corruption("csr: data inf", lambda m: _with(m, "data", lambda d: _set_first(d, np.inf))),
    Corruption(
        "csr: data int64",
        lambda m: m.astype(np.int64),
        lambda m: dense_of(m.data.astype(np.int64), m.indices, m.indptr, m.shape),
    ),
    Corruption("csr: data complex", lambda m: m.astype(np.complex128)),
    Corruption(
        "csr: one column more",
        lambda m: sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], m.shape[1] + 1)),
    ),
    Corruption("csr: one row fewer", lambda m: m[:-1]),
)


# -- scalars: configuration fields, sizes, tolerances ---------------------------------------------
def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    )


DOMAINS: dict[str, Callable[[Any], bool]] = {  # a name ending in "?" also takes None
    "pos_int": lambda v: is_int(v) and v >= 1,
    "nonneg_int": lambda v: is_int(v) and v >= 0,
    "prob": lambda v: is_real(v) and 0 <= v < 1,
    "pos_real": lambda v: is_real(v) and v > 0,
    "nonneg_real": lambda v: is_real(v) and v >= 0,
    "real": is_real,
    "bool": lambda v: isinstance(v, bool),
}


def scalar_corruptions(value: Any) -> list[tuple[str, Any]]:
    """Bad (and borderline) stand-ins for the valid scalar ``value``, by name."""
    number = float(value) if is_real(value) else 1.0
    out = [
        ("NaN", math.nan),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("huge float 1e308", 1e308),
        ("huge int 2**62", 2**62),
        ("negative", -abs(number) or -1),
        ("-1", -1),
        ("zero", 0),
        ("one", 1),
        ("fraction 0.5", 0.5),
        ("1.5", 1.5),
        ("str", str(value)),
        ("list", [value]),
        ("None", None),
        ("True", True),
        ("False", False),
        ("complex", complex(number, 1.0)),
        ("numpy float64", np.float64(number)),
        ("numpy int64", np.int64(int(number))),
        ("numpy 0-d array", np.array(number)),
        ("wrong case", str(value).upper()),
        ("empty str", ""),
    ]
    return out


def scalar_repair(value: Any, domain: str) -> Any:
    """The valid value ``value`` stands for in ``domain`` (a name of :data:`DOMAINS`, or
    ``"choice:a,b"``), or None: a whole float for an int (``2.0``), an int for a real,
    0 / 1 for a bool; nothing else is read generously."""
    domain = domain.rstrip("?")
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf":
        value = value.item()  # a 0-d array of a number stands for the number
    if value is None:
        return None  # valid exactly when the domain is optional: see scalar_valid
    if domain.startswith("choice:"):  # a name in another case stands for it
        names = {name.lower(): name for name in domain[7:].split(",")}
        return names.get(value.lower()) if isinstance(value, str) else None
    valid = DOMAINS[domain]
    if valid(value):
        return value
    if domain.endswith("int") and is_real(value) and float(value).is_integer():
        return int(value) if valid(int(value)) else None
    if domain == "bool" and (is_int(value) or isinstance(value, np.bool_)) and value in (0, 1):
        return bool(value)
    return None


def scalar_valid(value: Any, domain: str) -> bool:
    """Whether ``value`` stands for a valid value of ``domain``."""
    if value is None:
        return domain.endswith("?")
    return scalar_repair(value, domain) is not None
