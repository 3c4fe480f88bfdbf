"""The golden-vector file format: what a golden directory holds, and reading and writing its
files. :mod:`refimpl.interop.golden` computes the cases, exports and verifies them;
:mod:`refimpl.interop.golden_cases` lists them.

What a golden directory holds
-----------------------------
One ``<case>.npz`` per canonical case (:data:`~refimpl.interop.golden_cases.GOLDEN_CASES`) and
``manifest.json``. Every
``.npz`` is a plain NumPy zip archive (``numpy.load(path, allow_pickle=False)``; in Julia
``NPZ.npzread``; in JAX ``jnp.asarray`` of NumPy's arrays), C order, with these keys:

- ``input/x`` (float64): node features ``(N, in)``; for the dense attention blocks of
  LipschitzNorm ``(d, n)``, one input vector per *column*
- ``input/edge_index`` (int64): ``(2, E)``, row 0 the source ``u``, row 1 the target ``v`` (a
  message flows ``u -> v``), as PyTorch Geometric
- ``input/num_nodes`` (int64): 0-d ``N`` (an isolated node has no edge to tell it)
- ``input/edge_attr`` (float64): ``(E, edge_dim)``, row ``e`` belongs to edge ``e``
- ``input/pe`` (float64): positional encodings ``(N, pe_dim)``
- ``input/batch`` (int64): ``(N,)`` the graph of every node
- ``input/q``, ``k``, ``v`` (float64): queries, keys ``(N, d)``, values ``(N, d_v)`` (all-pair
  attention and random features)
- ``input/e`` (float64): pair features ``(P, D)`` over ``edge_index``'s pairs (SAN, GraphiT-GT:
  every ordered pair of a graph's nodes)
- ``input/real`` (bool): ``(P,)`` True where the pair is an input edge
- ``input/kernel`` (float64): ``(P,)`` GraphiT's kernel value of every pair
- ``input/attn_out``, ``input/residual_in`` (float64): ``(M, D)`` each: a transformer stream's
  attention output and its residual input
- ``input/eigvecs``, ``input/eigvals`` (float64): ``(N, m)`` each: padded eigenvector entries
  and eigenvalues (SAN's learned Laplacian encoding)
- ``input/valid`` (bool): ``(N, m)`` True where the eigenpair exists
- ``param/<name>`` (float64): parameters under our names (the block's ``param_shapes()``;
  weights are ``(out, in)``: ``y = x W^T + b``)
- ``noise/<key>`` (float64): random draws, fed in and never drawn: NodeFormer's projection
  ``omega (m, C)``, Gumbel noise ``g (N, H, K)`` (per key node, head, sample)
- ``noise/<key>`` (bool): dropout keep-masks, True = keep: ``y = x * mask / (1 - p)``
- ``cotangent`` (float64): ``c``, shaped like the output
- ``output/out`` (float64): the block's output
- ``grad/input/<name>`` (float64): ``dL/d input/<name>``, for the float inputs of the case
- ``grad/param/<name>`` (float64): ``dL/d param/<name>``

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

Files are written deterministically (fixed zip timestamps, fixed key order, seeded values),
so two exports on one machine are byte-identical and their manifests carry equal SHA-256s.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.files import read_npz

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LOSS",
    "MANIFEST_NAME",
    "GoldenError",
    "file_sha256",
    "load_case",
    "npz_bytes",
    "read_manifest",
]

FORMAT = "refimpl-golden"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
LOSS = "L = sum(cotangent * output/out)"

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest zip timestamp: files do not record export time


class GoldenError(ValueError):
    """A golden directory that cannot be checked: no or bad manifest, a missing or altered
    file, an unknown class or case. (A numerical mismatch is a result, not this error.)"""


# -- the manifest ------------------------------------------------------------------------------
def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """``directory``'s manifest, checked for the fields
    :func:`~refimpl.interop.golden.verify_golden` reads.

    Parameters
    ----------
    directory : str or os.PathLike
        A golden directory, as ``refimpl golden export DIR`` writes it.

    Returns
    -------
    dict
        The parsed ``manifest.json``: format, versions, loss, tolerances and ``cases``
        (one entry per case: name, file, SHA-256, class, config, forward, arrays).

    Raises
    ------
    GoldenError
        No directory or manifest, a manifest that is not valid JSON, not a refimpl golden
        manifest, of another format version, or missing a field.
    """
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
    """Every field :func:`~refimpl.interop.golden.verify_golden` and the CLI read, of the type
    and form export writes: one :class:`GoldenError` line naming the first field that is not."""
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


# -- the case files ----------------------------------------------------------------------------
def load_case(directory: Path, entry: dict[str, Any]) -> dict[str, np.ndarray]:
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


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
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


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
