"""Checkpoints read back only when every field is what the loop wrote: a tampered, truncated or
foreign file is one message naming the file and the field, never a traceback or a silent run."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.data import contextual_sbm
from refimpl.models import GAT
from refimpl.optim import make_optimizer
from refimpl.train import (
    TrainConfig,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    train_model,
)
from refimpl.train.resume import restore_run

RUN = ["train", "--no-progress", "--hidden", "4", "--epochs", "3", "--checkpoint-every", "3"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The arrays of a real checkpoint (three epochs of a small GAT)."""
    out = tmp_path_factory.mktemp("run")
    dataset = contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=4)
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
    train_model(model, dataset, TrainConfig(epochs=3, checkpoint_every=3), out_dir=out)
    with np.load(out / "checkpoint.npz") as archive:
        return {k: archive[k] for k in archive.files}


def progress_with(**changes: object) -> Callable[[dict], None]:
    def change(arrays: dict) -> None:
        progress = json.loads(str(arrays["progress"]))
        progress.update(changes)
        arrays["progress"] = np.array(json.dumps(progress))

    return change


def drop(key: str) -> Callable[[dict], None]:
    return lambda arrays: arrays.pop(key)


def put(key: str, value: object) -> Callable[[dict], None]:
    return lambda arrays: arrays.__setitem__(key, np.asarray(value))


TAMPERED = {
    # progress
    "negative epoch": (progress_with(epoch=-3), r"progress must be"),
    "float epoch": (progress_with(epoch=1e6), r"progress must be"),
    "best after epoch": (
        progress_with(best={"epoch": 7, "val_acc": 0.5, "test_acc": 0.5}),
        r"progress must be",
    ),
    "loss a string": (progress_with(train_loss="low"), r"progress must be"),
    "progress not json": (put("progress", "{epoch"), r"progress is not valid JSON"),
    "progress an array": (put("progress", [1, 2]), r"progress must be a 0-d string"),
    # entries
    "no progress": (drop("progress"), r"missing \['progress'\]"),
    "no rng state": (drop("rng_state"), r"missing \['rng_state'\]"),
    "foreign entry": (put("weights", [1.0]), r"unexpected entries \['weights'\]"),
    "rng state garbage": (
        put("rng_state", json.dumps({"bit_generator": "MT19937"})),
        r"rng_state is not a PCG64",
    ),
    "integer parameter": (
        put("param/layer0.W_s", np.ones((4, 4), np.int64)),
        r"parameter layer0\.W_s must be a finite floating",
    ),
    "nan parameter": (put("param/layer0.W_s", np.full((4, 4), np.nan)), r"with NaN/inf"),
    # model state (BatchNorm's running statistics) is held to the parameters' standard
    "nan model state": (
        put("state/layer0.node.norm1.running_var", np.full(4, np.nan)),
        r"model state entry layer0\.node\.norm1\.running_var must be a finite floating",
    ),
    "integer model state": (
        put("state/norm.running_mean", np.zeros(4, np.int64)),
        r"model state entry norm\.running_mean must be a finite floating",
    ),
    "string optimiser entry": (put("opt/step", "3"), r"optimiser entry step has dtype"),
    # issue 33: inf in the optimiser's state was accepted, and the first step made NaN
    "inf optimiser moment": (
        put("opt/m.layer0.W_s", np.full((4, 4), np.inf)),
        r"optimiser entry m\.layer0\.W_s holds NaN or infinity",
    ),
    "nan optimiser moment": (
        put("opt/v.layer0.W_s", np.full((4, 4), np.nan)),
        r"optimiser entry v\.layer0\.W_s holds NaN or infinity",
    ),
    "float step": (put("opt/step", 3.0), r"optimiser entry step must be a 0-d integer >= 0"),
    "negative step": (put("opt/step", -1), r"optimiser entry step must be a 0-d integer >= 0"),
    "data not a string": (progress_with(data=5), r"progress must be"),
    # the reliability harness: a NaN loss was accepted, a negative state an OverflowError
    "loss nan": (progress_with(train_loss=math.nan), r"progress must be"),
    "rng state negative": (
        put(
            "rng_state",
            json.dumps(
                {
                    "bit_generator": "PCG64",
                    "state": {"state": -1, "inc": 1},
                    "has_uint32": 0,
                    "uinteger": 0,
                }
            ),
        ),
        r"rng_state is not a PCG64",
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_checkpoint_is_refused_naming_file_and_field(
    saved: dict[str, np.ndarray], tmp_path: Path, case: str
) -> None:
    # Checkpoint contents were not validated: `epoch: -3` ran, `epoch: 1e6` "finished", missing
    # keys and wrong types gave tracebacks from deep inside the loop.
    change, message = TAMPERED[case]
    arrays = dict(saved)
    change(arrays)
    path = tmp_path / "checkpoint.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message) as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"is empty"),
        (b"not a zip archive at all", r"not a readable \.npz"),
        (b"PK\x03\x04" + b"\x00" * 40, r"not a readable \.npz"),
    ],
    ids=["empty", "text", "zip header only"],
)
def test_a_checkpoint_that_is_not_an_npz_is_one_message(
    tmp_path: Path, content: bytes, message: str
) -> None:
    # An empty, truncated or non-zip file gave tracebacks, and a non-zip file NumPy's advice
    # to load it with allow_pickle (which would run code from the file).
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        load_checkpoint(path)
    assert "allow_pickle" not in str(caught.value)


def test_a_truncated_checkpoint_is_one_message(saved: dict, tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    np.savez(path, **saved)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_checkpoint(path)


def test_a_pickled_object_in_a_checkpoint_is_refused_without_running_it(
    saved: dict, tmp_path: Path
) -> None:
    path = tmp_path / "checkpoint.npz"
    np.savez(path, **{**saved, "opt/step": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_checkpoint(path)


def test_a_checkpoint_past_the_epochs_asked_for_is_refused(saved: dict, tmp_path: Path) -> None:
    # `epoch: 1e6` (as an integer) "finished" at once with exit 0.
    arrays = dict(saved)
    progress_with(epoch=10**6)(arrays)
    path = tmp_path / "checkpoint.npz"
    np.savez(path, **arrays)
    dataset = contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=4)
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
    with pytest.raises(ValueError, match=r"is at epoch 1000000, past the 5 epochs asked for"):
        train_model(model, dataset, TrainConfig(epochs=5), resume=path)


def test_a_checkpoint_of_another_optimiser_is_refused(saved: dict, tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    np.savez(path, **saved)
    dataset = contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=4)
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
    with pytest.raises(ValueError, match=r"optimiser state does not fit"):
        train_model(model, dataset, TrainConfig(epochs=5, optimizer="sgd"), resume=path)


def test_the_cli_resuming_a_damaged_checkpoint_prints_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([*RUN, "--out", str(tmp_path)]) == 0
    (tmp_path / "summary.json").unlink()
    checkpoint = tmp_path / "checkpoint.npz"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path), "--epochs", "4"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"refimpl train: error: [^\n]*checkpoint\.npz[^\n]*\n", err)


def test_a_resume_on_other_data_is_refused_naming_the_checkpoint(tmp_path: Path) -> None:
    # The checkpoint did not record the data it was trained on: resuming on other data trained
    # half on one dataset and half on another, without a word.
    dataset = contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=4)
    other = contextual_sbm(40, 2, np.random.default_rng(1), feature_dim=4)
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
    config = TrainConfig(epochs=2, checkpoint_every=1)
    train_model(model, dataset, config, out_dir=tmp_path)
    checkpoint = tmp_path / "checkpoint.npz"
    longer = TrainConfig(epochs=4, checkpoint_every=1)
    with pytest.raises(ValueError, match="was written training on other data") as caught:
        train_model(model, other, longer, out_dir=tmp_path, resume=checkpoint)
    assert str(checkpoint) in str(caught.value)
    renamed = dataset.with_masks(dataset.train_mask, dataset.val_mask, dataset.test_mask)
    train_model(model, renamed, longer, out_dir=tmp_path, resume=checkpoint)  # the same data


def test_a_negative_second_moment_in_the_adam_state_is_refused(saved: dict) -> None:
    from refimpl.optim import Adam

    params = {k.removeprefix("param/"): v for k, v in saved.items() if k.startswith("param/")}
    state = {k.removeprefix("opt/"): v for k, v in saved.items() if k.startswith("opt/")}
    state["v.layer0.W_s"] = -np.abs(state["v.layer0.W_s"]) - 1.0
    with pytest.raises(ValueError, match=r"state\['v\.layer0\.W_s'\] holds negative second"):
        Adam(lr=0.01).load_state(state, params)


def test_model_state_round_trips_and_a_resume_checks_it_against_the_model(tmp_path: Path) -> None:
    # A model with state beside its parameters (BatchNorm's running statistics) must resume
    # with the statistics it had, not fresh ones: they are saved as state/<name> and checked
    # against the model's own names, shapes and dtypes on resume.
    params = {"W": np.arange(6.0).reshape(2, 3)}
    state = {"norm.running_mean": np.array([0.5, -1.0]), "norm.running_var": np.array([2.0, 3.0])}
    optimizer = make_optimizer("adam", lr=0.1)
    rng = np.random.default_rng(3)
    progress = {"epoch": 2, "best": {"epoch": 1, "val": 0.5}, "train_loss": 1.0}
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, params, optimizer.init(params), rng, progress, state)
    read = read_checkpoint(path)
    assert list(read.model_state) == list(state)
    for name, value in state.items():
        np.testing.assert_array_equal(read.model_state[name], value)
    assert len(load_checkpoint(path)) == 4  # the four-part reader is unchanged
    fresh = {name: np.zeros_like(value) for name, value in state.items()}
    restored = restore_run(path, params, optimizer, np.random.default_rng(), 5, None, fresh)
    restored_var = restored.model_state["norm.running_var"]
    np.testing.assert_array_equal(restored_var, state["norm.running_var"])
    with pytest.raises(ValueError, match=r"holds model state .* but the model has \[\]"):
        restore_run(path, params, optimizer, np.random.default_rng(), 5, None, None)
    wider = {name: np.zeros(3) for name in state}
    with pytest.raises(ValueError, match=r"norm\.running_mean is float64\(2,\), the model"):
        restore_run(path, params, optimizer, np.random.default_rng(), 5, None, wider)
