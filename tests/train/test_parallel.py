"""run_jobs: finished runs are read back, not rerun; results land in result.json; one BLAS
thread per worker from the worker's start."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from refimpl.train.parallel import BLAS_THREAD_VARIABLES, run_jobs


def square(job: dict) -> dict:
    """A stand-in run: importable by a spawned worker."""
    Path(job["run_dir"]).mkdir(parents=True, exist_ok=True)
    return {**job, "value": job["x"] ** 2}


def start_environment(job: dict) -> dict:
    """The environment the worker process was started with (Linux: /proc/self/environ)."""
    Path(job["run_dir"]).mkdir(parents=True, exist_ok=True)
    entries = Path("/proc/self/environ").read_bytes().decode(errors="replace").split("\0")
    return {**job, "environ": dict(e.split("=", 1) for e in entries if "=" in e)}


def test_run_jobs_skips_finished_runs_and_records_results(tmp_path: Path, capsys) -> None:
    jobs = [{"x": x, "run_dir": str(tmp_path / f"run{x}")} for x in range(3)]
    # run1 finished before, with a value run_one would not produce: it must be read back.
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "result.json").write_text(json.dumps({**jobs[1], "value": -1}))
    results = run_jobs(square, jobs, workers=2, describe=lambda r: f"done {r['x']}")
    assert sorted((r["x"], r["value"]) for r in results) == [(0, 0), (1, -1), (2, 4)]
    for x in (0, 2):
        assert json.loads((tmp_path / f"run{x}" / "result.json").read_text())["value"] == x * x
    printed = capsys.readouterr().out
    assert "3 runs, 1 done before, 2 to do" in printed and "done 2" in printed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/environ")
def test_workers_start_with_one_blas_thread(tmp_path: Path) -> None:
    # BLAS reads its thread count when NumPy is imported, which in a spawned worker can
    # precede any Pool initializer: the count must be in the environment the worker
    # starts with, not set later inside it. The parent's own environment is restored.
    before = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    jobs = [{"run_dir": str(tmp_path / "run0")}]
    (result,) = run_jobs(start_environment, jobs, workers=2, describe=lambda r: "")
    assert {name: result["environ"].get(name) for name in BLAS_THREAD_VARIABLES} == dict.fromkeys(
        BLAS_THREAD_VARIABLES, "1"
    )
    assert {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES} == before
