"""run_jobs: finished runs are read back, not rerun; results land in result.json."""

from __future__ import annotations

import json
from pathlib import Path

from refimpl.train.parallel import run_jobs


def square(job: dict) -> dict:
    """A stand-in run: importable by a spawned worker."""
    Path(job["run_dir"]).mkdir(parents=True, exist_ok=True)
    return {**job, "value": job["x"] ** 2}


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
