"""Independent training runs on one machine's cores or on a Dask cluster, resumable: what
``refimpl sweep`` and the reproduction scripts share.

Each job is a dict with a ``run_dir``; a finished run leaves ``run_dir/result.json``
(the job plus what ``run_one`` returned), written by this process as each job ends, and
is skipped on the next call, so the same command, rerun after an interruption, finishes
the grid (``run_one`` resumes its own checkpoint). Where the jobs run:

- one worker: here, one after another, with this process's threads;
- ``workers`` > 1: a pool of spawned processes (no inherited state) with one BLAS
  thread each: with one process per core, more threads only contend;
- ``scheduler``: Dask ``distributed`` (the ``cluster`` extra), either the address of a
  running scheduler (``tcp://host:8786``, started on a Slurm or cloud cluster) or
  ``"local:N"``, a ``LocalCluster`` of N single-threaded worker processes here. Each job
  runs with one BLAS thread (``threadpoolctl``). A worker that dies mid-job loses
  nothing: the scheduler runs its job again elsewhere, and only a finished job's result
  is written, once.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from refimpl.files import atomic_write

__all__ = ["SchedulerUnavailable", "WorkerLost", "dask_client", "run_jobs"]


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CONNECT_SECONDS = 10  # how long a scheduler address is given to answer


class SchedulerUnavailable(ConnectionError):
    """No Dask scheduler answered at the address given."""


class WorkerLost(OSError):
    """A job's worker died each time Dask ran the job (out of memory, say)."""


@contextlib.contextmanager
def _one_blas_thread_for_children() -> Iterator[None]:
    """Set one BLAS thread in the environment that spawned processes start with.

    BLAS reads these variables once, when NumPy is first imported, and a spawned
    worker imports NumPy before any ``Pool`` initializer runs (while re-importing
    the parent's main module). An initializer setting them is too late: each
    worker then runs one BLAS thread per core, and workers oversubscribe the
    cores. This process's own BLAS, loaded
    already, is unaffected; the variables are restored on exit.
    """
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARIABLES, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _OneBlasThread:
    """``run_one`` under a one-thread BLAS limit, for workers this process did not start
    (a cluster's): picklable, as Dask sends it to them."""

    def __init__(self, run_one: Callable[[dict], dict]) -> None:
        self.run_one = run_one

    def __call__(self, job: dict) -> dict:
        with threadpool_limits(limits=1, user_api="blas"):
            return self.run_one(job)


@contextlib.contextmanager
def dask_client(scheduler: str) -> Iterator[Any]:
    """A ``distributed.Client`` for ``scheduler``: ``"local:N"`` (a ``LocalCluster`` of N
    single-threaded worker processes, closed on exit) or a scheduler's address."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as err:
        raise ImportError(
            '--scheduler needs Dask distributed: pip install -e ".[cluster]"'
        ) from err
    if scheduler.startswith("local:"):
        count = scheduler.removeprefix("local:")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--scheduler local:N needs a number of workers N >= 1, got {count!r}")
        with _one_blas_thread_for_children():
            cluster = LocalCluster(
                n_workers=int(count), threads_per_worker=1, processes=True, dashboard_address=None
            )
        with cluster, Client(cluster) as client:
            yield client
        return
    try:
        client = Client(scheduler, timeout=f"{CONNECT_SECONDS}s")
    except (OSError, TimeoutError) as err:
        raise SchedulerUnavailable(
            f"no Dask scheduler answered at {scheduler} within {CONNECT_SECONDS} s: start one "
            "(dask scheduler) and its workers (dask worker ADDRESS), or run here with "
            "--scheduler local:N"
        ) from err
    with client:
        yield client


def _completed(
    run_one: Callable[[dict], dict], todo: list[dict], workers: int, scheduler: str | None
) -> Iterator[dict]:
    """The results of ``todo``'s jobs as they end, wherever the jobs run (module docstring)."""
    if scheduler is not None:
        with dask_client(scheduler) as client:
            from distributed import KilledWorker, as_completed  # dask_client checked it is there

            futures = client.map(_OneBlasThread(run_one), todo, pure=False)
            for future in as_completed(futures):
                try:
                    yield future.result()
                except KilledWorker as err:
                    raise WorkerLost(
                        f"a job's worker died each time it ran ({err}); the finished jobs are "
                        "kept: look at the workers' memory and logs, then rerun to resume"
                    ) from err
        return
    if workers <= 1:
        for job in todo:
            yield run_one(job)
        return
    # SIGTERM (kill) exits through the Pool's context manager, which terminates the
    # workers: none is left training on after its parent is gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = multiprocessing.get_context("spawn")
    with _one_blas_thread_for_children(), context.Pool(workers) as pool:
        yield from pool.imap_unordered(run_one, todo)


def run_jobs(
    run_one: Callable[[dict], dict],
    jobs: list[dict],
    workers: int,
    describe: Callable[[dict], str],
    scheduler: str | None = None,
) -> list[dict]:
    """Run the jobs not finished before; return every job's result (earlier ones read back).

    ``run_one`` must be importable by a spawned process (a module-level function, or a
    ``functools.partial`` of one). ``describe(result)`` is the line printed as each run
    ends, after ``[done/total]`` and before its time and the time left at the pace so far.
    """
    results, todo = [], []
    for job in jobs:
        summary = Path(job["run_dir"]) / "result.json"
        if summary.exists():
            results.append(json.loads(summary.read_text()))
        else:
            todo.append(job)
    where = f"scheduler {scheduler}" if scheduler else f"{workers} worker(s)"
    print(f"{len(jobs)} runs, {len(results)} done before, {len(todo)} to do, {where}", flush=True)
    started = last = time.perf_counter()
    for done, result in enumerate(_completed(run_one, todo, workers, scheduler), start=1):
        _write_result(result)
        results.append(result)
        now = time.perf_counter()
        left = (now - started) / done * (len(todo) - done)
        eta = f"about {_duration(left)} left" if done < len(todo) else "the last"
        print(
            f"[{done}/{len(todo)}] {describe(result)} ({_duration(now - last)}; {eta})", flush=True
        )
        last = now
    return results


def _write_result(result: dict) -> None:
    """``run_dir/result.json``, atomically: a kill leaves no torn record to be read back."""
    data = json.dumps(result, indent=2).encode()
    atomic_write(Path(result["run_dir"], "result.json"), lambda stream: stream.write(data))


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
