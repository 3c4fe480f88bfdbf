"""Helpers shared by the benchmark scripts: timing, child processes, peak memory (Linux).

- :func:`median_seconds`: the median wall time of a step after warm-up steps, with an
  optional ``sync`` (wait for a device) before and after each timed step.
- :func:`thread_env` and :func:`run_child`: run ``module.function(*args)`` of
  ``scripts/`` in a fresh interpreter with ``threads`` BLAS/OpenMP threads (so its
  peak memory and thread count are its own); the child prints its JSON result as the
  last line of its stdout. A child that fails raises :class:`ChildFailed`, which
  keeps the child's stderr.
- :func:`cpu_jiffies` and :func:`stolen_fraction`: the share of CPU time the hypervisor
  took from this (virtual) machine over a span, from ``/proc/stat`` (Linux): on a shared
  host, wall times swing with it; :func:`process_cpu_seconds`, this process's CPU time,
  which stolen time is not part of.
- :func:`machine`: what ran a benchmark (CPU model, cores, versions, load averages), which
  every benchmark table prints beside its figures: ratios against a peer differ by machine.
- :func:`reset_peak_rss` clears the kernel's peak mark through ``/proc/self/clear_refs``
  and returns the current resident size; ``status_mb("VmHWM")`` afterwards is the
  peak since the reset, so ``status_mb("VmHWM") - baseline`` is what a step added.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# -- timing ------------------------------------------------------------------------------------


def median_seconds(
    step: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], object] | None = None,
) -> float:
    """Median seconds of ``repeats`` calls of ``step`` after ``warmup`` untimed calls.

    ``sync`` (e.g. a device synchronisation) runs once after the warm-up and before and
    after each timed call, inside the timed span only after the call.
    """
    for _ in range(warmup):
        step()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        step()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def process_cpu_seconds() -> float:
    """This process's CPU time so far, user + system over all its threads, in seconds."""
    times = os.times()
    return times.user + times.system


def cpu_jiffies() -> tuple[int, int] | None:
    """``(stolen, total)`` CPU time of all CPUs so far, in jiffies, from ``/proc/stat``'s
    ``cpu`` line (its eighth field is ``steal``); None where there is no such file."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def stolen_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two :func:`cpu_jiffies` readings (None unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


# -- child processes ---------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    """A benchmark child exited with an error; ``stderr`` is what it wrote there."""

    def __init__(self, what: str, stderr: str) -> None:
        super().__init__(f"{what} failed:\n{stderr}")
        self.stderr = stderr


def thread_env(threads: int) -> dict[str, str]:
    """This process's environment with ``OMP_NUM_THREADS`` and friends set to ``threads``."""
    return {**os.environ, **dict.fromkeys(THREAD_VARIABLES, str(threads))}


def run_child(module: str, function: str, args: tuple, threads: int, what: str) -> Any:
    """``module.function(*args)`` in a fresh interpreter with ``threads`` threads; its result.

    ``module`` is a script of ``scripts/``; the child finds it and ``refimpl`` (from the
    repository root) first on its path. ``args`` must be literals whose ``repr`` reads
    back (ints, floats, strings). The result is the JSON the child prints as its last
    stdout line. A non-zero exit raises :class:`ChildFailed` with the message
    ``"{what} failed:"`` and the child's stderr.
    """
    paths = [SCRIPTS, os.path.dirname(SCRIPTS)]
    code = (
        f"import json, sys; sys.path[:0] = {paths!r}; import {module} as b; "
        f"print(json.dumps(b.{function}(*{tuple(args)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=thread_env(threads), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ChildFailed(what, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- peak memory -------------------------------------------------------------------------------


def reset_peak_rss() -> float:
    """Reset the kernel's peak-RSS mark (Linux ``clear_refs``); return the current RSS in MB."""
    with open("/proc/self/clear_refs", "w") as stream:
        stream.write("5")
    return status_mb("VmRSS")


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``, ...) in MB."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


# -- the machine -------------------------------------------------------------------------------


def machine() -> dict:
    """What ran the benchmark: CPU model, cores, versions, load averages at the start."""
    import numpy
    import scipy

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as stream:
            names = [line.split(":", 1)[1].strip() for line in stream if "model name" in line]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "numpy": numpy.__version__, "scipy": scipy.__version__, "load_start": os.getloadavg(),
    }  # fmt: skip


def machine_line(info: dict) -> str:
    """:func:`machine`'s record as the line printed under a benchmark table."""
    load = ", ".join(f"{v:.2f}" for v in info["load_start"])
    line = (
        f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, "
        f"NumPy {info['numpy']}, SciPy {info['scipy']}; load average {load} at the start"
    )
    if "load_end" in info:
        line += ", " + ", ".join(f"{v:.2f}" for v in info["load_end"]) + " at the end"
    return line
