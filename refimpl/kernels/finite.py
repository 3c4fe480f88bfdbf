"""The deferred checks' one read: every queued array's finiteness and a few small values, in
one kernel launch and one device-to-host transfer, beside its NumPy twin.

A training step on a device (:func:`refimpl.train.guards.deferred_step`) queues the arrays its
finiteness checks would read (:func:`refimpl.validation.all_finite`) and the small values it
needs on the host (the loss, the optimiser's flag). :func:`finite_read` reads them all: one
kernel (:func:`cuda_source`, made for the queue's dtypes and compiled once per such signature;
the pointers and sizes travel as kernel arguments, so no table is copied to the device) writes
one float64 vector, which is read back in one transfer:

    F1  array k gets max(1, ceil(n_k / CHUNK)) blocks, in queue order; a block reads the
        entries [start, start + CHUNK) of its array, each thread every BLOCK-th of them
    F2  a thread's flag: an entry whose exponent bits are all set (NaN or infinity, as
        ``numpy.isfinite`` decides); the block's: its threads' OR (``__syncthreads_or``)
    F3  thread 0 writes the block's flag, 1.0 or 0.0, at the block's index (a launch of
        values alone has one block and no flag)
    F4  block 0's thread 0 copies the values, in order, widened to double (exactly), after
        the flags

Every output entry is written once by one thread: no sum, no atomic, so the read repeats bit
for bit and :func:`finite_read_twin` (the strict stand-in's one launch,
``strict.run_kernel``) writes the same vector. The flag reads bits, not arithmetic, so
``-ftz`` and ``--fmad`` change nothing.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

from refimpl.backend import backend_name

__all__ = ["BLOCK", "CHUNK", "cuda_source", "cuda_sources", "finite_read", "finite_read_twin"]

BLOCK = 256  # threads per block
CHUNK = 8192  # entries per block: 32 per thread
GROUP = 120  # queued arrays and values per launch: 16 bytes each, well inside 4 KiB of arguments

_ARRAY_TYPES = {"float32": "float", "float64": "double"}
_VALUE_TYPES = {**_ARRAY_TYPES, "int32": "int", "bool": "bool"}

_HEADER = r"""
#define CHUNK %dLL
__device__ __forceinline__ long long refimpl_blocks(const long long n) {
    return n > 0 ? (n + CHUNK - 1) / CHUNK : 1;  // F1 an empty array still has its block
}
__device__ __forceinline__ bool refimpl_bad(const float v) {  // F2 exponent all ones
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool refimpl_bad(const double v) {
    return (__double_as_longlong(v) & 0x7ff0000000000000LL) == 0x7ff0000000000000LL;
}
template <typename T>
__device__ bool refimpl_any_bad(const T* a, const long long n, const long long start) {
    const long long end = start + CHUNK < n ? start + CHUNK : n;
    bool bad = false;
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) bad |= refimpl_bad(a[i]);
    return bad;
}
"""


@functools.cache
def cuda_source(arrays: tuple[str, ...], values: tuple[tuple[str, int], ...]) -> str:
    """The kernel ``refimpl_finite_read`` for queued arrays of the C types ``arrays``
    (``"float"``, ``"double"``) and values ``(C type, entries)``: its arguments are each
    array's pointer and size, then each value's pointer, then the flags' and values' outputs."""
    params = [f"const {c}* a{k}, const long long n{k}" for k, c in enumerate(arrays)]
    params += [f"const {c}* v{j}" for j, (c, _) in enumerate(values)]
    body = ["const long long b = blockIdx.x;", "long long first = 0;", "bool bad = false;"]
    for k in range(len(arrays)):  # F1 the array whose blocks hold b
        body.append(
            f"if (b >= first && b < first + refimpl_blocks(n{k})) "
            f"bad = refimpl_any_bad(a{k}, n{k}, (b - first) * CHUNK);"
        )
        body.append(f"first += refimpl_blocks(n{k});")
    body += [
        "bad = __syncthreads_or(bad);",
        "if (threadIdx.x == 0 && b < first) flags[b] = bad ? 1.0 : 0.0;",
    ]
    copies, offset = [], 0  # F4
    for j, (_, size) in enumerate(values):
        copies += [f"read[{offset + i}] = (double)v{j}[{i}];" for i in range(size)]
        offset += size
    if copies:
        body.append(
            "if (b == 0 && threadIdx.x == 0) {\n        " + "\n        ".join(copies) + "\n    }"
        )
    params += ["double* flags", "double* read"]
    return (
        _HEADER % CHUNK
        + f'extern "C" __global__ void refimpl_finite_read({", ".join(params)}) {{\n    '
        + "\n    ".join(body)
        + "\n}\n"
    )


def cuda_sources() -> dict[str, str]:
    """A kernel of each array type and each value type, by name (the PTX test)."""
    values = tuple((c, 2) for c in _VALUE_TYPES.values())
    return {"finite_read": cuda_source(tuple(_ARRAY_TYPES.values()), values)}


def finite_read_twin(
    arrays: list[np.ndarray], values: list[np.ndarray], flags: np.ndarray, read: np.ndarray
) -> None:
    """The kernel on NumPy, in its order (F1-F4), writing ``flags`` and ``read`` in place.

    Parameters
    ----------
    arrays : list of float numpy.ndarray
        The queued arrays.
    values : list of numpy.ndarray
        The values to read.
    flags : float64 numpy.ndarray (B,)
        One entry per block (F1).
    read : float64 numpy.ndarray (V,)
        The values' entries, in order.
    """
    b = 0
    for array in arrays:
        flat = array.reshape(-1)
        for start in range(0, max(flat.size, 1), CHUNK):  # F1
            flags[b] = 0.0 if np.isfinite(flat[start : start + CHUNK]).all() else 1.0  # F2 F3
            b += 1
    offset = 0
    for value in values:  # F4
        read[offset : offset + value.size] = value.reshape(-1)
        offset += value.size


@functools.cache
def _kernel(arrays: tuple[str, ...], values: tuple[tuple[str, int], ...]) -> Any:
    import cupy

    module = cupy.RawModule(code=cuda_source(arrays, values), options=("--fmad=false",))
    return module.get_function("refimpl_finite_read")


def _c_type(value: Any, types: dict[str, str], what: str) -> str:
    c_type = types.get(value.dtype.name)
    if c_type is None:
        raise TypeError(
            f"a deferred read takes {what} of dtype {', '.join(types)}, got {value.dtype}; "
            "check the array queued by the step"
        )
    return c_type


def finite_read(xp: Any, arrays: list[Any], values: list[Any]) -> tuple[np.ndarray, list]:
    """Which of ``arrays`` hold NaN or infinity, and the entries of ``values``, in one launch
    (a launch per :data:`GROUP` entries beyond that) and one device-to-host transfer.

    Parameters
    ----------
    xp : module
        The arrays' module: ``cupy`` or the strict stand-in.
    arrays : list of float array
        Float32 or float64 arrays of any shape.
    values : list of array
        Small float32, float64, int32 or bool arrays.

    Returns
    -------
    tuple
        ``(not_finite, read)``: a bool ``numpy.ndarray`` (len(arrays),), and per value its
        entries as a float64 ``numpy.ndarray`` (exact: every such value is a double).
    """
    name = backend_name(xp)
    if name not in ("cupy", "strict"):
        raise ValueError(f"the deferred read runs on a device backend, not {name!r}")
    array_types = [_c_type(a, _ARRAY_TYPES, "arrays") for a in arrays]
    value_types = [_c_type(v, _VALUE_TYPES, "values") for v in values]
    blocks = [max(1, -(-a.size // CHUNK)) for a in arrays]
    sizes = [v.size for v in values]
    out = xp.empty(sum(blocks) + sum(sizes), dtype=xp.float64)  # every entry written
    flags, read = out[: sum(blocks)], out[sum(blocks) :]
    entries = [("a", k) for k in range(len(arrays))] + [("v", j) for j in range(len(values))]
    for first in range(0, len(entries), GROUP):
        group = entries[first : first + GROUP]
        ks = [k for kind, k in group if kind == "a"]
        js = [j for kind, j in group if kind == "v"]
        block0 = sum(blocks[: ks[0]]) if ks else sum(blocks)
        value0 = sum(sizes[: js[0]]) if js else sum(sizes)
        group_flags = flags[block0 : block0 + sum(blocks[k] for k in ks)]
        group_read = read[value0 : value0 + sum(sizes[j] for j in js)]
        group_arrays = [arrays[k] for k in ks]
        group_values = [values[j] for j in js]
        if name == "strict":
            xp.run_kernel(finite_read_twin, group_arrays, group_values, group_flags, group_read)
            continue
        kernel = _kernel(
            tuple(array_types[k] for k in ks), tuple((value_types[j], sizes[j]) for j in js)
        )
        arguments = []
        for k in ks:
            arguments += [xp.ascontiguousarray(arrays[k]), np.int64(arrays[k].size)]
        arguments += [xp.ascontiguousarray(v) for v in group_values]
        kernel(
            (max(1, sum(blocks[k] for k in ks)),), (BLOCK,), (*arguments, group_flags, group_read)
        )
    host = out.get()  # the one sync
    starts = np.cumsum([0, *blocks])
    not_finite = np.array([host[s:e].any() for s, e in itertools.pairwise(starts)], bool)
    offsets = np.cumsum([sum(blocks), *sizes])
    return not_finite, [host[s:e] for s, e in itertools.pairwise(offsets)]
