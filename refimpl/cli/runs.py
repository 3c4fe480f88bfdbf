"""Run folders on the command line: ``--out``, ``--resume`` and ``--overwrite`` of ``refimpl train``
and ``refimpl sweep`` (and the reproduction scripts), and what an interrupted run prints.

A resumed run takes its options from its folder's ``run.json``
(:mod:`refimpl.train.run_folder`). Options given again beside ``--resume`` are compared with
the stored ones, which needs to know which options the user actually typed: argparse fills
in defaults, so :func:`explicit_options` parses the same command line again with every
default suppressed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from refimpl.cli.types import positive_float
from refimpl.train.parallel import WORKER_TIMEOUT_SECONDS
from refimpl.train.run_folder import (
    RUN_FILE,
    find_run_folder,
    merge_options,
    open_run_folder,
    read_run_file,
    save_run_file,
)
from refimpl.train.run_lock import release_run_folder

__all__ = [
    "OUTPUT_ONLY",
    "SCRIPT_OUTPUT_ONLY",
    "SWEEP_OUTPUT_ONLY",
    "add_run_folder_options",
    "add_scheduler_option",
    "add_script_run_options",
    "explicit_options",
    "interrupted_message",
    "open_cli_run",
    "open_script_run",
    "resume_options",
    "stored_options",
]

# Options that change what is written or how long the run goes on, not what an epoch
# computes: a resumed run takes them from the command line.
OUTPUT_ONLY = frozenset(
    {
        "epochs",
        "no_progress",
        "checkpoint_every",
        "data_root",
        "workers",
        "scheduler",
        "worker_timeout",
    }
)
# A sweep's cells finished earlier are read back whatever their length: a longer --epochs
# would mix two grids in one table, so a resumed sweep keeps its own.
SWEEP_OUTPUT_ONLY = OUTPUT_ONLY - {"epochs"}
# A script's grid skips finished jobs whatever their length, so there only where the data
# lives and how many processes run may change (a longer --epochs would mix two grids).
SCRIPT_OUTPUT_ONLY = frozenset({"data", "workers", "scheduler", "worker_timeout"})

# Never stored: where the run is and how it was opened.
_NOT_STORED = frozenset({"run", "command", "explicit", "out", "resume", "overwrite", "run_folder"})


def add_run_folder_options(parser: argparse.ArgumentParser, default_hint: str) -> None:
    """``--out``, ``--resume`` and ``--overwrite``."""
    parser.add_argument(
        "--out", type=Path, default=None, help=f"run folder (default {default_hint})"
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN",
        help="continue the run in this folder (or of this checkpoint.npz) with its own "
        "options; --epochs may extend it, any other option given must match the run's",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its files only; other files are kept)",
    )


def add_scheduler_option(parser: argparse.ArgumentParser) -> None:
    """``--scheduler``: run a grid's jobs on Dask (:mod:`refimpl.train.parallel`), and
    ``--worker-timeout``: how long the grid waits on a scheduler without workers."""
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the grid on Dask: a running scheduler's address (tcp://host:8786) or "
        "local:N (N single-threaded worker processes here); needs the cluster extra. "
        "Results are written here as jobs finish; a rerun skips finished jobs",
    )
    parser.add_argument(
        "--worker-timeout",
        type=positive_float,
        default=WORKER_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="with --scheduler: end the grid (finished jobs kept, --resume runs the rest) "
        f"once the scheduler has had no worker for this long (default {WORKER_TIMEOUT_SECONDS:g})",
    )


def add_script_run_options(parser: argparse.ArgumentParser) -> None:
    """``--resume`` and ``--overwrite`` of a script whose run folder is its ``--out``."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its own options (finished runs are skipped); "
        "any option given must match the run's",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its files only; other files are kept)",
    )


def explicit_options(
    build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]
) -> set[str]:
    """The destinations of the options typed in ``argv`` (not those left at their default)."""
    parser = build_parser()
    _suppress_defaults(parser)
    return set(vars(parser.parse_args(argv)))


def _suppress_defaults(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # argparse offers no public walk over its actions
        action.default = argparse.SUPPRESS
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _suppress_defaults(sub)


def resume_options(
    args: argparse.Namespace, command: str, output_only: frozenset[str] = OUTPUT_ONLY
) -> Path:
    """For ``--resume RUN``: set ``args`` to the run's stored options, with the output-only
    ones the user typed (``output_only``); return the run's folder. Nothing is written or
    locked yet: :func:`open_cli_run` does that once the data are loaded and known to be the
    run's. An option typed with another value than the run's is a ``ValueError`` naming both.
    """
    folder = _resumed_folder(args)
    record = read_run_file(folder)
    if record["command"] != command:
        raise ValueError(
            f"{folder} holds a '{record['command']}' run, not a '{command}' run; "
            f"resume it with {record['command']}"
        )
    given = stored_options(args)
    explicit = getattr(args, "explicit", set(given))
    merged = merge_options(record["options"], given, explicit & set(given), output_only)
    for name, value in merged.items():
        setattr(args, name, value)
    return folder


def open_cli_run(
    args: argparse.Namespace,
    command: str,
    default_out: Path,
    data: Mapping[str, str] | None = None,
    output_only: frozenset[str] = OUTPUT_ONLY,
) -> Path:
    """Lock and open the run folder of ``args`` (``--out``, ``--resume RUN``, ``--overwrite``);
    return it.

    A new run stores its options in ``run.json``; a resumed one (its options first set by
    :func:`resume_options`) stores them merged, with ``output_only`` taken from the command
    line. ``data`` maps each dataset of the run to its fingerprint
    (:func:`refimpl.train.resume.data_fingerprint`), recorded in ``run.json``; a resume on
    data whose fingerprint differs from the recorded one is refused before anything is
    written.
    """
    resume = args.resume is not None
    folder = _resumed_folder(args) if resume else Path(args.out or default_out)
    _open(args, command, folder, output_only, resume=resume, data=data)
    return folder


def _resumed_folder(args: argparse.Namespace) -> Path:
    """The folder of the run ``--resume`` names (a folder or its checkpoint)."""
    folder = find_run_folder(args.resume)
    if args.out is not None and Path(args.out).resolve() != folder.resolve():
        raise ValueError(
            f"--out {args.out} is not the folder of the run being resumed ({folder}); "
            "drop --out, or start a new run there without --resume"
        )
    return folder


def open_script_run(
    args: argparse.Namespace,
    command: str,
    folder: Path,
    outputs: Sequence[str] = (),
    output_only: frozenset[str] = SCRIPT_OUTPUT_ONLY,
) -> None:
    """:func:`open_cli_run` for a script whose ``--resume`` is a flag: the run is ``folder``.

    ``outputs``: the script's own files (figures, reports) that ``--overwrite`` removes too;
    ``output_only``: the options a resumed run takes from the command line.
    """
    _open(args, command, folder, output_only, resume=args.resume, outputs=outputs)


def _open(
    args: argparse.Namespace,
    command: str,
    folder: Path,
    output_only: frozenset[str],
    *,
    resume: bool,
    outputs: Sequence[str] = (),
    data: Mapping[str, str] | None = None,
) -> None:
    given = stored_options(args)
    explicit = getattr(args, "explicit", set(given))  # without a parsed command line: all
    record = open_run_folder(
        folder, command, given, resume=resume, overwrite=args.overwrite, outputs=outputs
    )
    try:  # the folder is locked now: every check before the one write
        if resume:
            merged = merge_options(record["options"], given, explicit & set(given), output_only)
            for name, value in merged.items():
                setattr(args, name, value)
            _check_data(folder, record.get("data", {}), data or {})
            record = {**record, "options": merged}
        if data:
            record = {**record, "data": {**record.get("data", {}), **data}}
        if resume or data:
            save_run_file(folder, record)
    except BaseException:
        release_run_folder(folder)
        raise
    args.run_folder = folder


def _check_data(folder: Path, recorded: Any, given: Mapping[str, str]) -> None:
    """Each dataset the resumed run loads now has the fingerprint its ``run.json`` records."""
    if not isinstance(recorded, dict):
        raise ValueError(f"{folder / RUN_FILE}: 'data' is not a mapping; the run folder is damaged")
    for name, fingerprint in given.items():
        if name in recorded and recorded[name] != fingerprint:
            raise ValueError(
                f"dataset {name} differs from the one the run in {folder} trained on (SHA-256 "
                f"{str(recorded[name])[:12]}... in its run.json, {fingerprint[:12]}... now): "
                "resume on the run's own data, or start a new run with another --out"
            )


def interrupted_message(prog: str, args: argparse.Namespace) -> str:
    """What an interrupted run prints: where its last checkpoint is and how to resume."""
    folder: Path | None = getattr(args, "run_folder", None)
    if folder is None:
        return f"{prog}: interrupted before a run folder was opened; nothing to resume"
    checkpoints = sorted(folder.rglob("checkpoint.npz"), key=lambda p: p.stat().st_mtime)
    where = (
        f"last checkpoint {checkpoints[-1]}"
        if checkpoints
        else "no checkpoint yet (--checkpoint-every N writes them), unfinished seeds start again"
    )
    return f"{prog}: interrupted; {where}; resume with: {prog} --resume {folder}"


def stored_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of ``args`` as a run records them (for ``summary.json``)."""
    return {k: v for k, v in vars(args).items() if k not in _NOT_STORED}
