"""The cross-entropy kernels' CUDA source itself, built for the host with a C++ compiler and
run thread by thread, against the literal :class:`refimpl.ops.losses.SoftmaxCrossEntropy`.

Without a GPU the twins are what CI runs; this checks that the source does what the twins
do (its indexing, the bisection, the forward's one block striding over more rows than it has
threads, the pairwise sums). The CUDA qualifiers become nothing, ``__syncthreads`` too: the
forward's threads run one after another, thread 0 last, so its sum reads every row's term as
after the barrier. The host's ``exp`` and ``log`` are the C library's, not NumPy's, so the
forward is held within ``FORWARD_RTOL``, its mean of the rows' terms bitwise NumPy's sum of
them; the backward reads the literal softmax and makes
only the kernel's own arithmetic (``-ffp-contract=off``, as ``--fmad=false``): bitwise.
Skips without ``g++``.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from refimpl.kernels.cross_entropy import BLOCK, cuda_sources
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.testing.tolerances import FORWARD_RTOL

SHIM = """
#include <cmath>
using std::exp;
using std::log;
struct Index { long long x; };
static Index threadIdx, blockIdx, blockDim;
#define __device__
#define __global__
#define __syncthreads()
"""
RUNNERS = """
extern "C" void run_forward(const T* logits, const long long* rows, const bool* one_hot,
                            const T* weight, long long m, long long k, T* probs, T* terms,
                            T* loss, int block) {
    blockDim.x = block;
    blockIdx.x = 0;
    for (int t = block - 1; t >= 0; --t) {
        threadIdx.x = t;
        refimpl_cross_entropy_forward(logits, rows, one_hot, weight, m, k, probs, terms, loss);
    }
}
extern "C" void run_backward(const T* probs, const bool* one_hot, const T* weight,
                             const long long* rows, const T* d_array, T d_value, bool from_array,
                             long long m, long long n, long long k, T* d_logits, int block) {
    blockDim.x = block;
    for (long long b = 0; b * block < n; ++b) {
        for (int t = 0; t < block; ++t) {
            blockIdx.x = b;
            threadIdx.x = t;
            refimpl_cross_entropy_backward(probs, one_hot, weight, rows, d_array, d_value,
                                           from_array, m, n, k, d_logits);
        }
    }
}
"""
LOSS = SoftmaxCrossEntropy()


@pytest.fixture(scope="module")
def host_builds(tmp_path_factory) -> dict:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernels' source cannot be built for the host")
    folder = tmp_path_factory.mktemp("cross_entropy")
    builds = {}
    for dtype in (np.float32, np.float64):
        name = np.dtype(dtype).name
        path = folder / f"{name}.cpp"
        path.write_text(SHIM + cuda_sources()[f"cross_entropy_{name}"] + RUNNERS)
        library = path.with_suffix(".so")
        command = ["g++", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(library),
                   str(path)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        builds[dtype] = ctypes.CDLL(str(library))
    return builds


def pointer(array: np.ndarray) -> ctypes.c_void_p:
    return array.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("num_rows", "k", "fraction"),
    [(20, 1, 1.0), (2708, 7, 0.2), (700, 130, 1.0), (300, 9, 0.3), (300, 9, 0.01)],
)
def test_the_source_built_for_the_host_computes_the_literal_loss(
    host_builds, dtype, num_rows, k, fraction
):
    rng = np.random.default_rng(num_rows)
    logits = (rng.standard_normal((num_rows, k)) * 3).astype(dtype)
    logits[::2] = np.round(logits[::2])  # ties
    mask = rng.random(num_rows) < fraction
    mask[-1] = True
    labels = rng.integers(0, k, num_rows)
    selection = LOSS.select(labels, mask, k, dtype)
    loss, cache = LOSS.forward({}, logits, labels, selection)
    rows, one_hot, weight = selection.rows.astype(np.int64), selection.one_hot, selection.weight
    m, scalar = rows.size, np.ctypeslib.as_ctypes_type(dtype)
    library = host_builds[dtype]
    probs, terms, got_loss = np.empty((m, k), dtype), np.empty(m, dtype), np.empty((), dtype)
    library.run_forward(pointer(logits), pointer(rows), pointer(one_hot), pointer(weight),
                        ctypes.c_longlong(m), ctypes.c_longlong(k), pointer(probs),
                        pointer(terms), pointer(got_loss), ctypes.c_int(BLOCK))  # fmt: skip
    # the mean of the rows' terms is NumPy's sum of them, bit for bit (the order of C3's sum too:
    # one device function)
    assert got_loss.tobytes() == np.asarray(terms.sum()).tobytes()
    np.testing.assert_allclose(got_loss, loss, rtol=FORWARD_RTOL[np.dtype(dtype)])
    np.testing.assert_allclose(probs, cache.probs, rtol=FORWARD_RTOL[np.dtype(dtype)])
    for d_loss in (1.0, -0.25, 0.0):
        want, _ = LOSS.backward({}, cache, d_loss)
        as_array = np.array(d_loss, dtype)
        for from_array in (False, True):
            got = np.full((num_rows, k), np.nan, dtype)
            library.run_backward(pointer(cache.probs), pointer(one_hot), pointer(weight),
                                 pointer(rows), pointer(as_array), scalar(d_loss),
                                 ctypes.c_bool(from_array), ctypes.c_longlong(m),
                                 ctypes.c_longlong(num_rows), ctypes.c_longlong(k),
                                 pointer(got), ctypes.c_int(BLOCK))  # fmt: skip
            assert got.tobytes() == want.tobytes(), (d_loss, from_array)
