"""``scripts/massive_activations_study.py``: the study's grid of architectures, each job one
``massive_activations.py --study`` run, summarised once every job has finished."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "massive_activations_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("massive_activations_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_grid_summarises_its_runs_and_a_rerun_skips_them(study, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    argv = ["--quick", "--variants", "gt", "graphit-explicit-bias", "--out", str(tmp_path)]
    results = study.main(argv)
    assert [(r["variant"], r["seed"]) for r in results] == [("gt", 0), ("graphit-explicit-bias", 0)]
    # each job is a whole massive_activations.py run in its own folder, with its settings
    for result in results:
        folder = tmp_path / f"{result['variant']}_seed0"
        run = json.loads((folder / "run.json").read_text())["options"]
        assert run["study"] == result["variant"].partition("-")[0]
        assert run["explicit_bias"] == result["variant"].endswith("explicit-bias")
        comparison = json.loads((folder / "comparison.json").read_text())
        assert comparison["layers"] == result["layers"]
    # the summary's largest ratio of a stream is the largest over that run's layers
    gt_edge_scores = [
        r["trained"]["max_ratio"]
        for r in results[0]["layers"]
        if r["layer"].endswith("e.attention")
    ]
    assert len(gt_edge_scores) == 4  # --quick: 4 layers
    table = (tmp_path / "summary.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| gt | `e.attention`"))
    assert row.split(" | ")[5] == f"{max(gt_edge_scores):.0f}"
    streams = {line.split(" | ")[1] for line in table.splitlines()[2:] if line}
    assert streams == {"`h.attention`", "`e.attention`", "`h.output`", "`e.output`"}
    assert (tmp_path / "summary.png").stat().st_size > 0

    # a rerun of the finished grid trains nothing and reads every result back
    capsys.readouterr()
    again = study.main([*argv, "--resume"])
    assert "2 runs, 2 done before, 0 to do" in capsys.readouterr().out
    assert again == results


def test_a_grid_without_seeds_is_refused(study, tmp_path):
    with pytest.raises(SystemExit):
        study.main(["--seeds", "0", "--out", str(tmp_path)])
    assert not tmp_path.joinpath("run.json").exists()
