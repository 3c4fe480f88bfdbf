"""The strict stand-in's ``cupyx.scipy.sparse``: CSR matrices over strict arrays.

:func:`refimpl.backend.sparse_module` hands this module to code running on the strict
backend, where CuPy would hand ``cupyx.scipy.sparse``. Like ``cupyx``, it takes only
device (strict) arrays, stores ``int32`` indices, and multiplies a matrix by a device
array into a device array; a NumPy array anywhere raises. Index arrays must hold integers
that fit ``int32``: a float or a wider value is refused, where a cast would truncate or wrap
it silently. Underneath it is ``scipy.sparse``, so the products are SciPy's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from refimpl.testing.launch_counts import record
from refimpl.testing.strict import StrictArray, StrictConversionError

__all__ = ["csr_matrix"]


def _device(array: Any, name: str) -> np.ndarray:
    if not isinstance(array, StrictArray):
        raise StrictConversionError(
            f"csr_matrix {name}: expected a strict-backend array, got {type(array).__name__} "
            "(cupyx.scipy.sparse refuses host arrays too)"
        )
    return array._data


def _index(array: Any, name: str) -> np.ndarray:
    """``array`` (strict, integers) as ``int32`` indices, refused where the cast would lose."""
    values = _device(array, name)
    info = np.iinfo(np.int32)
    if values.dtype.kind not in "iu" or (
        values.size and not info.min <= int(values.min()) <= int(values.max()) <= info.max
    ):
        raise ValueError(
            f"csr_matrix {name}: expected integers that fit int32 (the indices it stores), got "
            f"{values.dtype} values that a cast would truncate or wrap"
        )
    return values.astype(np.int32)


class csr_matrix:  # lower case: the name of the class it stands in for
    """``csr_matrix((data, indices, indptr), shape=(R, C))`` over strict arrays (its
    transpose is the same stand-in over SciPy's CSC)."""

    format = property(lambda self: self._matrix.format)  # "csc" for a transpose
    ndim = 2

    def __init__(self, arg: Any, shape: tuple[int, int] | None = None, copy: bool = False) -> None:
        if sp.issparse(arg):  # internal: the result of an operation (a transpose is CSC)
            self._matrix = arg
            return
        data, indices, indptr = arg
        self._matrix = sp.csr_matrix(
            (
                _device(data, "data"),
                _index(indices, "indices"),  # as cupyx: 32-bit indices
                _index(indptr, "indptr"),
            ),
            shape=shape,
            copy=copy,
        )

    shape = property(lambda self: self._matrix.shape)
    dtype = property(lambda self: self._matrix.dtype)
    nnz = property(lambda self: self._matrix.nnz)
    data = property(lambda self: StrictArray(self._matrix.data))
    indices = property(lambda self: StrictArray(self._matrix.indices))
    indptr = property(lambda self: StrictArray(self._matrix.indptr))

    T = property(lambda self: csr_matrix(self._matrix.T))

    def tocsr(self) -> csr_matrix:
        return csr_matrix(self._matrix.tocsr())

    def astype(self, dtype: Any) -> csr_matrix:
        return csr_matrix(self._matrix.astype(dtype))

    def sort_indices(self) -> None:
        self._matrix.sort_indices()

    def sum_duplicates(self) -> None:
        self._matrix.sum_duplicates()

    def __add__(self, other: csr_matrix) -> csr_matrix:
        if not isinstance(other, csr_matrix):
            raise TypeError(f"csr_matrix + {type(other).__name__} is not supported here")
        record("launches")  # cuSPARSE's sum, one launch as counted (launch_counts)
        return csr_matrix(sp.csr_matrix(self._matrix + other._matrix))

    def __matmul__(self, dense: Any) -> StrictArray:
        record("launches")  # cuSPARSE's product
        return StrictArray(np.asarray(self._matrix @ _device(dense, "@ operand")))

    def __repr__(self) -> str:
        return f"strict_sparse.csr_matrix(shape={self.shape}, nnz={self.nnz})"
