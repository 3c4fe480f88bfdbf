"""The multi-tensor Adam kernel's CUDA source itself, built for the host and run thread by
thread, against its twin (:func:`refimpl.kernels.adam.adam_twin`).

Without a GPU the twin is what CI runs; the twin loops over the parameters one by one, so it
cannot show that the kernel's threads find their parameter and entry (F1: entry ``i`` of
the parameters laid end to end). This builds :func:`refimpl.kernels.adam.cuda_source` with
``g++`` (the CUDA qualifiers become nothing, ``atomicOr`` a plain OR: one thread at a time),
launches it over every thread of every block, the threads past the last entry included, and
holds each output bitwise to the twin's: the update is IEEE arithmetic and ``sqrt``
(``-ffp-contract=off``, as ``--fmad=false``), which the host and NumPy round alike.
Skips without ``g++``.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from refimpl.kernels.adam import BLOCK, AdamScalars, adam_twin, cuda_source
from tests.kernels.host_build import build

SHIM = """
#include <cmath>
using std::isfinite;
using std::sqrt;
struct Index { unsigned x; };
static Index threadIdx, blockIdx, blockDim;
#define __device__
#define __global__
#define __forceinline__ inline
static int atomicOr(int* address, int value) { int old = *address; *address |= value; return old; }
extern "C" void refimpl_set_thread(unsigned block, unsigned thread, unsigned threads) {
    blockIdx.x = block; threadIdx.x = thread; blockDim.x = threads;
}
"""
C_TYPES = {
    np.dtype(np.float32): ("float", ctypes.c_float),
    np.dtype(np.float64): ("double", ctypes.c_double),
}
COUNT = 3  # parameters per launch in the built kernel


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernel's source cannot be built on the CPU")
    folder = tmp_path_factory.mktemp("adam_host")
    sources = {dtype: (f"adam_{c}", cuda_source(c, COUNT)) for dtype, (c, _) in C_TYPES.items()}
    return {dtype: build(folder, stem, SHIM, source) for dtype, (stem, source) in sources.items()}


def launch(library: ctypes.CDLL, dtype: np.dtype, arrays: list, scalars: AdamScalars) -> tuple:
    """Every thread of the launch ``fused_adam_step`` makes: ``(w_news, ms, vs, flag)``."""
    scalar = C_TYPES[dtype][1]
    outputs = [[np.full_like(w, -7.0) for w in arrays[0]] for _ in range(3)]  # all overwritten
    flag = np.zeros(1, np.int32)
    values = [scalar(v) for v in scalars[:8]] + [ctypes.c_int(int(v)) for v in scalars[8:]]
    values.append(flag.ctypes.data_as(ctypes.c_void_p))
    for k in range(COUNT):
        pointers = [a[k] for a in arrays] + [o[k] for o in outputs]
        values += [p.ctypes.data_as(ctypes.c_void_p) for p in pointers]
        values.append(ctypes.c_longlong(arrays[0][k].size))
    total = sum(w.size for w in arrays[0])
    for block in range(max(1, -(-total // BLOCK))):
        for thread in range(BLOCK):
            library.refimpl_set_thread(block, thread, BLOCK)
            library.refimpl_adam(*values)
    return (*outputs, flag)


@pytest.mark.parametrize("dtype", list(C_TYPES))
@pytest.mark.parametrize(
    "sizes", [(5, 0, 7), (BLOCK + 1, 1, 2), (0, 0, 1), (3, BLOCK - 3, BLOCK)], ids=str
)
@pytest.mark.parametrize("decayed", [False, True])
@pytest.mark.parametrize("poison", [None, "grad", "overflow"])
def test_the_built_kernel_is_the_twin_bit_for_bit(built, dtype, sizes, decayed, poison):
    rng = np.random.default_rng(sum(sizes) + decayed)
    arrays = [
        [(rng.normal(size=n) * 10.0 ** rng.integers(-3, 3)).astype(dtype) for n in sizes]
        for _ in range(3)
    ]
    arrays.append([np.abs(rng.normal(size=n)).astype(dtype) for n in sizes])  # v >= 0
    neg_step = -5e-3
    if poison == "grad":
        arrays[1][-1][-1] = np.nan  # the last entry of the last parameter: S6 and S7
    if poison == "overflow":  # S6 from finite inputs: the step times a large moment
        neg_step, arrays[2][-1][-1] = -float(np.finfo(dtype).max), 1e10
    scalars = AdamScalars(5e-4, 0.1, 0.9, 0.999, 1e-3, 0.03, 1e-8, neg_step, decayed, True)
    *got, got_flag = launch(built[dtype], dtype, arrays, scalars)
    twin_flag = np.zeros(1, np.int32)
    expected = adam_twin(*arrays, *scalars, twin_flag)
    for slot, (got_arrays, expected_arrays) in enumerate(zip(got, expected, strict=True)):
        for k, (g, e) in enumerate(zip(got_arrays, expected_arrays, strict=True)):
            np.testing.assert_array_equal(g, e, err_msg=f"output {slot}, parameter {k}")
    assert int(got_flag[0]) == int(twin_flag[0])
    assert int(twin_flag[0]) & 1 == (poison is not None)  # the flag is exercised both ways


def test_a_kernel_that_misplaces_an_entry_is_caught(built, tmp_path):
    # The comparison must be able to fail: a source whose first parameter's threads write
    # the second's outputs (equal sizes, so no write leaves its array) differs from the twin.
    dtype, sizes = np.dtype(np.float64), (5, 5, 2)
    rng = np.random.default_rng(1)
    arrays = [[rng.normal(size=n) for n in sizes] for _ in range(3)]
    arrays.append([np.abs(rng.normal(size=n)) for n in sizes])
    scalars = AdamScalars(0.0, 0.1, 0.9, 0.999, 1e-3, 0.03, 1e-8, -5e-3, False, True)
    source = cuda_source("double", COUNT)
    assert source.count("w_new0[i]") == 1
    misplaced = build(tmp_path, "misplaced", SHIM, source.replace("w_new0[i]", "w_new1[i]"))
    expected = adam_twin(*arrays, *scalars, np.zeros(1, np.int32))[0]
    right = launch(built[dtype], dtype, arrays, scalars)[0]
    wrong = launch(misplaced, dtype, arrays, scalars)[0]
    np.testing.assert_array_equal(right[0], expected[0])
    assert not np.array_equal(wrong[0], expected[0])


def as_ctypes(argument: object) -> object:
    """A kernel argument as CuPy hands it to the device: an array's pointer, a NumPy scalar's
    C value (the exact C type, as CuPy maps it); anything else is refused."""
    if isinstance(argument, np.ndarray):
        return argument.ctypes.data_as(ctypes.c_void_p)
    types = {np.float32: ctypes.c_float, np.float64: ctypes.c_double,
             np.int32: ctypes.c_int, np.int64: ctypes.c_longlong}  # fmt: skip
    assert type(argument) in types, f"a kernel argument of type {type(argument).__name__}"
    return types[type(argument)](argument)


@pytest.mark.parametrize("dtype", list(C_TYPES))
def test_the_launcher_hands_the_built_kernel_what_it_declares(built, dtype, monkeypatch):
    # The launcher (_launch: the arguments' order, each parameter's size, the grid) runs on
    # CuPy only, so no CPU test ran it: a mutant that kept only the last parameter's
    # arguments, or that made the grid a float, survived. Here it runs with NumPy arrays
    # and the host-built kernel standing in for CuPy's, over every thread of its grid, and
    # must give the twin's update bit for bit.
    from refimpl.kernels import adam

    library, c_type = built[dtype], C_TYPES[dtype][0]

    def kernel(grid: tuple, block: tuple, arguments: tuple) -> None:
        assert all(type(n) is int and n > 0 for n in (*grid, *block)), (grid, block)
        assert len(arguments) == 11 + 8 * COUNT  # the scalars, the flag, 8 per parameter
        values = [as_ctypes(argument) for argument in arguments]
        for b in range(grid[0]):
            for t in range(block[0]):
                library.refimpl_set_thread(b, t, block[0])
                library.refimpl_adam(*values)

    monkeypatch.setattr(
        adam, "_kernel", lambda c, count: kernel if (c, count) == (c_type, COUNT) else None
    )
    rng = np.random.default_rng(5)
    sizes = (BLOCK + 3, 0, 7)
    arrays = [[rng.normal(size=n).astype(dtype) for n in sizes] for _ in range(3)]
    arrays.append([np.abs(rng.normal(size=n)).astype(dtype) for n in sizes])
    scalars = AdamScalars(5e-4, 0.1, 0.9, 0.999, 1e-3, 0.03, 1e-8, -5e-3, True, True)
    flag, twin_flag = np.zeros(1, np.int32), np.zeros(1, np.int32)
    got = adam._launch(np, c_type, arrays, scalars, flag)
    expected = adam_twin(*arrays, *scalars, twin_flag)
    for slot, (got_arrays, expected_arrays) in enumerate(zip(got, expected, strict=True)):
        for k, (g, e) in enumerate(zip(got_arrays, expected_arrays, strict=True)):
            np.testing.assert_array_equal(g, e, err_msg=f"output {slot}, parameter {k}")
    assert int(flag[0]) == int(twin_flag[0]) == 2  # every parameter changed, none overflowed
