"""Golden vectors: every layer and model on fixed small inputs, written so any framework can replay
them (``refimpl golden export DIR``) and checked against the current code (``refimpl golden
verify DIR``).

The files (the keys of each ``<case>.npz``, ``manifest.json``) are described in
:mod:`refimpl.interop.golden_format`; the cases are listed in
:mod:`refimpl.interop.golden_cases`.

Replaying in another framework: build the layer from ``config`` (the docstring of the case's
``module`` says what each option means), load ``param/*`` into it (names and layouts: the
parameter table of each layer's docstring, e.g. ``refimpl.nn.gat.conv`` maps ours to PyG's), run
it on ``input/*`` with ``noise/*`` in place of its own random draws, compare with ``output/out``,
then pull ``cotangent`` back and compare with ``grad/*``. Conventions that decide a match:
GATConv with ``add_self_loops`` drops existing self-loops and appends one per node, so its
attention (and ``noise/attn_dropout_mask``, ``(E', H)``) runs over "non-loop edges in input
order, then the loops of nodes 0..N-1"; TransformerConv attends over the graph as given
(a node without incoming edges aggregates zero); duplicate edges are separate terms. The
models name their noise per layer (``noise/layer0.input_mask``, ``noise/layer1.projection``,
...): the "Randomness" paragraph of each model's docstring gives the keys and shapes.

Tolerances (``verify``): outputs ``max |a - b| / max |b| <= 1e-12`` (``FORWARD_RTOL``:
the same formulas, summed in another order); gradients ``1e-10`` relative to the largest
gradient entry of the case (:mod:`refimpl.interop.compare` explains the group scale: a
gradient that is zero by cancellation is rounding on both sides). Gradients get 100x the
outputs' tolerance because a backward pass accumulates more roundings than its forward.

``verify`` checks every file's presence and SHA-256 before computing anything, rebuilds each
block from an allow-list of classes (never ``eval`` or pickle), replays it and compares.
Adding a case is one :class:`~refimpl.interop.golden_cases.GoldenCase` entry in ``CASES``: a
name, the class and its keyword arguments, and an input builder.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

import refimpl
from refimpl.backend import to_numpy
from refimpl.files import atomic_write
from refimpl.graph import Graph
from refimpl.interop.compare import Comparison, compare_tensors
from refimpl.interop.golden_cases import CASES, GOLDEN_CASES, REGISTRY, GoldenCase
from refimpl.interop.golden_format import (
    FORMAT,
    FORMAT_VERSION,
    LOSS,
    MANIFEST_NAME,
    GoldenError,
    file_sha256,
    load_case,
    npz_bytes,
    read_manifest,
)
from refimpl.testing import tolerances
from refimpl.testing.gradcheck import as_tuple

__all__ = [
    "GRADIENT_RTOL",
    "OUTPUT_RTOL",
    "export_golden",
    "verify_golden",
]

# golden files are float64: outputs 1e-12 (the same forward, summed differently), gradients
# 1e-10 (a backward accumulates more roundings; scale: the case's largest gradient)
OUTPUT_RTOL = tolerances.FORWARD_RTOL[np.dtype(np.float64)]
GRADIENT_RTOL = tolerances.GRADIENT_RTOL[np.dtype(np.float64)]

_PARAM_JITTER = 0.3  # added to init_params' values: no zero biases, no ones in LayerNorm


# -- export ------------------------------------------------------------------------------------
def export_golden(
    directory: str | os.PathLike, cases: Iterable[str] | None = None, *, force: bool = False
) -> dict[str, Any]:
    """Write ``<case>.npz`` for each case and ``manifest.json`` to ``directory``.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing. One that exists and is not empty is refused unless ``force``.
    cases : iterable of str, optional
        Names from :data:`GOLDEN_CASES`; default all of them.
    force : bool, default False
        Write into a non-empty directory: files of the same names are replaced, others are
        left alone.

    Returns
    -------
    dict
        The manifest written (as :func:`read_manifest` reads it back).
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise GoldenError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise GoldenError(
            f"{directory} is not empty; choose a new directory or pass --force "
            "(force=True) to overwrite the golden files in it"
        )
    selected = _select(cases, GOLDEN_CASES, "refimpl's golden cases")
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for case in CASES:
        if case.name in selected:
            entries.append(_export_case(case, directory))
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refimpl_version": refimpl.__version__,
        "numpy_version": np.__version__,
        "loss": LOSS,
        "tolerances": {"output_rtol": OUTPUT_RTOL, "gradient_rtol": GRADIENT_RTOL},
        "cases": entries,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    atomic_write(directory / MANIFEST_NAME, lambda stream: stream.write(text.encode()))
    return manifest


def _export_case(case: GoldenCase, directory: Path) -> dict[str, Any]:
    block = case.cls(**case.kwargs)
    rng = np.random.default_rng(case.seed)
    initial = block.init_params(rng) if hasattr(block, "init_params") else {}  # all-pair: none
    params = {
        name: value + _PARAM_JITTER * rng.standard_normal(value.shape)
        for name, value in initial.items()
    }
    data = case.build(block, rng)
    forward = {
        "args": list(data.args),
        "array_kwargs": dict(data.array_kwargs),
        "kwargs": dict(data.kwargs),
        "noise_kwarg": data.noise_kwarg,
    }
    arrays: dict[str, np.ndarray] = {f"input/{k}": v for k, v in data.inputs.items()}
    arrays |= {f"param/{k}": v for k, v in params.items()}
    noise = dict(data.noise)
    if data.draw_noise:
        _, cache = _forward(block, params, arrays, {**forward, "noise_kwarg": None}, rng=rng)
        noise |= {key: to_numpy(value) for key, value in cache.noise.items()}
    arrays |= {f"noise/{k}": np.asarray(v) for k, v in noise.items()}
    out, cache = _forward(block, params, arrays, forward)
    cotangent = rng.standard_normal(out.shape)
    grads = _backward(block, params, cache, cotangent, data.grad_inputs)
    arrays["cotangent"] = cotangent
    arrays["output/out"] = out
    arrays |= grads
    arrays = {key: _stored(key, value) for key, value in arrays.items()}
    content = npz_bytes(arrays)
    file_name = f"{case.name}.npz"
    atomic_write(directory / file_name, lambda stream: stream.write(content))
    return {
        "name": case.name,
        "file": file_name,
        "sha256": hashlib.sha256(content).hexdigest(),
        "class": type(block).__name__,
        "module": type(block).__module__,
        "config": _config(block),
        "forward": forward,
        "grad_inputs": [f"input/{name}" for name in data.grad_inputs],
        "seed": case.seed,
        "description": case.description,
        "arrays": {
            key: {"shape": list(value.shape), "dtype": str(value.dtype)}
            for key, value in arrays.items()
        },
    }


def _stored(key: str, value: Any) -> np.ndarray:
    """Host array in the file's dtype: float64, int64 for indices, bool for masks."""
    value = np.array(to_numpy(value), order="C")  # a C-order copy; keeps 0-d arrays 0-d
    if value.dtype.kind == "b":
        return value
    if value.dtype.kind in "iu":
        return value.astype(np.int64)
    if value.dtype != np.float64:
        raise GoldenError(f"{key} has dtype {value.dtype}; golden files hold float64 values")
    return value


def _config(block: Any) -> dict[str, Any]:
    """The constructor's keyword arguments: dataclass init fields only (derived ones skipped)."""
    config = {}
    for item in fields(block):
        if item.init:
            value = getattr(block, item.name)
            config[item.name] = list(value) if isinstance(value, tuple) else value
    return config


# -- the replay, shared by export and verify -----------------------------------------------------
def _forward(
    block: Any,
    params: dict[str, Any],
    arrays: dict[str, np.ndarray],
    forward: dict[str, Any],
    rng: np.random.Generator | None = None,
) -> tuple[Any, Any]:
    """``block.forward(params, *args, **kwargs)`` with the arrays the spec names."""
    graph = None
    if "input/edge_index" in arrays:
        graph = Graph(arrays["input/edge_index"], int(arrays["input/num_nodes"]))
    args = [graph if key == "graph" else arrays[key] for key in forward["args"]]
    kwargs = dict(forward["kwargs"])
    kwargs |= {name: arrays[key] for name, key in forward["array_kwargs"].items()}
    if forward["noise_kwarg"] is not None:
        kwargs[forward["noise_kwarg"]] = {
            key.removeprefix("noise/"): value
            for key, value in arrays.items()
            if key.startswith("noise/")
        }
    if rng is not None:
        kwargs["rng"] = rng
    return block.forward(params, *args, **kwargs)


def _backward(
    block: Any, params: dict[str, Any], cache: Any, cotangent: Any, grad_inputs: Iterable[str]
) -> dict[str, Any]:
    """``grad/input/<name>`` and ``grad/param/<name>`` of ``L = sum(cotangent * out)``."""
    grad_inputs = list(grad_inputs)
    d_inputs, d_params = block.backward(params, cache, cotangent)
    d_inputs = as_tuple(d_inputs, len(grad_inputs))
    grads = {f"grad/input/{n}": d for n, d in zip(grad_inputs, d_inputs, strict=True)}
    grads |= {f"grad/param/{name}": d_params[name] for name in params}
    return grads


# -- verify ------------------------------------------------------------------------------------
def verify_golden(
    directory: str | os.PathLike, cases: Iterable[str] | None = None
) -> list[tuple[str, Comparison]]:
    """Replay the golden files of ``directory`` and compare, case by case.

    Checks the manifest and every selected file's presence and SHA-256 before computing
    anything (:class:`~refimpl.interop.golden_format.GoldenError` naming each problem).

    Parameters
    ----------
    directory : str or os.PathLike
        A golden directory written by :func:`export_golden`.
    cases : iterable of str, optional
        Case names from its manifest; default all of them.

    Returns
    -------
    list of (str, Comparison)
        Per case in manifest order, its name and one
        :class:`~refimpl.interop.compare.Comparison`: ``output/out`` judged at
        :data:`OUTPUT_RTOL` against its own scale, the gradients at :data:`GRADIENT_RTOL`
        against the case's largest gradient entry (every tensor carries its own rtol and
        verdict).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    entries = {entry["name"]: entry for entry in manifest["cases"]}
    selected = _select(cases, tuple(entries), f"the cases of {directory / MANIFEST_NAME}")
    chosen = [entries[name] for name in entries if name in selected]
    problems = []
    for entry in chosen:
        path = directory / entry["file"]
        if not path.is_file():
            problems.append(f"{entry['file']}: missing (case {entry['name']})")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(
                f"{entry['file']}: altered (its SHA-256 differs from the manifest's; "
                f"case {entry['name']})"
            )
    if problems:
        raise GoldenError(
            f"{len(problems)} golden file(s) in {directory} cannot be trusted:\n  "
            + "\n  ".join(problems)
            + "\nre-export the directory or restore the files"
        )
    return [(entry["name"], _verify_case(directory, entry)) for entry in chosen]


def _verify_case(directory: Path, entry: dict[str, Any]) -> Comparison:
    name = entry["name"]
    cls = REGISTRY.get(entry["class"])
    if cls is None:
        raise GoldenError(
            f"case {name}: unknown class {entry['class']!r}; golden files may name "
            + ", ".join(sorted(REGISTRY))
        )
    arrays = load_case(directory, entry)
    try:
        block = cls(**_from_json(entry["config"]))
        shapes = block.param_shapes() if hasattr(block, "param_shapes") else {}
        params = {key: arrays[f"param/{key}"] for key in shapes}
        out, cache = _forward(block, params, arrays, entry["forward"])
        grad_inputs = [key.removeprefix("input/") for key in entry["grad_inputs"]]
        grads = _backward(block, params, cache, arrays["cotangent"], grad_inputs)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise GoldenError(
            f"case {name}: cannot replay {entry['class']}({entry['config']}): "
            f"{type(err).__name__}: {err}"
        ) from err
    outputs = compare_tensors(
        {"output/out": out}, {"output/out": arrays["output/out"]}, OUTPUT_RTOL
    )
    stored = {key: value for key, value in arrays.items() if key.startswith("grad/")}
    gradients = compare_tensors(grads, stored, GRADIENT_RTOL, groups={"gradients": list(stored)})
    return outputs + gradients


def _from_json(config: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments from JSON: lists back to tuples (``GAT(heads=(2, 1))``)."""
    return {key: tuple(v) if isinstance(v, list) else v for key, v in config.items()}


# -- case selection ----------------------------------------------------------------------------
def _select(names: Iterable[str] | None, available: tuple[str, ...], where: str) -> set[str]:
    if names is None:
        return set(available)
    names = list(names)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise GoldenError(
            f"unknown case(s) {', '.join(unknown)}; {where} are: {', '.join(available)}"
        )
    return set(names)
