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

__all__ = ["cuda_sources", "row_sums_in_order"]

_BODY = """
const long long n = i / num_features, f = i % num_features;
T total = 0;
for (long long j = indptr[n]; j < indptr[n + 1]; ++j) {
    total += values[(long long)order[j] * num_features + f];
}
out = total;
"""


_IN_PARAMS = "raw T values, raw int32 order, raw int32 indptr, int64 num_features"
_OUT_PARAMS = "T out"
_NAME = "refimpl_row_sums_in_order"


@functools.cache
def _kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel(_IN_PARAMS, _OUT_PARAMS, _BODY, _NAME)


def cuda_sources() -> dict[str, str]:
    """The kernel as CUDA source, by name, for ``nvcc`` (the PTX test): ``_BODY`` wrapped as
    ``cupy.ElementwiseKernel`` wraps it, one thread per output entry ``i`` (a grid-stride
    loop), the raw arrays as pointers, ``num_features`` by value, ``out`` a reference to
    entry ``i``; once for float and once for double."""
    c_types = {"int32": "int", "int64": "long long"}  # and T: the type being compiled

    def signature(t: str) -> str:
        parameters = []
        for entry in _IN_PARAMS.split(","):
            *raw, type_name, name = entry.split()
            parameters.append(f"const {c_types.get(type_name, t)}{'*' if raw else ''} {name}")
        return ", ".join([*parameters, f"{t}* out_", "const long long size_"])

    kernel = (
        f"template <typename T> __global__ void {_NAME}({signature('T')}) {{\n"
        "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < size_;"
        " i += (long long)blockDim.x * gridDim.x) {\n"
        f"T& out = out_[i];\n{_BODY}}}\n}}\n"
    )
    instances = "".join(
        f"template __global__ void {_NAME}<{c}>({signature(c)});\n" for c in ("float", "double")
    )
    return {"device_sums": kernel + instances}


def row_sums_in_order(flat: Any, order: Any, indptr: Any) -> Any:
    """``flat`` summed per segment, each segment's items in CSR order (CuPy).

    Parameters
    ----------
    flat : cupy.ndarray
        ``(E, F)``, the items' values.
    order : cupy.ndarray
        ``(E,)`` int32, the items in segment order (:meth:`Segments.csr_structure`).
    indptr : cupy.ndarray
        ``(N + 1,)`` int32, where each segment's items start in ``order``.

    Returns
    -------
    cupy.ndarray
        ``(N, F)``, zero for an empty segment.
    """
    import cupy

    num_features = flat.shape[1]
    values = cupy.ascontiguousarray(flat).ravel()  # (E * F,) read by linear index
    out = cupy.empty((indptr.shape[0] - 1, num_features), dtype=flat.dtype)
    return _kernel()(values, order, indptr, num_features, out)
