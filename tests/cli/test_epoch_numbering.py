"""One epoch numbering across what a run prints, stores and draws (issue 36): the 0-based
``epoch`` of ``log.jsonl`` and ``summary.json``'s ``best_epoch``, labelled as such on the command
line (beside the count of epochs run to it) and on the plots' epoch axes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from refimpl.cli import main

pytest.importorskip("matplotlib")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from refimpl.cli import plot

RUNS = {
    "node": ["--epochs", "6"],
    "graph": ["--model", "graph_transformer", "--graphs", "30", "--epochs", "4", "--layers", "1",
              "--hidden", "8", "--heads", "2", "--pe-dim", "2"],
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_the_best_epoch_reads_the_same_in_the_cli_the_summary_and_the_plot(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI printed "best validation ... after 31 epochs" (a count) where the plot marked
    # "epoch 30" (log.jsonl's 0-based index), neither saying which numbering it used; the
    # tests checked each number alone against its own source.
    assert main(["train", *RUNS[kind], "--no-progress", "--out", str(tmp_path)]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("seed 0:"))
    found = re.search(r" at epoch (\d+) \(0-based\), after (\d+) epochs, test there ", line)
    assert found, line
    best = int(found.group(1))
    assert int(found.group(2)) == best + 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"][0]["best_epoch"] == best
    logged = [json.loads(s)["epoch"] for s in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert logged == list(range(len(logged)))  # 0-based, one line per epoch
    figures: list = []
    monkeypatch.setattr(plot, "_save", lambda plt_, figure, path: figures.append(figure) or path)
    plot.plot_run(tmp_path)
    curves = figures[0]
    for axis in curves.axes:
        assert axis.get_xlabel() == "epoch (0-based)"
        assert axis.get_legend().get_texts()[-1].get_text() == f"best validation (epoch {best})"
        assert list(axis.get_lines()[-1].get_xdata()) == [best, best]
    for figure in figures:
        plt.close(figure)
