"""Sparse (CSR) times dense on the host, split into row blocks over threads when large.

SciPy's CSR product runs on one core but releases the GIL. On large graphs it is
bound by memory latency (each stored entry fetches a row of the dense operand from
anywhere in memory), so blocks of rows on separate threads overlap those fetches.
Small products stay on one thread, where the dispatch would cost more than it
saves. Every output row is computed by one
thread exactly as the single product computes it, so the result does not depend
on the thread count.

The blocks call SciPy's own kernel behind ``A @ X`` (``csr_matvecs``, which adds
``A X`` into a given output) on their rows of one zeroed output, so no block makes
an array of its own to be copied in (no per-block arrays, no copy-in). Where that
kernel is missing (it is private to SciPy) or the operands' dtypes differ, each
block makes its product with ``@`` and it is copied in, as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl.kernels.parallel import map_blocks, num_threads

try:  # Y += A X into a given Y: the kernel of SciPy's own CSR-dense product
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - a SciPy without it: each block's own product
    _csr_matvecs = None

__all__ = ["MIN_PARALLEL_WORK", "csr_matmul", "head_block_matmul", "head_blocks"]

MIN_PARALLEL_WORK = 1 << 24  # stored entries x dense columns below which one thread runs it


def csr_matmul(
    matrix: Any, dense: Any, threads: int | None = None, min_work: int = MIN_PARALLEL_WORK
) -> np.ndarray:
    """``matrix @ dense``, on threads over blocks of rows when the product is large.

    On ``threads`` contiguous blocks of rows with about equal numbers of stored entries, when
    ``matrix.nnz * F >= min_work``; each row is summed as one product would sum it.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix
        ``(R, C)``.
    dense : numpy.ndarray
        ``(C, F)``.
    threads : int or None, default None
        The most threads; None takes :func:`~refimpl.kernels.parallel.num_threads`.
    min_work : int, default MIN_PARALLEL_WORK
        The least ``nnz * F`` worth splitting; below it one product on the calling thread.

    Returns
    -------
    numpy.ndarray
        ``(R, F)``.
    """
    import scipy.sparse as sp

    threads = num_threads() if threads is None else threads
    columns = dense.shape[1] if dense.ndim == 2 else 1
    rows = matrix.shape[0]
    if threads < 2 or rows < threads or matrix.nnz * columns < min_work:
        return matrix @ dense
    # row boundaries that split the stored entries evenly (rows hold different counts)
    indptr = matrix.indptr
    targets = np.linspace(0, matrix.nnz, threads + 1)[1:-1]
    bounds = [0, *np.searchsorted(indptr, targets).tolist(), rows]
    dtype = np.result_type(matrix.dtype, dense.dtype)
    if (
        _csr_matvecs is not None
        and dense.ndim == 2
        and matrix.dtype == dtype
        and matrix.indices.dtype == indptr.dtype
    ):
        return _into_one_output(matrix, np.ascontiguousarray(dense, dtype=dtype), bounds)
    out = np.empty((rows, *dense.shape[1:]), dtype=dtype)

    def block(k: int) -> None:
        first, last = bounds[k], bounds[k + 1]
        lo, hi = indptr[first], indptr[last]
        part = sp.csr_matrix(
            (matrix.data[lo:hi], matrix.indices[lo:hi], indptr[first : last + 1] - lo),
            shape=(last - first, matrix.shape[1]),
        )
        out[first:last] = part @ dense

    map_blocks(block, threads, threads)
    return out


def _into_one_output(matrix: Any, dense: np.ndarray, bounds: list[int]) -> np.ndarray:
    """``matrix @ dense`` with each block of rows ``bounds[k]:bounds[k + 1]`` added by SciPy's
    kernel into its rows of one zeroed output; ``dense`` C-contiguous, of the matrix's dtype.
    The block's ``indptr`` slice keeps its absolute offsets into ``indices`` and ``data``."""
    rows, (inner, columns) = matrix.shape[0], dense.shape
    out = np.zeros((rows, columns), dtype=dense.dtype)  # the kernel adds into it
    flat = dense.reshape(-1)

    def block(k: int) -> None:
        first, last = bounds[k], bounds[k + 1]
        _csr_matvecs(
            last - first,
            inner,
            columns,
            matrix.indptr[first : last + 1],
            matrix.indices,
            matrix.data,
            flat,
            out[first:last].reshape(-1),  # a view: these rows are contiguous
        )

    map_blocks(block, len(bounds) - 1, len(bounds) - 1)
    return out


def head_blocks(
    indptr: np.ndarray, column: np.ndarray, heads: int, num_columns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR structure that applies one sparsity pattern to ``heads`` heads in one product.

    For a CSR pattern ``(R, C)`` (``indptr`` (R + 1,), ``column`` (nnz,)), row ``r * H + h`` of
    the block matrix ``(R H, C H)`` holds row ``r``'s stored entries for head ``h``, in their
    stored order, at columns ``column * H + h``. With ``dense (C, H, F)`` read as ``(C H, F)``
    (a free reshape), one product gives every head's ``(R, H, F)``, each output row summed in
    the order the one-head product sums it: the same values as a product per head, without
    ``H`` strided slices, ``H`` matrices or a stack.

    Parameters
    ----------
    indptr : numpy.ndarray
        ``(R + 1,)``, the pattern's row pointers.
    column : numpy.ndarray
        ``(nnz,)``, its column indices.
    heads : int
        ``H``, ``>= 1``.
    num_columns : int
        ``C``.

    Returns
    -------
    tuple of numpy.ndarray
        ``(source, column_h, indptr_h)``: ``source[q] = p * H + h`` names the stored position
        ``p`` and head ``h`` of block entry ``q`` (a flat index into an ``(nnz, H)`` array);
        ``column_h`` and ``indptr_h`` are int32 where they fit.
    """
    nnz, rows = column.shape[0], indptr.shape[0] - 1
    degree = np.diff(indptr)  # (R,) stored entries per row
    row = np.repeat(np.arange(rows), degree)  # (nnz,) each entry's row
    start = indptr[:-1][row]  # (nnz,) its row's first position
    # entry (p, h) goes to q = start[r] H + h degree[r] + (p - start[r])  (nnz, H)
    target = (start * (heads - 1) + np.arange(nnz))[:, None] + np.outer(degree[row], range(heads))
    source = np.empty(nnz * heads, dtype=np.int64)
    source[target.ravel()] = np.arange(nnz * heads)
    index_type = np.int32 if max(nnz, num_columns) * heads < 2**31 else np.int64
    column_h = (column[source // heads] * heads + source % heads).astype(index_type)
    indptr_h = np.zeros(rows * heads + 1, dtype=index_type)
    np.cumsum(np.repeat(degree, heads), out=indptr_h[1:])
    return source, column_h, indptr_h


def head_block_matmul(matrix: Any, dense: Any) -> np.ndarray:
    """``matrix`` applied to every head of ``dense``: one :func:`csr_matmul`.

    Parameters
    ----------
    matrix : scipy.sparse.csr_matrix
        ``(R H, C H)``, built on the structure of :func:`head_blocks`.
    dense : numpy.ndarray
        ``(C, H, *F)``.

    Returns
    -------
    numpy.ndarray
        ``(R, H, *F)``.
    """
    heads, features = dense.shape[1], dense.shape[2:]
    flat = dense.reshape(dense.shape[0] * heads, math.prod(features))  # (C H, F)
    out = csr_matmul(matrix, flat)  # (R H, F)
    return out.reshape((matrix.shape[0] // max(heads, 1), heads, *features))
