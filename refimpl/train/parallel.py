"""Independent training runs, one process per core, resumable: what the reproduction scripts share.

Each job is a dict with a ``run_dir``; a finished run leaves ``run_dir/result.json``
(the job plus what ``run_one`` returned) and is skipped on the next call, so the
same command, rerun after an interruption, finishes the grid (``run_one`` resumes
its own checkpoint). Workers are spawned (no inherited state) with one BLAS thread
each: with one process per core, more threads only contend.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["run_jobs"]


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


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


def run_jobs(
    run_one: Callable[[dict], dict],
    jobs: list[dict],
    workers: int,
    describe: Callable[[dict], str],
) -> list[dict]:
    """Run the jobs not finished before; return every job's result (earlier ones read back).

    ``run_one`` must be importable by a spawned process (a module-level function).
    ``describe(result)`` is the progress line printed as each run ends.
    """
    results, todo = [], []
    for job in jobs:
        summary = Path(job["run_dir"]) / "result.json"
        if summary.exists():
            results.append(json.loads(summary.read_text()))
        else:
            todo.append(job)
    print(f"{len(jobs)} runs, {len(results)} done before, {len(todo)} to do, {workers} workers")
    if not todo:
        return results
    # SIGTERM (kill) exits through the Pool's context manager, which terminates the
    # workers: none is left training on after its parent is gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = multiprocessing.get_context("spawn")
    with _one_blas_thread_for_children(), context.Pool(workers) as pool:
        for result in pool.imap_unordered(run_one, todo):
            Path(result["run_dir"], "result.json").write_text(json.dumps(result, indent=2))
            results.append(result)
            print(describe(result), flush=True)
    return results
