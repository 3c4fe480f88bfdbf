"""The command line: demo, train (seeds, resume, divergence), sweep and plot, end to end."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.cli.options import load_data

FAST = ["--epochs", "4", "--no-progress", "--hidden", "4"]


def test_no_command_prints_help(capsys: pytest.CaptureFixture) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_demo_runs_and_trains(capsys: pytest.CaptureFixture) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "all within 1e-06" in out and "best validation accuracy" in out


def test_demo_runs_under_a_device_backend(capsys: pytest.CaptureFixture) -> None:
    """With a device backend selected globally (REFIMPL_BACKEND=cupy), the demo's host part
    stays on NumPy and its training run moves to the device; it mixed the two before."""
    from refimpl.backend import use_backend

    with use_backend("strict"):
        assert main(["demo"]) == 0
    assert "backend strict" in capsys.readouterr().out


def test_train_with_sparse_features_logs_the_dense_curve(tmp_path: Path) -> None:
    logs = []
    for flags in ([], ["--sparse-features"]):
        out = tmp_path / ("sparse" if flags else "dense")
        assert main(["train", *FAST, "--dtype", "float64", "--out", str(out), *flags]) == 0
        lines = (out / "log.jsonl").read_text().splitlines()
        logs.append([json.loads(line)["train_loss"] for line in lines])
    assert logs[1] == pytest.approx(logs[0], rel=1e-12)


def test_sparse_features_are_for_gat(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", *FAST, "--model", "nodeformer", "--sparse-features"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["refimpl train: error: --sparse-features is for --model gat, not nodeformer"]
    assert not (tmp_path / "runs").exists()  # refused before a run folder was made


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_data_that_does_not_load_leaves_no_run_folder(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A new run's folder is made once its data loaded: a missing file is one line, and no
    empty run folder is left where the next attempt would need --overwrite."""
    dataset = ["--dataset", "cora"] if command == "train" else ["--datasets", "cora"]
    out = tmp_path / "run"
    argv = [command, *dataset, "--data-root", str(tmp_path / "none"), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"refimpl {command}: error: "), err
    assert not out.exists()


def test_train_several_seeds_writes_the_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *FAST, "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [run["seed"] for run in summary["runs"]] == [0, 1]
    assert summary["config"]["dataset"] == "csbm"
    for seed in (0, 1):
        with np.load(tmp_path / f"seed{seed}" / "final.npz") as final:
            assert "layer0.W_s" in final.files
    assert "test accuracy at best validation" in capsys.readouterr().out


def test_train_prints_a_line_per_seed_as_it_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["train", *FAST, "--seeds", "3", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    seeds = [line for line in lines if line.startswith("seed ")]
    assert [line.split(":")[0] for line in seeds] == ["seed 3", "seed 1"]
    assert lines.index(seeds[-1]) < next(i for i, s in enumerate(lines) if "test accuracy" in s)
    summary = json.loads((tmp_path / "summary.json").read_text())
    run = summary["runs"][0]
    assert f"after {run['best_epoch'] + 1} epochs, test there {run['test_acc']:.4f}" in seeds[0]
    assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 0
    again = [line for line in capsys.readouterr().out.splitlines() if line.startswith("seed ")]
    assert all(line.endswith("(finished earlier)") for line in again) and len(again) == 2


def test_nodeformer_logs_its_loss_terms_apart(tmp_path: Path) -> None:
    """NodeFormer's training loss holds lambda L_e; the log shows the two parts (the total
    alone hid the edge loss)."""
    assert main(["train", *FAST, "--model", "nodeformer", "--out", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    for record in records:
        parts = record["supervised_loss"] + record["auxiliary_loss"]
        assert parts == pytest.approx(record["train_loss"], rel=1e-12)
        assert record["auxiliary_loss"] > 0  # lambda = 1: the edge loss is there
    assert main(["train", *FAST, "--out", str(tmp_path / "gat")]) == 0
    gat = json.loads((tmp_path / "gat" / "log.jsonl").read_text().splitlines()[0])
    assert "auxiliary_loss" not in gat and "supervised_loss" not in gat


def test_train_resume_through_the_command_line(tmp_path: Path) -> None:
    # The same run twice: once straight through, once stopped at epoch 4 and resumed.
    args = ["train", "--no-progress", "--hidden", "4", "--dtype", "float64", "--dropout", "0.2"]
    assert main([*args, "--epochs", "6", "--out", str(tmp_path / "full")]) == 0
    assert (
        main([*args, "--epochs", "4", "--checkpoint-every", "4", "--out", str(tmp_path / "part")])
        == 0
    )
    assert (
        main([*args, "--epochs", "6", "--resume", str(tmp_path / "part" / "checkpoint.npz")]) == 0
    )
    with np.load(tmp_path / "full" / "final.npz") as a:
        with np.load(tmp_path / "part" / "final.npz") as b:
            assert all(np.array_equal(a[k], b[k]) for k in a.files)


# lr = 1e30 overflows on purpose; NumPy warns on the way to the error under test
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_diverging_training_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "train",
            *FAST,
            "--optimizer",
            "sgd",
            "--lr",
            "1e30",
            "--epochs",
            "30",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1
    assert "training diverged: epoch" in capsys.readouterr().out


def test_sweep_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import refimpl.cli.sweep as sweep

    loads = []
    monkeypatch.setattr(sweep, "load_data", lambda *a: loads.append(a[0]) or load_data(*a))
    assert (
        main(["sweep", *FAST, "--depths", "1", "2", "--seeds", "0", "1", "--out", str(tmp_path)])
        == 0
    )
    assert loads == ["csbm"]  # cells run here reuse the data: loaded once, not once per cell
    out = capsys.readouterr().out
    assert "L=1" in out and "L=2" in out and "csbm" in out
    cells = json.loads((tmp_path / "sweep.json").read_text())
    assert [(c["depth"], c["diverged"]) for c in cells] == [(1, False), (2, False)]
    assert (tmp_path / "csbm" / "xavier" / "L2" / "seed1" / "final.npz").is_file()
    # one line per finished cell: its place in the grid, its result, its time, the time left
    progress = [line.strip() for line in out.splitlines() if line.strip().startswith("[")]
    first = rf"\[1/2\] csbm xavier L=1: test {100 * cells[0]['test_acc_mean']:.1f}% "
    assert re.fullmatch(first + r"\(\d+\.\d s; about \d+\.\d s left\)", progress[0])
    assert re.fullmatch(
        r"\[2/2\] csbm xavier L=2: test \d+\.\d% \(\d+\.\d s; the last\)", progress[1]
    )


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib")
def test_plot_draws_curves_and_heat_map(tmp_path: Path) -> None:
    assert main(["train", *FAST, "--layers", "3", "--out", str(tmp_path)]) == 0
    assert main(["plot", str(tmp_path)]) == 0
    for name in ("curves.png", "grad_norms.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("init", ["Bal_O", "Bal_X", "Xav", "Bal_LLidentity"])
def test_diagnostics_run_is_plotted_with_its_balance(tmp_path: Path, init: str) -> None:
    args = ["train", *FAST, "--layers", "3", "--init", init, "--diagnostics"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "changes.json").is_file() and (tmp_path / "best.npz").is_file()
    pytest.importorskip("matplotlib")
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "balance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_a_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    assert main(["plot", str(tmp_path)]) == 2
    assert re.fullmatch(r"refimpl plot: error: .* has no log\.jsonl; .*\n", capsys.readouterr().err)


def test_file_backed_dataset_without_root_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("REFIMPL_DATA", raising=False)
    assert main(["train", *FAST, "--dataset", "cora", "--data-root", ""]) == 2
    assert re.search(r"refimpl train: error: .*(REFIMPL_DATA|--data-root)", capsys.readouterr().err)


def test_unknown_dataset_lists_the_valid_names(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *FAST, "--dataset", "corra"]) == 2
    err = capsys.readouterr().err
    assert "corra" in err and "cora" in err and "Traceback" not in err
