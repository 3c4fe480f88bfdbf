"""Softmax cross-entropy over selected rows as one device kernel each way, beside NumPy twins.

:class:`refimpl.ops.losses.SoftmaxCrossEntropy` makes each step one array operation, a
device launch each (13 forward, 8 backward on the 140 training rows of Cora). These kernels
make the same operations on each entry, in the same order and in the logits' dtype:

    forward   C1  top = max of the row (exact in any order)
              C2  e_j = exp(z_j - top), kept in ``probs`` for the sum
              C3  log_norm = log(sum_j e_j)           (NumPy's pairwise order)
              C4  lp_j = (z_j - top) - log_norm,  probs_j = exp(lp_j),  picked = lp_label
              C5  term = weight * -picked
              C6  loss = sum over the selected rows of term   (NumPy's pairwise order)
    backward  D0  the row's place among the selected rows (bisection in the sorted ``rows``)
              D1  d_picked = -(d_loss * weight)
              D2  d_z_j = (j == label ? d_picked : 0) - probs_j * (d_picked + 0)

The sums C3 and C6 follow NumPy's ``add.reduce`` of a contiguous run (``pairwise_sum`` in
NumPy's ``loops_utils.h``: fewer than 8 terms one by one from 0, up to 128 in eight strided
partial sums joined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))`` and the rest one
by one, more split in two at a multiple of 8; the whole added to the output's 0), a
fixed-shape tree. C6 is one thread's, after the block's threads have written every row's
term (``__syncthreads``): the mean is bitwise the literal path's, and no atomic is used. The
literal path's label pick and its backward's row sum add one value to zeros, which is exact,
and are written out as such: ``lp_label`` itself (never -0: a -0 shift needs a +0 maximum
beside it, so ``log_norm > 0``), and ``d_picked + 0`` (-0 becomes +0, as in the sum from 0).

:func:`cross_entropy_forward_twin` and :func:`cross_entropy_backward_twin` are the twins
(NumPy in the kernels' order, so bitwise the literal loss on the host, ties, K = 1 and
overflowing logits included: ``tests/kernels/test_cross_entropy.py``); the strict stand-in
runs each as one launch (``strict.run_kernel``). On a device the kernels call CUDA's ``exp``
and ``log``, not NumPy's: there the forward agrees with the literal path to those functions'
rounding, not bitwise; the backward makes only its own arithmetic on the softmax it is given.
``tests/kernels/test_cross_entropy_host_build.py`` builds :data:`SOURCE` for the host with a
C++ compiler and runs it thread by thread. Compiled with ``--fmad=false``; no atomics.

The forward runs as ONE block (its threads stride over the selected rows, then one thread
sums): a training split's rows are few, and a single block needs no grid-wide wait.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from refimpl.backend import backend_name, is_array

__all__ = ["SOURCE", "cross_entropy_backward", "cross_entropy_backward_twin",
           "cross_entropy_forward", "cross_entropy_forward_twin", "cuda_sources",
           "pairwise_sum_twin"]  # fmt: skip

BLOCK = 256  # threads per block: the forward's one block, the backward's one row each

SOURCE = r"""
typedef REFIMPL_T T;  // float or double, one module per dtype

// a[0] + a[stride] + ... + a[(n - 1) stride] in the order of NumPy's pairwise_sum
__device__ T pairwise_sum(const T* a, const long long n, const long long stride) {
    if (n < 8) {
        T res = (T)0;
        for (long long i = 0; i < n; ++i) res = res + a[i * stride];
        return res;
    }
    if (n <= 128) {
        T r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j * stride];
        long long i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; ++j) r[j] = r[j] + a[(i + j) * stride];
        T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res = res + a[i * stride];
        return res;
    }
    long long half = n / 2;
    half -= half % 8;
    return pairwise_sum(a, half, stride) + pairwise_sum(a + half * stride, n - half, stride);
}

// NumPy's add.reduce: its output starts at 0 and gets the pairwise sum added (-0 becomes +0)
__device__ T reduce_sum(const T* a, const long long n, const long long stride) {
    return (T)0 + pairwise_sum(a, n, stride);
}

extern "C" __global__ void refimpl_cross_entropy_forward(
        const T* logits, const long long* rows, const bool* one_hot, const T* weight,
        const long long num_selected, const long long k, T* probs, T* terms, T* loss) {
    for (long long m = threadIdx.x; m < num_selected; m += blockDim.x) {
        const T* z = logits + rows[m] * k;
        T* p = probs + m * k;
        T top = z[0];  // C1
        for (long long j = 1; j < k; ++j) top = z[j] > top ? z[j] : top;
        for (long long j = 0; j < k; ++j) p[j] = exp(z[j] - top);  // C2
        const T log_norm = log(reduce_sum(p, k, 1));  // C3
        T picked = (T)0;
        for (long long j = 0; j < k; ++j) {  // C4
            const T lp = (z[j] - top) - log_norm;
            p[j] = exp(lp);
            if (one_hot[m * k + j]) picked = lp;
        }
        terms[m] = weight[m] * -picked;  // C5
    }
    __syncthreads();
    if (threadIdx.x == 0) loss[0] = reduce_sum(terms, num_selected, 1);  // C6
}

extern "C" __global__ void refimpl_cross_entropy_backward(
        const T* probs, const bool* one_hot, const T* weight, const long long* rows,
        const T* d_loss_array, const T d_loss_value, const bool from_array,
        const long long num_selected, const long long num_rows, const long long k,
        T* d_logits) {
    const long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (n >= num_rows) return;
    T* d = d_logits + n * k;
    long long lo = 0, hi = num_selected;  // D0 the first selected row >= n
    while (lo < hi) {
        const long long mid = lo + (hi - lo) / 2;
        if (rows[mid] < n) lo = mid + 1; else hi = mid;
    }
    if (lo == num_selected || rows[lo] != n) {  // not selected: gradient 0
        for (long long j = 0; j < k; ++j) d[j] = (T)0;
        return;
    }
    const T d_loss = from_array ? d_loss_array[0] : d_loss_value;  // a 0-d array or a number
    const T d_picked = -(d_loss * weight[lo]);  // D1
    const T total = d_picked + (T)0;  // the literal row sum of d_picked and zeros
    for (long long j = 0; j < k; ++j) {  // D2
        d[j] = (one_hot[lo * k + j] ? d_picked : (T)0) - probs[lo * k + j] * total;
    }
}
"""

_C_TYPES = {"float32": "float", "float64": "double"}


def cuda_sources() -> dict[str, str]:
    """:data:`SOURCE` once per dtype, by name (what CuPy compiles, and the PTX test)."""
    return {
        f"cross_entropy_{name}": f"#define REFIMPL_T {c}\n{SOURCE}" for name, c in _C_TYPES.items()
    }


def pairwise_sum_twin(a: np.ndarray) -> np.ndarray:
    """The sum over the last axis in the order of the kernels' ``reduce_sum`` (NumPy's own
    ``add.reduce`` of a contiguous run: 0 plus the pairwise sum), written out over the
    leading axes at once.

    Parameters
    ----------
    a : float array (*S, n)
        The terms; their dtype is every addition's.

    Returns
    -------
    array (*S,)
        The sums, +0 where ``n = 0`` or every term is -0.
    """
    return np.zeros(a.shape[:-1], dtype=a.dtype) + _pairwise(a)


def _pairwise(a: np.ndarray) -> np.ndarray:
    """The kernels' ``pairwise_sum`` over the last axis of ``a`` (NumPy's ``pairwise_sum``)."""
    n = a.shape[-1]
    if n < 8:
        total = np.zeros(a.shape[:-1], dtype=a.dtype)
        for i in range(n):
            total = total + a[..., i]
        return total
    if n <= 128:
        r = [a[..., j] for j in range(8)]
        whole = n - n % 8
        for i in range(8, whole, 8):
            r = [r[j] + a[..., i + j] for j in range(8)]
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(whole, n):
            total = total + a[..., i]
        return total
    half = n // 2 - (n // 2) % 8
    return _pairwise(a[..., :half]) + _pairwise(a[..., half:])


def cross_entropy_forward_twin(
    logits: np.ndarray, rows: np.ndarray, one_hot: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """C1-C6 on NumPy, in the forward kernel's order.

    Parameters
    ----------
    logits : float array (N, K)
        All rows' logits; only ``rows`` are read.
    rows : int array (M,)
        The selected rows, ascending (``RowSelection.rows``), M >= 1.
    one_hot : bool array (M, K)
        Each selected row's label, exactly one True per row.
    weight : float array (M,)
        ``1 / M`` in the logits' dtype.

    Returns
    -------
    tuple of array
        ``(loss, probs)``: 0-d, and ``(M, K)`` the selected rows' softmax.
    """
    z = logits[rows]  # (M, K)
    with np.errstate(over="ignore"):  # z - top may overflow to -inf: its exp is 0, as there
        shifted = z - z.max(axis=1, keepdims=True)  # C1
        log_norm = np.log(pairwise_sum_twin(np.exp(shifted)))[:, None]  # C2-C3 (M, 1)
        log_probs = shifted - log_norm  # C4
    picked = log_probs[one_hot]  # (M,): one label per row, in row order
    loss = pairwise_sum_twin(weight * -picked)  # C5-C6
    return np.asarray(loss), np.exp(log_probs)


def cross_entropy_backward_twin(
    probs: np.ndarray,
    one_hot: np.ndarray,
    weight: np.ndarray,
    rows: np.ndarray,
    d_loss: Any,
    num_rows: int,
) -> np.ndarray:
    """D0-D2 on NumPy, in the backward kernel's order.

    Parameters
    ----------
    probs : float array (M, K)
        The forward's softmax of the selected rows.
    one_hot : bool array (M, K)
        Their labels.
    weight : float array (M,)
        ``1 / M`` in the logits' dtype.
    rows : int array (M,)
        The selected rows, ascending.
    d_loss : float or 0-d float array
        The loss's cotangent (checked).
    num_rows : int
        ``N``, the logits' rows.

    Returns
    -------
    array (N, K)
        ``d_logits``, 0 outside ``rows``.
    """
    every = np.arange(num_rows)
    place = np.searchsorted(rows, every)  # D0, the kernel's bisection
    found = place < rows.shape[0]
    found[found] = rows[place[found]] == every[found]
    d_picked = -(d_loss * weight)  # D1 (M,)
    zero = probs.dtype.type(0)
    total = d_picked + zero  # the literal row sum of d_picked and zeros
    d_selected = np.where(one_hot, d_picked[:, None], zero) - probs * total[:, None]  # D2
    d_logits = np.zeros((num_rows, probs.shape[1]), dtype=d_selected.dtype)
    d_logits[found] = d_selected[place[found]]
    return d_logits


@functools.cache
def _module(dtype_name: str) -> Any:
    if dtype_name not in _C_TYPES:
        raise TypeError(
            f"the fused cross-entropy kernels take float32 or float64 logits, got {dtype_name}; "
            "cast the logits, or compute the loss outside fused_kernels()"
        )
    import cupy

    source = cuda_sources()[f"cross_entropy_{dtype_name}"]
    return cupy.RawModule(code=source, options=("--fmad=false",))


def cross_entropy_forward(
    xp: Any, logits: Any, rows: Any, one_hot: Any, weight: Any
) -> tuple[Any, Any]:
    """C1-C6 in one launch on a device backend (CuPy's kernel, or the twin on the strict
    stand-in): ``(loss, probs)``, as :func:`cross_entropy_forward_twin` describes.

    Parameters
    ----------
    xp : module
        The arrays' module (CuPy or the strict stand-in).
    logits : float array (N, K)
        All rows' logits.
    rows : int array (M,)
        The selected rows, ascending, M >= 1.
    one_hot : bool array (M, K)
        Their labels.
    weight : float array (M,)
        ``1 / M`` in the logits' dtype.
    """
    if backend_name(xp) == "strict":
        return xp.run_kernel(cross_entropy_forward_twin, logits, rows, one_hot, weight)
    logits, one_hot = xp.ascontiguousarray(logits), xp.ascontiguousarray(one_hot)
    rows, weight = xp.ascontiguousarray(rows, dtype=np.int64), xp.ascontiguousarray(weight)
    num_selected, k = one_hot.shape
    probs = xp.empty((num_selected, k), dtype=logits.dtype)
    terms = xp.empty(num_selected, dtype=logits.dtype)
    loss = xp.empty((), dtype=logits.dtype)
    kernel = _module(np.dtype(logits.dtype).name).get_function("refimpl_cross_entropy_forward")
    kernel((1,), (BLOCK,), (logits, rows, one_hot, weight, np.int64(num_selected),
                            np.int64(k), probs, terms, loss))  # fmt: skip
    return loss, probs


def cross_entropy_backward(
    xp: Any, probs: Any, one_hot: Any, weight: Any, rows: Any, d_loss: Any, num_rows: int
) -> Any:
    """D0-D2 in one launch on a device backend: ``d_logits`` (N, K), as
    :func:`cross_entropy_backward_twin` describes.

    Parameters
    ----------
    xp : module
        The arrays' module (CuPy or the strict stand-in).
    probs : float array (M, K)
        The forward's softmax of the selected rows.
    one_hot : bool array (M, K)
        Their labels.
    weight : float array (M,)
        ``1 / M`` in the logits' dtype.
    rows : int array (M,)
        The selected rows, ascending.
    d_loss : float or 0-d float array
        The loss's cotangent (checked).
    num_rows : int
        ``N``.
    """
    if backend_name(xp) == "strict":
        return xp.run_kernel(
            cross_entropy_backward_twin, probs, one_hot, weight, rows, d_loss, num_rows
        )
    probs, one_hot = xp.ascontiguousarray(probs), xp.ascontiguousarray(one_hot)
    rows, weight = xp.ascontiguousarray(rows, dtype=np.int64), xp.ascontiguousarray(weight)
    num_selected, k = probs.shape
    d_logits = xp.empty((num_rows, k), dtype=probs.dtype)
    if num_rows > 0:
        kernel = _module(np.dtype(probs.dtype).name).get_function("refimpl_cross_entropy_backward")
        blocks = (num_rows + BLOCK - 1) // BLOCK
        # a 0-d device array is read there (no sync); a number is passed by value, and
        # probs stands in for the pointer then, never read
        from_array = is_array(d_loss)
        value = probs.dtype.type(0 if from_array else d_loss)
        kernel((blocks,), (BLOCK,), (probs, one_hot, weight, rows,
                                     d_loss if from_array else probs, value,
                                     np.bool_(from_array), np.int64(num_selected),
                                     np.int64(num_rows), np.int64(k), d_logits))  # fmt: skip
    return d_logits
