"""Atomic ``.npz`` checkpoints (no pickle): parameters, model state, optimiser state, RNG state,
progress.

Layout of a checkpoint file (every entry a plain array; ``numpy.load(...,
allow_pickle=False)`` reads it):

- ``param/<name>``: model parameters, keyed as in the model
- ``state/<name>``: the model's state that is not a parameter (BatchNorm's running statistics,
  ``model.init_state()``); absent where it has none
- ``opt/<key>``: optimiser state (``refimpl.optim``), e.g. ``opt/step``
- ``sched/<key>``: learning-rate schedule state (``refimpl.schedules``) as 0-d int64 / float64
  arrays, e.g. ``sched/lr``; absent for a run without one
- ``rng_state``: JSON of ``Generator.bit_generator.state`` (0-d str)
- ``progress``: JSON of the loop's bookkeeping: epoch, best model (0-d str)

Writes go to a temporary file in the same directory, then ``os.replace``, so a
crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import to_numpy
from refimpl.files import atomic_write, read_npz

__all__ = ["Checkpoint", "atomic_savez", "load_checkpoint", "read_checkpoint", "save_checkpoint"]


class Checkpoint(NamedTuple):
    """What a checkpoint holds (host arrays), as :func:`read_checkpoint` returns it.

    Attributes
    ----------
    params : dict of str to numpy.ndarray
        Model parameters, keyed as in the model (``param/<name>``).
    opt_state : dict of str to numpy.ndarray
        Optimiser state (``opt/<key>``), e.g. ``step``.
    rng_state : dict
        ``Generator.bit_generator.state``: ``rng.bit_generator.state = rng_state`` resumes
        the draws.
    progress : dict
        The loop's bookkeeping: epoch, best model.
    model_state : dict of str to numpy.ndarray
        State that is not a parameter (BatchNorm's running statistics); empty for a model
        without state.
    schedule_state : dict of str to int or float
        The learning-rate schedule's state, e.g. ``lr``; empty for a run without a schedule.
    """

    params: dict[str, np.ndarray]
    opt_state: dict[str, np.ndarray]
    rng_state: dict[str, Any]
    progress: dict[str, Any]
    model_state: dict[str, np.ndarray]
    schedule_state: dict[str, int | float]


def atomic_savez(path: str | os.PathLike, arrays: dict[str, Any]) -> None:
    """``numpy.savez`` to ``path`` atomically (:func:`refimpl.files.atomic_write`)."""
    host = {k: to_numpy(v) for k, v in arrays.items()}
    atomic_write(path, lambda stream: np.savez(stream, **host))


def save_checkpoint(
    path: str | os.PathLike,
    params: dict[str, Any],
    opt_state: dict[str, Any],
    rng: np.random.Generator,
    progress: dict[str, Any],
    model_state: dict[str, Any] | None = None,
    schedule_state: dict[str, int | float] | None = None,
) -> None:
    """Write one checkpoint atomically (see the module docstring for the layout).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file written; a checkpoint already there is replaced only once the new
        one is complete.
    params : dict of str to array
        Model parameters, keyed as in the model (any backend; saved as host arrays).
    opt_state : dict of str to array
        The optimiser's state (``refimpl.optim``).
    rng : numpy.random.Generator
        The run's generator; its ``bit_generator.state`` is saved.
    progress : dict
        JSON-serialisable bookkeeping of the loop (epoch, best model).
    model_state : dict of str to array, optional
        The model's state that is not a parameter (``model.init_state()``).
    schedule_state : dict of str to int or float, optional
        The learning-rate schedule's state (``refimpl.schedules``), saved exactly.
    """
    arrays: dict[str, Any] = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"state/{k}": v for k, v in (model_state or {}).items()})
    for key, value in (schedule_state or {}).items():  # Python numbers, held exactly
        arrays[f"sched/{key}"] = np.asarray(value, np.int64 if isinstance(value, int) else float)
    arrays.update({f"opt/{k}": v for k, v in opt_state.items()})
    arrays["rng_state"] = np.array(json.dumps(rng.bit_generator.state))
    arrays["progress"] = np.array(json.dumps(progress))
    atomic_savez(path, arrays)


def load_checkpoint(
    path: str | os.PathLike,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """Read a checkpoint's first four fields, checked as :func:`read_checkpoint` checks it.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint written by :func:`save_checkpoint`.

    Returns
    -------
    tuple
        ``(params, opt_state, rng_state, progress)`` as in :class:`Checkpoint` (host
        arrays); the model and schedule state are left out.
    """
    return read_checkpoint(path)[:4]


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint whole, model state included (:class:`Checkpoint`).

    Read through :func:`refimpl.files.read_npz` (plain arrays only, sizes bounded by the
    file), and every field checked: parameters and model state are finite floating arrays, optimiser
    entries finite numeric arrays (``step`` a 0-d integer >= 0), schedule entries 0-d
    numbers not NaN (read back as Python numbers; the schedule's ``load_state`` checks the
    rest), ``rng_state`` a state
    NumPy's generator accepts, ``progress`` an epoch count >= 0 with the best epoch before
    it. Anything else is one ``ValueError`` naming the file and the field.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint written by :func:`save_checkpoint`.

    Returns
    -------
    Checkpoint
        Every field, as host arrays and Python values.
    """
    path = Path(path)
    arrays = read_npz(path, ValueError, _FIX_HINT, what="checkpoint")
    missing = {"rng_state", "progress"} - set(arrays)
    if missing:
        raise ValueError(f"{path} is not a refimpl checkpoint (missing {sorted(missing)})")
    unknown = sorted(
        k for k in arrays if k not in ("rng_state", "progress") and not k.startswith(_PREFIXES)
    )
    if unknown:
        raise ValueError(f"{path} is not a refimpl checkpoint (unexpected entries {unknown})")
    params = {k.removeprefix("param/"): v for k, v in arrays.items() if k.startswith("param/")}
    opt_state = {k.removeprefix("opt/"): v for k, v in arrays.items() if k.startswith("opt/")}
    state = {k.removeprefix("state/"): v for k, v in arrays.items() if k.startswith("state/")}
    schedule = {k.removeprefix("sched/"): v for k, v in arrays.items() if k.startswith("sched/")}
    for name, value in schedule.items():
        if value.shape != () or value.dtype.kind not in "fiu" or np.isnan(value):
            raise ValueError(
                f"{path}: schedule entry {name} must be a 0-d number (not NaN), got "
                f"{value.dtype}{value.shape} {value if value.size == 1 else ''}"
            )
    for kind, entries in (("parameter", params), ("model state entry", state)):
        for name, value in entries.items():
            if value.dtype.kind != "f" or not np.isfinite(value).all():
                raise ValueError(
                    f"{path}: {kind} {name} must be a finite floating array, got {value.dtype}"
                    f"{value.shape}{'' if value.dtype.kind != 'f' else ' with NaN/inf'}"
                )
    for name, value in opt_state.items():
        if value.dtype.kind not in "fiu":
            raise ValueError(f"{path}: optimiser entry {name} has dtype {value.dtype}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            # Adam's moments at inf would turn the first step's update into NaN
            raise ValueError(f"{path}: optimiser entry {name} holds NaN or infinity")
    step = opt_state.get("step")
    if step is not None and (step.shape != () or step.dtype.kind not in "iu" or step < 0):
        raise ValueError(
            f"{path}: optimiser entry step must be a 0-d integer >= 0, got {step.dtype}{step.shape}"
        )
    rng_state = _json_field(path, arrays, "rng_state")
    try:  # NumPy checks the state's fields when it is assigned
        np.random.default_rng().bit_generator.state = rng_state
    except (TypeError, ValueError, KeyError, OverflowError) as err:  # -1 overflows uint64
        raise ValueError(f"{path}: rng_state is not a PCG64 generator state ({err})") from err
    progress = _checked_progress(path, _json_field(path, arrays, "progress"))
    schedule_state = {name: value.item() for name, value in schedule.items()}
    return Checkpoint(params, opt_state, rng_state, progress, state, schedule_state)


_PREFIXES = ("param/", "opt/", "state/", "sched/")
_FIX_HINT = "pass the checkpoint.npz of a refimpl run"


def _json_field(path: Path, arrays: dict[str, np.ndarray], key: str) -> Any:
    """The JSON text stored as a 0-d string array under ``key``, parsed."""
    value = arrays[key]
    if value.shape != () or value.dtype.kind != "U":
        raise ValueError(f"{path}: {key} must be a 0-d string, got {value.dtype}{value.shape}")
    try:
        return json.loads(str(value))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: {key} is not valid JSON ({err})") from err


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checked_progress(path: Path, progress: Any) -> dict[str, Any]:
    """``progress`` is ``{"epoch": int >= 0, "best": {"epoch": int, <metric>: number, ...},
    "train_loss": finite number, "data": str}`` with the best epoch before ``epoch`` (-1:
    none yet); ``data`` (the data's fingerprint) is absent from earlier versions' files."""
    best = progress.get("best") if isinstance(progress, dict) else None
    valid = (
        isinstance(best, dict)
        and _is_int(progress.get("epoch"))
        and progress["epoch"] >= 0
        and _is_number(progress.get("train_loss"))
        and math.isfinite(progress["train_loss"])  # written after an epoch: the guards' finite
        and _is_int(best.get("epoch"))
        and -1 <= best["epoch"] < max(progress["epoch"], 0)
        and all(_is_number(v) for k, v in best.items() if k != "epoch")
        and isinstance(progress.get("data", ""), str)
    )
    if not valid:
        raise ValueError(
            f"{path}: progress must be {{'epoch': int >= 0, 'best': {{'epoch': int before it, "
            f"<metric>: number, ...}}, 'train_loss': number, 'data': str (optional)}}, got "
            f"{progress!r}"
        )
    return progress
