"""Segment sums on a CUDA device that repeat bit for bit: one thread per output entry.

``out[n, f] = sum of values[order[j], f] for j in indptr[n] .. indptr[n + 1] - 1``, added
left to right in the precision of ``values``: the order SciPy's CSR product uses on the
host, so an unweighted float sum is bitwise the CPU's. No atomics: ``add.at`` adds in
the order its atomic updates land, and cuSPARSE's CSR product also varied from run to
run on rows of a few thousand items (measured on an H200: docs/benchmarks.md, GPU).

Threads ``i = n * F + f`` of a warp read consecutive features of one item, so the reads
of a row of ``values`` are coalesced. Only CuPy calls this; the strict stand-in runs the
same sums through SciPy (:mod:`refimpl.kernels.segment`).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["row_sums_in_order"]

_BODY = """
const long long n = i / num_features, f = i % num_features;
T total = 0;
for (long long j = indptr[n]; j < indptr[n + 1]; ++j) {
    total += values[(long long)order[j] * num_features + f];
}
out = total;
"""


@functools.cache
def _kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "raw T values, raw int32 order, raw int32 indptr, int64 num_features",
        "T out",
        _BODY,
        "refimpl_row_sums_in_order",
    )


def row_sums_in_order(flat: Any, order: Any, indptr: Any) -> Any:
    """``flat (E, F)`` (CuPy) summed per segment in CSR order: ``(N, F)``, N = len(indptr) - 1.

    ``order`` (E,) and ``indptr`` (N + 1,) int32 (:meth:`Segments.csr_structure`).
    """
    import cupy

    num_features = flat.shape[1]
    values = cupy.ascontiguousarray(flat).ravel()  # (E * F,) read by linear index
    out = cupy.empty((indptr.shape[0] - 1, num_features), dtype=flat.dtype)
    return _kernel()(values, order, indptr, num_features, out)
