"""Sparse input features (issue 27): ``x`` as a CSR matrix gives the dense path's results to
rounding in Linear, GATConv and the GAT model, forward and backward; the parameter gradients
pass central differences; the strict stand-in runs it; bad input gets one clear line."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import asarray, to_numpy
from refimpl.data import contextual_sbm, row_normalize
from refimpl.models import GAT, NodeFormer
from refimpl.nn import GATConv
from refimpl.ops.dropout import Dropout
from refimpl.ops.linear import Linear
from refimpl.testing import check_gradients, relative_errors
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS

RTOL = 1e-12  # float64: a sparse product and BLAS add the same terms in other orders


def sparse_features(rng: np.random.Generator, n: int, f: int, density: float) -> sp.csr_matrix:
    """A CSR matrix with about ``density`` stored values, an empty row and an empty column."""
    dense = np.where(rng.random((n, f)) < density, rng.standard_normal((n, f)), 0.0)
    dense[0] = 0.0
    dense[:, -1] = 0.0
    return sp.csr_matrix(dense)


LAYERS = {
    "linear": lambda f: Linear(f, 5),
    "gat v1": lambda f: GATConv(f, 3, heads=2, version="v1"),
    "gat v2 residual": lambda f: GATConv(
        f, 3, heads=2, version="v2", share_weights=False, residual=True, projection_bias=True
    ),
}


def _run(block: Any, params: dict, x: Any, graph: Graph, d_out: Any = None) -> dict:
    inputs = (x,) if isinstance(block, Linear) else (x, graph)
    out, cache = block.forward(params, *inputs)
    d_out = np.ones_like(out) if d_out is None else d_out
    d_x, d_params = block.backward(params, cache, d_out)
    return {
        "out": to_numpy(out),
        "x": to_numpy(d_x),
        **{k: to_numpy(v) for k, v in d_params.items()},
    }


@pytest.mark.parametrize("name", list(LAYERS))
@given(seed=seeds(), density=st.sampled_from([0.0, 0.05, 0.3, 1.0]))
def test_sparse_input_equals_dense(name: str, seed: int, density: float) -> None:
    rng = np.random.default_rng(seed)
    x = sparse_features(rng, 14, 9, density)
    graph = Graph(rng.integers(0, 14, (2, 40)), 14)
    block = LAYERS[name](9)
    params = block.init_params(rng)
    d_out = rng.standard_normal((14, 5 if name == "linear" else 6))
    errors = relative_errors(
        _run(block, params, x, graph, d_out), _run(block, params, x.toarray(), graph, d_out)
    )
    assert max(errors.values()) <= RTOL, errors


class _ParamsOnly:
    """A block whose backward reports no input gradient: the gradient check then perturbs
    the parameters alone (a CSR input is not an array it can perturb entry by entry)."""

    def __init__(self, block: Any) -> None:
        self.block = block

    def forward(self, params: dict, *inputs: Any) -> Any:
        return self.block.forward(params, *inputs)

    def backward(self, params: dict, cache: Any, d_out: Any) -> Any:
        return (), self.block.backward(params, cache, d_out)[1]


@pytest.mark.parametrize("name", list(LAYERS))
def test_parameter_gradients_pass_central_differences(name: str) -> None:
    rng = np.random.default_rng(3)
    x = sparse_features(rng, 10, 7, 0.3)
    block = LAYERS[name](7)
    inputs = (x,) if name == "linear" else (x, Graph(rng.integers(0, 10, (2, 25)), 10))
    report = check_gradients(_ParamsOnly(block), block.init_params(rng), inputs, rng=rng)
    assert report.max_rel_error <= GRADCHECK_RTOL, report


def test_the_model_with_dropout_replays_the_dense_masks() -> None:
    """GAT's input dropout over the stored values equals dense dropout whose mask keeps every
    entry not stored (they are 0 either way); the attention masks are shared."""
    rng = np.random.default_rng(0)
    x = sparse_features(rng, 20, 8, 0.3)
    graph = Graph(rng.integers(0, 20, (2, 60)), 20)
    model = GAT(8, 4, 3, num_layers=2, heads=2, version="v2", dropout=0.5, attn_dropout=0.5)
    params = model.init_params(rng)
    out, cache = model.forward(params, x, graph, training=True, rng=np.random.default_rng(1))
    noise = dict(cache.noise)
    dense_mask = np.ones((20, 8), bool)
    rows = np.repeat(np.arange(20), np.diff(x.indptr))
    dense_mask[rows, x.indices] = noise["layer0.input_mask"]
    dense_noise = {**noise, "layer0.input_mask": dense_mask}
    dense_out, dense_cache = model.forward(
        params, x.toarray(), graph, training=True, noise=dense_noise
    )
    assert relative_errors({"out": out}, {"out": dense_out})["out"] <= RTOL
    d = rng.standard_normal(out.shape)
    d_x, grads = model.backward(params, cache, d)
    dense_d_x, dense_grads = model.backward(params, dense_cache, d)
    errors = relative_errors({"x": d_x, **grads}, {"x": dense_d_x, **dense_grads})
    assert max(errors.values()) <= RTOL, errors


def test_training_curve_equals_dense(tmp_path) -> None:
    from refimpl.train import TrainConfig, train_model

    dataset = contextual_sbm(80, 3, np.random.default_rng(0))
    dense_x = np.where(np.abs(dataset.x) > 1.0, dataset.x, 0.0)  # about a third stored
    runs = []
    for x in (dense_x, sp.csr_matrix(dense_x)):
        model = GAT(dataset.num_features, 4, 3, num_layers=2, heads=2, version="v1")
        result = train_model(model, dataclasses.replace(dataset, x=x), TrainConfig(epochs=5))
        runs.append(result)
    assert runs[0].final_train_loss == pytest.approx(runs[1].final_train_loss, rel=1e-12)
    errors = relative_errors(runs[1].params, runs[0].params)
    assert max(errors.values()) <= 1e-11, errors


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_a_device_backend_runs_sparse_features(backend: str) -> None:
    """The strict stand-in here, and cupyx's CSR where CuPy is installed: the same outputs."""
    rng = np.random.default_rng(0)
    x = sparse_features(rng, 12, 6, 0.4)
    graph = Graph(rng.integers(0, 12, (2, 30)), 12)
    model = GAT(6, 3, 2, num_layers=2, heads=2, version="v2", dropout=0.3)
    params = model.init_params(np.random.default_rng(1))
    host = model.forward(params, x, graph, training=True, rng=np.random.default_rng(2))[0]
    device_params = {k: asarray(v, backend=backend) for k, v in params.items()}
    device_x = asarray(x, backend=backend)
    out, cache = model.forward(
        device_params, device_x, graph.to_backend(backend), training=True,
        rng=np.random.default_rng(2),
    )  # fmt: skip
    np.testing.assert_allclose(to_numpy(out), host, rtol=1e-12, atol=1e-14)
    d_x, _ = model.backward(device_params, cache, asarray(np.ones(out.shape), backend=backend))
    assert to_numpy(d_x).shape == (12, 6)


def test_bad_sparse_input_gets_one_clear_line() -> None:
    rng = np.random.default_rng(0)
    graph = Graph(rng.integers(0, 5, (2, 8)), 5)
    conv = GATConv(4, 2)
    params = conv.init_params(rng)
    x = sp.random(5, 4, density=0.5, format="coo", random_state=0)
    with pytest.raises(TypeError, match=r"must be CSR: convert with x\.tocsr\(\)"):
        conv.forward(params, x, graph)
    bad = x.tocsr()
    bad.data[0] = np.nan
    with pytest.raises(NonFiniteError, match=r"x \(its stored values\) contains NaN"):
        conv.forward(params, bad, graph)
    model = NodeFormer(4, 3, 2, num_layers=1, heads=1, num_random_features=4)
    with pytest.raises(TypeError, match=r"NodeFormer takes x as a dense array.*x\.toarray\(\)"):
        model.forward(model.init_params(rng), x.tocsr(), graph)
    with pytest.raises(TypeError, match=r"sparse x must be a scipy\.sparse CSR matrix"):
        dataclasses.replace(contextual_sbm(5, 2, rng), x=sp.coo_matrix(np.ones((5, 4))))


def test_sparse_dropout_without_randomness_says_so() -> None:
    x = sp.csr_matrix(np.eye(3))
    with pytest.raises(ValueError, match=r"Dropout\(p=0\.5\) in training mode needs randomness"):
        Dropout(0.5).forward({}, x, training=True)


def test_row_normalize_gives_the_dense_values() -> None:
    """Bitwise for binary features (Cora's: every row sum is an exact integer); to an ulp or
    two otherwise, where the two sums add the same values in other orders."""
    rng = np.random.default_rng(0)
    x = sparse_features(rng, 30, 10, 0.3)
    x.data = (x.data > 0).astype(float) + 1.0  # ones and twos
    np.testing.assert_array_equal(row_normalize(x).toarray(), row_normalize(x.toarray()))
    x.data = rng.random(x.nnz)
    np.testing.assert_array_max_ulp(row_normalize(x).toarray(), row_normalize(x.toarray()), 4)
