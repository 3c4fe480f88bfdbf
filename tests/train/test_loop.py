"""The training loop: determinism, bit-identical resume, divergence errors, logs, summaries."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl.backend import to_numpy
from refimpl.data import contextual_sbm, tree_neighbors_match
from refimpl.diagnostics import grad_norms
from refimpl.models import GAT
from refimpl.train import (
    TrainConfig,
    TrainingDiverged,
    guards,
    load_checkpoint,
    relative_grad_norms,
    run_seeds,
    summarize,
    train_model,
)


@pytest.fixture(scope="module")
def dataset() -> object:
    return contextual_sbm(60, 3, np.random.default_rng(0), feature_dim=6)


def small_model(dataset: object, **kwargs: object) -> GAT:
    settings = {"heads": 2, "version": "v1", "dropout": 0.3, "attn_dropout": 0.3, **kwargs}
    return GAT(dataset.num_features, 4, dataset.num_classes, 2, **settings)


def test_same_seed_same_run(dataset: object) -> None:
    config = TrainConfig(epochs=6, seed=3)
    a = train_model(small_model(dataset), dataset, config)
    b = train_model(small_model(dataset), dataset, config)
    assert (a.best_epoch, a.val_acc, a.test_acc, a.final_train_loss) == (
        b.best_epoch,
        b.val_acc,
        b.test_acc,
        b.final_train_loss,
    )
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    c = train_model(small_model(dataset), dataset, TrainConfig(epochs=6, seed=4))
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_resumed_run_is_bit_identical(dataset: object, tmp_path: Path, optimizer: str) -> None:
    # Dropout, Adam's moments and the parameters must all be restored: a run
    # "interrupted" after 7 epochs and resumed must end exactly as one never stopped.
    data64 = dataset.astype(np.float64)
    config = TrainConfig(epochs=12, optimizer=optimizer, lr=0.01, checkpoint_every=7, seed=1)
    full = train_model(small_model(data64), data64, config, out_dir=tmp_path / "full")
    interrupted = TrainConfig(**{**config.__dict__, "epochs": 7})
    train_model(small_model(data64), data64, interrupted, out_dir=tmp_path / "part")
    resumed = train_model(
        small_model(data64),
        data64,
        config,
        out_dir=tmp_path / "part",
        resume=tmp_path / "part" / "checkpoint.npz",
    )
    for name in full.params:
        np.testing.assert_array_equal(resumed.params[name], full.params[name])
    assert resumed.as_dict() == full.as_dict()
    with (
        np.load(tmp_path / "full" / "final.npz") as a,
        np.load(tmp_path / "part" / "final.npz") as b,
    ):
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    assert (tmp_path / "full" / "log.jsonl").read_text() == (
        tmp_path / "part" / "log.jsonl"
    ).read_text()


def test_checkpoint_holds_everything_and_no_temporary_files(
    dataset: object, tmp_path: Path
) -> None:
    config = TrainConfig(epochs=4, checkpoint_every=2)
    result = train_model(small_model(dataset), dataset, config, out_dir=tmp_path)
    params, opt_state, rng_state, progress = load_checkpoint(tmp_path / "checkpoint.npz")
    assert list(params) == list(result.params) and progress["epoch"] == 4
    assert int(opt_state["step"]) == 4 and "bit_generator" in rng_state
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.npz",
        "final.npz",
        "log.jsonl",
        "summary.json",
    ]


def test_resume_refuses_another_model(dataset: object, tmp_path: Path) -> None:
    train_model(
        small_model(dataset), dataset, TrainConfig(epochs=2, checkpoint_every=1), out_dir=tmp_path
    )
    with pytest.raises(ValueError, match="same model configuration"):
        train_model(
            small_model(dataset, heads=3),
            dataset,
            TrainConfig(epochs=3),
            resume=tmp_path / "checkpoint.npz",
        )
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train_model(
            small_model(dataset), dataset, TrainConfig(epochs=3), resume=tmp_path / "missing.npz"
        )


# lr = 1e30 overflows on purpose; NumPy warns on the way to the error under test
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_names_epoch_and_layer(dataset: object) -> None:
    config = TrainConfig(epochs=50, optimizer="sgd", lr=1e30)
    with pytest.raises(TrainingDiverged, match=r"epoch \d+: .*layer\d"):
        train_model(small_model(dataset, dropout=0.0, attn_dropout=0.0), dataset, config)


def test_loss_threshold_stops_early(dataset: object) -> None:
    result = train_model(small_model(dataset), dataset, TrainConfig(epochs=50, loss_threshold=10.0))
    assert result.epochs_run == 1 and result.final_train_loss < 10.0


def test_log_lines_and_selection(dataset: object, tmp_path: Path) -> None:
    result = train_model(small_model(dataset), dataset, TrainConfig(epochs=5), out_dir=tmp_path)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(5))
    assert set(records[0]) == {
        "epoch",
        "train_loss",
        "train_acc",
        "val_acc",
        "test_acc",
        "grad_norms",
        "grad_abs",
    }
    assert set(records[0]["grad_norms"]) == {"layer0", "layer1"}
    for layer, norms in records[0]["grad_abs"].items():
        relative = records[0]["grad_norms"][layer]
        assert set(norms) == set(relative) == {"feature", "attention"}
        assert all(norms[kind] > 0 for kind in norms)
    best = max(records, key=lambda r: (r["val_acc"], -r["epoch"]))
    assert (result.best_epoch, result.val_acc, result.test_acc) == (
        best["epoch"],
        best["val_acc"],
        best["test_acc"],
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["best_epoch"] == result.best_epoch


def test_without_validation_nodes_the_last_epoch_is_selected(tmp_path: Path) -> None:
    # TREES with train_fraction=1 has no validation or test roots (the paper reports the
    # training accuracy): those splits score NaN (null in the log) and the run reports its
    # last epoch.
    trees = tree_neighbors_match(2, 20, seed=0)
    assert not trees.val_mask.any() and not trees.test_mask.any()
    model = GAT(trees.num_features, 4, trees.num_classes, 3, version="v1")
    result = train_model(model, trees, TrainConfig(epochs=4), out_dir=tmp_path)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert result.best_epoch == 3 and math.isnan(result.val_acc) and math.isnan(result.test_acc)
    assert all(r["val_acc"] is None and 0 <= r["train_acc"] <= 1 for r in records)


def test_an_empty_training_mask_is_refused(dataset: object) -> None:
    no_train = np.zeros_like(dataset.train_mask)
    empty = dataset.with_masks(no_train, dataset.val_mask, dataset.test_mask)
    with pytest.raises(ValueError, match="train_mask selects no node"):
        train_model(small_model(dataset), empty, TrainConfig(epochs=1))


def test_relative_grad_norms_by_hand() -> None:
    params = {
        "layer0.W": np.array([[3.0, 4.0]]),
        "layer0.att": np.zeros((1, 2)),
        "layer0.bias": np.ones(2),
        "layer1.W_s": np.array([[1.0, 0.0]]),
        "layer1.res_W": np.array([[0.0, 1.0]]),
    }
    grads = {
        "layer0.W": np.array([[0.3, 0.4]]),
        "layer0.att": np.ones((1, 2)),
        "layer0.bias": np.ones(2),
        "layer1.W_s": np.array([[2.0, 0.0]]),
        "layer1.res_W": np.array([[0.0, 2.0]]),
    }
    norms = relative_grad_norms(params, grads)
    assert norms["layer0"] == {"feature": pytest.approx(0.1), "attention": None}
    assert norms["layer1"] == {"feature": pytest.approx(2.0)}
    absolute = grad_norms(params, grads)  # ||grad|| alone: defined at zero parameters too
    assert absolute["layer0"] == {"feature": pytest.approx(0.5), "attention": pytest.approx(2**0.5)}
    assert absolute["layer1"] == {"feature": pytest.approx(8**0.5)}


def test_several_seeds_get_their_own_directories(dataset: object, tmp_path: Path) -> None:
    summary = run_seeds(
        lambda: small_model(dataset),
        dataset,
        TrainConfig(epochs=3),
        [0, 1, 2],
        tmp_path,
        extra={"note": "test"},
    )
    for seed in (0, 1, 2):
        assert (tmp_path / f"seed{seed}" / "final.npz").is_file()
        assert (tmp_path / f"seed{seed}" / "summary.json").is_file()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    for key in ("test_acc_mean", "test_acc_ci95", "val_acc_mean", "epochs_to_best_mean", "runs"):
        assert key in saved
    assert [run["seed"] for run in saved["runs"]] == [0, 1, 2]
    assert saved["config"] == {"note": "test"}


def test_confidence_interval_is_student_t() -> None:
    from scipy import stats

    from refimpl.train import RunResult

    accuracies = [0.80, 0.82, 0.85, 0.79, 0.81]
    results = [RunResult(s, s, 0.5, a, 10, 0.1, {}) for s, a in enumerate(accuracies)]
    summary = summarize(results)
    half = stats.t.ppf(0.975, 4) * np.std(accuracies, ddof=1) / math.sqrt(5)
    assert summary["test_acc_mean"] == pytest.approx(np.mean(accuracies), rel=1e-15)
    assert summary["test_acc_ci95"] == pytest.approx(half, rel=1e-12)
    assert summary["epochs_to_best_mean"] == pytest.approx(3.0)
    assert summarize(results[:1])["test_acc_ci95"] is None


# The table said "best epoch 113" (the 0-based index) while the line under it said "mean
# epochs to best 114.0" (a count) for the same run.
def test_the_table_and_its_summary_line_count_epochs_alike() -> None:
    from refimpl.train import RunResult
    from refimpl.train.experiment import format_summary

    text = format_summary(summarize([RunResult(0, 113, 0.5, 0.8, 200, 0.1, {})]))
    header, row, line = text.splitlines()
    assert "epochs to best" in header and row.split()[:2] == ["0", "114"]
    assert line.endswith("mean epochs to best 114.0")


def test_training_on_the_strict_backend_matches_numpy(dataset: object) -> None:
    # The whole step (model, loss, optimiser, metrics) runs without a stray NumPy call, and
    # gives the numbers of the NumPy run up to summation order.
    config = TrainConfig(epochs=4, seed=2)
    host = train_model(small_model(dataset), dataset, config)
    device = train_model(small_model(dataset), dataset, config, backend="strict")
    assert (device.best_epoch, device.val_acc, device.test_acc) == (
        host.best_epoch,
        host.val_acc,
        host.test_acc,
    )
    assert device.final_train_loss == pytest.approx(host.final_train_loss, rel=1e-12)
    for name, value in host.params.items():
        np.testing.assert_allclose(to_numpy(device.params[name]), value, rtol=1e-10, atol=1e-12)


def test_diagnostics_log_balance_and_change_and_resume_identically(
    dataset: object, tmp_path: Path
) -> None:
    # With diagnostics each log line carries c and the conservation residual of the
    # parameters the gradient was taken at; a resumed run must rebuild the same
    # initial/best parameters, so changes.json matches the uninterrupted run.
    data64 = dataset.astype(np.float64)

    def model() -> GAT:
        return GAT(data64.num_features, 4, data64.num_classes, 3, heads=2)

    config = TrainConfig(
        epochs=8, optimizer="sgd", lr=0.1, init="Bal_O", checkpoint_every=5, diagnostics=True
    )
    train_model(model(), data64, config, out_dir=tmp_path / "full")
    train_model(
        model(), data64, TrainConfig(**{**config.__dict__, "epochs": 5}), out_dir=tmp_path / "part"
    )
    train_model(
        model(),
        data64,
        config,
        out_dir=tmp_path / "part",
        resume=tmp_path / "part" / "checkpoint.npz",
    )
    for name in ("log.jsonl", "changes.json"):
        assert (tmp_path / "full" / name).read_text() == (tmp_path / "part" / name).read_text()
    records = [json.loads(line) for line in (tmp_path / "full" / "log.jsonl").open()]
    first = records[0]
    assert set(first["balancedness"]) == set(first["conservation"]) == {"layer0", "layer1"}
    # Bal_O: balanced at the start, to rounding; the law holds at every epoch.
    assert all(abs(b["sum"]) < 1e-12 for b in first["balancedness"].values())
    assert all(r <= 1e-10 for rec in records for r in rec["conservation"].values())
    changes = json.loads((tmp_path / "full" / "changes.json").read_text())
    assert set(changes) == {"0.0", "0.05", "0.5"}
    assert set(changes["0.0"]["layer0"]) == {"feature", "attention"}
    with np.load(tmp_path / "full" / "initial.npz") as initial:
        assert not np.any(initial["layer0.att"])  # Bal_O starts with zero attention


def test_resume_with_diagnostics_needs_the_saved_parameters(
    dataset: object, tmp_path: Path
) -> None:
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2)
    config = TrainConfig(epochs=4, checkpoint_every=2)
    train_model(model, dataset, config, out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"initial\.npz"):
        train_model(
            model,
            dataset,
            TrainConfig(**{**config.__dict__, "diagnostics": True}),
            out_dir=tmp_path,
            resume=tmp_path / "checkpoint.npz",
        )


# Float32 Adam at lr 1e6 ran to a loss of 1e13 and exited 0: the loop stopped only on
# non-finite numbers, and its divergence test (SGD at lr 1e30) overflowed the parameters
# themselves, so a loss that grew by orders of magnitude while staying finite was never met.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_adam_at_a_huge_learning_rate_stops_on_loss_growth(dataset: object, tmp_path: Path) -> None:
    data32 = dataset.astype(np.float32)
    config = TrainConfig(epochs=30, lr=1e6)
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 1: loss \S+e\+\d\d is over 1e\+04 times that of an all-zero output "
        r"\(1\.099\); the largest gradient is in layer\d \(layer\d\.\w+\)",
    ):
        train_model(small_model(data32), data32, config, out_dir=tmp_path)
    # nothing lost: epoch 0's record is there, in strict JSON
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0]


# With the loss rule out of the way the same run froze: float32 Adam's second moment v
# overflowed to infinity, its update became exactly 0 there, and nothing checked the
# optimiser's state (only gradients and parameters, both finite). Features scaled by 1e24
# make the first gradients ~1e25: finite, with g^2 over float32's range at epoch 0. (At
# lr 1e6 on unscaled features the overflow came or not by the luck of float32 rounding in
# a chaotic run: with numpy 2.4.6's BLAS it never came in 200 epochs.)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_overflowing_adam_state_stops_naming_the_state_entry(
    dataset: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guards, "LOSS_GROWTH", math.inf)
    data32 = dataset.astype(np.float32)
    data32 = dataclasses.replace(data32, x=data32.x * np.float32(1e24))
    with pytest.raises(
        TrainingDiverged,
        match=r"^epoch 0: the update made the optimiser state of layer\d non-finite "
        r"\(v\.layer\d\.\w+\); lower the learning rate$",
    ):
        train_model(small_model(data32), data32, TrainConfig(epochs=5, lr=1e-2))


# log.jsonl held the bare word NaN (accuracy of an empty split), which is not JSON: jq,
# JavaScript and most readers outside Python refuse the line. Python's json.loads accepts
# NaN, so every test that read the log back passed.
def test_log_is_strict_json_with_null_for_nan(tmp_path: Path) -> None:
    trees = tree_neighbors_match(2, 20, seed=0)  # no validation or test nodes: NaN scores
    model = GAT(trees.num_features, 4, trees.num_classes, 2, version="v1")
    train_model(model, trees, TrainConfig(epochs=2), out_dir=tmp_path)

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON")

    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    assert [(r["val_acc"], r["test_acc"]) for r in records] == [(None, None)] * 2


class Terminal(io.StringIO):
    """A stream that says it is a terminal, where the progress bar draws."""

    def isatty(self) -> bool:
        return True


def test_the_progress_bar_names_its_seed(dataset: object, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run_seeds(lambda: small_model(dataset), dataset, TrainConfig(epochs=2), [7], progress=True)
    assert "seed 7" in terminal.getvalue()
