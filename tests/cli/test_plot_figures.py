"""``refimpl plot``'s figures read through matplotlib's objects (issue 26): titles, axis labels,
legends, colour-bar labels, the best epoch marked, and the seed aggregate's numbers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main

pytest.importorskip("matplotlib")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg

from refimpl.cli import plot, run_log


def record(epoch: int, val: float, loss: float = 1.0) -> dict:
    return {
        "epoch": epoch, "train_loss": loss, "train_acc": 0.5, "val_acc": val,
        "test_acc": val / 2, "grad_norms": {},
    }  # fmt: skip


def legend_texts(axis) -> list[str]:
    return [text.get_text() for text in axis.get_legend().get_texts()]


def test_the_best_epoch_is_the_first_highest_validation_or_the_last_without_one() -> None:
    values = [0.1, 0.7, 0.3, 0.7, 0.2]
    assert run_log.best_epoch([record(i, v) for i, v in enumerate(values)]) == 1
    assert run_log.best_epoch([record(i, math.nan) for i in range(4)]) == 3


def test_curves_name_the_run_and_mark_the_best_epoch() -> None:
    records = [record(i, v, loss=2.0 / (i + 1)) for i, v in enumerate([0.2, 0.6, 0.5])]
    figure = plot.curves_figure(plt, records, "seed3")
    left, right = figure.axes
    assert figure._suptitle.get_text() == "seed3"
    assert (left.get_title(), right.get_title()) == ("loss", "accuracy (eval mode)")
    assert (left.get_xlabel(), left.get_ylabel()) == ("epoch (0-based)", "training loss")
    assert right.get_ylabel() == "accuracy"
    assert legend_texts(right) == ["train", "val", "test", "best validation (epoch 1)"]
    assert legend_texts(left) == ["training loss", "best validation (epoch 1)"]
    marker = right.get_lines()[-1]
    assert list(marker.get_xdata()) == [1, 1]
    plt.close(figure)


def test_the_seed_aggregate_draws_mean_and_band() -> None:
    logs = {
        f"seed{s}": [record(i, 0.1 * (i + s), loss=1.0 + s) for i in range(4)] for s in range(3)
    }
    logs["seed2"].append(record(4, 0.9))  # a longer seed: only the common epochs are drawn
    figure = plot.seeds_figure(plt, logs, "grid")
    left, right = figure.axes
    assert figure._suptitle.get_text() == "grid: 3 seeds"
    assert "min..max over seeds" in left.get_title() and "min..max" in right.get_title()
    assert legend_texts(right)[:3] == ["train (mean)", "val (mean)", "test (mean)"]
    val_line = right.get_lines()[1]
    expected = np.mean([[0.1 * (i + s) for i in range(4)] for s in range(3)], axis=0)
    np.testing.assert_allclose(val_line.get_ydata(), expected)
    np.testing.assert_allclose(left.get_lines()[0].get_ydata(), [2.0] * 4)  # mean of 1, 2, 3
    bests = [3, 3, 4]  # each seed's last epoch has its highest validation accuracy
    assert legend_texts(left)[-1] == f"mean best epoch {np.mean(bests):.1f}"
    plt.close(figure)


def test_heat_maps_and_balance_have_their_labels(tmp_path: Path, monkeypatch) -> None:
    """Every figure ``refimpl plot`` draws of a --diagnostics run, caught before saving."""
    figures = []
    monkeypatch.setattr(plot, "_save", lambda plt_, figure, path: figures.append(figure) or path)
    assert main(["train", "--epochs", "3", "--no-progress", "--diagnostics", "--out",
                 str(tmp_path)]) == 0  # fmt: skip
    plot.plot_run(tmp_path)
    _, grad_norms, grad_abs, balance = figures
    maps = (
        (grad_norms, "relative gradient norm (feature)", "||grad W|| / ||W||"),
        (grad_abs, "attention vectors' gradient norm", "||grad a||"),
    )
    for heat, quantity, formula in maps:
        axis, colour_bar = heat.axes
        assert axis.get_title() == f"{tmp_path.name}: {quantity} {formula}"
        assert axis.get_ylabel() == "layer" and colour_bar.get_ylabel() == formula
        assert axis.get_xlabel() == "epoch (0-based)"
    left, right = balance.axes
    assert balance._suptitle.get_text() == tmp_path.name
    assert legend_texts(left) == ["layer0 sum"] and legend_texts(right) == ["layer0"]


def test_plot_writes_the_seed_aggregate_for_several_seeds(tmp_path: Path) -> None:
    args = ["train", "--epochs", "3", "--no-progress", "--seeds", "0", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "seeds.png").is_file() and (tmp_path / "seed1" / "curves.png").is_file()


def drawn_past_the_canvas(figure) -> list[float]:
    """How far (inches) what ``figure`` draws reaches past its canvas on each side (left,
    bottom, right, top), as laid out by the last save: the bounding box matplotlib computes
    for ``bbox_inches="tight"``, of every visible text, tick label and axis drawn."""
    drawn = FigureCanvasAgg(figure)  # _save closed it: drawn again as laid out there
    drawn.draw()
    tight, whole = figure.get_tightbbox(drawn.get_renderer()), figure.bbox_inches
    return [whole.x0 - tight.x0, whole.y0 - tight.y0, tight.x1 - whole.x1, tight.y1 - whole.y1]


@pytest.mark.parametrize("layers", ["1", "2"])
def test_colour_bar_label_fits_a_short_heat_map(tmp_path: Path, monkeypatch, layers: str) -> None:
    # The colour bar's label ("gradient norm of the attention parameters") was longer than a
    # heat map of few layers is tall and ran off the canvas; the figure tests read labels
    # through matplotlib's objects, never where they were drawn.
    figures = []
    real_save = plot._save
    monkeypatch.setattr(
        plot,
        "_save",
        lambda plt_, figure, path: figures.append(figure) or real_save(plt_, figure, path),
    )
    args = ["train", "--epochs", "3", "--layers", layers, "--no-progress", "--diagnostics"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    notes: list[str] = []
    plot.plot_run(tmp_path, notes=notes)
    # one layer has no hidden layer: balance.png was an empty figure with an empty legend
    skipped = [f"{tmp_path}: no balance.png: the model has no hidden layer to balance"]
    assert notes == (skipped if layers == "1" else [])
    pixel = 1 / 120  # inches, at the dpi _save writes
    for figure in figures:
        assert max(drawn_past_the_canvas(figure)) < pixel
    colour_bars = [figure.axes[1].get_ylabel() for figure in figures[1:3]]  # the heat maps'
    assert colour_bars == ["||grad W|| / ||W||", "||grad a||"]


def test_a_nodeformer_run_has_no_attention_vectors_to_map(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # grad_abs.png maps the attention vectors' (att*) gradient norms, which a NodeFormer does
    # not have (its attention is W_q, W_k): the figure was an empty heat map. The plot tests
    # drew GAT runs only.
    args = ["train", "--model", "nodeformer", "--epochs", "2", "--layers", "1", "--no-progress"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"wrote {tmp_path / 'curves.png'}",
        f"wrote {tmp_path / 'grad_norms.png'}",
        f"note: {tmp_path}: no grad_abs.png: the model has no attention vectors (att*) to map; "
        "a NodeFormer's attention is its W_q and W_k matrices, in grad_norms.png (--kind feature)",
    ]
    assert not (tmp_path / "grad_abs.png").exists()
    assert main(["plot", "--kind", "attention", str(tmp_path)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert [note.split(": ")[2] for note in notes] == ["no grad_norms.png", "no grad_abs.png"]
