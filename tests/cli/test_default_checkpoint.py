"""A default ``refimpl train`` run checkpoints (issue 36): Ctrl-C part-way, then ``--resume``,
ends as the run never stopped, node level and graph level. ``--checkpoint-every 0`` turns the
checkpoints off, and ``--help`` shows the interval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.cli.training_options import CHECKPOINT_EVERY
from refimpl.train import graph_level
from refimpl.train import loop as loop_module

# float64 and dropout: a bit-identical resume must restore the noise generator too
NODE = ["train", "--no-progress", "--hidden", "4", "--dtype", "float64", "--dropout", "0.2"]
GRAPH = [
    "train", "--no-progress", "--model", "graph_transformer", "--graphs", "24", "--layers", "1",
    "--hidden", "8", "--heads", "2", "--pe-dim", "2", "--batch-size", "8", "--dtype", "float64",
    "--dropout", "0.2",
]  # fmt: skip
EPOCHS = CHECKPOINT_EVERY + 3  # past the first default checkpoint, short of the second


def same_arrays(a: Path, b: Path) -> bool:
    with np.load(a) as left, np.load(b) as right:
        return left.files == right.files and all(
            np.array_equal(left[k], right[k]) for k in left.files
        )


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("command", "module"), [(NODE, loop_module), (GRAPH, graph_level)])
def test_a_default_run_interrupted_after_its_first_checkpoint_resumes_to_the_same_end(
    command: list[str],
    module: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    # A run without --checkpoint-every wrote no checkpoint (the option defaulted to 0), so a
    # Ctrl-C and --resume started over from epoch 0 although the README advertises resume.
    # The resume tests all passed --checkpoint-every themselves.
    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*command, "--epochs", str(EPOCHS), "--out", str(full)]) == 0
    real_save = module.save_checkpoint
    saved = []

    def save_then_interrupt(path, *args, **kwargs) -> None:  # Ctrl-C right after the write
        real_save(path, *args, **kwargs)
        saved.append(args[3]["epoch"])  # the epochs done, as the checkpoint records them
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "save_checkpoint", save_then_interrupt)
    assert main([*command, "--epochs", str(EPOCHS), "--out", str(part)]) == 130
    assert saved == [CHECKPOINT_EVERY] and len(records(part)) == CHECKPOINT_EVERY
    assert "last checkpoint" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["train", "--no-progress", "--resume", str(part)]) == 0
    assert same_arrays(part / "final.npz", full / "final.npz")
    assert records(part) == records(full)
    summaries = [json.loads((f / "summary.json").read_text()) for f in (part, full)]
    assert summaries[0]["runs"] == summaries[1]["runs"]


def test_checkpoint_every_zero_writes_none(tmp_path: Path) -> None:
    args = [*NODE, "--epochs", str(EPOCHS), "--checkpoint-every", "0", "--out", str(tmp_path)]
    assert main(args) == 0
    assert (tmp_path / "final.npz").is_file() and not (tmp_path / "checkpoint.npz").exists()


def test_help_shows_the_interval(capsys: pytest.CaptureFixture) -> None:
    for command in ("train", "sweep"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert (
            f"0: never); what --resume continues from after Ctrl-C (default: {CHECKPOINT_EVERY})"
            in text
        )
        assert (
            "--no-progress no progress bar (it is off by itself where the output is not a terminal)"
            in text
        )
