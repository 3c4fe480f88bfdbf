"""``refimpl train --model graph_transformer`` (issue 26): the graph-level model end to end, on
the bundled synthetic molecules and on a user's ``.npz`` graph dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import save_graph_dataset, synthetic_molecules
from refimpl.models import GraphTransformer
from refimpl.train import GraphTrainConfig, train_graph_model

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
