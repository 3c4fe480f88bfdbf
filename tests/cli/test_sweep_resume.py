"""Resuming a sweep (issue 33): only as it was started, from wherever its folder now is, and
never after rewriting anything for a resume that is then refused; and a resume on other data
refused, in ``train`` and ``sweep`` alike."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import save_graph_dataset, synthetic_molecules

SWEEP = ["sweep", "--no-progress", "--hidden", "4", "--dtype", "float64", "--depths", "1", "2"]
SWEEP += ["--seeds", "0", "--checkpoint-every", "1"]
RUN = ["train", "--no-progress", "--hidden", "4", "--dtype", "float64"]


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def unfinish(cell: Path) -> None:
    """The cell as a kill at its last epoch leaves it: checkpoint and log, nothing final."""
    for name in ("result.json", "final.npz", "summary.json"):
        (cell / name).unlink()


def test_a_sweep_resumed_with_other_epochs_is_refused_naming_both_and_rewrites_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --epochs was an output-only option of sweep as of train: a resumed sweep rewrote
    # run.json to say 10, reported the 5-epoch cells as done, and a half-finished sweep
    # mixed 5- and 10-epoch cells in one table.
    assert main([*SWEEP, "--epochs", "5", "--out", str(tmp_path)]) == 0
    unfinish(tmp_path / "csbm" / "xavier" / "L2")
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["sweep", "--no-progress", "--resume", str(tmp_path), "--epochs", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refimpl sweep: error: --epochs 10 differs from the resumed run's 5")
    assert len(err.splitlines()) == 1 and snapshot(tmp_path) == before


def test_a_sweep_moved_to_another_folder_resumes_to_the_same_table(tmp_path: Path) -> None:
    # result.json stored the absolute run_dir, and the resumed sweep looked its cells up by
    # it: a sweep moved (or reached through another path) failed with KeyError '/.../L2',
    # after rewriting run.json.
    first = tmp_path / "first"
    assert main([*SWEEP, "--epochs", "3", "--out", str(first)]) == 0
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    unfinish(moved / "csbm" / "xavier" / "L2")
    assert main(["sweep", "--no-progress", "--resume", str(moved)]) == 0
    assert (moved / "table.txt").read_text() == (first / "table.txt").read_text()
    for cell in ("L1", "L2"):
        with (
            np.load(first / "csbm" / "xavier" / cell / "final.npz") as a,
            np.load(moved / "csbm" / "xavier" / cell / "final.npz") as b,
        ):
            assert all(np.array_equal(a[k], b[k]) for k in a.files)
    stored = json.loads((moved / "csbm" / "xavier" / "L1" / "result.json").read_text())
    assert "run_dir" not in stored  # its own folder is its run's, wherever it is
    cells = json.loads((moved / "sweep.json").read_text())
    assert [Path(c["run_dir"]).parent.parent.parent for c in cells] == [moved, moved]


def test_a_damaged_result_json_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # it was read with json.loads: a JSON error naming no file
    assert main([*SWEEP, "--epochs", "2", "--out", str(tmp_path)]) == 0
    damaged = tmp_path / "csbm" / "xavier" / "L1" / "result.json"
    damaged.write_text('{"dataset": "csbm", ')
    capsys.readouterr()
    assert main(["sweep", "--no-progress", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{damaged} is not valid JSON" in err and len(err.splitlines()) == 1


def test_a_result_of_another_grid_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([*SWEEP, "--epochs", "2", "--out", str(tmp_path)]) == 0
    path = tmp_path / "csbm" / "xavier" / "L1" / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "depth": 7}))
    capsys.readouterr()
    assert main(["sweep", "--no-progress", "--resume", str(tmp_path)]) == 2
    assert f"{path} is the result of another job (depth 7" in capsys.readouterr().err


def test_a_graph_run_resumed_on_another_dataset_file_is_refused_and_rewrites_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Neither run.json nor the checkpoint recorded which data a run used: replacing the .npz
    # and resuming trained half on one dataset and half on another, and exited 0.
    data = tmp_path / "molecules.npz"
    save_graph_dataset(data, synthetic_molecules(40, seed=0, standardize=True))
    out = tmp_path / "run"
    graph = ["--model", "graph_transformer", "--dataset", str(data), "--layers", "1"]
    assert main([*RUN, *graph, "--epochs", "2", "--checkpoint-every", "1", "--out", str(out)]) == 0
    save_graph_dataset(data, synthetic_molecules(40, seed=1, standardize=True))
    before = snapshot(out)
    capsys.readouterr()
    assert main(["train", "--no-progress", "--resume", str(out), "--epochs", "4"]) == 2
    err = capsys.readouterr().err
    assert f"dataset {data} differs from the one the run in {out} trained on" in err
    assert len(err.splitlines()) == 1 and snapshot(out) == before


def test_a_node_run_resumed_on_other_data_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([*RUN, "--epochs", "2", "--checkpoint-every", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "run.json").read_text())
    assert set(record["data"]) == {"csbm"} and len(record["data"]["csbm"]) == 64
    record["data"]["csbm"] = "0" * 64  # as if the data it trained on had been other data
    (tmp_path / "run.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["train", "--no-progress", "--resume", str(tmp_path), "--epochs", "3"]) == 2
    assert "dataset csbm differs from the one the run" in capsys.readouterr().err


def test_a_graph_run_with_an_empty_evaluation_split_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # 5 graphs split 80/10/10 leave no validation graph: the run printed "best
    # validation mae nan" and exited 0
    args = [*RUN, "--model", "graph_transformer", "--graphs", "5", "--out", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the 5 graphs split 80/10/10 leave the validation split empty" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()
