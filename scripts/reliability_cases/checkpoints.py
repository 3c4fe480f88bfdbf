"""Checkpoints: ``load_checkpoint`` on damaged files and members (NaN or infinite parameters
and optimiser state, bad RNG state and progress), and ``train_model(resume=...)`` from
damaged checkpoints.

References: the arrays and records the checkpoint was written from; a resumed run must end
bit for bit where the same run without a stop ends.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.data import karate_club
from refimpl.models import GAT
from refimpl.train import TrainConfig, load_checkpoint, train_model
from reliability_cases.files import file_cases, in_scratch, member_cases
from reliability_cases.outcomes import Case, difference

EPOCHS, STOP = 4, 2  # the full run, and the epoch its checkpoint is written at


@functools.cache
def _setting() -> tuple[Any, Any]:
    return GAT(34, 4, 2, num_layers=2), karate_club()


def _train(folder: Path, epochs: int, resume: Path | None = None) -> Any:
    model, data = _setting()
    config = TrainConfig(epochs=epochs, checkpoint_every=1)
    return train_model(model, data, config, out_dir=folder, resume=resume)


@functools.cache
def _stopped_run() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The checkpoint of a run stopped after :data:`STOP` epochs (its arrays), and the
    parameters the same run ends with after :data:`EPOCHS` without a stop."""

    def inside(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        _train(folder / "stopped", STOP)
        with np.load(folder / "stopped" / "checkpoint.npz") as archive:
            arrays = {key: archive[key] for key in archive.files}
        return arrays, _train(folder / "full", EPOCHS).params

    return in_scratch(inside)


def _arrays() -> dict[str, np.ndarray]:
    return dict(_stopped_run()[0])


def _loaded(path: Path) -> dict[str, Any]:
    params, opt_state, rng_state, progress = load_checkpoint(path)
    return {"params": params, "opt": opt_state, "rng": rng_state, "progress": progress}


def _reference(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """What the checkpoint holds, read back by hand."""
    return {
        "params": {k[6:]: v for k, v in arrays.items() if k.startswith("param/")},
        "opt": {k[4:]: v for k, v in arrays.items() if k.startswith("opt/")},
        "rng": json.loads(str(arrays["rng_state"])),
        "progress": json.loads(str(arrays["progress"])),
    }


def _json_cases() -> list[Case]:
    """``rng_state`` and ``progress`` replaced by other JSON (or none)."""
    progress = json.loads(str(_arrays()["progress"]))
    rng = json.loads(str(_arrays()["rng_state"]))
    texts = {
        "rng_state": {
            "not JSON": "{",
            "a list": "[1, 2]",
            "state missing": json.dumps({"bit_generator": "PCG64"}),
            "another generator": json.dumps({**rng, "bit_generator": "MT19937"}),
            "state a string": json.dumps({**rng, "state": "x"}),
            "negative state": json.dumps({**rng, "state": {**rng["state"], "state": -1}}),
        },
        "progress": {
            "not JSON": "{",
            "null": "null",
            "epoch -1": json.dumps({**progress, "epoch": -1}),
            "epoch 1.5": json.dumps({**progress, "epoch": 1.5}),
            "epoch NaN": json.dumps({**progress, "epoch": float("nan")}),
            "best after epoch": json.dumps({**progress, "best": {**progress["best"], "epoch": 9}}),
            "loss a string": json.dumps({**progress, "train_loss": "low"}),
            "loss NaN": json.dumps({**progress, "train_loss": float("nan")}),
            "best missing": json.dumps({k: v for k, v in progress.items() if k != "best"}),
        },
    }

    def run(key: str, text: str) -> Any:
        def inside(folder: Path) -> Any:
            np.savez(folder / "checkpoint.npz", **{**_arrays(), key: np.array(text)})
            return _loaded(folder / "checkpoint.npz")

        return in_scratch(inside)

    return [
        Case(f"load_checkpoint | {key} | {label}", lambda k=key, t=text: run(k, t), None, (key,))
        for key, table in texts.items()
        for label, text in table.items()
    ]


def _resume(change: dict[str, np.ndarray | None]) -> Any:
    """Resume the stopped run from its checkpoint with members changed (None: removed)."""

    def inside(folder: Path) -> Any:
        arrays = {k: v for k, v in {**_arrays(), **change}.items() if v is not None}
        np.savez(folder / "checkpoint.npz", **arrays)
        return _train(folder / "resumed", EPOCHS, resume=folder / "checkpoint.npz").params

    return in_scratch(inside)


def _resume_cases() -> list[Case]:
    arrays = _arrays()
    w = arrays["param/layer0.W_s"]
    changes = {
        "parameter of another shape": {"param/layer0.W_s": w[:, :-1]},
        "parameter missing": {"param/layer0.W_s": None},
        "parameter of another model": {"param/layer9.W_s": w},
        "optimiser moment of another shape": {"opt/m.layer0.W_s": w[:-1]},
        "optimiser moment missing": {"opt/v.layer0.W_s": None},
        "optimiser step -1": {"opt/step": np.array(-1)},
        "optimiser step 1.5": {"opt/step": np.array(1.5)},
        "optimiser moment NaN": {"opt/m.layer0.W_s": np.full_like(w, np.nan)},
        "optimiser second moment negative": {"opt/v.layer0.W_s": -np.ones_like(w)},
        "progress past the epochs": {
            "progress": np.array(
                json.dumps({**json.loads(str(arrays["progress"])), "epoch": EPOCHS + 3})
            )
        },
        "another data set's fingerprint": {
            "progress": np.array(
                json.dumps({**json.loads(str(arrays["progress"])), "data": "0" * 64})
            )
        },
    }
    full = _stopped_run()[1]
    cases = [
        Case(
            "resume | valid checkpoint",
            lambda: _resume({}),
            lambda params: difference(params, full, 0.0),
        )
    ]
    cases += [
        Case(
            f"resume | {label}",
            lambda c=change: _resume(c),
            None,
            ("checkpoint", *(k.split("/")[-1] for k in change)),
        )
        for label, change in changes.items()
    ]
    return cases


# what load_checkpoint must refuse in any member: it cannot hold a number, or not a finite
# one; a parameter must be a float; a step a count
_NEVER = ("NaN", "inf", "type: str", "type: None", "dtype: str", "dtype: object", "dtype: complex")


def _as_stored(key: str, corruption: Any) -> bool:
    """Damages that leave a checkpoint of another model or state (shapes, keys, float
    precision): load_checkpoint cannot know the model; resuming checks it (below)."""
    if corruption is None:  # a checkpoint of a smaller model, or of no step yet
        return True
    name = corruption.name
    if any(word in name for word in _NEVER):
        return False
    if key.startswith("param/"):
        return not name.startswith(("dtype: int", "dtype: bool", "dtype: uint"))
    if key == "opt/step":
        return not name.startswith(("dtype: float", "dtype: bool", "range: one index -1"))
    return not name.startswith("dtype: bool")


def cases() -> list[Case]:
    def write(folder: Path) -> Path:
        np.savez(folder / "checkpoint.npz", **_arrays())
        return folder / "checkpoint.npz"

    return (
        file_cases(
            "load_checkpoint",
            write,
            _loaded,
            lambda: _reference(_arrays()),
            npz=True,
            mentions=("checkpoint",),
        )
        + member_cases(
            "load_checkpoint member",
            _arrays,
            _loaded,
            _reference,
            skip=("rng_state", "progress"),
            as_stored=_as_stored,
        )
        + _json_cases()
        + _resume_cases()
    )
