"""run_jobs: finished runs are read back, not rerun; results land in result.json; one BLAS
thread per worker from the worker's start."""

from __future__ import annotations

import json
import os
import subprocess
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


def dies_on_marked(job: dict) -> dict:
    """``square``, but the job marked ``die`` kills its worker process (out of memory, say)."""
    if job.get("die"):
        os._exit(1)
    return square(job)


KILLED_GRID = """
import sys
from tests.train.test_parallel import dies_on_marked
from refimpl.train.parallel import WorkerLost, run_jobs

jobs = [{"x": x, "die": x == 3, "run_dir": f"{sys.argv[1]}/run{x}"} for x in range(6)]
try:
    run_jobs(dies_on_marked, jobs, workers=2, describe=lambda r: "")
except WorkerLost as err:
    print("WorkerLost:", err)
"""


def test_a_killed_worker_process_ends_the_grid_in_one_line_keeping_finished_jobs(
    tmp_path: Path,
) -> None:
    # multiprocessing.Pool replaces a killed worker but never its job: the grid waited
    # forever (6 of 6 tries). Run in a child with a time limit, so a regression fails here
    # instead of hanging the suite.
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_GRID, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert child.returncode == 0, child.stderr
    lost = [line for line in child.stdout.splitlines() if line.startswith("WorkerLost")]
    assert len(lost) == 1 and "a worker process died (killed, or out of memory)" in lost[0]
    assert "finished and are kept; rerun to finish the rest" in lost[0]
    written = sorted(p.parent.name for p in tmp_path.rglob("result.json"))
    assert "run3" not in written
    for name in written:  # what finished is whole and right
        x = int(name.removeprefix("run"))
        assert json.loads((tmp_path / name / "result.json").read_text())["value"] == x * x
    jobs = [{"x": x, "die": False, "run_dir": str(tmp_path / f"run{x}")} for x in range(6)]
    # the rerun (the marked job no longer dies) finishes the rest
    assert [r["value"] for r in run_jobs(square, jobs, 2, lambda r: "")] == [0, 1, 4, 9, 16, 25]


def test_results_come_back_in_job_order_with_their_current_folder(tmp_path: Path) -> None:
    # a result read back takes the job's run_dir: a grid moved since finds its cells
    jobs = [{"x": x, "run_dir": str(tmp_path / "now" / f"run{x}")} for x in range(3)]
    (tmp_path / "now" / "run2").mkdir(parents=True)
    old = {"x": 2, "value": 4, "run_dir": "/where/it/was/run2"}  # written by an older version
    (tmp_path / "now" / "run2" / "result.json").write_text(json.dumps(old))
    results = run_jobs(square, jobs, workers=1, describe=lambda r: "")
    assert [r["x"] for r in results] == [0, 1, 2]
    assert [r["run_dir"] for r in results] == [job["run_dir"] for job in jobs]
