"""Learning-rate schedules in the node-level loop and its checkpoints: a run cut at epoch k and
resumed ends with the parameters and the learning-rate sequence of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from refimpl.data import contextual_sbm
from refimpl.models import GAT
from refimpl.schedules import MultiStepLR, ReduceLROnPlateau
from refimpl.train import TrainConfig, read_checkpoint, save_checkpoint, train_model
from refimpl.train.run_folder import read_log


@pytest.fixture(scope="module")
def dataset() -> object:
    return contextual_sbm(40, 3, np.random.default_rng(0), feature_dim=5).astype(np.float64)


def gat(dataset: object) -> GAT:
    return GAT(dataset.num_features, 4, dataset.num_classes, 2, heads=2, dropout=0.3)


def lrs(folder: Path) -> list[float]:
    return [record["lr"] for record in read_log(folder / "log.jsonl")]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_plateau_resumed_at_epoch_k_continues_bit_for_bit(
    dataset: object, tmp_path: Path, mode: str
) -> None:
    # No epoch improves by the absolute threshold 10 after the first, so with patience 1 and
    # cooldown 1 the rate halves after epochs 2, 5 and 8 (worked by hand below). Cut at
    # epoch 5, one bad epoch is counted: a resume that restarted the schedule (or lost best,
    # num_bad_epochs or cooldown_counter) would log another sequence.
    schedule = ReduceLROnPlateau(
        mode, 0.5, patience=1, threshold=10.0, threshold_mode="abs", cooldown=1
    )
    settings = {"lr": 0.05, "seed": 1, "schedule": schedule, "checkpoint_every": 5}
    model = gat(dataset)
    full = train_model(model, dataset, TrainConfig(epochs=10, **settings), out_dir=tmp_path / "a")
    train_model(model, dataset, TrainConfig(epochs=5, **settings), out_dir=tmp_path / "b")
    resumed = train_model(
        model,
        dataset,
        TrainConfig(epochs=10, **settings),
        out_dir=tmp_path / "b",
        resume=tmp_path / "b/checkpoint.npz",
    )
    for name, value in full.params.items():
        np.testing.assert_array_equal(resumed.params[name], value)
    assert resumed.final_train_loss == full.final_train_loss
    assert (
        lrs(tmp_path / "a")
        == lrs(tmp_path / "b")
        == [0.05] * 3 + [0.025] * 3 + [0.0125] * 3 + [0.00625]
    )


def test_the_schedule_changes_the_run(dataset: object) -> None:
    # The scheduled rate reaches the optimiser: a milestone at the first epoch changes the
    # parameters against an unscheduled run, which equals a schedule that never fires.
    model = gat(dataset)
    plain = train_model(model, dataset, TrainConfig(epochs=3, lr=0.05))
    never = TrainConfig(epochs=3, lr=0.05, schedule=MultiStepLR([50]))
    at_once = TrainConfig(epochs=3, lr=0.05, schedule=MultiStepLR([1]))
    for name, value in plain.params.items():
        np.testing.assert_array_equal(train_model(model, dataset, never).params[name], value)
    changed = train_model(model, dataset, at_once).params
    assert any(not np.array_equal(changed[name], plain.params[name]) for name in plain.params)


def test_resuming_with_another_schedule_setting_is_refused(dataset: object, tmp_path: Path) -> None:
    model = gat(dataset)
    scheduled = TrainConfig(epochs=2, checkpoint_every=1, schedule=MultiStepLR([1]))
    train_model(model, dataset, scheduled, out_dir=tmp_path / "s")
    train_model(model, dataset, TrainConfig(epochs=2, checkpoint_every=1), out_dir=tmp_path / "p")
    with pytest.raises(ValueError, match="holds a learning-rate schedule's state but the run"):
        train_model(model, dataset, TrainConfig(epochs=3), resume=tmp_path / "s/checkpoint.npz")
    with pytest.raises(ValueError, match="written without a learning-rate schedule"):
        train_model(
            model,
            dataset,
            TrainConfig(epochs=3, schedule=MultiStepLR([1])),
            resume=tmp_path / "p/checkpoint.npz",
        )
    plateau = TrainConfig(epochs=3, schedule=ReduceLROnPlateau())
    with pytest.raises(ValueError, match=r"schedule state does not fit: .*saved by another"):
        train_model(model, dataset, plateau, resume=tmp_path / "s/checkpoint.npz")


def test_schedule_state_round_trips_exactly_and_damage_is_refused(tmp_path: Path) -> None:
    params = {"W": np.ones((2, 2))}
    progress = {"epoch": 1, "best": {"epoch": 0, "val": 0.5}, "train_loss": 1.0}
    state = ReduceLROnPlateau().init(0.1) | {"lr": 0.1 * 0.1, "best": 0.7 * 3}  # inexact floats
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, params, {}, np.random.default_rng(0), progress, None, state)
    read = read_checkpoint(path).schedule_state
    assert read == state and all(type(read[k]) is type(v) for k, v in state.items())
    save_checkpoint(path, params, {}, np.random.default_rng(0), progress, None, {"lr": np.nan})
    with pytest.raises(ValueError, match="schedule entry lr must be a 0-d number"):
        read_checkpoint(path)


def test_bad_schedule_settings_are_refused_in_one_line(dataset: object) -> None:
    with pytest.raises(TypeError, match="schedule must be None, MultiStepLR or ReduceLROnPlateau"):
        TrainConfig(schedule="plateau")
    with pytest.raises(ValueError, match="schedule_every must be 'epoch' or 'batch'"):
        TrainConfig(schedule=MultiStepLR([1]), schedule_every="step")
    with pytest.raises(ValueError, match="watches a validation metric, measured once per epoch"):
        TrainConfig(schedule=ReduceLROnPlateau(), schedule_every="batch")
    no_val = dataset.with_masks(dataset.train_mask, np.zeros(40, bool), dataset.test_mask)
    config = TrainConfig(epochs=1, schedule=ReduceLROnPlateau())
    with pytest.raises(ValueError, match="watches the validation split, but val_mask is empty"):
        train_model(gat(dataset), no_val, config)
