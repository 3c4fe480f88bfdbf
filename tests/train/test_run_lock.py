"""The run folder's lock: one process at a time, the holder named, re-entrant within a process,
released by the holder's death, and no lock file left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.train import run_lock
from refimpl.train.run_lock import (
    LOCK_FILE,
    RunFolderBusy,
    lock_run_folder,
    lock_scope,
    release_run_folder,
    run_folder_lock,
)

pytestmark = pytest.mark.skipif(run_lock.fcntl is None, reason="flock is POSIX")

ROOT = Path(__file__).resolve().parents[2]
# a process that takes the lock, says so, and holds it until killed
HOLDER = (
    "import sys, time; from refimpl.train.run_lock import lock_run_folder; "
    "lock_run_folder(sys.argv[1], 'holder test'); print('locked', flush=True); time.sleep(600)"
)


def start_holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout.readline() == "locked\n"
    return process


def test_a_second_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunFolderBusy) as refused:
            lock_run_folder(tmp_path, "second")
        message = str(refused.value)
        assert f"is in use by PID {holder.pid} (holder test on " in message
        assert "\n" not in message and "another --out" in message
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    # flock belongs to the open file: SIGKILL, which runs no clean-up, still releases it;
    # the lock file the dead holder left is taken over, not a reason to refuse
    holder = start_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_FILE).exists()
    with run_folder_lock(tmp_path, "after"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_lock_is_reentrant_in_a_process_and_its_file_goes_with_the_last_release(
    tmp_path: Path,
) -> None:
    # a command holds its folder and trains into it through train_model, which locks again
    lock_run_folder(tmp_path, "outer")
    with run_folder_lock(tmp_path, "inner"):
        assert (tmp_path / LOCK_FILE).exists()
    assert (tmp_path / LOCK_FILE).exists()  # the outer take still holds it
    release_run_folder(tmp_path)
    assert not (tmp_path / LOCK_FILE).exists()
    release_run_folder(tmp_path)  # not held: nothing to do


def test_lock_scope_releases_every_lock_taken_inside(tmp_path: Path) -> None:
    with lock_scope():
        lock_run_folder(tmp_path / "a", "scoped")
        lock_run_folder(tmp_path / "b", "scoped")
    assert not (tmp_path / "a" / LOCK_FILE).exists() and not (tmp_path / "b" / LOCK_FILE).exists()
    holder = start_holder(tmp_path / "a")  # released for other processes too
    holder.kill()
    holder.wait()


def test_a_failed_block_removes_the_folder_it_made_only_if_empty(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), run_folder_lock(tmp_path / "new", "failing"):
        raise RuntimeError("bad data")
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError), run_folder_lock(tmp_path / "kept", "failing"):
        (tmp_path / "kept" / "log.jsonl").write_text("{}\n")
        raise RuntimeError("diverged")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["log.jsonl"]
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError), run_folder_lock(tmp_path / "mine", "failing"):
        raise RuntimeError("bad data")
    assert (tmp_path / "mine").is_dir()  # the user's folder, even empty, is not removed


def test_a_lock_file_removed_while_being_taken_is_taken_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder removes its lock file before unlocking. A taker that opened the old file and
    # locked it just after holds a lock on a file no longer in the folder: it must see that
    # and lock the new one, or two processes would hold "the" lock at once.
    real_flock = run_lock.fcntl.flock
    calls = []

    def flock_then_removed(descriptor: int, operation: int) -> None:
        real_flock(descriptor, operation)
        calls.append(descriptor)
        if len(calls) == 1:  # the previous holder's release, between our open and our check
            (tmp_path / LOCK_FILE).unlink()

    monkeypatch.setattr(run_lock.fcntl, "flock", flock_then_removed)
    lock_run_folder(tmp_path, "racing")
    try:
        assert len(calls) == 2
        held = run_lock._HELD[tmp_path.resolve()].descriptor
        assert os.fstat(held).st_ino == os.stat(tmp_path / LOCK_FILE).st_ino
    finally:
        release_run_folder(tmp_path)


def test_without_fcntl_folders_are_not_locked_and_a_warning_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_lock, "fcntl", None)
    with pytest.warns(UserWarning, match="run folders are not locked"):
        lock_run_folder(tmp_path, "anywhere")
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_file_is_not_a_run_folder(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a run folder"):
        lock_run_folder(path, "file")


def test_the_holder_is_described_even_before_it_wrote_its_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; d = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(d, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(600)",
            str(tmp_path / LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunFolderBusy, match=r"another process \(which has not written"):
            lock_run_folder(tmp_path, "second")
    finally:
        holder.kill()
        holder.wait()
