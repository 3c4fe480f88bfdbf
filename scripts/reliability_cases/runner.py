"""Running a surface's cases in child processes, so that a case that kills its process is
counted (a crash) and the cases after it still run.

The parent starts ``scripts/reliability.py --worker SURFACE --start I``; the worker writes
one JSON line per case to a results file, ``{"begin": name}`` before the case and
``{"name", "outcome", "detail"}`` after it, flushed each time. When the worker dies (a
signal, ``os.abort()``, a segfault in C code) or stops answering, the case it had begun is
a crash and a new worker starts at the case after it. The cases are made in the same
order by every worker (seeded: the same inputs every run).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reliability_cases.outcomes import CRASH, Case, Hung, Result, classify

ENTRY = Path(__file__).resolve().parents[1] / "reliability.py"
REPO = ENTRY.parents[1]
CASE_TIMEOUT = 180.0  # seconds a worker may spend on one case before it counts as hung
MEMORY_LIMIT = 4 << 30  # bytes of address space per worker: a forged size fails, not the host
POLL = 0.02  # seconds between looks at a worker's results


def child_env() -> dict[str, str]:
    """The environment of workers and of the commands they run: this tree's refimpl, one
    BLAS thread (cases run two at a time on two cores), no progress bars' colours."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env.pop("REFIMPL_DEBUG", None)  # tracebacks on purpose would read as failures
    return env


def run_worker(
    cases: list[Case], start: int, count: int | None, results: Path, limit: float | None
) -> None:
    """The worker's side: classify ``count`` cases (or all) from ``start`` in turn, writing
    each as it goes; a case still running after ``limit`` seconds is stopped as hung."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    def stop(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {limit:g} s")

    signal.signal(signal.SIGALRM, stop)
    with open(results, "a", encoding="utf-8") as stream:
        for case in cases[start : None if count is None else start + count]:
            stream.write(json.dumps({"begin": case.name}) + "\n")
            stream.flush()
            if limit:
                signal.setitimer(signal.ITIMER_REAL, limit)
            result = classify(case)
            signal.setitimer(signal.ITIMER_REAL, 0)
            record = {"name": case.name, "outcome": result.outcome, "detail": result.detail}
            stream.write(json.dumps(record) + "\n")
            stream.flush()


def _read(results: Path) -> tuple[list[tuple[str, Result]], str | None]:
    """Finished cases, and the name of a case begun and not finished (or None)."""
    done, begun = [], None
    for line in results.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the worker's death
            continue
        if "begin" in record:
            begun = record["begin"]
        else:
            done.append((record["name"], Result(record["outcome"], record["detail"])))
            begun = None
    return done, begun


def run_surface(
    surface: str, options: list[str], total: int, report: Callable[[str], None] = print
) -> list[tuple[str, Result]]:
    """Every case of ``surface`` (``total`` of them), in workers; ``options`` are passed
    to each worker (``--quick``, ``--case``).

    A case a worker died in is run again alone in a fresh worker: an earlier case of the
    same process may have corrupted memory (a CSR index out of bounds written by SciPy's C
    code) and the death shows up later. A case that passes alone gets its own outcome, and
    the note says so; the earlier case was accepted, so it is a failure of its own.
    """
    results: list[tuple[str, Result]] = []
    with tempfile.TemporaryDirectory(prefix="reliability-") as scratch:
        while len(results) < total:
            done, begun, why = _worker(surface, options, len(results), None, Path(scratch))
            results += done
            if begun is None:
                continue
            alone, _, why_alone = _worker(surface, options, len(results), 1, Path(scratch))
            if alone:
                results += alone
                report(f"  {surface}: {begun}: {why} after other cases, not alone")
            else:
                results.append((begun, Result(CRASH, why_alone)))
                report(f"  {surface}: {begun}: {why_alone}")
    return results


def _worker(
    surface: str, options: list[str], start: int, count: int | None, scratch: Path
) -> tuple[list[tuple[str, Result]], str | None, str]:
    """One worker from case ``start`` (``count`` cases, or to the end): the cases it
    finished, the one it died or hung in (or None), and how it ended."""
    path = scratch / f"results-{start}-{count}.jsonl"
    path.write_text("")
    command = [
        sys.executable,
        str(ENTRY),
        "--worker",
        surface,
        "--start",
        str(start),
        "--results",
        str(path),
        *options,
    ]
    if count is not None:
        command += ["--count", str(count)]
    log = scratch / "worker.log"
    with open(log, "wb") as stderr:
        worker = subprocess.Popen(
            command,
            cwd=scratch,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        returncode, hung = _wait(worker, path)
    done, begun = _read(path)
    if begun is None and (returncode != 0 or not done):
        text = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the {surface} worker failed outside its cases:\n{text}")
    why = "hung" if hung else f"worker died (exit {returncode})"
    if returncode is not None and returncode < 0:
        why = f"killed by signal {-returncode} ({signal.Signals(-returncode).name})"
    return done, begun, why


def _wait(worker: subprocess.Popen, path: Path) -> tuple[int | None, bool]:
    """Wait for ``worker`` to end; kill it (its process group) when a case takes longer
    than :data:`CASE_TIMEOUT`. Returns its exit status and whether it hung."""
    size, since = -1, time.monotonic()
    while worker.poll() is None:
        current = path.stat().st_size
        if current != size:
            size, since = current, time.monotonic()
        elif time.monotonic() - since > CASE_TIMEOUT:
            os.killpg(worker.pid, signal.SIGKILL)  # the worker and the commands it started
            worker.wait()
            return worker.returncode, True
        time.sleep(POLL)
    return worker.returncode, False
