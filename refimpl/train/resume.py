"""What a resumed run reads back and checks: its checkpoint against the model, the optimiser,
the run's length and the data, and its log cut back to the checkpoint's epoch.

A run resumed on other data would train half on one dataset and half on another and end
without a word, so a run records the identity of its data (:func:`data_fingerprint`, a
SHA-256 of every array it trains on) in each checkpoint, and ``refimpl train`` / ``sweep``
also in ``run.json``; a resume on data whose fingerprint differs is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.files import atomic_write, read_npz
from refimpl.train.checkpoint import atomic_savez, read_checkpoint
from refimpl.train.records import strict_json
from refimpl.train.run_folder import read_log

__all__ = [
    "Restored",
    "data_fingerprint",
    "diagnostic_baselines",
    "restore_run",
    "truncate_log",
]


def data_fingerprint(*data: Any) -> str:
    """The SHA-256 (hex) of the data a run trains on, the same on every machine and backend.

    Each part may be a dataset (a dataclass such as ``NodeDataset`` or ``GraphDataset``:
    every field but its ``name``, which names the data and does not change it), a
    :class:`refimpl.Graph`, an array (NumPy or a device array, hashed as its host copy), a
    SciPy CSR matrix, a number, a string, or a list or tuple of these. Dtypes and shapes are
    part of the hash, so a float32 copy of a dataset is other data than its float64 original.
    """
    digest = hashlib.sha256()
    for part in data:
        _update(digest, part)
    return digest.hexdigest()


def _update(digest: Any, value: Any) -> None:
    """Feed ``value`` to ``digest``, each item tagged with its kind and layout."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(f"dataclass {type(value).__name__}\n".encode())
        for field in dataclasses.fields(value):
            # a dataset without missing labels or edge features hashes as before its y_mask
            # and edge_attr existed, so the runs written then still resume
            optional = ("y_mask", "edge_attr")
            absent = field.name in optional and getattr(value, field.name) is None
            if field.name != "name" and not absent:
                digest.update(f"field {field.name}\n".encode())
                _update(digest, getattr(value, field.name))
    elif hasattr(value, "edge_index") and hasattr(value, "num_dst_nodes"):  # a Graph
        digest.update(f"graph {value.num_nodes} {value.num_dst_nodes}\n".encode())
        _update(digest, value.edge_index)
    elif getattr(value, "format", None) == "csr":  # sparse features
        digest.update(f"csr {value.shape}\n".encode())
        for array in (value.indptr, value.indices, value.data):
            _update(digest, array)
    elif isinstance(value, list | tuple):
        digest.update(f"sequence {len(value)}\n".encode())
        for item in value:
            _update(digest, item)
    elif isinstance(value, str | int | float | bool) or value is None:
        digest.update(f"{type(value).__name__} {value!r}\n".encode())
    else:
        array = np.ascontiguousarray(to_numpy(value))
        digest.update(f"array {array.dtype.str} {array.shape}\n".encode())
        digest.update(array.tobytes())


class Restored(NamedTuple):
    """A run's state read back from its checkpoint by :func:`restore_run`."""

    params: dict
    opt_state: dict
    epoch: int  # the next epoch to run
    best: dict
    train_loss: float
    model_state: dict  # empty for a model without state
    schedule_state: dict | None  # None for a run without a learning-rate schedule


def restore_run(
    path: Any,
    params: dict,
    optimizer: Any,
    rng: np.random.Generator,
    epochs: int,
    fingerprint: str | None = None,
    model_state: dict | None = None,
    schedule: Any = None,
) -> Restored:
    """The state saved in the checkpoint at ``path``, checked against the model (its
    ``params`` and, for a model with state, ``model_state``: BatchNorm's running statistics),
    the optimiser, the learning-rate ``schedule`` (a :mod:`refimpl.schedules` configuration,
    or ``None``), the run's length and (``fingerprint``, when the checkpoint records one) the
    data; ``rng`` is set to the saved state. A checkpoint with a schedule's state resumed
    without a schedule, or the reverse, is refused: the rest of the run would not be the run
    that was started."""
    saved_params, saved_opt, rng_state, progress, saved_state, saved_schedule = read_checkpoint(
        path
    )
    saved_data = progress.get("data")
    if fingerprint is not None and saved_data is not None and saved_data != fingerprint:
        raise ValueError(
            f"checkpoint {path} was written training on other data (SHA-256 "
            f"{str(saved_data)[:12]}...) than given now ({fingerprint[:12]}...): resume on the "
            "run's own data, or start a new run"
        )
    model_state = model_state or {}
    for kind, saved, expected in (
        ("parameters", saved_params, params),
        ("model state", saved_state, model_state),
    ):
        _check_entries(path, kind, saved, expected)
    if progress["epoch"] > epochs:
        raise ValueError(
            f"checkpoint {path} is at epoch {progress['epoch']}, past the {epochs} epochs asked "
            f"for; pass --epochs {progress['epoch']} or more"
        )
    restored, restored_state = (
        {k: asarray(v, backend=backend_name(get_array_module(like[k]))) for k, v in saved.items()}
        for saved, like in ((saved_params, params), (saved_state, model_state))
    )
    try:  # keys, shapes and dtypes against the parameters, moved to their backend
        restored_opt = optimizer.load_state(saved_opt, restored)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {path}: optimiser state does not fit: {err}") from err
    schedule_state = _restore_schedule(path, schedule, saved_schedule)
    rng.bit_generator.state = rng_state
    epoch, best, train_loss = progress["epoch"], progress["best"], progress["train_loss"]
    return Restored(restored, restored_opt, epoch, best, train_loss, restored_state, schedule_state)


def _restore_schedule(path: Any, schedule: Any, saved: dict) -> dict | None:
    """The saved schedule state, checked by ``schedule``; refused where one of the two is
    missing."""
    if schedule is None and saved:
        raise ValueError(
            f"checkpoint {path} holds a learning-rate schedule's state but the run has no "
            "schedule; resume with the run's own schedule options"
        )
    if schedule is None:
        return None
    if not saved:
        raise ValueError(
            f"checkpoint {path} was written without a learning-rate schedule; resume without "
            f"one, or start a new run with {type(schedule).__name__}"
        )
    try:
        return schedule.load_state(saved)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {path}: schedule state does not fit: {err}") from err


def _check_entries(path: Any, kind: str, saved: dict, expected: dict) -> None:
    """The checkpoint's ``kind`` entries have the model's names, in order, shapes and dtypes."""
    if list(saved) != list(expected):
        raise ValueError(
            f"checkpoint {path} holds {kind} {list(saved)} but the model has "
            f"{list(expected)}; resume with the same model configuration"
        )
    for name, value in saved.items():
        if value.shape != expected[name].shape or value.dtype != expected[name].dtype:
            raise ValueError(
                f"checkpoint {path}: {name} is {value.dtype}{value.shape}, the model expects "
                f"{expected[name].dtype}{expected[name].shape}; "
                "resume with the same model configuration"
            )


def truncate_log(out: Path, start: int) -> None:
    """Keep the log lines of epochs before ``start`` (a resumed run rewrites the rest); a
    last line cut short by a kill is dropped with a warning (:func:`read_log`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "log.jsonl"
    kept = []
    if start > 0 and path.exists():
        kept = [record for record in read_log(path) if record["epoch"] < start]
    text = "".join(strict_json(record) + "\n" for record in kept)
    atomic_write(path, lambda stream: stream.write(text.encode()))


def diagnostic_baselines(out: Path | None, params: dict, resume: Any) -> tuple[dict, dict]:
    """``(initial, best)`` parameters for ``TrainConfig.diagnostics``: saved as ``initial.npz``
    by a fresh run, read back (with ``best.npz``) from beside the checkpoint by a resumed one."""
    if resume is None:
        if out is not None:
            atomic_savez(out / "initial.npz", {k: to_numpy(v) for k, v in params.items()})
        return params, params
    folder = Path(resume).parent
    try:
        return read_npz(folder / "initial.npz"), read_npz(folder / "best.npz")
    except FileNotFoundError as err:
        raise ValueError(
            f"resuming with diagnostics needs initial.npz and best.npz beside {resume}; "
            "the run was started without --diagnostics"
        ) from err
