"""Subclasses of numpy.ndarray at the public boundary: numpy.ma masked arrays and numpy.matrix
are refused in one line that says what to pass instead; a memmap is an array."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from refimpl import Graph
from refimpl.backend import asarray, is_array
from refimpl.models import GAT, GraphTransformer
from refimpl.nn import GraphTransformerLayer, NodeFormerConv, TransformerConv
from refimpl.ops.linear import Linear
from refimpl.validation import check_array

# numpy.matrix itself warns that it is not the way to hold arrays: that is the point here
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

GRAPH = Graph([[0, 1, 2, 3], [1, 2, 3, 0]], 4)
X = np.random.default_rng(0).standard_normal((4, 3))


def _masked(a: np.ndarray) -> np.ma.MaskedArray:
    """``a`` with its first entry masked: a value that stands for nothing there."""
    mask = np.zeros(a.shape, dtype=bool)
    mask.flat[0] = True
    return np.ma.masked_array(a, mask=mask)


def _matrix(a: np.ndarray) -> np.matrix:
    return np.matrix(a) if a.ndim == 2 else np.matrix(a).T


def test_masked_arrays_are_refused_where_their_mask_was_ignored() -> None:
    # Regression (issue 33, item 7): is_array took any numpy.ndarray subclass, so a masked
    # array's mask was ignored (a silent wrong result) or NumPy's "operands could not be
    # broadcast" escaped; earlier tests fed plain arrays, lists and None only.
    conv = TransformerConv(3, 2, heads=2)
    params = conv.init_params(np.random.default_rng(1))
    with pytest.raises(TypeError, match=r"^x is a numpy\.ma masked array.*x\.filled\(value\)"):
        conv.forward(params, _masked(X), GRAPH)
    bad = {**params, "W_q": _masked(params["W_q"])}
    with pytest.raises(TypeError, match=r"^params\['W_q'\] is a numpy\.ma masked array"):
        conv.forward(bad, X, GRAPH)
    out, cache = conv.forward(params, X, GRAPH)
    with pytest.raises(TypeError, match=r"^d_out is a numpy\.ma masked array"):
        conv.backward(params, cache, _masked(np.ones_like(out)))
    with pytest.raises(TypeError, match=r"^edge_index is a numpy\.ma masked array"):
        Graph(_masked(np.array([[0, 1], [1, 0]])), 2)
    with pytest.raises(TypeError, match=r"^array is a numpy\.ma masked array"):
        asarray(_masked(X))  # a conversion that would drop the mask silently


def test_numpy_matrix_is_refused_where_it_broke_indexing_and_gradient_shapes() -> None:
    # Regression (issue 33, item 7): a numpy.matrix passed is_array; it stays 2-D, so GATConv's
    # 3-D indexing of att_src raised IndexError, and a matrix cotangent made Linear's bias
    # gradient (1, n) instead of (n,). Earlier tests never built a matrix.
    gat = GAT(3, 2, 2, num_layers=2, version="v1")
    params = gat.init_params(np.random.default_rng(1))
    bad = {**params, "layer0.att_src": _matrix(params["layer0.att_src"])}
    with pytest.raises(TypeError, match=r"^params\['layer0\.att_src'\] is a numpy\.matrix.*"):
        gat.forward(bad, X, GRAPH)
    linear = Linear(3, 2)
    linear_params = linear.init_params(np.random.default_rng(2))
    y, cache = linear.forward(linear_params, X)
    with pytest.raises(TypeError, match=r"^d_y is a numpy\.matrix.*numpy\.asarray\(d_y\)"):
        linear.backward(linear_params, cache, _matrix(np.ones_like(y)))
    layer = GraphTransformerLayer(4, heads=2)
    with pytest.raises(TypeError, match=r"^x is a numpy\.matrix"):
        layer.forward(layer.init_params(np.random.default_rng(3)), _matrix(np.ones((4, 4))), GRAPH)


@pytest.mark.parametrize("kind", ["masked", "matrix"])
def test_subclasses_are_refused_in_every_boundary_check(kind: str) -> None:
    # The other arrays a call takes: noise, a model's batch, a bipartite side, edge_attr.
    make = _masked if kind == "masked" else _matrix
    conv = NodeFormerConv(3, 2)
    params = conv.init_params(np.random.default_rng(1))
    omega = make(np.ones((conv.num_random_features, 2)))
    with pytest.raises(TypeError, match=r"^noise\['projection'\] is a numpy\."):
        conv.forward(params, X, GRAPH, noise={"projection": omega})
    model = GraphTransformer(3, 1, hidden_channels=4, num_layers=1, heads=2)
    model_params = model.init_params(np.random.default_rng(1))
    with pytest.raises(TypeError, match=r"^batch is a numpy\."):
        model.forward(model_params, X, GRAPH, batch=make(np.array([0, 0, 1, 1])), num_graphs=2)
    pair = TransformerConv((3, 3), 2)
    pair_params = pair.init_params(np.random.default_rng(1))
    with pytest.raises(TypeError, match=r"^x_dst is a numpy\."):
        pair.forward(pair_params, (X, make(X)), Graph([[0], [1]], 4, num_dst_nodes=4))
    edges = TransformerConv(3, 2, edge_dim=2)
    edge_params = edges.init_params(np.random.default_rng(1))
    with pytest.raises(TypeError, match=r"^edge_attr is a numpy\."):
        edges.forward(edge_params, X, GRAPH, make(np.ones((4, 2))))


def test_other_ndarray_subclasses_are_refused_and_a_memmap_is_an_array(tmp_path: Path) -> None:
    # A subclass of unknown arithmetic is refused by its name; a memmap computes as an array,
    # and gives the plain array's result bit for bit.
    class Tagged(np.ndarray):
        pass

    with pytest.raises(TypeError, match=r"^x is a .*Tagged, a subclass of numpy\.ndarray"):
        check_array(X.view(Tagged), "x")
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", shape=X.shape)
    mapped[:] = X
    assert is_array(mapped) and is_array(mapped[1:])
    conv = TransformerConv(3, 2, heads=2)
    params = conv.init_params(np.random.default_rng(1))
    np.testing.assert_array_equal(
        conv.forward(params, mapped, GRAPH)[0], conv.forward(params, X, GRAPH)[0]
    )
