"""Run folders: opened without destroying an earlier run, resumed from what they hold.

A run folder is what ``refimpl train``, ``refimpl sweep`` and the reproduction scripts
write to ``--out``. Its ``run.json`` holds the configuration it was started with
(``{"command": ..., "options": {...}}``), so the folder alone says how to continue it.

:func:`open_run_folder` is the one gate every writer passes:

- a new or empty folder is created and gets its ``run.json``;
- a folder that holds a run (any of its files beyond ``run.json``) is refused, unless
  the caller asks to ``resume`` it (its ``run.json`` is read back) or to ``overwrite``
  it (the run's own files are removed, files the user put there are kept);
- temporary files left by writes that were killed (:func:`refimpl.files.atomic_write`)
  are removed;
- the folder is locked first (:mod:`refimpl.train.run_lock`): a folder another command is
  writing is refused before anything in it is read, cleaned or replaced, and the lock stays
  with the caller for the run's life.

:func:`merge_options` decides what a resumed run is: the stored options, with the
options that change only what is written (``--epochs``, progress, checkpoint cadence,
where the data lives) taken from the command line; any other option given again must
have the run's own value.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from refimpl.files import atomic_write, remove_stale_temporaries
from refimpl.train.records import strict_json
from refimpl.train.run_lock import lock_run_folder, release_run_folder

__all__ = [
    "RUN_FILE",
    "RUN_OUTPUTS",
    "find_run_folder",
    "merge_options",
    "open_run_folder",
    "read_json",
    "read_log",
    "read_run_file",
    "save_run_file",
    "write_json",
]

RUN_FILE = "run.json"

# Every file name a run writes (training loop, seeds, sweeps, the reproduction scripts'
# job records): what --overwrite removes, and what marks a folder as holding a run.
RUN_OUTPUTS = frozenset(
    {
        RUN_FILE,
        "log.jsonl",
        "checkpoint.npz",
        "final.npz",
        "final_state.npz",
        "initial.npz",
        "best.npz",
        "summary.json",
        "changes.json",
        "result.json",
        "sweep.json",
        "table.txt",
    }
)


def write_json(path: str | Path, record: Any) -> None:
    """``record`` as strict JSON (non-finite floats as ``null``), written atomically."""
    text = strict_json(record, indent=2) + "\n"
    atomic_write(path, lambda stream: stream.write(text.encode()))


def _run_files(folder: Path, outputs: frozenset[str]) -> list[Path]:
    """The run's own files anywhere below ``folder``."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name in outputs)


def open_run_folder(
    folder: str | Path,
    command: str,
    options: Mapping[str, Any],
    *,
    resume: bool = False,
    overwrite: bool = False,
    outputs: Iterable[str] = (),
) -> dict[str, Any]:
    """Open ``folder`` for a run of ``command`` with ``options``; return its run record.

    ``outputs``: file names the caller writes beyond :data:`RUN_OUTPUTS` (a script's
    figures), removed by ``overwrite`` too. A fresh or overwritten folder gets a new
    ``run.json`` from ``options``; a resumed one returns the stored record (the caller
    merges options with :func:`merge_options` and saves the result with
    :func:`save_run_file`).

    The folder's lock (:func:`refimpl.train.run_lock.lock_run_folder`) is taken first and
    kept on success: the caller releases it (:func:`refimpl.train.run_lock.lock_scope`, or
    the process's end).

    Raises :class:`refimpl.train.run_lock.RunFolderBusy` (a ``FileExistsError``) for a
    folder another process is writing, ``FileExistsError`` for a folder that holds a run
    when neither ``resume`` nor ``overwrite`` is given, ``ValueError`` for both at once, for
    ``resume`` of a folder without ``run.json`` or of another command's run, and for a path
    that is a file.
    """
    folder = Path(folder)
    if resume and overwrite:
        raise ValueError("--resume continues a run and --overwrite replaces it: give one")
    created = not folder.exists()
    lock_run_folder(folder, command)
    try:
        return _open_locked(folder, command, options, resume, overwrite, outputs)
    except BaseException:
        release_run_folder(folder, discard_empty=created)  # a refused open leaves no folder
        raise


def _open_locked(
    folder: Path,
    command: str,
    options: Mapping[str, Any],
    resume: bool,
    overwrite: bool,
    outputs: Iterable[str],
) -> dict[str, Any]:
    """:func:`open_run_folder` once the folder is locked: nothing else writes it now."""
    known = RUN_OUTPUTS | frozenset(outputs)
    existing = _run_files(folder, known)
    # run.json alone is a run that stopped before it wrote anything (bad data, say): no loss
    started = [path for path in existing if path != folder / RUN_FILE]
    # what writes killed mid-way left, in the run and its seeds' folders: under the lock, no
    # write is in flight
    for sub in (folder, *(p for p in folder.rglob("*") if p.is_dir())):
        remove_stale_temporaries(sub)
    if resume:
        record = read_run_file(folder)
        if record["command"] != command:
            raise ValueError(
                f"{folder} holds a '{record['command']}' run, not a '{command}' run; "
                f"resume it with {record['command']}"
            )
        return record
    if started and not overwrite:
        raise FileExistsError(
            f"{folder} holds an earlier run ({started[0].relative_to(folder)}, ...); "
            "pass --resume to continue it, --overwrite to replace it, or another --out"
        )
    for path in existing:
        path.unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        if not any(sub.iterdir()):  # folders the old run made, now empty
            sub.rmdir()
    record = {"command": command, "options": dict(options)}
    save_run_file(folder, record)
    return record


def save_run_file(folder: str | Path, record: Mapping[str, Any]) -> None:
    """Write ``folder/run.json`` (atomically)."""
    write_json(Path(folder) / RUN_FILE, dict(record))


def read_json(path: str | Path) -> Any:
    """The JSON file a run wrote at ``path``; ``ValueError`` naming it if it is damaged."""
    try:
        return json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the run folder is damaged") from err


def read_log(path: str | Path, required: Iterable[str] = ("epoch",)) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl``, one a line, each holding the ``required`` keys.

    A last line cut short (the process was killed while appending it) is dropped with a
    warning; any other line that is not such a record is a ``ValueError`` naming the file
    and the line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start}); the log is damaged"
        ) from err
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            missing = [key for key in required if key not in record]
        except RecursionError:  # nested deeper than the JSON reader goes: no record of ours
            raise ValueError(
                f"{path}, line {number}: a record nested too deep to read; the log is damaged"
            ) from None
        except (ValueError, TypeError) as err:  # JSONDecodeError; an int of > 4300 digits
            if number == len(lines):
                warnings.warn(
                    f"{path}: dropped its last line, cut short ({line[:40]!r})", stacklevel=2
                )
                break
            raise ValueError(
                f"{path}, line {number}: not a JSON record ({err}); the log is damaged"
            ) from err
        if missing:
            raise ValueError(
                f"{path}, line {number}: no {', '.join(missing)} in the record; "
                "not a refimpl training log"
            )
        records.append(record)
    return records


def read_run_file(folder: str | Path) -> dict[str, Any]:
    """``folder/run.json``, checked: ``{"command": str, "options": dict}``."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        raise ValueError(
            f"{folder} has no {RUN_FILE}, so it is not a run folder this version can resume "
            "(runs started before run.json existed: start them again with --overwrite)"
        )
    record = read_json(path)
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("command"), str)
        or not isinstance(record.get("options"), dict)
    ):
        raise ValueError(
            f"{path} is not a run record (expected {{'command': str, 'options': dict}}); "
            "the run folder is damaged"
        )
    return record


def find_run_folder(path: str | Path) -> Path:
    """The run folder of ``path``: the folder itself, or for a file (a checkpoint) the
    nearest of its folder and that folder's parent (a ``seed<k>/``) that holds ``run.json``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no run folder or checkpoint at {path}")
    if path.is_dir():
        return path
    for folder in (path.parent, path.parent.parent):
        if (folder / RUN_FILE).is_file():
            return folder
    raise ValueError(
        f"no {RUN_FILE} beside {path} or in its parent folder, so the run it belongs to is "
        "unknown; pass the run folder to --resume"
    )


def _canonical(value: Any) -> Any:
    """A value as it reads back from JSON (paths as strings, tuples as lists)."""
    return json.loads(json.dumps(value, default=str))


def merge_options(
    stored: Mapping[str, Any],
    given: Mapping[str, Any],
    explicit: Iterable[str],
    output_only: Iterable[str],
    flag_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The options of a resumed run: ``stored``, with the ``output_only`` options the user
    gave (``explicit``) taken from ``given``.

    Every other option in ``explicit`` must equal the stored value; the first that differs
    is a ``ValueError`` naming the flag and both values. ``flag_names`` maps an option's
    name to its spelling on the command line (default ``--name-with-dashes``).
    """
    flag_names = flag_names or {}
    output_only = set(output_only)
    merged = dict(stored)
    for name in sorted(explicit):
        if name not in given:
            continue
        flag = flag_names.get(name, "--" + name.replace("_", "-"))
        if name in output_only:
            merged[name] = _canonical(given[name])
        elif name not in stored:
            raise ValueError(f"{flag} is not an option of the run being resumed")
        elif _canonical(given[name]) != _canonical(stored[name]):
            raise ValueError(
                f"{flag} {_show(given[name])} differs from the resumed run's "
                f"{_show(stored[name])}; drop {flag} to continue the run as it was, "
                "or start a new run with another --out"
            )
    return merged


def _show(value: Any) -> str:
    value = _canonical(value)
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)
