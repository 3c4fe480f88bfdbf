"""The training loop with random node batches (NodeFormer Sec. 4.2) and with a model's auxiliary
loss (NodeFormer's lambda L_e): equivalences, the logged loss by hand, bit-identical resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import contextual_sbm
from refimpl.models import GAT, NodeFormer
from refimpl.ops.losses import SoftmaxCrossEntropy
from refimpl.train import TrainConfig, train_model


@pytest.fixture(scope="module")
def dataset() -> object:
    return contextual_sbm(40, 3, np.random.default_rng(0), feature_dim=5).astype(np.float64)


def nodeformer(dataset: object, **kwargs: object) -> NodeFormer:
    settings = {"hidden_channels": 6, "heads": 2, "num_random_features": 8, "num_samples": 3}
    return NodeFormer(dataset.num_features, out_channels=dataset.num_classes, **settings, **kwargs)


def test_one_batch_of_all_nodes_is_the_full_batch_run_relabelled(dataset: object) -> None:
    """batch_size >= N: one batch holding every node in a random order. A GAT without dropout
    is equivariant under relabelling, so the run equals the full-batch one up to rounding."""
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2, heads=2, version="v1")
    config = TrainConfig(epochs=5, lr=0.01, seed=2)
    full = train_model(model, dataset, config)
    batched = train_model(model, dataset, TrainConfig(**{**config.__dict__, "batch_size": 1000}))
    assert batched.final_train_loss == pytest.approx(full.final_train_loss, rel=1e-12)
    for name, value in full.params.items():
        np.testing.assert_allclose(batched.params[name], value, rtol=1e-10, atol=1e-13)


def test_batches_take_one_step_each_on_their_induced_subgraphs(dataset: object) -> None:
    """Two epochs of batches of 15 nodes (3 per epoch, the last 10 nodes), by hand."""
    model = GAT(dataset.num_features, 4, dataset.num_classes, 1, version="v2")
    config = TrainConfig(epochs=2, optimizer="sgd", lr=0.1, seed=5, batch_size=15)
    result = train_model(model, dataset, config)

    params = model.init_params(np.random.default_rng([5, 0]))
    noise_rng = np.random.default_rng([5, 1])
    loss_block = SoftmaxCrossEntropy()
    for _ in range(2):
        order = noise_rng.permutation(40)
        for batch in (order[:15], order[15:30], order[30:]):
            train = dataset.train_mask[batch]
            if not train.any():
                continue
            x, graph = dataset.x[batch], dataset.graph.subgraph(batch)
            logits, cache = model.forward(params, x, graph, training=True)
            _, loss_cache = loss_block.forward({}, logits, dataset.y[batch], train)
            d_logits, _ = loss_block.backward({}, loss_cache, 1.0)
            _, grads = model.backward(params, cache, d_logits)
            params = {k: v - 0.1 * grads[k] for k, v in params.items()}
    for name, value in params.items():
        np.testing.assert_allclose(result.params[name], value, rtol=1e-12, atol=1e-15)


def test_logged_loss_is_cross_entropy_plus_the_auxiliary_loss(
    dataset: object, tmp_path: Path
) -> None:
    model = nodeformer(dataset, edge_loss_weight=0.5)
    train_model(model, dataset, TrainConfig(epochs=1, seed=3), out_dir=tmp_path)
    logged = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])["train_loss"]
    params = model.init_params(np.random.default_rng([3, 0]))
    logits, cache = model.forward(
        params, dataset.x, dataset.graph, training=True, rng=np.random.default_rng([3, 1])
    )
    cross_entropy, _ = SoftmaxCrossEntropy().forward({}, logits, dataset.y, dataset.train_mask)
    edge_loss = float(cache.edge_loss)
    assert edge_loss > 0.1  # the term is not negligible, so leaving it out would show
    assert logged == pytest.approx(float(cross_entropy) + 0.5 * edge_loss, rel=1e-12)


def test_nodeformer_training_is_reproducible(dataset: object) -> None:
    """Same seed, same run; and the loop never reuses an evaluation forward for training (the
    training forward draws fresh projections even without Gumbel noise)."""
    model = nodeformer(dataset, use_gumbel=False, edge_loss_weight=0.0)
    assert not model.deterministic_training
    a = train_model(model, dataset, TrainConfig(epochs=3, seed=1))
    b = train_model(model, dataset, TrainConfig(epochs=3, seed=1))
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


@pytest.mark.parametrize("batch_size", [None, 16])
def test_nodeformer_resume_is_bit_identical(
    dataset: object, tmp_path: Path, batch_size: int | None
) -> None:
    model = nodeformer(dataset, dropout=0.2)
    config = TrainConfig(epochs=6, lr=0.01, checkpoint_every=3, seed=4, batch_size=batch_size)
    full = train_model(model, dataset, config, out_dir=tmp_path / "full")
    part = TrainConfig(**{**config.__dict__, "epochs": 3})
    train_model(model, dataset, part, out_dir=tmp_path / "part")
    resumed = train_model(
        model, dataset, config, out_dir=tmp_path / "part", resume=tmp_path / "part/checkpoint.npz"
    )
    assert resumed.final_train_loss == full.final_train_loss
    for name, value in full.params.items():
        np.testing.assert_array_equal(resumed.params[name], value)


def test_bad_batch_size_is_refused() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be None or a positive int"):
            TrainConfig(batch_size=bad)


CORRUPTED_AFTER_CONSTRUCTION = """
import dataclasses
import numpy as np
import scipy.sparse as sp
from refimpl.data import contextual_sbm
from refimpl.models import GAT
from refimpl.train import TrainConfig, train_model

dataset = contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=4)
dataset = dataclasses.replace(dataset, x=sp.csr_matrix(dataset.x))
dataset.x.indptr[-1] = 10**8  # the dataset holds the user's matrix: edited after the checks
model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
try:
    train_model(model, dataset, TrainConfig(epochs=1, batch_size=10))
except ValueError as err:
    print("refused:", err)
"""


def test_a_csr_corrupted_after_the_dataset_was_built_is_refused_before_batching() -> None:
    # With batch_size, x[rows] indexed the CSR in SciPy's compiled code before any model saw
    # it: indptr[-1] = 10**8 killed the process (exit 139). Run in a child so a regression
    # fails here instead of killing the suite.
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", CORRUPTED_AFTER_CONSTRUCTION],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert child.returncode == 0, (child.returncode, child.stderr)
    assert child.stdout.startswith("refused: x (CSR) indptr runs from 0 to 100000000"), child.stdout
