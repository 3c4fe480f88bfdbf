"""Every error the command line meets is one line on stderr with its exit code, never a
traceback: 2 for bad input, 1 for a failed check, 3 for a bug, 130 for Ctrl-C."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import refimpl.cli.train as train_command
from refimpl.cli import main

FAST = ["--epochs", "2", "--no-progress", "--hidden", "4"]
ONE_LINE = re.compile(r"refimpl (\w+): (error|internal error): [^\n]+\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hidden", "0"], r"argument --hidden: must be an integer >= 1, got 0"),
        (
            ["--loss-threshold", "nan"],
            r"argument --loss-threshold: must be a finite number, got nan",
        ),
        (["--lr", "-1"], r"argument --lr: must be a finite number > 0, got -1"),
        (["--lr", "inf"], r"argument --lr: must be a finite number, got inf"),
        (["--dropout", "1"], r"argument --dropout: must be a number in \[0, 1\), got 1"),
        (["--epochs", "0"], r"argument --epochs: must be an integer >= 1, got 0"),
        (["--seeds", "-1"], r"argument --seeds: must be an integer >= 0, got -1"),
        (["--checkpoint-every", "x"], r"argument --checkpoint-every: must be an integer, got 'x'"),
    ],
)
def test_an_option_out_of_range_is_one_usage_line(
    capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    # `--hidden 0` became 8 (an `or 8` default), `--loss-threshold nan` was accepted, and a
    # usage error printed the whole usage of train's 40 options before its one line.
    with pytest.raises(SystemExit) as caught:
        main(["train", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"refimpl train: error: {message} \(see refimpl train --help\)\n", err)


def test_repeated_seeds_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # `--seeds 0 0` ran the same run twice and reported a confidence interval over copies.
    assert main(["train", *FAST, "--seeds", "0", "0", "--out", str(tmp_path)]) == 2
    assert "seeds must be distinct, got [0, 0]" in capsys.readouterr().err


def test_split_for_a_set_without_splits_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # `--split` was silently ignored for every set but Geom-GCN's.
    assert main(["train", *FAST, "--split", "3", "--out", str(tmp_path)]) == 2
    assert "csbm has no such splits" in capsys.readouterr().err


def test_an_out_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # OSError (a folder that cannot be written, a full disk) printed a traceback.
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train", *FAST, "--out", str(blocker / "run")]) == 2
    assert ONE_LINE.fullmatch(capsys.readouterr().err)


def test_an_out_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    assert main(["train", *FAST, "--out", str(blocker)]) == 2
    assert "is a file, not a run folder" in capsys.readouterr().err
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_the_cupy_backend_without_cupy_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # ImportError printed a traceback.
    assert main(["train", *FAST, "--backend", "cupy", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ONE_LINE.fullmatch(err) and "CuPy" in err


@pytest.mark.parametrize(
    ("raised", "code", "text"),
    [
        (MemoryError(), 2, "refimpl train: error: out of memory"),
        (KeyError("val_acc"), 2, "refimpl train: error: KeyError: 'val_acc'"),
        (IndexError("index 9 is out of bounds"), 2, "refimpl train: error: IndexError: index 9"),
        (EOFError("ran out of input"), 2, "refimpl train: error: EOFError: ran out of input"),
        (PermissionError(13, "Permission denied"), 2, "refimpl train: error: PermissionError"),
        (RuntimeError("a bug"), 3, "refimpl train: internal error: RuntimeError: a bug; rerun"),
    ],
    ids=["memory", "key", "index", "eof", "permission", "bug"],
)
def test_each_kind_of_error_is_one_line_with_its_exit_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    raised: BaseException,
    code: int,
    text: str,
) -> None:
    # The CLI caught only ValueError and FileNotFoundError; everything else was a traceback.
    def fail(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(train_command, "run_seeds", fail)
    assert main(["train", *FAST, "--out", str(tmp_path)]) == code
    err = capsys.readouterr().err
    assert ONE_LINE.fullmatch(err) and err.startswith(text)


def test_refimpl_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(train_command, "run_seeds", fail)
    monkeypatch.setenv("REFIMPL_DEBUG", "1")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", *FAST, "--out", str(tmp_path)])


def test_plot_of_a_log_line_without_a_key_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # `refimpl plot` on a log line without a key was a KeyError traceback.
    pytest.importorskip("matplotlib")
    (tmp_path / "log.jsonl").write_text('{"epoch": 0, "train_loss": 1.0}\n')
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ONE_LINE.fullmatch(err) and "log.jsonl, line 1: no train_acc" in err


def test_plot_draws_a_log_with_null_scores(tmp_path: Path) -> None:
    # Strict JSON logs write a NaN score (an empty split) as null; plot draws it as a gap.
    pytest.importorskip("matplotlib")
    line = '{"epoch": %d, "train_loss": 1.0, "train_acc": 0.5, "val_acc": null, '
    line += '"test_acc": null, "grad_norms": {"layer0": {"feature": 0.1}}}\n'
    (tmp_path / "log.jsonl").write_text(line % 0 + line % 1)
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_refimpl_backend_variable_is_one_line(tmp_path: Path) -> None:
    # REFIMPL_BACKEND=bogus raised at `import refimpl`, before the CLI could catch anything.
    code = "import sys; from refimpl.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "REFIMPL_BACKEND": "bogus"}
    argv = ["train", *FAST, "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr == (
        "refimpl train: error: unknown backend 'bogus' (from REFIMPL_BACKEND); "
        "choose one of numpy, cupy, strict\n"
    )


def test_a_message_quoting_a_file_is_printed_with_its_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Messages quote what files hold (run.json's command, keys, names): a command name with
    # an escape sequence reached the terminal as one, clearing the screen.
    (tmp_path / "run.json").write_text('{"command": "x\\u001b[2Jy", "options": {}}')
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds a 'x\\x1b[2Jy' run" in err and "\x1b" not in err
    assert ONE_LINE.fullmatch(err)
