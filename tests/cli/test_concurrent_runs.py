"""Two commands on one run folder (issue 33): the second is refused in one line naming the
holder, and the first finishes untouched, bit for bit the run it would have been alone.

Run folders had no lock: a second ``refimpl train --out R`` (even one then refused) cleaned
"stale" temporary files and deleted the live run's file in flight, killing it; two runs
started together both exited 0 with interleaved logs; ``--overwrite`` or ``--resume`` on a
live run replaced what it was writing. The earlier tests ran one command at a time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.train import run_lock

pytestmark = pytest.mark.skipif(run_lock.fcntl is None, reason="flock is POSIX")

ROOT = Path(__file__).resolve().parents[2]
RUN = ["train", "--no-progress", "--hidden", "4", "--dtype", "float64", "--dropout", "0.2"]
LONG = [*RUN, "--epochs", "600", "--checkpoint-every", "50"]
BUSY = re.compile(r"refimpl train: error: \S+ is in use by PID (\d+) \(train on [^\n]+\n")


def refimpl(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "refimpl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def wait_for_lock(folder: Path, process: subprocess.Popen, then: str | None = None) -> None:
    """Until ``process`` holds ``folder``'s lock (its PID in the lock file) and, if given, has
    written the file ``then``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            holder = json.loads((folder / run_lock.LOCK_FILE).read_text())["pid"]
            if holder == process.pid and (then is None or (folder / then).exists()):
                return
        except (OSError, ValueError, KeyError):
            pass
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    raise AssertionError(f"{process.pid} never locked {folder}")


def same_arrays(a: Path, b: Path) -> bool:
    with np.load(a) as left, np.load(b) as right:
        return left.files == right.files and all(
            np.array_equal(left[k], right[k]) for k in left.files
        )


def test_commands_on_a_live_run_are_refused_and_the_run_finishes_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    live, alone = tmp_path / "live", tmp_path / "alone"
    first = refimpl(*LONG, "--out", str(live))
    wait_for_lock(live, first, then="checkpoint.npz")
    first.send_signal(signal.SIGSTOP)  # frozen while it holds the lock: no race with its end
    try:
        attempts = [
            [*LONG, "--out", str(live)],
            [*LONG, "--out", str(live), "--overwrite"],
            ["train", "--no-progress", "--resume", str(live)],
            ["train", "--no-progress", "--resume", str(live / "checkpoint.npz")],
        ]
        for attempt in attempts:
            capsys.readouterr()
            assert main(attempt) == 2, attempt
            err = capsys.readouterr().err
            assert BUSY.fullmatch(err) and int(BUSY.match(err)[1]) == first.pid, err
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert main([*LONG, "--out", str(alone)]) == 0
    assert same_arrays(live / "final.npz", alone / "final.npz")
    assert (live / "log.jsonl").read_text() == (alone / "log.jsonl").read_text()
    assert not (live / run_lock.LOCK_FILE).exists()  # released with the run


def test_two_runs_started_together_one_runs_and_one_is_refused(tmp_path: Path) -> None:
    out, alone = tmp_path / "both", tmp_path / "alone"
    processes = [refimpl(*RUN, "--epochs", "200", "--out", str(out)) for _ in range(2)]
    outcomes = sorted((p.wait(timeout=300), p.communicate()[1], p.pid) for p in processes)
    (ran, ran_err, _), (refused, refused_err, _) = outcomes
    assert (ran, refused) == (0, 2), (ran_err, refused_err)
    # the loser is refused either by the lock (the winner still running; named by its PID,
    # or, in the instant before the winner writes it, as a process without one yet) or, had
    # the winner already finished, because the folder holds a run: never both writing
    assert (
        BUSY.fullmatch(refused_err)
        or "is in use by another process (which has not written its PID yet)" in refused_err
        or "holds an earlier run" in refused_err
    ), refused_err
    assert main([*RUN, "--epochs", "200", "--out", str(alone)]) == 0
    assert same_arrays(out / "final.npz", alone / "final.npz")
    assert len((out / "log.jsonl").read_text().splitlines()) == 200


def test_a_refused_second_command_removes_no_temporary_file_of_the_live_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # what killed the live run: the second command's clean-up of "stale" temporary files
    live = tmp_path / "live"
    first = refimpl(*LONG, "--out", str(live))
    wait_for_lock(live, first)
    first.send_signal(signal.SIGSTOP)
    in_flight = live / ".checkpoint.npz.abcd1234.tmp"  # as atomic_write names its temporary
    try:
        in_flight.write_bytes(b"half a checkpoint")
        assert main([*LONG, "--out", str(live), "--overwrite"]) == 2
        assert in_flight.read_bytes() == b"half a checkpoint"
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0
    in_flight.unlink()
