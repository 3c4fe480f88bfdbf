"""Host threads for row-block kernels: one pool per thread count, BLAS on one thread inside.

NumPy's ufuncs and BLAS calls and SciPy's sparse products release the GIL, so blocks of
rows of one computation can run on threads. Two kinds of work do:

* sparse times dense products (:mod:`refimpl.kernels.csr`), bound by memory latency;
* the kernelised attention's row blocks (:mod:`refimpl.nn.nodeformer.kernel_attention`), whose
  arrays stay in a core's cache and which mix elementwise steps with small GEMMs.

While blocks run, BLAS is held to one thread (``threadpoolctl``), for two reasons:

* speed: every block's GEMM would otherwise ask for the whole BLAS pool, and calls from
  several threads queue for it (the benchmark docs give the measured cost);
* rounding: OpenBLAS sums a product differently when more threads split it, so a
  block's result would depend on whether it ran alone (BLAS on two threads) or beside
  another (on one). On one thread too, then.

Callers fix their blocks independently of the thread count, each block is computed by
one thread, and partial results are combined in block order, so no result depends on
the thread count. A call made from inside a worker runs its blocks on that worker.
The BLAS limit is process-wide while a call runs: another thread's BLAS calls made
meanwhile run on one thread too, and two overlapping calls from two threads can end
each other's limit early (which changes speed and rounding, not correctness).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from refimpl.backend import backend_name

__all__ = ["DEVICE_BLOCK_BYTES", "map_blocks", "num_threads", "row_blocks", "sum_in_order"]

T = TypeVar("T")

_pools: dict[int, ThreadPoolExecutor] = {}
_worker = threading.local()  # .active is True on a pool thread while it runs a block
_controller: Any = None  # threadpoolctl.ThreadpoolController, made on first use

if hasattr(os, "register_at_fork"):  # a forked child has no worker threads: start afresh
    os.register_at_fork(after_in_child=_pools.clear)


def num_threads() -> int:
    """Threads for host kernels: ``REFIMPL_NUM_THREADS``, else ``OMP_NUM_THREADS`` (as the
    BLAS reads it), else the CPUs this process may run on."""
    for name in ("REFIMPL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_blocks(function: Callable[[int], T], count: int, threads: int | None = None) -> list[T]:
    """``[function(0), ..., function(count - 1)]``, on up to ``threads`` threads (default
    :func:`num_threads`), with BLAS on one thread while they run (on one thread too: a BLAS
    product's rounding can depend on how many threads split it). One block runs on the
    calling thread with BLAS as it is: whatever the thread count, it is computed the same
    way (and setting the BLAS thread limit, a call into every BLAS library, would
    dominate small products).

    Parameters
    ----------
    function : callable
        ``function(j)`` computes block ``j``; blocks may write only disjoint parts of a shared
        output.
    count : int
        The number of blocks, ``>= 0``.
    threads : int or None, default None
        The most threads; None takes :func:`num_threads`.

    Returns
    -------
    list
        The blocks' results, in block order.
    """
    if getattr(_worker, "active", False):  # nested: this thread is one of the pool's
        return [function(j) for j in range(count)]
    if count == 1:
        return [function(0)]
    threads = min(num_threads() if threads is None else threads, count)

    def run(j: int) -> T:
        _worker.active = True
        try:
            return function(j)
        finally:
            _worker.active = False

    with _blas_controller().limit(limits=1, user_api="blas"):
        if threads < 2:
            return [run(j) for j in range(count)]
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="refimpl")
        return list(pool.map(run, range(count)))


DEVICE_BLOCK_BYTES = 1 << 30  # a device block's intermediates: far below a GPU's memory


def row_blocks(xp: Any, n: int, size: int, row_bytes: int = 0) -> list[slice]:
    """Slices covering ``range(n)`` in order; none for ``n = 0``.

    On the host each holds ``size`` rows (the caller's, chosen to fit a core's cache). A
    device launches every step over all of a block's rows, so there a block is as large as
    memory allows: as many rows as keep ``row_bytes`` (the bytes of intermediates one row
    adds) within :data:`DEVICE_BLOCK_BYTES`, all ``n`` when ``row_bytes`` is 0.

    Parameters
    ----------
    xp : module
        The array module: ``numpy`` (the host) or a device backend's.
    n : int
        The number of rows.
    size : int
        Rows per block on the host, ``>= 1``.
    row_bytes : int, default 0
        On a device, the bytes of intermediates one row adds.

    Returns
    -------
    list of slice
        Consecutive slices covering ``range(n)``.
    """
    if backend_name(xp) != "numpy":
        size = max(DEVICE_BLOCK_BYTES // row_bytes, 1) if row_bytes > 0 else max(n, 1)
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def sum_in_order(parts: list[Any]) -> Any:
    """The sum of the blocks' partial results, added in block order (whatever thread made
    each), into a copy of the first: the rounding depends on the blocks, not the threads.

    Parameters
    ----------
    parts : list of array
        The blocks' partial results, of one shape, at least one.

    Returns
    -------
    array
        Their sum, a new array.
    """
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _blas_controller() -> Any:
    """The process's ``threadpoolctl`` controller, found once (finding the BLAS libraries
    walks the loaded shared objects)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller
