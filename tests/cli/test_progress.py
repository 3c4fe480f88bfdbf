"""The progress bar draws on a terminal only: a run whose output goes to a file or a pipe wrote
hundreds of carriage-return updates into it (49 KB for one graph-level run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from refimpl.cli import main


@pytest.mark.parametrize(
    "model", [["--model", "gat"], ["--model", "graph_transformer", "--graphs", "20"]]
)
def test_no_progress_bar_where_the_output_is_not_a_terminal(
    model: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # pytest's captured streams are not terminals, as a log file or a pipe is not
    assert main(["train", *model, "--epochs", "3", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err + captured.out
    assert "epoch/s" not in captured.err
