"""``refimpl train --model nodeformer``: the model built from the flags, random splits per seed
shared across models, k-NN and empty graphs, mini-batches."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.cli.options import (
    add_data_options,
    add_model_options,
    add_nodeformer_options,
    add_training_options,
    build_model,
    dataset_for_seeds,
    replace_graph,
)
from refimpl.data import contextual_sbm
from refimpl.models import GAT, NodeFormer

FAST = ["--epochs", "2", "--no-progress", "--dtype", "float64"]
SMALL = "--model nodeformer --hidden 4 --heads 2 --random-features 6 --gumbel-samples 2".split()


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for add in (add_data_options, add_model_options, add_nodeformer_options, add_training_options):
        add(parser)
    return parser.parse_args(list(flags))


def test_flags_build_the_authors_cora_model_by_default() -> None:
    data = contextual_sbm(30, 3, np.random.default_rng(0), feature_dim=5)
    model = build_model(parse("--model", "nodeformer"), data, 2)
    assert model == NodeFormer(5, 32, 3, 2)
    flags = "--no-residual --relational-bias none --edge-loss-weight 0 --conv-activation"
    model = build_model(parse("--model", "nodeformer", *flags.split()), data, 3)
    assert (model.residual, model.relational_bias, model.edge_loss_weight) == (False, None, 0.0)
    assert model.activation and model.num_layers == 3
    gat = build_model(parse(), data, 2)
    assert isinstance(gat, GAT) and gat.hidden_channels == 8 and not gat.residual


def test_random_split_is_per_seed_and_the_same_for_every_model() -> None:
    data = contextual_sbm(40, 3, np.random.default_rng(0), feature_dim=5)
    for_seed = dataset_for_seeds(data, parse("--random-split", "0.5", "0.25", "0.25"))
    a, b, again = for_seed(0), for_seed(1), for_seed(0)
    assert int(a.train_mask.sum()) == 20 and int(a.val_mask.sum()) == 10
    assert not np.array_equal(a.train_mask, b.train_mask)
    np.testing.assert_array_equal(a.test_mask, again.test_mask)
    assert dataset_for_seeds(data, parse()) is data


def test_knn_graph_is_symmetric_without_duplicates_and_none_has_no_edges() -> None:
    data = contextual_sbm(30, 3, np.random.default_rng(0), feature_dim=4)
    knn = replace_graph(data, "knn", 3).graph
    src, dst = knn.edge_index
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert len(pairs) == knn.num_edges and all((v, u) in pairs for u, v in pairs)
    assert (np.bincount(dst, minlength=30) >= 3).all() and not (src == dst).any()
    assert replace_graph(data, "none", 3).graph.num_edges == 0


@pytest.mark.parametrize(
    "extra", [[], ["--graph", "knn", "--knn", "4"], ["--graph", "none"], ["--batch-size", "50"]]
)
def test_train_nodeformer_runs(tmp_path: Path, extra: list[str]) -> None:
    args = ["train", *FAST, *SMALL, "--random-split", "0.5", "0.25", "0.25", *extra]
    assert main([*args, "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["model"] == "nodeformer" and len(summary["runs"]) == 2
    assert all(0 <= run["test_acc"] <= 1 for run in summary["runs"])


def test_several_heads_per_layer_are_refused_for_nodeformer(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["train", *FAST, "--model", "nodeformer", "--heads", "2", "3", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "one --heads value" in capsys.readouterr().err
