"""Run folders on the command line: never overwritten unasked, resumable from themselves (one
seed, several, a sweep), Ctrl-C with the way back, and one line for every error."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.train import checkpoint as checkpoint_module
from refimpl.train import loop as loop_module

# float64 and dropout: bit-identical resumes must restore the noise generator too
RUN = ["train", "--no-progress", "--hidden", "4", "--dtype", "float64", "--dropout", "0.2"]
ONE_LINE = re.compile(r"refimpl (train|sweep|plot): error: [^\n]+\n")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` by relative path, with the hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def same_arrays(a: Path, b: Path) -> bool:
    with np.load(a) as left, np.load(b) as right:
        return left.files == right.files and all(
            np.array_equal(left[k], right[k]) for k in left.files
        )


def log_records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten epochs, two seeds, never stopped: what every resumed run below must equal."""
    out = tmp_path_factory.mktemp("full")
    assert main([*RUN, "--epochs", "10", "--seeds", "0", "1", "--out", str(out)]) == 0
    return out


def test_train_out_on_an_existing_run_is_refused_and_the_run_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # `--out D` with an earlier run in D truncated its log and overwrote its final and summary
    # files, leaving the old checkpoint beside the new ones: nothing checked for a run there.
    assert main([*RUN, "--epochs", "3", "--checkpoint-every", "1", "--out", str(tmp_path)]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main([*RUN, "--epochs", "5", "--lr", "0.1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ONE_LINE.fullmatch(err) and "--resume" in err and "--overwrite" in err
    assert snapshot(tmp_path) == before


def test_overwrite_replaces_the_run_and_keeps_the_users_files(tmp_path: Path) -> None:
    # --overwrite removes the run's own files (the old checkpoint would otherwise sit beside
    # a run that never wrote one) and nothing the user put in the folder.
    assert main([*RUN, "--epochs", "3", "--checkpoint-every", "1", "--out", str(tmp_path)]) == 0
    (tmp_path / "notes.txt").write_text("mine")
    # (--checkpoint-every 0: a run checkpoints every 10 epochs by default)
    overwrite = ["--checkpoint-every", "0", "--overwrite"]
    assert main([*RUN, "--epochs", "2", "--out", str(tmp_path), *overwrite]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "checkpoint.npz").exists()
    assert [r["epoch"] for r in log_records(tmp_path)] == [0, 1]
    assert json.loads((tmp_path / "run.json").read_text())["options"]["epochs"] == 2


def test_a_failed_start_leaves_no_folder_and_only_run_json_is_not_a_run(tmp_path: Path) -> None:
    # A run that failed before training (say, bad data) left only run.json; starting again
    # there must not need --overwrite. Now it leaves nothing, and a folder holding only
    # run.json (an earlier version's failed start) is still not a run.
    out = tmp_path / "run"
    assert main([*RUN, "--epochs", "2", "--dataset", "nope", "--out", str(out)]) == 2
    assert not out.exists()
    assert main([*RUN, "--epochs", "2", "--out", str(out)]) == 0
    for path in out.iterdir():
        if path.name != "run.json":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert main([*RUN, "--epochs", "2", "--out", str(out)]) == 0


def test_resume_with_only_epochs_equals_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: Path
) -> None:
    # The checkpoint did not carry the configuration: `--resume` without every flag repeated
    # trained with the defaults. Now the run folder's run.json restores it.
    part = ["--epochs", "5", "--checkpoint-every", "5", "--seeds", "0", "1", "--out", str(tmp_path)]
    assert main([*RUN, *part]) == 0
    assert main(["train", "--no-progress", "--resume", str(tmp_path), "--epochs", "10"]) == 0
    for seed in ("seed0", "seed1"):
        assert same_arrays(tmp_path / seed / "final.npz", uninterrupted / seed / "final.npz")
        assert log_records(tmp_path / seed) == log_records(uninterrupted / seed)
    resumed = json.loads((tmp_path / "summary.json").read_text())
    full = json.loads((uninterrupted / "summary.json").read_text())
    assert resumed["runs"] == full["runs"]
    assert json.loads((tmp_path / "run.json").read_text())["options"]["epochs"] == 10


def test_resume_accepts_a_checkpoint_path_and_a_repeated_flag_with_the_runs_value(
    tmp_path: Path, uninterrupted: Path
) -> None:
    part = ["--epochs", "5", "--checkpoint-every", "5", "--seeds", "0", "1", "--out", str(tmp_path)]
    assert main([*RUN, *part]) == 0
    checkpoint = tmp_path / "seed1" / "checkpoint.npz"
    again = ["--resume", str(checkpoint), "--epochs", "10", "--dropout", "0.2", "--hidden", "4"]
    assert main(["train", "--no-progress", *again]) == 0
    assert same_arrays(tmp_path / "seed1" / "final.npz", uninterrupted / "seed1" / "final.npz")


@pytest.mark.parametrize(
    ("flag", "value", "stored"),
    [
        ("--lr", "0.1", "0.005"),
        ("--dropout", "0.5", "0.2"),
        ("--seeds", "3", "0"),
        ("--graph", "knn", "input"),
    ],
)
def test_resume_refuses_a_flag_whose_value_differs_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, value: str, stored: str
) -> None:
    # A different --lr, --dropout, --seeds or --graph was accepted silently: a hybrid run.
    assert main([*RUN, "--epochs", "2", "--checkpoint-every", "1", "--out", str(tmp_path)]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path), "--epochs", "4", flag, value]) == 2
    err = capsys.readouterr().err
    assert ONE_LINE.fullmatch(err)
    assert f"{flag} {value} differs from the resumed run's {stored}" in err
    assert snapshot(tmp_path) == before


def test_resume_with_fewer_epochs_than_the_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --epochs below the checkpoint's epoch "finished" at once with exit 0.
    assert main([*RUN, "--epochs", "4", "--checkpoint-every", "4", "--out", str(tmp_path)]) == 0
    os.remove(tmp_path / "summary.json")  # as if killed after the checkpoint
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path), "--epochs", "2"]) == 2
    assert "is at epoch 4, past the 2 epochs asked for" in capsys.readouterr().err


def test_resume_of_a_finished_run_with_fewer_epochs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([*RUN, "--epochs", "4", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path), "--epochs", "2"]) == 2
    assert "finished 4 epochs, more than the 2 asked for" in capsys.readouterr().err


def test_resume_and_overwrite_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([*RUN, "--epochs", "2", "--out", str(tmp_path)]) == 0
    assert main(["train", "--resume", str(tmp_path), "--overwrite"]) == 2
    assert ONE_LINE.fullmatch(capsys.readouterr().err)


def test_resume_of_a_folder_without_run_json_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "has no run.json" in capsys.readouterr().err


def test_interrupted_seed_resumes_and_finished_seeds_are_skipped(
    tmp_path: Path,
    uninterrupted: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    # Multi-seed runs could not resume. Ctrl-C in seed 1 right after its epoch-6 checkpoint:
    # one line with the checkpoint and the command, exit 130; the resume skips seed 0.
    real_save = checkpoint_module.save_checkpoint

    def save_then_interrupt(path, params, opt_state, rng, progress) -> None:
        real_save(path, params, opt_state, rng, progress)
        if Path(path).parent.name == "seed1" and progress["epoch"] == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_interrupt)
    args = ["--epochs", "10", "--checkpoint-every", "3", "--seeds", "0", "1"]
    assert main([*RUN, *args, "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err == (
        f"refimpl train: interrupted; last checkpoint {tmp_path / 'seed1' / 'checkpoint.npz'}; "
        f"resume with: refimpl train --resume {tmp_path}\n"
    )
    monkeypatch.undo()
    seed0 = snapshot(tmp_path / "seed0")
    trained = []
    real_train = loop_module.train_model

    def counting(*args, **kwargs):
        trained.append(kwargs["out_dir"].name)
        return real_train(*args, **kwargs)

    monkeypatch.setattr("refimpl.train.experiment.train_model", counting)
    assert main(["train", "--no-progress", "--resume", str(tmp_path)]) == 0
    assert trained == ["seed1"] and snapshot(tmp_path / "seed0") == seed0
    for seed in ("seed0", "seed1"):
        assert same_arrays(tmp_path / seed / "final.npz", uninterrupted / seed / "final.npz")
        assert log_records(tmp_path / seed) == log_records(uninterrupted / seed)


def test_sigint_prints_the_resume_command_and_the_checkpoint_resumes(tmp_path: Path) -> None:
    # A real Ctrl-C (SIGINT) to a training process: one line, exit 130, and the run resumes
    # to the same parameters as one never interrupted.
    out = tmp_path / "run"
    # Ctrl-C's handler as a terminal's foreground job has it: a suite started in the
    # background (`cmd &` in a script) runs with SIGINT ignored, and its children inherit that
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from refimpl.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = [*RUN, "--epochs", "100000", "--checkpoint-every", "1", "--out", str(out)]
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.npz").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert err == (
        f"refimpl train: interrupted; last checkpoint {out / 'checkpoint.npz'}; "
        f"resume with: refimpl train --resume {out}\n"
    )
    with np.load(out / "checkpoint.npz") as archive:
        epoch = json.loads(str(archive["progress"]))["epoch"]
    assert main(["train", "--no-progress", "--resume", str(out), "--epochs", str(epoch + 2)]) == 0
    full = tmp_path / "full"
    assert main([*RUN, "--epochs", str(epoch + 2), "--out", str(full)]) == 0
    assert same_arrays(out / "final.npz", full / "final.npz")


def test_sweep_refuses_an_existing_run_and_resumes_skipping_finished_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # `refimpl sweep` could not resume, and wrote over an earlier sweep.
    sweep = ["sweep", "--no-progress", "--hidden", "4", "--epochs", "3", "--depths", "1", "2"]
    assert main([*sweep, "--seeds", "0", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.txt").read_text()
    before = snapshot(tmp_path)
    assert main([*sweep, "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err and snapshot(tmp_path) == before
    for name in ("final.npz", "result.json"):  # as if killed in that cell: not finished
        os.remove(tmp_path / "csbm" / "xavier" / "L2" / name)
    trained = []
    real_train = loop_module.train_model

    def counting(*args, **kwargs):
        trained.append(str(kwargs["out_dir"].relative_to(tmp_path)))
        return real_train(*args, **kwargs)

    monkeypatch.setattr("refimpl.train.experiment.train_model", counting)
    assert main(["sweep", "--no-progress", "--resume", str(tmp_path)]) == 0
    assert trained == [str(Path("csbm", "xavier", "L2"))]
    assert (tmp_path / "table.txt").read_text() == table


def test_a_torn_last_log_line_is_dropped_with_a_warning(tmp_path: Path) -> None:
    # A process killed while appending to log.jsonl left half a line, and resuming failed
    # with a JSON error that named no file. Rebuilt here: checkpoint at epoch 2, the log of
    # epoch 2 written, killed while writing epoch 3's line.
    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*RUN, "--epochs", "4", "--out", str(full)]) == 0
    assert main([*RUN, "--epochs", "2", "--checkpoint-every", "2", "--out", str(part)]) == 0
    for name in ("summary.json", "final.npz"):
        os.remove(part / name)
    lines = (full / "log.jsonl").read_text().splitlines()
    (part / "log.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    with pytest.warns(UserWarning, match=r"log\.jsonl: dropped its last line, cut short"):
        assert main(["train", "--no-progress", "--resume", str(part), "--epochs", "4"]) == 0
    assert log_records(part) == log_records(full)
    assert same_arrays(part / "final.npz", full / "final.npz")


def test_a_damaged_log_line_before_the_last_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main([*RUN, "--epochs", "4", "--checkpoint-every", "2", "--out", str(tmp_path)]) == 0
    log = tmp_path / "log.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "{oops", *lines[2:]]) + "\n")
    assert main(["train", "--resume", str(tmp_path), "--epochs", "6"]) == 2
    assert re.search(r"log\.jsonl, line 2: not a JSON record", capsys.readouterr().err)


def test_stale_temporary_files_are_cleaned_when_a_run_folder_is_opened(tmp_path: Path) -> None:
    # Temporary files of writes that were killed stayed in the run folder for ever.
    assert main([*RUN, "--epochs", "2", "--checkpoint-every", "1", "--out", str(tmp_path)]) == 0
    stale = tmp_path / ".checkpoint.npz.abcd1234.tmp"
    stale.write_bytes(b"half a checkpoint")
    assert main(["train", "--no-progress", "--resume", str(tmp_path), "--epochs", "3"]) == 0
    assert not stale.exists()
