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
    yield from _on_processes(run_one, todo, workers)


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
                    f"a worker process died (killed, or out of memory), and the jobs in flight "
                    f"with it: {done} of {len(todo)} jobs finished and are kept; rerun to "
                    "finish the rest"
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
) -> list[dict]:
    """Run the jobs not finished before; return every job's result (earlier ones read back).

    ``run_one`` must be importable by a spawned process (a module-level function, or a
    ``functools.partial`` of one). ``describe(result)`` is the line printed as each run
    ends, after ``[done/total]`` and before its time and the time left at the pace so far.
    """
    results: dict[str, dict] = {}  # by run_dir
    for job in jobs:
        earlier = _read_result(job)
        if earlier is not None:
            results[job["run_dir"]] = earlier
    todo = [job for job in jobs if job["run_dir"] not in results]
    where = f"scheduler {scheduler}" if scheduler else f"{workers} worker(s)"
    print(f"{len(jobs)} runs, {len(results)} done before, {len(todo)} to do, {where}", flush=True)
    started = last = time.perf_counter()
    for done, result in enumerate(_completed(run_one, todo, workers, scheduler), start=1):
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
