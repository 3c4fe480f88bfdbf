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
  is written, once. Every wait is bounded: a scheduler left without workers for
  ``worker_timeout`` seconds, a job that killed every worker it ran on, or a lost
  connection to the scheduler ends the grid in one line, the finished jobs kept.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as futures_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from refimpl.files import atomic_write
from refimpl.train.run_folder import read_json

__all__ = ["SchedulerUnavailable", "WorkerLost", "dask_client", "run_jobs"]


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CONNECT_SECONDS = 10  # how long a scheduler address is given to answer
# How long a grid waits on a scheduler that has no worker: Dask's own patience with a silent
# worker (its worker-ttl), long enough for a worker restarted by its nanny or a batch job's
# worker still starting, short against a grid's hours. ``--worker-timeout`` sets it.
WORKER_TIMEOUT_SECONDS = 300.0
CHECK_SECONDS = 1.0  # how often a waiting grid asks the scheduler for its workers


class SchedulerUnavailable(ConnectionError):
    """No Dask scheduler answered at the address given, or the connection to it was lost."""


class WorkerLost(OSError):
    """The grid's workers are gone: a worker process of the pool died, a job's worker died
    each time Dask ran the job (out of memory, say), or the scheduler had no worker left."""


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
    except Exception as err:  # whatever another service's reply makes of Dask
        # Another service on that port (a web server, ssh) answers with bytes Dask reads as a
        # frame length: a MemoryError for exabytes, or a struct error for a short frame.
        raise SchedulerUnavailable(
            f"the service at {scheduler} is not a Dask scheduler (its reply could not be read "
            f"as Dask's protocol: {type(err).__name__}); check the address and port (a "
            "scheduler listens on 8786 by default)"
        ) from err
    with client:
        yield client


def _completed(
    run_one: Callable[[dict], dict],
    todo: list[dict],
    workers: int,
    scheduler: str | None,
    worker_timeout: float,
) -> Iterator[dict]:
    """The results of ``todo``'s jobs as they end, wherever the jobs run (module docstring)."""
    if scheduler is not None:
        yield from _on_dask(run_one, todo, scheduler, worker_timeout)
        return
    if workers <= 1:
        for job in todo:
            yield run_one(job)
        return
    yield from _on_processes(run_one, todo, workers)


def _kept(done: int, total: int) -> str:
    """What a grid ended early keeps, and how to finish it."""
    return f"{done} of {total} jobs finished and are kept; rerun to finish the rest with --resume"


def _on_dask(
    run_one: Callable[[dict], dict], todo: list[dict], scheduler: str, worker_timeout: float
) -> Iterator[dict]:
    """``todo`` on the Dask ``scheduler``, results as the jobs end, every wait bounded.

    ``as_completed`` alone waits forever on a scheduler whose workers are gone (a
    ``LocalCluster`` whose nannies could not restart them, a cluster's batch jobs ended):
    the scheduler keeps the jobs queued for workers that never come. So the wait for the
    next result wakes every :data:`CHECK_SECONDS` to ask the scheduler for its workers, and
    :class:`WorkerLost` ends the grid once it has had none for ``worker_timeout`` seconds.
    A job that killed every worker it ran on (Dask's ``KilledWorker``) is a ``WorkerLost``
    too, and a lost connection to the scheduler (it cancels the jobs) a
    :class:`SchedulerUnavailable`.
    """
    with dask_client(scheduler) as client:
        from distributed import CancelledError, KilledWorker  # dask_client checked it is there

        finished: queue.SimpleQueue = queue.SimpleQueue()
        for future in client.map(_OneBlasThread(run_one), todo, pure=False):
            future.add_done_callback(finished.put)  # also on an error or a cancellation
        alone_since = None  # when the scheduler was first seen without a worker
        for done in range(len(todo)):
            while True:
                try:
                    future = finished.get(timeout=min(CHECK_SECONDS, worker_timeout))
                    break
                except queue.Empty:
                    alone_since = _check_workers(
                        client, scheduler, alone_since, worker_timeout, _kept(done, len(todo))
                    )
            try:
                yield future.result()
            except KilledWorker as err:
                raise WorkerLost(
                    f"a job's worker died each time it ran ({err}): look at the workers' "
                    f"memory and logs; {_kept(done, len(todo))}"
                ) from err
            except CancelledError as err:
                raise SchedulerUnavailable(
                    f"the Dask scheduler at {scheduler} cancelled the grid's jobs (the "
                    f"connection to it was lost, or it was shut down); {_kept(done, len(todo))}"
                ) from err


def _check_workers(
    client: Any, scheduler: str, alone_since: float | None, worker_timeout: float, kept: str
) -> float | None:
    """When the scheduler was first seen without a worker (None: it has one now), or
    :class:`WorkerLost` once that was ``worker_timeout`` seconds ago."""
    try:
        count = len(client.nthreads())  # {worker: threads}: small, in every Dask since 2023.1
    except OSError as err:  # the connection is gone: the jobs' cancellation follows
        raise SchedulerUnavailable(
            f"the Dask scheduler at {scheduler} stopped answering ({type(err).__name__}); {kept}"
        ) from err
    if count > 0:
        return None
    now = time.monotonic()
    if alone_since is None:
        return now
    if now - alone_since >= worker_timeout:
        raise WorkerLost(
            f"the Dask scheduler at {scheduler} has had no worker for {worker_timeout:g} s "
            f"(they died or were stopped, or never started; --worker-timeout sets the wait): "
            f"{kept}"
        )
    return alone_since


def _on_processes(run_one: Callable[[dict], dict], todo: list[dict], workers: int) -> Iterator:
    """``todo`` on a pool of ``workers`` spawned processes, results as the jobs end.

    A worker that dies (killed, out of memory) breaks the pool: the jobs in flight are lost
    with it and :class:`WorkerLost` ends the grid in one line, the finished jobs kept (a
    ``multiprocessing.Pool`` would wait forever for the lost job). On any exit other than
    the end of the grid (SIGTERM, Ctrl-C, an error), the workers are terminated: none is
    left training on after its parent is gone.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # exits through the finally
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context)
    finished = False
    try:
        with _one_blas_thread_for_children():  # the workers start at the first submit
            futures = [pool.submit(run_one, job) for job in todo]
        for done, future in enumerate(futures_completed(futures)):
            try:
                result = future.result()
            except BrokenProcessPool as err:
                raise WorkerLost(
                    "a worker process died (killed, or out of memory), and the jobs in flight "
                    f"with it: {_kept(done, len(todo))}"
                ) from err
            yield result
        finished = True
    finally:
        if not finished:
            pool.shutdown(wait=False, cancel_futures=True)
            for process in multiprocessing.active_children():
                process.terminate()
        pool.shutdown(wait=True)


def run_jobs(
    run_one: Callable[[dict], dict],
    jobs: list[dict],
    workers: int,
    describe: Callable[[dict], str],
    scheduler: str | None = None,
    worker_timeout: float = WORKER_TIMEOUT_SECONDS,
) -> list[dict]:
    """Run the jobs not finished before; return every job's result (earlier ones read back).

    ``run_one`` must be importable by a spawned process (a module-level function, or a
    ``functools.partial`` of one). ``describe(result)`` is the line printed as each run
    ends, after ``[done/total]`` and before its time and the time left at the pace so far.
    ``worker_timeout``: how many seconds a grid on ``scheduler`` waits while the scheduler
    has no worker before it ends in :class:`WorkerLost` (> 0).
    """
    if not worker_timeout > 0:  # also NaN
        raise ValueError(f"worker_timeout must be a number of seconds > 0, got {worker_timeout}")
    results: dict[str, dict] = {}  # by run_dir
    for job in jobs:
        earlier = _read_result(job)
        if earlier is not None:
            results[job["run_dir"]] = earlier
    todo = [job for job in jobs if job["run_dir"] not in results]
    where = f"scheduler {scheduler}" if scheduler else f"{workers} worker(s)"
    print(f"{len(jobs)} runs, {len(results)} done before, {len(todo)} to do, {where}", flush=True)
    started = last = time.perf_counter()
    for done, result in enumerate(
        _completed(run_one, todo, workers, scheduler, worker_timeout), start=1
    ):
        _write_result(result)
        results[result["run_dir"]] = result
        now = time.perf_counter()
        left = (now - started) / done * (len(todo) - done)
        eta = f"about {_duration(left)} left" if done < len(todo) else "the last"
        print(
            f"[{done}/{len(todo)}] {describe(result)} ({_duration(now - last)}; {eta})", flush=True
        )
        last = now
    return [results[job["run_dir"]] for job in jobs]


def _read_result(job: dict) -> dict | None:
    """The result a finished run of ``job`` left in its ``run_dir`` (None: not run yet), with
    ``run_dir`` where the job is now: a grid's folder may have moved since.

    A record that is not a result of this very job (another grid's, a damaged file) is a
    ``ValueError`` naming the file: reading it back would put another run in the table.
    """
    path = Path(job["run_dir"]) / "result.json"
    if not path.exists():
        return None
    record = read_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a run's result record; the run folder is damaged")
    as_read = json.loads(json.dumps(job))  # tuples as lists, as the record reads back
    differ = sorted(k for k in job if k != "run_dir" and record.get(k) != as_read[k])
    if differ:
        key = differ[0]
        raise ValueError(
            f"{path} is the result of another job ({key} {record.get(key)!r}, this grid's "
            f"{job[key]!r}): it belongs to another grid; move it away, or run this grid "
            "in another folder"
        )
    return {**record, "run_dir": job["run_dir"]}


def _write_result(result: dict) -> None:
    """``run_dir/result.json``, atomically: a kill leaves no torn record to be read back.

    The record leaves out ``run_dir``: the file's own folder is the run's, wherever the grid
    is moved (:func:`_read_result` puts it back)."""
    record = {k: v for k, v in result.items() if k != "run_dir"}
    data = json.dumps(record, indent=2).encode()
    atomic_write(Path(result["run_dir"], "result.json"), lambda stream: stream.write(data))


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
