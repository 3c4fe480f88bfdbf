"""Grids on Dask (issue 26): a LocalCluster of two workers gives the sequential results bit for
bit, a worker killed mid-grid loses and duplicates no job, and a scheduler that does not
answer gives one clear line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.train import parallel
from refimpl.train.parallel import WorkerLost, run_jobs
from tests.cluster_jobs import always_dies, dies_once, square_sum

pytest.importorskip("distributed")

GRID = ["sweep", "--depths", "1", "2", "--seeds", "0", "1", "--epochs", "3", "--hidden", "4",
        "--dtype", "float64", "--no-progress"]  # fmt: skip


def _records(folder: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(folder.rglob("result.json")):
        record = json.loads(path.read_text())
        record.pop("run_dir")
        found[str(path.parent.relative_to(folder))] = record
    return found


def test_a_local_cluster_gives_the_sequential_sweep_bit_for_bit(tmp_path: Path) -> None:
    assert main([*GRID, "--out", str(tmp_path / "here")]) == 0
    assert main([*GRID, "--scheduler", "local:2", "--out", str(tmp_path / "dask")]) == 0
    here, dask = _records(tmp_path / "here"), _records(tmp_path / "dask")
    assert len(here) == 2 and here == dask
    for cell in here:
        for seed in (0, 1):
            with (
                np.load(tmp_path / "here" / cell / f"seed{seed}" / "final.npz") as a,
                np.load(tmp_path / "dask" / cell / f"seed{seed}" / "final.npz") as b,
            ):
                for name in a.files:
                    np.testing.assert_array_equal(a[name], b[name])


def test_a_killed_worker_loses_and_duplicates_no_job(tmp_path: Path, capsys) -> None:
    jobs = []
    for seed in range(6):
        run_dir = tmp_path / f"job{seed}"
        run_dir.mkdir()
        jobs.append({"seed": seed, "run_dir": str(run_dir), "die": seed == 2})
    results = run_jobs(dies_once, jobs, 1, lambda r: f"job {r['seed']}", scheduler="local:2")
    assert sorted(r["seed"] for r in results) == list(range(6))  # none lost, none twice
    # it died once and ran again (a job running beside it on that worker may have too);
    # each job's result is written once, by this process, when the job finishes
    assert (tmp_path / "job2" / "attempts").read_text() == "xx"
    expected = {job["seed"]: square_sum(job)["value"] for job in jobs}
    for job in jobs:
        written = json.loads((Path(job["run_dir"]) / "result.json").read_text())
        assert written["value"] == expected[job["seed"]]  # bitwise: the sequential value
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(printed) == 6  # one line per finished job
    attempts = [(Path(job["run_dir"]) / "attempts").read_text() for job in jobs]
    again = run_jobs(dies_once, jobs, 1, lambda r: "", scheduler="local:2")  # a rerun: all done
    assert sorted(r["seed"] for r in again) == list(range(6))
    assert [(Path(job["run_dir"]) / "attempts").read_text() for job in jobs] == attempts


def test_a_job_that_kills_every_worker_is_one_line(tmp_path: Path) -> None:
    import dask

    jobs = [{"seed": 0, "run_dir": str(tmp_path)}]
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with pytest.raises(WorkerLost, match="a job's worker died each time it ran"):
            run_jobs(always_dies, jobs, 1, lambda r: "", scheduler="local:2")
    assert not (tmp_path / "result.json").exists()


def test_a_scheduler_that_does_not_answer_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "CONNECT_SECONDS", 2)
    args = [*GRID, "--scheduler", "tcp://127.0.0.1:9", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "refimpl sweep: error: no Dask scheduler answered at tcp://127.0.0.1:9 within 2 s: "
        "start one (dask scheduler) and its workers (dask worker ADDRESS), or run here with "
        "--scheduler local:N"
    ]


@pytest.mark.parametrize("value", ["local:0", "local:x"])
def test_local_needs_a_worker_count(value: str, tmp_path: Path, capsys) -> None:
    assert main([*GRID, "--scheduler", value, "--out", str(tmp_path)]) == 2
    assert "needs a number of workers N >= 1" in capsys.readouterr().err


def test_without_dask_the_scheduler_option_says_what_to_install(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    assert main([*GRID, "--scheduler", "local:2", "--out", str(tmp_path)]) == 2
    assert 'needs Dask distributed: pip install -e ".[cluster]"' in capsys.readouterr().err
