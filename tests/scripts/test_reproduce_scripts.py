"""The grid scripts open their run folder as `refimpl train` does: an earlier run in --out is
refused unless --resume or --overwrite is given (checked before any data is read)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "argv", "folder"),
    [
        ("reproduce_balance", [], "."),
        ("reproduce_lipschitz", ["depth"], "depth"),
    ],
)
def test_a_grid_script_refuses_an_earlier_run_in_out(
    tmp_path: Path, name: str, argv: list[str], folder: str
) -> None:
    # A rerun with other options mixed its jobs into the earlier grid's folder.
    run = tmp_path / folder
    run.mkdir(exist_ok=True)
    (run / "log.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError, match=r"pass --resume to continue it, --overwrite"):
        load(name).main([*argv, "--out", str(tmp_path), "--data", str(tmp_path)])
    assert (run / "log.jsonl").read_text() == "{}\n"


def test_a_grid_script_refuses_a_longer_epochs_on_resume(tmp_path: Path) -> None:
    # A grid skips its finished jobs whatever their length: a resume with another --epochs
    # would have mixed runs of two lengths in one table.
    record = {"command": "reproduce_balance", "options": {"epochs": 5000, "data": "x"}}
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"--epochs 10 differs from the resumed run's 5000"):
        load("reproduce_balance").main(["--resume", "--epochs", "10", "--out", str(tmp_path)])


def test_the_balance_table_sets_citeseer_beside_table_2() -> None:
    """CiteSeer's cells are GAT-balance Table 2's rows; Cora's are Tables 3, 4 and 6."""
    balance = load("reproduce_balance")
    run = {"optimizer": "sgd", "depth": 5, "init": "Bal_O", "seed": 0, "test_acc": 0.7,
           "best_epoch": 9, "epochs_run": 10}  # fmt: skip
    text = balance.table([{**run, "dataset": "citeseer"}, {**run, "dataset": "cora"}])
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert rows["citeseer"].endswith("| 70.63 +- 0.60 (T2) |")
    assert rows["cora"].endswith("| 79.48 +- 0.43 (T3) |")
