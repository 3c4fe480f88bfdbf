"""NodeFormer trained as its authors batch it (``main-batch.py``: a permutation of the training
nodes cut into batches, each on its induced subgraph; on ogbn-proteins a MultiStepLR stepped per
batch), beside today's partition of every node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from refimpl.data import contextual_sbm
from refimpl.graph import Graph
from refimpl.models import NodeFormer
from refimpl.schedules import MultiStepLR
from refimpl.train import TrainConfig, train_model
from refimpl.train.run_folder import read_log

N, BATCH = 40, 5


@pytest.fixture(scope="module")
def dataset() -> object:
    data = contextual_sbm(N, 3, np.random.default_rng(0), feature_dim=5).astype(np.float64)
    train = np.zeros(N, bool)
    train[::3] = True  # 14 training nodes: batches of 5, 5 and 4
    val = ~train & (np.arange(N) % 3 == 1)
    return data.with_masks(train, val, ~train & ~val)


def nodeformer(dataset: object) -> NodeFormer:
    settings = {"hidden_channels": 6, "heads": 2, "num_random_features": 8, "num_samples": 3}
    return NodeFormer(dataset.num_features, out_channels=dataset.num_classes, **settings)


def recorded_batches(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Every node set the loop cuts a training subgraph with, in order."""
    seen: list[np.ndarray] = []
    original = Graph.subgraph

    def spy(self: Graph, nodes: object) -> Graph:
        seen.append(np.asarray(nodes).copy())
        return original(self, nodes)

    monkeypatch.setattr(Graph, "subgraph", spy)
    return seen


@pytest.mark.parametrize("batch_nodes", ["train", "all"])
def test_batches_hold_each_node_once_per_epoch(
    dataset: object, monkeypatch: pytest.MonkeyPatch, batch_nodes: str
) -> None:
    seen = recorded_batches(monkeypatch)
    config = TrainConfig(epochs=3, seed=2, batch_size=BATCH, batch_nodes=batch_nodes)
    train_model(nodeformer(dataset), dataset, config)
    train = np.flatnonzero(dataset.train_mask)
    expected = train if batch_nodes == "train" else np.arange(N)
    per_epoch = -(-expected.size // BATCH)  # 3 of 14 training nodes, 8 of all 40
    assert len(seen) == 3 * per_epoch
    orders = []
    for epoch in range(3):
        batches = seen[epoch * per_epoch : (epoch + 1) * per_epoch]
        assert [b.size for b in batches[:-1]] == [BATCH] * (per_epoch - 1)
        order = np.concatenate(batches)
        np.testing.assert_array_equal(np.sort(order), expected)  # each node exactly once
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])  # a fresh permutation every epoch


def test_multistep_per_batch_counts_optimiser_steps(dataset: object, tmp_path: Path) -> None:
    # 3 steps per epoch; milestones [4, 7] halve lr after the 4th and the 7th step, so the
    # last steps of epochs 0, 1, 2 (steps 3, 6, 9) run at lr, lr / 2 and lr / 4.
    schedule = MultiStepLR([4, 7], gamma=0.5)
    config = TrainConfig(
        epochs=3,
        lr=0.01,
        batch_size=BATCH,
        batch_nodes="train",
        schedule=schedule,
        schedule_every="batch",
    )
    train_model(nodeformer(dataset), dataset, config, out_dir=tmp_path)
    assert [r["lr"] for r in read_log(tmp_path / "log.jsonl")] == [0.01, 0.005, 0.0025]


def test_training_node_batches_resume_bit_for_bit(dataset: object, tmp_path: Path) -> None:
    # The authors' protocol, cut at epoch 2 of 5 with a milestone on either side of the cut:
    # parameters, the per-batch schedule and the learning rates go on as if never stopped.
    schedule = MultiStepLR([4, 10], gamma=0.5)
    settings = {"lr": 0.01, "batch_size": BATCH, "batch_nodes": "train", "seed": 3}
    settings |= {"schedule": schedule, "schedule_every": "batch", "checkpoint_every": 2}
    model = nodeformer(dataset)
    full = train_model(model, dataset, TrainConfig(epochs=5, **settings), out_dir=tmp_path / "a")
    train_model(model, dataset, TrainConfig(epochs=2, **settings), out_dir=tmp_path / "b")
    resumed = train_model(
        model,
        dataset,
        TrainConfig(epochs=5, **settings),
        out_dir=tmp_path / "b",
        resume=tmp_path / "b/checkpoint.npz",
    )
    for name, value in full.params.items():
        np.testing.assert_array_equal(resumed.params[name], value)
    lrs = [[r["lr"] for r in read_log(tmp_path / run / "log.jsonl")] for run in ("a", "b")]
    assert lrs[0] == lrs[1] and len(set(lrs[0])) == 3


def test_training_node_batches_need_a_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_nodes='train' cuts batches: set batch_size"):
        TrainConfig(batch_nodes="train")
    with pytest.raises(ValueError, match="batch_nodes must be one of 'all', 'train'"):
        TrainConfig(batch_size=4, batch_nodes="training")
