"""Atomic ``.npz`` checkpoints (no pickle): parameters, optimiser state, RNG state, progress.

Layout of a checkpoint file (every entry a plain array; ``numpy.load(...,
allow_pickle=False)`` reads it):

=====================  =====================================================
key                    content
=====================  =====================================================
``param/<name>``       model parameters, keyed as in the model
``opt/<key>``          optimiser state (``refimpl.optim``), e.g. ``opt/step``
``rng_state``          JSON of ``Generator.bit_generator.state`` (0-d str)
``progress``           JSON of the loop's bookkeeping: epoch, best model (0-d str)
=====================  =====================================================

Writes go to a temporary file in the same directory, then ``os.replace``, so a
crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.backend import to_numpy
from refimpl.files import atomic_write

__all__ = ["atomic_savez", "load_checkpoint", "save_checkpoint"]


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
) -> None:
    """Write one checkpoint (see the module docstring for the layout)."""
    arrays: dict[str, Any] = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"opt/{k}": v for k, v in opt_state.items()})
    arrays["rng_state"] = np.array(json.dumps(rng.bit_generator.state))
    arrays["progress"] = np.array(json.dumps(progress))
    atomic_savez(path, arrays)


def load_checkpoint(
    path: str | os.PathLike,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """Read a checkpoint: ``(params, opt_state, rng_state, progress)`` (host arrays)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; pass the checkpoint.npz of a run")
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.files)
        missing = {"rng_state", "progress"} - set(names)
        if missing:
            raise ValueError(f"{path} is not a refimpl checkpoint (missing {sorted(missing)})")
        params = {k.removeprefix("param/"): archive[k] for k in names if k.startswith("param/")}
        opt_state = {k.removeprefix("opt/"): archive[k] for k in names if k.startswith("opt/")}
        rng_state = json.loads(str(archive["rng_state"]))
        progress = json.loads(str(archive["progress"]))
    return params, opt_state, rng_state, progress
