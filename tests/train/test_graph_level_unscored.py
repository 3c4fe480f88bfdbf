"""Graph-level splits whose metric is undefined (a multi-label split with no task having both a
positive and a negative observed label, or no observed label at all): scored NaN with the reason
in ``summary.json``, as the node-level loop scores such splits, not an exception mid-run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.data import synthetic_molecules
from refimpl.metrics import roc_auc
from refimpl.models import GraphTransformer
from refimpl.schedules import ReduceLROnPlateau
from refimpl.train import GraphTrainConfig, train_graph_model

UNDEFINED = (
    "ROC AUC is undefined: no column has both a positive and a negative target among the "
    "selected rows"
)


@pytest.fixture(scope="module")
def splits() -> tuple:
    return synthetic_molecules(40, seed=1, task="multilabel").split(seed=0)


def _model(dataset: object) -> GraphTransformer:
    return GraphTransformer(
        in_channels=dataset.num_node_features,
        out_channels=dataset.num_targets,
        hidden_channels=8,
        num_layers=1,
        heads=2,
        edge_dim=dataset.num_edge_features,
        pe_dim=0,
    )


def _log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def test_roc_auc_raised_mid_run_on_a_split_with_no_task_having_both_classes(
    splits: tuple, tmp_path: Path
) -> None:
    # The graph loop called roc_auc on every evaluated split, and roc_auc raises where no task
    # has both a positive and a negative label: a one-graph validation split (each task has
    # one label there) killed the run at its first evaluation, after its first epoch had
    # trained, with nothing saved. The multi-label tests so far drew splits of several graphs,
    # where some task always had both classes; the node loop scores such a split NaN.
    train, val, test = splits
    one_graph = val.subset([0])
    assert np.isin(one_graph.y, (0, 1)).all() and one_graph.y_mask is None
    config = GraphTrainConfig(epochs=2, batch_size=16)
    result = train_graph_model(_model(train), train, one_graph, test, config, out_dir=tmp_path)
    log = _log(tmp_path)
    assert [record["val_roc_auc"] for record in log] == [None, None]  # NaN, as null
    # without a validation metric the last epoch is selected, as the node loop does
    assert np.isnan(result.val_metric) and result.best_epoch == 1
    assert result.test_metric == log[1]["test_roc_auc"]  # the test graphs are still scored
    assert 0.0 <= result.test_metric <= 1.0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["unscored"] == {"val": UNDEFINED}  # the reason, once
    # ... and in the result, whose as_dict() the CLI's summary lists for every seed
    assert result.unscored == {"val": UNDEFINED} and summary.keys() == result.as_dict().keys()
    assert summary["val_metric"] is None and summary["best_epoch"] == 1


def test_a_split_without_any_observed_label_scores_nan_with_its_reason(
    splits: tuple, tmp_path: Path
) -> None:
    train, val, test = splits
    unlabelled = dataclasses.replace(test, y_mask=np.zeros(test.y.shape, dtype=bool))
    # only positives observed: every task has one class among its observed labels
    positives = dataclasses.replace(val, y_mask=val.y == 1)
    assert (positives.y == 1).any()  # some label is observed, so only the classes fail
    with pytest.raises(ValueError, match="no entries to score"):
        roc_auc(np.zeros(test.y.shape), test.y, unlabelled.y_mask)
    config = GraphTrainConfig(epochs=1, batch_size=16)
    result = train_graph_model(
        _model(train), train, positives, unlabelled, config, out_dir=tmp_path
    )
    assert np.isnan(result.val_metric) and np.isnan(result.test_metric)
    assert _log(tmp_path)[0]["test_roc_auc"] is None
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["unscored"] == {
        "val": UNDEFINED,
        "test": "no entries to score: the mask selects nothing (or N = 0)",
    }


def test_scored_splits_leave_no_unscored_note(splits: tuple, tmp_path: Path) -> None:
    train, val, test = splits
    config = GraphTrainConfig(epochs=1, batch_size=16)
    result = train_graph_model(_model(train), train, val, test, config, out_dir=tmp_path)
    assert 0.0 <= result.val_metric <= 1.0
    assert "unscored" not in json.loads((tmp_path / "summary.json").read_text())


def test_a_plateau_schedule_on_an_undefined_metric_is_refused_before_training(
    splits: tuple, tmp_path: Path
) -> None:
    # ReduceLROnPlateau steps on the validation metric: NaN every epoch would never cut the
    # rate, so the run is refused before an epoch, as the node loop refuses it
    train, val, test = splits
    config = GraphTrainConfig(epochs=2, schedule=ReduceLROnPlateau("max"))
    with pytest.raises(ValueError) as err:
        train_graph_model(_model(train), train, val.subset([0]), test, config, out_dir=tmp_path)
    assert str(err.value) == (
        f"ReduceLROnPlateau watches the validation metric, which is undefined here "
        f"({UNDEFINED}): give validation graphs it can score"
    )
    assert not (tmp_path / "log.jsonl").exists()
