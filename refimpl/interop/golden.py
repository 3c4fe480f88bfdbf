"""Golden vectors: every layer and model on fixed small inputs, written so any framework can replay
them (``refimpl golden export DIR``) and checked against the current code (``refimpl golden
verify DIR``).

What a golden directory holds
-----------------------------
One ``<case>.npz`` per canonical case (:data:`GOLDEN_CASES`) and ``manifest.json``. Every
``.npz`` is a plain NumPy zip archive (``numpy.load(path, allow_pickle=False)``; in Julia
``NPZ.npzread``; in JAX ``jnp.asarray`` of NumPy's arrays), C order, with these keys:

========================  ========  ===========================================================
key                       dtype     content
========================  ========  ===========================================================
``input/x``               float64   node features ``(N, in)``; for the dense attention blocks
                                    of LipschitzNorm ``(d, n)``, one input vector per *column*
``input/edge_index``      int64     ``(2, E)``, row 0 the source ``u``, row 1 the target ``v``
                                    (a message flows ``u -> v``), as PyTorch Geometric
``input/num_nodes``       int64     0-d ``N`` (an isolated node has no edge to tell it)
``input/edge_attr``       float64   ``(E, edge_dim)``, row ``e`` belongs to edge ``e``
``input/pe``              float64   positional encodings ``(N, pe_dim)``
``input/batch``           int64     ``(N,)`` the graph of every node
``input/q``, ``k``, ``v`` float64   queries, keys ``(N, d)``, values ``(N, d_v)`` (all-pair
                                    attention and random features)
``param/<name>``          float64   parameters under our names (the block's ``param_shapes()``;
                                    weights are ``(out, in)``: ``y = x W^T + b``)
``noise/<key>``           float64   random draws, fed in and never drawn: NodeFormer's
                                    projection ``omega (m, C)``, Gumbel noise ``g (N, H, K)``
                                    (per key node, head, sample)
``noise/<key>``           bool      dropout keep-masks, True = keep: ``y = x * mask / (1 - p)``
``cotangent``             float64   ``c``, shaped like the output
``output/out``            float64   the block's output
``grad/input/<name>``     float64   ``dL/d input/<name>``, for the float inputs of the case
``grad/param/<name>``     float64   ``dL/d param/<name>``
========================  ========  ===========================================================

The loss is ``L = sum(c * out)`` (``c`` the stored ``cotangent``), so the stored gradients are
the vector-Jacobian product of ``c``: what ``jax.vjp(f, ...)[1](c)`` or Zygote's pullback
returns. Integer inputs and noise get no gradient.

``manifest.json``: ``format`` ("refimpl-golden"), ``format_version`` (1), ``refimpl_version``,
``numpy_version``, ``loss``, ``tolerances``, and ``cases``, a list with per case: ``name``,
``file``, ``sha256`` (of the file's bytes), ``class`` (the layer or model), ``module`` (whose
docstring states the equations and every convention to replicate: self-loop handling, edge
order, ties, where ``eps`` sits), ``config`` (the constructor's keyword arguments),
``forward`` (how the arrays enter ``forward``: ``args`` positional keys, ``"graph"`` standing
for ``Graph(input/edge_index, input/num_nodes)``; ``array_kwargs`` keyword -> key;
``kwargs`` literal keywords such as ``training``; ``noise_kwarg`` the keyword receiving the
dict ``{key: noise/<key>}``), ``grad_inputs`` (the inputs with a stored gradient),
``seed``, ``description``, and ``arrays``: every key's ``shape`` and ``dtype``.

Replaying in another framework: build the layer from ``config`` (the docstring of the case's
``module`` says what each option means), load ``param/*`` into it (names and layouts: the
parameter table of each layer's docstring, e.g. ``refimpl.nn.gat`` maps ours to PyG's), run
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

Files are written deterministically (fixed zip timestamps, fixed key order, seeded values),
so two exports on one machine are byte-identical and their manifests carry equal SHA-256s.
``verify`` checks every file's presence and SHA-256 before computing anything, rebuilds each
block from an allow-list of classes (never ``eval`` or pickle), replays it and compares.
Adding a case is one :class:`GoldenCase` entry in ``CASES``: a name, the class and its
keyword arguments, and an input builder.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

import refimpl
from refimpl.backend import to_numpy
from refimpl.files import atomic_write, read_npz
from refimpl.graph import Graph
from refimpl.interop.compare import Comparison, compare_tensors
from refimpl.interop.golden_cases import CASES, GOLDEN_CASES, REGISTRY, GoldenCase
from refimpl.testing import tolerances
from refimpl.testing.gradcheck import as_tuple

__all__ = [
    "GOLDEN_CASES",
    "GRADIENT_RTOL",
    "MANIFEST_NAME",
    "OUTPUT_RTOL",
    "REGISTRY",
    "GoldenError",
    "export_golden",
    "read_manifest",
    "verify_golden",
]

FORMAT = "refimpl-golden"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# golden files are float64: outputs 1e-12 (the same forward, summed differently), gradients
# 1e-10 (a backward accumulates more roundings; scale: the case's largest gradient)
OUTPUT_RTOL = tolerances.FORWARD_RTOL[np.dtype(np.float64)]
GRADIENT_RTOL = tolerances.GRADIENT_RTOL[np.dtype(np.float64)]
LOSS = "L = sum(cotangent * output/out)"

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest zip timestamp: files do not record export time
_PARAM_JITTER = 0.3  # added to init_params' values: no zero biases, no ones in LayerNorm


class GoldenError(ValueError):
    """A golden directory that cannot be checked: no or bad manifest, a missing or altered
    file, an unknown class or case. (A numerical mismatch is a result, not this error.)"""


# -- export ------------------------------------------------------------------------------------
def export_golden(
    directory: str | os.PathLike, cases: Iterable[str] | None = None, *, force: bool = False
) -> dict[str, Any]:
    """Write ``<case>.npz`` for each case (all of :data:`GOLDEN_CASES` by default) and
    ``manifest.json`` to ``directory``; returns the manifest.

    Refuses a directory that exists and is not empty unless ``force`` (files of the same
    names are then replaced; others are left alone).
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
    content = _npz_bytes(arrays)
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
def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """``directory``'s manifest, checked for the fields :func:`verify_golden` reads."""
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        raise GoldenError(f"{directory} is not a directory; run `refimpl golden export DIR`")
    if not path.is_file():
        raise GoldenError(
            f"no {MANIFEST_NAME} in {directory}: not a golden directory (create one with "
            "`refimpl golden export DIR`)"
        )
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GoldenError(f"{path} is not valid JSON ({err}); re-export the directory") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise GoldenError(f"{path} is not a refimpl golden manifest (no format {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenError(
            f"{path} has format_version {manifest.get('format_version')!r}; this refimpl "
            f"reads version {FORMAT_VERSION}: re-export with this version"
        )
    _check_manifest(path, manifest)
    return manifest


_REQUIRED = ("name", "file", "sha256", "class", "config", "forward", "grad_inputs", "arrays")


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Every field :func:`verify_golden` and the CLI read, of the type and form export writes:
    one :class:`GoldenError` line naming the first field that is not."""
    fix = "re-export the directory"
    cases = manifest.get("cases")
    if not isinstance(cases, list) or not cases:
        # a verification that checks nothing must not pass
        raise GoldenError(
            f"{path}: 'cases' must be a list of one or more entries with the fields "
            f"{', '.join(_REQUIRED)} (an empty list would verify nothing); {fix}"
        )
    names = set()
    for number, entry in enumerate(cases):
        problem = _entry_problem(entry)
        if problem:
            name = entry.get("name") if isinstance(entry, dict) else None
            raise GoldenError(f"{path}: case {number} ({name!r}) {problem}; {fix}")
        if entry["name"] in names:
            raise GoldenError(f"{path}: case {entry['name']!r} is listed twice; {fix}")
        names.add(entry["name"])
    for key in ("refimpl_version", "numpy_version", "loss"):
        if not isinstance(manifest.get(key), str):
            raise GoldenError(f"{path}: {key!r} must be a string, got {manifest.get(key)!r}; {fix}")
    tolerances = manifest.get("tolerances")
    if not isinstance(tolerances, dict) or not all(
        _is_number(tolerances.get(key)) and tolerances[key] >= 0
        for key in ("output_rtol", "gradient_rtol")
    ):
        raise GoldenError(
            f"{path}: 'tolerances' must be an object of finite output_rtol and gradient_rtol "
            f">= 0, got {tolerances!r}; {fix}"
        )


def _entry_problem(entry: Any) -> str:
    """What is wrong with one manifest entry, or ""."""
    if not isinstance(entry, dict) or not all(key in entry for key in _REQUIRED):
        return f"must be an object with the fields {', '.join(_REQUIRED)}"
    if not isinstance(entry["name"], str) or not entry["name"]:
        return "has no name"
    file_name = entry["file"]
    if not isinstance(file_name, str) or Path(file_name).name != file_name:
        return f"names the file {file_name!r}; files must be plain names inside the directory"
    sha256 = entry["sha256"]
    if not (isinstance(sha256, str) and len(sha256) == 64 and set(sha256) <= set(_HEX)):
        return f"has sha256 {sha256!r}, not 64 hexadecimal digits"
    if not isinstance(entry["class"], str) or not isinstance(entry["config"], dict):
        return "needs a class name (a string) and a config (an object)"
    forward = entry["forward"]
    if not (
        isinstance(forward, dict)
        and _is_strings(forward.get("args"))
        and isinstance(forward.get("array_kwargs"), dict)
        and _is_strings(list(forward["array_kwargs"].values()))
        and isinstance(forward.get("kwargs"), dict)
        and (forward.get("noise_kwarg") is None or isinstance(forward["noise_kwarg"], str))
    ):
        return (
            "has a malformed 'forward': it needs args (a list of keys), array_kwargs (keyword "
            "-> key), kwargs (an object) and noise_kwarg (a name or null)"
        )
    if not _is_strings(entry["grad_inputs"]):
        return "has a malformed 'grad_inputs': it needs a list of input keys"
    arrays = entry["arrays"]
    if not isinstance(arrays, dict) or not all(
        isinstance(spec, dict)
        and isinstance(spec.get("dtype"), str)
        and isinstance(spec.get("shape"), list)
        and all(_is_int(extent) and extent >= 0 for extent in spec["shape"])
        for spec in arrays.values()
    ):
        return "has a malformed 'arrays': every key needs a shape (sizes >= 0) and a dtype"
    return ""


_HEX = "0123456789abcdef"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def verify_golden(
    directory: str | os.PathLike, cases: Iterable[str] | None = None
) -> list[tuple[str, Comparison]]:
    """Replay the golden files of ``directory`` (all cases, or those named) and compare.

    Checks the manifest and every selected file's presence and SHA-256 before computing
    anything (:class:`GoldenError` naming each problem). Returns, per case in manifest
    order, its name and one :class:`~refimpl.interop.compare.Comparison`: ``output/out``
    judged at :data:`OUTPUT_RTOL` against its own scale, the gradients at
    :data:`GRADIENT_RTOL` against the case's largest gradient entry (every tensor carries
    its own rtol and verdict).
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
        elif _sha256(path) != entry["sha256"]:
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
    arrays = _load_case(directory, entry)
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


def _load_case(directory: Path, entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """The case's arrays, checked against the manifest's list of keys, shapes and dtypes."""
    name, file_name = entry["name"], entry["file"]
    arrays = read_npz(
        directory / file_name,
        GoldenError,
        f"re-export the directory or restore the file (case {name})",
        what="golden file",
    )
    listed = {key: (spec["shape"], spec["dtype"]) for key, spec in entry["arrays"].items()}
    found = {key: (list(value.shape), str(value.dtype)) for key, value in arrays.items()}
    if found != listed:
        differ = [
            key for key in sorted(set(found) | set(listed)) if found.get(key) != listed.get(key)
        ]
        details = [f"{key} (file {found.get(key)}, manifest {listed.get(key)})" for key in differ]
        raise GoldenError(
            f"case {name}: {file_name} does not match the manifest's list of arrays at "
            + ", ".join(details)
        )
    for key in ("cotangent", "output/out"):
        if key not in arrays:
            raise GoldenError(f"case {name}: {file_name} has no {key!r}")
    return arrays


def _from_json(config: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments from JSON: lists back to tuples (``GAT(heads=(2, 1))``)."""
    return {key: tuple(v) if isinstance(v, list) else v for key, v in config.items()}


# -- files -------------------------------------------------------------------------------------
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


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """A ``.npz`` archive (what ``numpy.savez`` writes) with fixed timestamps: the same arrays
    give the same bytes, so a file's SHA-256 identifies its content."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16  # -rw-r--r--, as numpy.savez
            with archive.open(info, "w", force_zip64=True) as stream:
                np.lib.format.write_array(stream, value, allow_pickle=False)
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
