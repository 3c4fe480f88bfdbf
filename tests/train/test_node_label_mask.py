"""Node-level training with missing labels (``NodeDataset.y_mask``, ogbn-proteins' tasks): the
loss averages the training nodes' observed entries, batches carry their rows of the mask, each
task's ROC-AUC reads the split's observed entries, an unobserved entry changes nothing (NaN
included) and an observed one does; the backward through the model respects the mask (finite
differences)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from refimpl.data import load_ogb_node_dataset
from refimpl.metrics import roc_auc
from refimpl.models import GAT
from refimpl.ops.losses import BCEWithLogits
from refimpl.schedules import ReduceLROnPlateau
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients
from refimpl.train import TrainConfig, loop, train_model
from tests.data.test_ogb_node import random_folder

F64 = FORWARD_RTOL[np.dtype(np.float64)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_ogb_node_dataset(random_folder(tmp_path_factory.mktemp("ogbn")))


def small_gat(dataset: object) -> GAT:
    return GAT(dataset.num_features, 4, dataset.num_classes, 2, heads=2, activation="elu")


def with_raw_labels(dataset: object, y: np.ndarray) -> SimpleNamespace:
    """The dataset with ``y`` as given, past NodeDataset's cleaning (which stores 0 outside
    y_mask): what the loop itself must never read."""
    fields = ("name", "graph", "x", "train_mask", "val_mask", "test_mask", "num_classes")
    return SimpleNamespace(**{k: getattr(dataset, k) for k in fields}, y=y, y_mask=dataset.y_mask)


def test_the_loss_averages_the_observed_training_entries_only(
    dataset: object, tmp_path: Path
) -> None:
    assert dataset.y_mask is not None and not dataset.y_mask[dataset.train_mask].all()
    model = small_gat(dataset)
    train_model(model, dataset, TrainConfig(epochs=1), out_dir=tmp_path)
    logged = json.loads((tmp_path / "log.jsonl").read_text())
    params = model.init_params(np.random.default_rng([0, 0]))
    z, _ = model.forward(params, dataset.x, dataset.graph)
    terms = np.logaddexp(0, z) - z * dataset.y  # (N, K) binary cross-entropy with logits
    observed = dataset.train_mask[:, None] & dataset.y_mask
    assert logged["train_loss"] == pytest.approx(terms[observed].mean(), rel=F64)
    assert abs(logged["train_loss"] - terms[dataset.train_mask].mean()) > 1e-6  # 0 as a label
    # the metrics: each task over the split's observed entries, of the updated model
    result = train_model(model, dataset, TrainConfig(epochs=1))
    z, _ = model.forward(result.params, dataset.x, dataset.graph)
    val = dataset.val_mask[:, None] & dataset.y_mask
    assert result.val_acc == roc_auc(z, dataset.y, val) != roc_auc(z, dataset.y, dataset.val_mask)


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(epochs=3, schedule=ReduceLROnPlateau(mode="min", patience=0)),
        TrainConfig(epochs=3, batch_size=7),
        TrainConfig(epochs=3, batch_size=5, batch_nodes="train"),
    ],
    ids=["full-batch-plateau", "batches", "train-batches"],
)
def test_an_unobserved_entry_changes_nothing_and_an_observed_one_does(
    dataset: object, config: TrainConfig
) -> None:
    base = train_model(small_gat(dataset), dataset, config)
    junk = np.where(dataset.y_mask, dataset.y, [np.nan, 7.0, -1e300, 0.5])  # (N, K)
    moved = train_model(small_gat(dataset), with_raw_labels(dataset, junk), config)
    assert moved.final_train_loss == base.final_train_loss
    assert (moved.val_acc, moved.test_acc) == (base.val_acc, base.test_acc)
    for key, value in base.params.items():
        np.testing.assert_array_equal(moved.params[key], value, err_msg=key)
    # one observed training label flipped: another loss and other parameters
    row, task = np.argwhere(dataset.train_mask[:, None] & dataset.y_mask)[0]
    flipped = dataset.y.copy()
    flipped[row, task] = 1 - flipped[row, task]
    other = train_model(small_gat(dataset), with_raw_labels(dataset, flipped), config)
    assert other.final_train_loss != base.final_train_loss
    assert any(not np.array_equal(other.params[k], v) for k, v in base.params.items())


def test_an_observed_validation_label_moves_the_metric(dataset: object) -> None:
    config = TrainConfig(epochs=1)
    base = train_model(small_gat(dataset), dataset, config)
    val = dataset.val_mask[:, None] & dataset.y_mask
    flipped = dataset.y.copy()
    flipped[val] = 1 - flipped[val]  # every observed validation label: AUC -> 1 - AUC
    other = train_model(small_gat(dataset), with_raw_labels(dataset, flipped), config)
    assert other.val_acc == pytest.approx(1 - base.val_acc, rel=F64)
    assert other.test_acc == base.test_acc and base.val_acc != 0.5


def test_batches_carry_their_rows_of_the_label_mask(
    dataset: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every loss call of a batched epoch gets the entry mask of exactly its batch's rows.
    calls: list[tuple[np.ndarray, np.ndarray]] = []
    batches: list[np.ndarray] = []

    class Recording(BCEWithLogits):
        def forward(self, params: dict, logits: object, targets: object, mask: object) -> tuple:
            calls.append((np.array(targets), np.array(mask)))
            return super().forward(params, logits, targets, mask)

    original = loop.node_batches

    def spy(*args: object) -> list[np.ndarray]:
        cut = original(*args)
        batches.extend(cut)
        return cut

    monkeypatch.setattr(loop, "BCEWithLogits", Recording)
    monkeypatch.setattr(loop, "node_batches", spy)
    train_model(small_gat(dataset), dataset, TrainConfig(epochs=1, batch_size=7))
    observed = dataset.train_mask[:, None] & dataset.y_mask
    kept = [rows for rows in batches if observed[rows].any()]
    assert len(batches) == math.ceil(dataset.num_nodes / 7) and kept
    for rows, (targets, mask) in zip(kept, calls[: len(kept)], strict=True):  # then evaluation
        np.testing.assert_array_equal(mask, observed[rows])
        np.testing.assert_array_equal(targets, dataset.y[rows])


class MaskedNodeLoss:
    """GAT logits, then the binary cross-entropy over an (N, K) entry mask, as one block (the
    loop's steps 1-3); ``leak`` makes the backward use whole rows (a mask-ignoring bug)."""

    def __init__(self, model: GAT, targets: np.ndarray, mask: np.ndarray, leak: bool) -> None:
        self.model, self.targets, self.mask, self.leak = model, targets, mask, leak

    def forward(self, params: dict, x: np.ndarray, graph: object) -> tuple:
        logits, cache = self.model.forward(params, x, graph)
        loss, loss_cache = BCEWithLogits().forward({}, logits, self.targets, self.mask)
        if self.leak:  # the rows' every entry, unobserved ones read as 0
            rows = self.mask.any(axis=1)
            _, loss_cache = BCEWithLogits().forward({}, logits, np.nan_to_num(self.targets), rows)
        return loss, (cache, loss_cache)

    def backward(self, params: dict, cache: tuple, d_loss: object) -> tuple:
        d_logits, _ = BCEWithLogits().backward({}, cache[1], d_loss)
        return self.model.backward(params, cache[0], d_logits)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_backward_through_the_model_respects_the_mask(dataset: object, seed: int) -> None:
    # tests/ops/test_losses.py checks the loss alone against finite differences with NaN
    # outside an entry mask; here the whole node-level chain, GAT included, as the loop runs it
    model = small_gat(dataset)
    rng = np.random.default_rng(seed)
    params = model.init_params(rng)
    targets = np.where(dataset.y_mask, dataset.y, np.nan)  # missing labels as OGB reads them
    observed = dataset.train_mask[:, None] & dataset.y_mask
    block = MaskedNodeLoss(model, targets, observed, leak=False)
    inputs = (dataset.x, dataset.graph)
    report = check_gradients(block, params, inputs, rng=rng, max_entries=8)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()
    leaking = MaskedNodeLoss(model, targets, observed, leak=True)
    assert check_gradients(leaking, params, inputs, rng=rng, max_entries=8).max_rel_error > 1e-3


def test_a_split_without_a_scoreable_task_scores_nan_and_no_label_to_fit_is_refused(
    dataset: object, tmp_path: Path
) -> None:
    # test: every observed label 1 (no task has both classes: the macro ROC-AUC is undefined,
    # where roc_auc raises); val: no observed label at all
    y, y_mask = dataset.y.copy(), dataset.y_mask.copy()
    y[dataset.test_mask] = 1
    y_mask[dataset.val_mask] = False
    data = dataclasses.replace(dataset, y=y, y_mask=y_mask)
    result = train_model(small_gat(data), data, TrainConfig(epochs=2), out_dir=tmp_path)
    assert math.isnan(result.val_acc) and math.isnan(result.test_acc)
    assert result.best_epoch == 1  # no validation score: the last epoch, as with no val nodes
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert all('"val_acc": null' in line and '"test_acc": null' in line for line in lines)
    y_mask[dataset.train_mask] = False
    unlabelled = dataclasses.replace(dataset, y_mask=y_mask)
    with pytest.raises(ValueError, match=r"^the training nodes have no observed label"):
        train_model(small_gat(data), unlabelled, TrainConfig(epochs=1))


@pytest.mark.parametrize("batch_size", [None, 7])
def test_masked_labels_on_the_strict_backend_match_numpy(
    dataset: object, batch_size: int | None
) -> None:
    # The entry masks live on the training backend: no stray NumPy array reaches the loss,
    # the batches or the metric.
    config = TrainConfig(epochs=3, batch_size=batch_size)
    host = train_model(small_gat(dataset), dataset, config)
    device = train_model(small_gat(dataset), dataset, config, backend="strict")
    assert (device.val_acc, device.test_acc) == (host.val_acc, host.test_acc)
    assert device.final_train_loss == pytest.approx(host.final_train_loss, rel=1e-12)
