"""Smoke test of ``scripts/massive_activations.py``: a tiny run, its outputs, and a resumed run
that ends where an uninterrupted one does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "massive_activations.py"
TINY = ["--graphs", "40", "--layers", "2", "--hidden", "8", "--heads", "2", "--batch-size", "8"]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("massive_activations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_the_comparison_and_the_plot(script, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    summary = script.main([*TINY, "--epochs", "2", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "comparison.json").read_text()) == json.loads(
        json.dumps(summary, default=float)
    )
    assert (tmp_path / "massive_activations.png").stat().st_size > 0
    assert (tmp_path / "run" / "final.npz").exists()
    layers = [record["layer"] for record in summary["layers"]]
    assert layers == ["layer0.scores", "layer0.output", "layer1.scores", "layer1.output"]
    for record in summary["layers"]:
        for model in ("base", "trained"):
            assert 0.0 <= record[model]["ks_statistic"] <= 1.0
            assert record[model]["max_ratio"] >= 1.0
    printed = capsys.readouterr().out
    assert "KS" in printed and "above 1000" in printed


def test_resumed_run_ends_like_an_uninterrupted_one(script, tmp_path):
    pytest.importorskip("matplotlib")
    full = script.main([*TINY, "--epochs", "10", "--out", str(tmp_path / "full")])
    script.main([*TINY, "--epochs", "5", "--out", str(tmp_path / "part")])
    resumed = script.main([*TINY, "--epochs", "10", "--out", str(tmp_path / "part"), "--resume"])
    assert resumed["layers"] == full["layers"]
    keep = ("best_epoch", "val_metric", "test_metric", "epochs_run", "final_train_loss")
    assert {k: resumed["training"][k] for k in keep} == {k: full["training"][k] for k in keep}


def test_a_second_run_into_the_same_out_is_refused_unless_asked(script, tmp_path):
    # The reproduction scripts wrote a new run over an earlier one in --out.
    pytest.importorskip("matplotlib")
    script.main([*TINY, "--epochs", "1", "--out", str(tmp_path)])
    before = (tmp_path / "comparison.json").read_bytes()
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        script.main([*TINY, "--epochs", "2", "--out", str(tmp_path)])
    assert (tmp_path / "comparison.json").read_bytes() == before
    with pytest.raises(ValueError, match=r"--hidden 16 differs from the resumed run's 8"):
        script.main([*TINY[:4], "--hidden", "16", "--out", str(tmp_path), "--resume"])
    replaced = script.main([*TINY, "--epochs", "2", "--out", str(tmp_path), "--overwrite"])
    assert replaced["training"]["epochs_run"] == 2


@pytest.mark.parametrize(
    ("arch", "streams"),
    [
        ("gt", ["h.attention", "e.attention", "h.output", "e.output"]),
        ("san", ["h.attention", "e.attention", "h.output"]),
    ],
)
def test_the_studys_architectures_report_every_stream(script, tmp_path, arch, streams):
    # issue 34: the ratios and the KS test read each architecture's node and edge streams and
    # its attention products, named as the study's malog_h / malog_e
    pytest.importorskip("matplotlib")
    summary = script.main([*TINY, "--epochs", "1", "--arch", arch, "--out", str(tmp_path)])
    layers = [record["layer"] for record in summary["layers"]]
    assert layers == [f"layer{i}.{name}" for i in range(2) for name in streams]
    assert (tmp_path / "run" / "final_state.npz").exists()  # BatchNorm's statistics
