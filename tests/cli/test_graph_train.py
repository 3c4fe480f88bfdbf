"""``refimpl train --model graph_transformer`` (issue 26): the graph-level model end to end, on
the bundled synthetic molecules, on a user's ``.npz`` graph dataset and on a CSV of SMILES
(issue 35)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import save_graph_dataset, synthetic_molecules
from refimpl.models import GraphTransformer
from refimpl.train import GraphTrainConfig, train_graph_model
from tests.data import data_root

FAST = ["--model", "graph_transformer", "--graphs", "60", "--epochs", "2", "--no-progress"]


def test_two_seeds_train_log_and_summarise(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *FAST, "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("seed ")] == [
        "seed 0",
        "seed 1",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metric"] == "mae" and [r["seed"] for r in summary["runs"]] == [0, 1]
    for seed in (0, 1):
        lines = (tmp_path / f"seed{seed}" / "log.jsonl").read_text().splitlines()
        assert len(lines) == 2


def test_the_command_runs_what_the_api_runs(tmp_path: Path) -> None:
    """The same data, split, model and configuration as a direct call: the same test MAE."""
    assert (
        main(["train", *FAST, "--layers", "2", "--dtype", "float64", "--out", str(tmp_path)]) == 0
    )
    ran = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    dataset = synthetic_molecules(60, seed=0, standardize=True)
    train, val, test = dataset.split(seed=0)
    model = GraphTransformer(
        dataset.num_node_features, dataset.num_targets, hidden_channels=64, num_layers=2,
        heads=4, edge_dim=dataset.num_edge_features, pe_dim=8,
    )  # fmt: skip
    config = GraphTrainConfig(epochs=2, batch_size=64, lr=0.005, dtype="float64")
    direct = train_graph_model(model, train, val, test, config)
    assert ran["test_metric"] == direct.test_metric and ran["best_epoch"] == direct.best_epoch


def test_a_users_npz_graph_dataset(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    save_graph_dataset(path, synthetic_molecules(40, seed=3, task="multilabel"))
    out = tmp_path / "run"
    args = ["train", *FAST, "--dataset", str(path), "--pe-dim", "0", "--global-node"]
    assert main([*args, "--out", str(out)]) == 0
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    assert run["metric"] == "roc_auc" and np.isfinite(run["val_metric"])


def test_a_resumed_run_keeps_its_dataset(tmp_path: Path) -> None:
    """The dataset is stored with the run: a resume trains on the user's .npz again, not
    on this model's default."""
    path = tmp_path / "mine.npz"
    save_graph_dataset(path, synthetic_molecules(40, seed=3, task="multilabel"))
    out = tmp_path / "run"
    args = ["train", *FAST, "--dataset", str(path), "--checkpoint-every", "1", "--out", str(out)]
    assert main(args) == 0
    assert main(["train", "--resume", str(out), "--epochs", "3", "--no-progress"]) == 0
    run = json.loads((out / "summary.json").read_text())["runs"][0]
    assert run["metric"] == "roc_auc" and run["epochs_run"] == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset", "cora"], "trains on graphs: --dataset molecules .* not 'cora'"),
        (["--version", "v1"], "--version do not apply to --model graph_transformer"),
        (["--optimizer", "sgd"], "trains with Adam"),
        (["--lipschitz-norm", "reference-code"], "takes --lipschitz-norm paper"),
        (["--dataset", "mols.csv"], r"mols.csv \(SMILES\) needs --target COLUMN"),
        (["--target", "score", "--bad-smiles", "skip"], "--bad-smiles, --target: only for"),
    ],
)
def test_what_does_not_apply_is_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    assert main(["train", *FAST, *extra, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refimpl train: error: ")
    assert re.search(message, err[0]), err[0]


def test_sweep_keeps_to_node_models(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["sweep", "--model", "graph_transformer"])
    assert "invalid choice: 'graph_transformer'" in capsys.readouterr().err


# -- molecules from SMILES (issue 35 item 1) --------------------------------------------------
TINY = ["--layers", "1", "--hidden", "8", "--heads", "1", "--pe-dim", "0", "--batch-size", "256"]


def test_the_shared_zinc_smiles_train(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("rdkit", reason="RDKit (refimpl[chem]) is not installed")
    path = data_root() / "molecules" / "micro_ZINC.csv"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    args = ["train", *FAST, *TINY, "--dataset", str(path), "--target", "score"]
    assert main([*args, "--epochs", "1", "--out", str(tmp_path)]) == 0
    # OGB's 9 atom and 3 bond features of the file's 1002 molecules, one regression target
    assert "micro_ZINC: graphs=1002 N=23165 E=49820 F=9 B=3 T=1" in capsys.readouterr().out
    run = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert run["metric"] == "mae" and np.isfinite(run["test_metric"])
    options = json.loads((tmp_path / "run.json").read_text())["options"]
    assert options["target"] == ["score"]  # stored, so --resume reads the same column


def test_bad_smiles_skipped_with_a_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("rdkit", reason="RDKit (refimpl[chem]) is not installed")
    rows = [f"{'C' * k}O,{k}" for k in range(1, 12)]
    path = tmp_path / "mols.csv"
    path.write_text("\n".join(["smiles,y", rows[0], "C1CC,0", *rows[1:]]) + "\n")
    args = ["train", *FAST, *TINY, "--dataset", str(path), "--target", "y"]
    args += ["--smiles-column", "smiles", "--out", str(tmp_path / "run")]
    assert main(args) == 2  # refused by default, naming the row
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mols.csv row 1 (line 3): RDKit cannot parse" in err[0]
    assert main([*args, "--bad-smiles", "skip"]) == 0
    out = capsys.readouterr().out
    assert "warning: mols.csv: skipped 1 of 12 rows whose SMILES RDKit cannot use (rows 1," in out
    assert "graphs=11 " in out


def test_without_rdkit_a_smiles_csv_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rdkit", None)  # import rdkit now raises ImportError
    path = tmp_path / "mols.csv"
    path.write_text("SMILES,score\nCCO,1.0\n")
    args = ["train", *FAST, "--dataset", str(path), "--target", "score"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'refimpl[chem]'" in err[0], err
    assert not (tmp_path / "run").exists()  # nothing written for a run that cannot start
