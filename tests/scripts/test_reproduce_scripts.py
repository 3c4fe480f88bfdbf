"""The grid scripts open their run folder as `refimpl train` does: an earlier run in --out is
refused unless --resume or --overwrite is given (checked before any data is read)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
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


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("reproduce_balance", ["--data", "."]),
        ("reproduce_lipschitz", ["depth", "--data", "."]),
        ("massive_activations", ["--quick"]),
        ("massive_activations_study", ["--quick"]),
    ],
)
def test_a_script_refuses_bad_input_in_one_line_without_a_traceback(
    tmp_path: Path, name: str, argv: list[str]
) -> None:
    # The scripts printed a Python traceback where the refimpl command prints one line.
    run = tmp_path / ("depth" if name == "reproduce_lipschitz" else ".")
    run.mkdir(exist_ok=True)
    (run / "log.jsonl").write_text("{}\n")  # an earlier run: refused before any work
    root = SCRIPTS.parent
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *argv, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{name}.py: error: ") and "holds an earlier run" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


EXPERIMENT = {"reproduce_lipschitz": ["depth"]}  # its positional argument


@pytest.mark.parametrize(
    "name", ["reproduce_balance", "reproduce_lipschitz", "massive_activations",
             "massive_activations_study"],
)  # fmt: skip
def test_a_script_refuses_an_unknown_option_in_one_line(name: str) -> None:
    # argparse printed the usage of every option before its one line of error.
    root = SCRIPTS.parent
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / f"{name}.py"),
            *EXPERIMENT.get(name, []),
            "--no-such-option",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--no-such-option" in done.stderr, done.stderr
