"""Run folders, through the command line: a second command on a live run folder, a resume
with changed options, SIGKILL during a run's writes and then resume, a finished run or a
user's file in the way, and sweeps on worker processes and on Dask.

Expected: a second command on a live folder is refused with a line naming the holder's PID
(the run-folder lock, :mod:`refimpl.train.run_folder`); a resume after a kill ends bit for
bit where the same run without a kill ends; a sweep gives the same numbers on one process,
on two and on Dask; nothing a user made, and no finished result, changes or vanishes
(a change is a *loss*).
"""

from __future__ import annotations

import functools
import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from reliability_cases.commands import SWEEP, TRAIN, judge, refimpl
from reliability_cases.files import in_scratch
from reliability_cases.outcomes import LOSS, REFUSED, RIGHT, Case, Result, difference
from reliability_cases.runner import child_env

KILL_AFTER = (0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.4)  # seconds into a run's first epochs
LONG = [*TRAIN[:3], "--epochs", "60", "--checkpoint-every", "1", "--no-progress"]


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` by relative path, with its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def results(folder: Path) -> dict[str, Any]:
    """A run's numbers: every final.npz array and the sweep table's numbers."""
    out: dict[str, Any] = {}
    for path in sorted(folder.rglob("final.npz")):
        with np.load(path) as archive:
            out |= {f"{path.parent.relative_to(folder)}/{k}": archive[k] for k in archive.files}
    if (folder / "sweep.json").is_file():
        for i, row in enumerate(json.loads((folder / "sweep.json").read_text())):
            out |= {
                f"sweep[{i}].{k}": np.array(v)
                for k, v in row.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
    return out


@functools.cache
def _uninterrupted(args: tuple[str, ...]) -> dict[str, Any]:
    """The numbers of ``refimpl args --out run`` run to the end without a stop."""

    def inside(folder: Path) -> dict[str, Any]:
        done = refimpl([*args, "--out", "run"], folder)
        if done.returncode:
            raise RuntimeError(f"reference run failed: {done.stderr}")
        return results(folder / "run")

    return in_scratch(inside)


def _start(args: list[str], folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "refimpl", *args],
        cwd=folder,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait()


def _live(second: list[str], overwrite: bool) -> Result:
    """A second command on the folder of a run that is still going."""

    def inside(folder: Path) -> Result:
        first = _start(
            [
                *TRAIN[:3],
                "--epochs",
                "100000",
                "--checkpoint-every",
                "50",
                "--no-progress",
                "--out",
                "run",
            ],
            folder,
        )
        try:
            deadline = time.monotonic() + 60
            while not (folder / "run" / "log.jsonl").is_file() and time.monotonic() < deadline:
                time.sleep(0.05)
            if first.poll() is not None:
                raise RuntimeError("the first run ended before the second command")
            result = judge(second, (str(first.pid),), False, folder)
            alive = first.poll() is None
        finally:
            _stop(first)
        if result.outcome != REFUSED and overwrite:
            return Result(LOSS, f"{result.detail or 'accepted'}: a live run's files replaced")
        if not alive:
            return Result(LOSS, "the live run died during the second command")
        return result

    return in_scratch(inside)


def _killed(delay: float, resume_args: list[str]) -> Result:
    """SIGKILL a run ``delay`` s in, resume it, and compare with the run never stopped."""

    def inside(folder: Path) -> Result:
        run = _start([*LONG, "--out", "run"], folder)
        time.sleep(delay)
        _stop(run)
        result = judge([*resume_args, "--resume", "run"], ("run", "checkpoint"), True, folder)
        if result.outcome != RIGHT:
            return result
        problem = difference(results(folder / "run"), _uninterrupted(tuple(LONG)), 0.0)
        return Result("silent wrong", f"not bit-identical: {problem}") if problem else result

    return in_scratch(inside)


def _finished(
    extra: list[str], user_file: str | None, expect_refusal: bool, mentions: tuple[str, ...]
) -> Result:
    """A command on the folder of a finished run (holding a user's file, or being one)."""

    def inside(folder: Path) -> Result:
        if refimpl([*TRAIN, "--out", "run"], folder).returncode:
            raise RuntimeError("the finished run could not be made")
        target = folder / "run"
        if user_file == "beside":
            (target / "notes.txt").write_text("a user's notes\n")
        if user_file == "instead":
            target = folder / "notes.txt"
            target.write_text("a user's notes\n")
        before = fingerprint(folder)
        result = judge(
            [*TRAIN, "--out", str(target.relative_to(folder)), *extra],
            mentions,
            not expect_refusal,
            folder,
        )
        after = fingerprint(folder)
        lost = [p for p in before if p not in after or (expect_refusal and after[p] != before[p])]
        lost += [p for p in before if p.endswith("notes.txt") and after.get(p) != before[p]]
        if lost:
            return Result(LOSS, f"changed or removed: {sorted(set(lost))}")
        return result

    return in_scratch(inside)


def _resumed(change: list[str], valid: bool, mentions: tuple[str, ...]) -> Result:
    """A finished 2-epoch run resumed with options changed; ``--epochs 4`` must end where
    a 4-epoch run ends."""

    def inside(folder: Path) -> Result:
        base = [*TRAIN[:3], "--checkpoint-every", "1", "--no-progress"]
        if refimpl([*base, "--epochs", "2", "--out", "run"], folder).returncode:
            raise RuntimeError("the run to resume could not be made")
        result = judge(
            ["train", "--resume", "run", "--no-progress", *change], mentions, valid, folder
        )
        if result.outcome == RIGHT and valid:
            problem = difference(
                results(folder / "run"), _uninterrupted((*base, "--epochs", "4")), 0.0
            )
            if problem:
                return Result("silent wrong", f"not bit-identical: {problem}")
        return result

    return in_scratch(inside)


def _sweep(extra: list[str], kill_after: float | None = None) -> Result:
    """A sweep with ``extra`` options (workers, Dask), killed and resumed if asked; its
    numbers must equal the plain sweep's."""
    args = [*SWEEP, "--seeds", "0", "1"]

    def inside(folder: Path) -> Result:
        if kill_after is not None:
            run = _start([*args, *extra, "--out", "run"], folder)
            time.sleep(kill_after)
            _stop(run)
            result = judge(["sweep", "--resume", "run", "--no-progress"], ("run",), True, folder)
        else:
            result = judge([*args, *extra, "--out", "run"], ("scheduler", "workers"), True, folder)
        if result.outcome != RIGHT:
            return result
        problem = difference(results(folder / "run"), _uninterrupted(tuple(args)), 0.0)
        return Result("silent wrong", f"numbers differ: {problem}") if problem else result

    return in_scratch(inside)


def cases() -> list[Case]:
    live = [
        ("the same command", [*TRAIN, "--out", "run"], False),
        ("--overwrite", [*TRAIN, "--out", "run", "--overwrite"], True),
        ("--resume", ["train", "--resume", "run", "--no-progress"], False),
    ]
    out = [
        Case(f"live run | second command: {label}", lambda a=args, o=over: _live(a, o))
        for label, args, over in live
    ]
    out += [
        Case(f"SIGKILL {delay} s into a run | resume", lambda d=delay: _killed(d, ["train"]))
        for delay in KILL_AFTER
    ]
    out += [
        Case("finished run | --out again", lambda: _finished([], None, True, ("run",))),
        Case(
            "finished run | --overwrite keeps a user's file",
            lambda: _finished(["--overwrite"], "beside", False, ()),
        ),
        Case("a user's file | as --out", lambda: _finished([], "instead", True, ("notes.txt",))),
        Case(
            "a user's file | as --out with --overwrite",
            lambda: _finished(["--overwrite"], "instead", True, ("notes.txt",)),
        ),
    ]
    changes = [
        ("--epochs 4", ["--epochs", "4"], True, ()),
        ("--lr 0.1", ["--epochs", "4", "--lr", "0.1"], False, ("lr",)),
        ("--dataset csbm", ["--dataset", "csbm"], False, ("dataset",)),
        ("--model nodeformer", ["--model", "nodeformer"], False, ("model",)),
        ("--hidden 5", ["--hidden", "5"], False, ("hidden",)),
        ("--dtype float64", ["--dtype", "float64"], False, ("dtype",)),
    ]
    out += [
        Case(f"resume | {label}", lambda c=change, v=valid, m=m: _resumed(c, v, m))
        for label, change, valid, m in changes
    ]
    out += [
        Case("sweep | --workers 2", lambda: _sweep(["--workers", "2"])),
        Case("sweep | --scheduler local:2 (Dask)", lambda: _sweep(["--scheduler", "local:2"])),
        Case("sweep | SIGKILL 1.2 s in | resume", lambda: _sweep([], 1.2)),
        Case(
            "sweep | --workers 2, SIGKILL 1.5 s in | resume",
            lambda: _sweep(["--workers", "2"], 1.5),
        ),
    ]
    return out
