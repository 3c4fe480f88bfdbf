"""The progress bar draws on a terminal only: a run whose output goes to a file or a pipe wrote
hundreds of carriage-return updates into it (49 KB for one graph-level run); ``--no-progress``
hides it on a terminal too, on every training command."""

from __future__ import annotations

import io
import sys
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


class Terminal(io.StringIO):
    """Standard error as a terminal shows it: tqdm draws its bar where ``isatty()`` is true."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--model", "gat"],
        ["train", "--model", "graph_transformer", "--graphs", "20"],
        ["sweep", "--depths", "1", "--seeds", "0"],
    ],
)
def test_no_progress_hides_the_bar_on_a_terminal_too(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --no-progress must reach every training loop the commands run; the test above only
    # shows the bar off where it turns itself off. On a terminal the bar is drawn (the
    # stand-in can fail), and --no-progress leaves standard error without it.
    for flags, drawn in (([], True), (["--no-progress"], False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        out = tmp_path / f"run{len(flags)}"
        assert main([*command, "--epochs", "3", *flags, "--out", str(out)]) == 0
        monkeypatch.undo()
        assert ("\r" in terminal.getvalue()) is drawn, terminal.getvalue()  # tqdm redraws
