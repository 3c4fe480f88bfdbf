"""Sparse (CSR) inputs checked whole before any compiled kernel reads them (issue 33).

SciPy's and cuSPARSE's kernels trust ``indptr`` and ``indices``: a corrupt ``indptr`` read
memory out of bounds (a segfault), a column index past the last column read garbage. Every
public entry point that takes a CSR refuses each corruption in one line
(:func:`refimpl.validation.check_csr_structure`), on NumPy, the strict stand-in and CuPy;
what SciPy builds itself, and unsorted column indices, pass and give the dense results.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.data import contextual_sbm
from refimpl.models import GAT
from refimpl.nn import GATConv
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import Linear
from refimpl.testing import max_relative_error
from refimpl.testing.strict import StrictArray
from refimpl.testing.strict_sparse import csr_matrix as strict_csr_matrix
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.backends import DEVICE_BACKENDS

ROOT = Path(__file__).resolve().parents[1]
F64 = FORWARD_RTOL[np.dtype(np.float64)]  # a sparse product and BLAS add in other orders
DENSE = np.array(
    [
        [1.0, 0.0, 2.0, 0.0, 0.0],
        [0.0, 3.0, 0.0, 0.0, 4.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],  # an empty row
        [5.0, 0.0, 0.0, 6.0, 7.0],
    ]
)  # indptr [0, 2, 4, 4, 7], indices [0, 2, 1, 4, 0, 3, 4]
GRAPH = Graph(np.array([[0, 1, 2, 3, 3], [1, 2, 3, 0, 1]]), 4)
BIPARTITE = Graph(np.array([[0, 1, 3, 2], [1, 0, 2, 2]]), 4, num_dst_nodes=4)


def _set(part: str, index: int, value: Any) -> Callable[[Any], None]:
    def corrupt(x: Any) -> None:
        getattr(x, part)[index] = value  # in place: a view on every backend

    return corrupt


def _replace(part: str, make: Callable[[np.ndarray], Any]) -> Callable[[Any], None]:
    def corrupt(x: Any) -> None:
        setattr(x, part, make(getattr(x, part)))

    return corrupt


# name: (corruption of the CSR of DENSE, in place on every backend?, error, message)
CORRUPTIONS = {
    "indptr[-1] = 10**8": (_set("indptr", -1, 10**8), True, ValueError,
                           "indptr runs from 0 to 100000000, not 0 to 7"),
    "indptr not monotone": (_set("indptr", 2, 5), True, ValueError,
                            r"indptr is not non-decreasing at row 2 \(5 then 4\)"),
    "indptr[0] != 0": (_set("indptr", 0, 1), True, ValueError, "indptr runs from 1 to 7, not 0"),
    "indptr one short": (_replace("indptr", lambda a: a[:-1]), False, ValueError,
                         r"4 indptr entries for 4 rows \(needs 5\)"),
    "column index 7": (_set("indices", 0, 7), True, ValueError,
                       r"column index 7 at stored entry 0, outside \[0, 5\)"),
    "negative column index": (_set("indices", 3, -1), True, ValueError,
                              r"column index -1 at stored entry 3, outside \[0, 5\)"),
    "data shorter": (_replace("data", lambda a: a[:-1]), False, ValueError,
                     r"7 column indices and 6 values \(needs as many\)"),
    "float indices": (_replace("indices", lambda a: a.astype(float)), False, TypeError,
                      "indices has dtype float64; index arrays must hold integers"),
    "uint64 indptr": (_replace("indptr", lambda a: a.astype(np.uint64)), False, TypeError,
                      "indptr has dtype uint64"),
    "duplicate entry": (_set("indices", 1, 0), True, ValueError,
                        "stores row 0, column 0 more than once; merge duplicates with"),
}  # fmt: skip


def _linear(x: Any) -> None:
    layer = Linear(5, 3)
    layer.forward(layer.init_params(np.random.default_rng(0), backend=_backend(x)), x)


def _conv(x: Any) -> None:
    conv = GATConv(5, 2, heads=2)
    conv.forward(conv.init_params(np.random.default_rng(0)), x, GRAPH)


def _conv_x_src(x: Any) -> None:
    conv = GATConv((5, 3), 2, version="v2")
    conv.forward(conv.init_params(np.random.default_rng(0)), (x, np.ones((4, 3))), BIPARTITE)


def _conv_x_dst(x: Any) -> None:
    conv = GATConv((3, 5), 2, residual=True)
    conv.forward(conv.init_params(np.random.default_rng(0)), (np.ones((4, 3)), x), BIPARTITE)


def _model(x: Any, **kwargs: Any) -> None:
    model = GAT(5, 3, 2, num_layers=2, heads=2, **kwargs)
    params = model.init_params(np.random.default_rng(0), backend=_backend(x))
    graph = GRAPH.to_backend(_backend(x))
    model.forward(params, x, graph, training=bool(kwargs), rng=np.random.default_rng(1))


def _dropout(x: Any) -> None:
    Dropout(0.5).forward({}, x, training=True, rng=np.random.default_rng(0))


def _training(x: Any) -> None:
    from refimpl.train import TrainConfig, train_model

    dataset = contextual_sbm(4, 2, np.random.default_rng(0))
    dataset = dataclasses.replace(dataset, graph=GRAPH, x=x, num_classes=2)
    train_model(GAT(5, 3, 2, num_layers=2), dataset, TrainConfig(epochs=1))


def _backend(x: Any) -> str:
    return {"scipy": "numpy", "cupyx": "cupy"}.get(type(x).__module__.split(".")[0], "strict")


ENTRY_POINTS = {  # name: (entry, what its message calls the CSR)
    "Linear": (_linear, "x"),
    "GATConv": (_conv, "x"),
    "GATConv x_src": (_conv_x_src, "x_src"),
    "GATConv x_dst": (_conv_x_dst, "x_dst"),
    "GAT": (_model, "x"),
    "GAT training, input dropout": (lambda x: _model(x, dropout=0.5, residual=True), "x"),
    "Dropout": (_dropout, "x"),
    "train_model": (_training, "x"),
}


DEVICE_ENTRIES = ("Linear", "GAT")  # on the strict stand-in and CuPy: in-place corruptions


def _refusals(backends: list[str]) -> None:
    """In the child process: each corruption on each entry point, one JSON line per case."""
    for backend in backends:
        for corruption, (corrupt, in_place, *_) in CORRUPTIONS.items():
            entries = ENTRY_POINTS if backend == "numpy" else DEVICE_ENTRIES
            for entry in entries if backend == "numpy" or in_place else ():
                x = asarray(sp.csr_matrix(DENSE), backend=backend)
                corrupt(x)
                try:
                    ENTRY_POINTS[entry][0](x)
                    error, message = None, ""
                except Exception as err:  # any error: the parent judges its type and message
                    error, message = type(err).__name__, str(err)
                case = {"case": [backend, corruption, entry], "error": error, "message": message}
                print(json.dumps(case), flush=True)


@pytest.fixture(scope="module")
def refusals() -> tuple[dict, Any]:
    """Every case run in one child process: unchecked, a corrupt CSR crashes the process
    (``indptr[-1] = 10**8``: SIGSEGV) or corrupts its heap (a short ``indptr`` or ``data``:
    a crash later, anywhere), so a regression kills the child alone and each case still
    reports. Returns ``({(backend, corruption, entry): result}, the child)``."""
    backends = ["numpy", "strict", *(["cupy"] if importlib.util.find_spec("cupy") else [])]
    code = f"from tests.test_sparse_structure import _refusals; _refusals({backends!r})"
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    results = {tuple(r["case"]): r for r in map(json.loads, child.stdout.splitlines())}
    return results, child


def _refused(refusals: tuple[dict, Any], backend: str, corruption: str, entry: str) -> None:
    results, child = refusals
    died = f"the child died first (status {child.returncode}): {child.stderr[-1500:]}"
    assert (backend, corruption, entry) in results, died
    result = results[backend, corruption, entry]
    _, _, error, match = CORRUPTIONS[corruption]
    name = ENTRY_POINTS[entry][1]
    assert result["error"] == error.__name__, result
    assert result["message"].startswith(f"{name} (CSR) "), result
    assert re.search(match, result["message"]) and "\n" not in result["message"], result


def test_a_corrupt_indptr_is_refused_not_a_segfault(refusals: tuple[dict, Any]) -> None:
    # Regression: x.indptr[-1] = 10**8 reached SciPy's CSR product unchecked and killed the
    # process (SIGSEGV, or glibc's "double free" abort); the checks looked at the format,
    # shape, dtype and values, and every earlier test built its CSR with SciPy's constructor,
    # whose checks hold only until an array is edited in place.
    assert refusals[1].returncode == 0, refusals[1].stderr[-2000:]
    for entry in ENTRY_POINTS:
        _refused(refusals, "numpy", "indptr[-1] = 10**8", entry)
    for entry in DEVICE_ENTRIES:  # the strict stand-in's arrays are views of SciPy's
        _refused(refusals, "strict", "indptr[-1] = 10**8", entry)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_each_corruption_is_refused_in_one_line(refusals, corruption: str, entry: str) -> None:
    _refused(refusals, "numpy", corruption, entry)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("entry", DEVICE_ENTRIES)
@pytest.mark.parametrize(
    "corruption", [c for c, (_, in_place, *_) in CORRUPTIONS.items() if in_place]
)
def test_a_device_backend_refuses_each_corruption(refusals, corruption, entry, backend) -> None:
    # the strict stand-in's and cupyx's arrays are views: an edit reaches the matrix itself
    _refused(refusals, backend, corruption, entry)


@pytest.mark.parametrize("backend", ["numpy", *DEVICE_BACKENDS])
def test_the_fix_the_duplicate_message_names_works(backend: str) -> None:
    # "merge duplicates with x.sum_duplicates()": SciPy's, cupyx's and the strict stand-in's
    canonical = sp.csr_matrix(DENSE)
    indices = canonical.indices.copy()
    indices[1] = 0  # row 0 stores column 0 twice: 1.0 and 2.0
    built = sp.csr_matrix((canonical.data, indices, canonical.indptr), shape=DENSE.shape)
    x = asarray(built, backend=backend)
    with pytest.raises(ValueError, match="more than once"):
        _linear(x)
    x.sum_duplicates()
    layer = Linear(5, 3)
    params = layer.init_params(np.random.default_rng(0))
    merged = DENSE.copy()
    merged[0] = [3.0, 0.0, 0.0, 0.0, 0.0]
    out, _ = layer.forward({k: asarray(v, backend=backend) for k, v in params.items()}, x)
    assert max_relative_error(to_numpy(out), layer.forward(params, merged)[0]) <= F64


def _shuffled_rows(x: sp.csr_matrix, rng: np.random.Generator) -> sp.csr_matrix:
    """``x`` with each row's stored entries in a random order (no longer sorted)."""
    order = np.concatenate(
        [
            start + rng.permutation(stop - start)
            for start, stop in zip(x.indptr[:-1], x.indptr[1:], strict=True)
        ]
    ).astype(np.int64)
    return sp.csr_matrix((x.data[order], x.indices[order], x.indptr), shape=x.shape)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda x, rng: _shuffled_rows(x, rng), id="unsorted indices"),
        pytest.param(
            lambda x, rng: sp.csr_matrix((x.data, x.indices.astype(np.int16), x.indptr), x.shape),
            id="int16 indices",
        ),
        pytest.param(
            lambda x, rng: sp.csr_matrix((x.data, x.indices, x.indptr.astype(np.int64)), x.shape),
            id="int64 indptr",
        ),
    ],
)
def test_structures_the_kernels_take_pass_and_give_the_dense_results(make: Any) -> None:
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((12, 6)) < 0.5, rng.standard_normal((12, 6)), 0.0)
    x = make(sp.csr_matrix(dense), rng)
    graph = Graph(rng.integers(0, 12, (2, 30)), 12)
    model = GAT(6, 3, 2, num_layers=2, heads=2, dropout=0.5, residual=True)
    params = model.init_params(rng)
    out, cache = model.forward(params, x, graph, training=True, rng=np.random.default_rng(1))
    # the dense run with the same masks: dropped stored entries are 0 in the dense mask too
    mask = np.ones(dense.shape, bool)
    rows = np.repeat(np.arange(12), np.diff(x.indptr))
    mask[rows, x.indices] = cache.noise["layer0.input_mask"]
    noise = {**cache.noise, "layer0.input_mask": mask}
    dense_out, dense_cache = model.forward(params, dense, graph, training=True, noise=noise)
    assert max_relative_error(out, dense_out) <= F64
    d_out = rng.standard_normal(out.shape)
    d_x, grads = model.backward(params, cache, d_out)
    dense_d_x, dense_grads = model.backward(params, dense_cache, d_out)
    assert max_relative_error(d_x, dense_d_x) <= F64
    for name, grad in grads.items():
        assert max_relative_error(grad, dense_grads[name]) <= F64, name


def test_an_empty_matrix_passes() -> None:
    x = sp.csr_matrix((4, 5))
    layer = Linear(5, 3)
    out, _ = layer.forward(layer.init_params(np.random.default_rng(0)), x)
    assert to_numpy(out).shape == (4, 3)


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        (np.array([0.0, 1.0]), "expected integers that fit int32"),
        (np.array([0, 2**32 + 1]), "expected integers that fit int32"),  # would wrap to 1
    ],
)
def test_the_strict_stand_in_refuses_indices_a_cast_would_change(indices, match) -> None:
    with pytest.raises(ValueError, match=match):
        strict_csr_matrix(
            (StrictArray(np.ones(2)), StrictArray(indices), StrictArray(np.array([0, 2]))),
            shape=(1, 3),
        )
