"""GlobalPool: against a naive per-graph loop, gradients against finite differences, empty
graphs, ties of the max, the strict backend against NumPy, and PyG's global_mean_pool /
global_add_pool / global_max_pool."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import array_module, to_numpy
from refimpl.kernels.segment import Segments
from refimpl.ops.pooling import GlobalPool
from refimpl.testing import FORWARD_RTOL, GRADCHECK_RTOL, check_gradients, max_relative_error
from refimpl.testing.strategies import seeds

F64 = FORWARD_RTOL[np.dtype(np.float64)]
REDUCES = ["mean", "sum", "max"]


@st.composite
def batch_vectors(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """``(batch (N,), G)``: any graph of each node, in any order; some graphs may be empty."""
    num_graphs = draw(st.integers(1, 5))
    batch = draw(st.lists(st.integers(0, num_graphs - 1), max_size=10))
    if draw(st.booleans()):
        batch = sorted(batch)  # the usual collated order
    return np.array(batch, dtype=np.int64), num_graphs


def naive_pool(x: np.ndarray, batch: np.ndarray, num_graphs: int, reduce: str) -> np.ndarray:
    out = np.zeros((num_graphs, x.shape[1]), dtype=x.dtype)
    for g in range(num_graphs):
        rows = [x[v] for v in range(len(batch)) if batch[v] == g]
        if rows and reduce == "max":
            out[g] = np.max(rows, axis=0)
        elif rows:
            out[g] = np.sum(rows, axis=0) / (len(rows) if reduce == "mean" else 1)
    return out


def naive_max_backward(
    x: np.ndarray, batch: np.ndarray, num_graphs: int, d_out: np.ndarray
) -> np.ndarray:
    """The tie rule as stated: per graph and channel, the nodes equal to the maximum share
    its cotangent evenly."""
    d_x = np.zeros_like(x)
    for g in range(num_graphs):
        nodes = [v for v in range(len(batch)) if batch[v] == g]
        for f in range(x.shape[1]):
            top = [v for v in nodes if x[v, f] == max(x[u, f] for u in nodes)]
            for v in top:
                d_x[v, f] = d_out[g, f] / len(top)
    return d_x


EMPTY_MIDDLE = (np.array([0, 0, 2, 2, 2]), 4)  # graphs 1 and 3 have no node


@pytest.mark.parametrize("reduce", REDUCES)
@given(case=batch_vectors(), seed=seeds(), dtype=st.sampled_from([np.float64, np.float32]))
@example(case=EMPTY_MIDDLE, seed=0, dtype=np.float64)
@example(case=(np.zeros(0, dtype=np.int64), 2), seed=0, dtype=np.float64)  # no node at all
def test_matches_naive_loop(reduce: str, case, seed: int, dtype) -> None:
    batch, num_graphs = case
    x = np.random.default_rng(seed).standard_normal((batch.size, 3)).astype(dtype)
    copy = x.copy()
    out, _ = GlobalPool(reduce).forward({}, x, Segments(batch, num_graphs))
    assert out.shape == (num_graphs, 3) and out.dtype == dtype
    assert (
        max_relative_error(out, naive_pool(x, batch, num_graphs, reduce))
        <= FORWARD_RTOL[np.dtype(dtype)]
    )
    np.testing.assert_array_equal(x, copy)


@pytest.mark.parametrize("reduce", REDUCES)
@given(case=batch_vectors(), seed=seeds())
@example(case=EMPTY_MIDDLE, seed=0)
def test_backward_matches_finite_differences(reduce: str, case, seed: int) -> None:
    batch, num_graphs = case
    x = np.random.default_rng(seed).standard_normal((batch.size, 2))
    report = check_gradients(
        GlobalPool(reduce), {}, (x, Segments(batch, num_graphs)), rng=np.random.default_rng(seed)
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_backward_is_the_naive_adjoint(reduce: str) -> None:
    # <d_out, pool(x)> = <backward(d_out), x> for all x: pooling is linear, so its backward is
    # exactly its transpose; built here column by column from the naive loop.
    batch, num_graphs = EMPTY_MIDDLE
    pool = GlobalPool(reduce)
    rng = np.random.default_rng(1)
    d_out = rng.standard_normal((num_graphs, 2))
    _, cache = pool.forward({}, rng.standard_normal((5, 2)), Segments(batch, num_graphs))
    d_x, d_params = pool.backward({}, cache, d_out)
    transpose = np.zeros((5, 2))
    for v in range(5):
        for f in range(2):
            unit = np.zeros((5, 2))
            unit[v, f] = 1.0
            transpose[v, f] = np.sum(d_out * naive_pool(unit, batch, num_graphs, reduce))
    np.testing.assert_allclose(d_x, transpose, rtol=F64)
    assert d_params == {}
    assert np.all(d_out[[1, 3]] != 0)  # the empty graphs' cotangent reaches no node


def test_empty_graph_pools_to_exactly_zero() -> None:
    batch, num_graphs = EMPTY_MIDDLE
    x = np.full((5, 2), 7.0)
    for reduce in REDUCES:
        out, _ = GlobalPool(reduce).forward({}, x, Segments(batch, num_graphs))
        np.testing.assert_array_equal(out[[1, 3]], 0.0)
    mean, _ = GlobalPool("mean").forward({}, x, Segments(batch, num_graphs))
    np.testing.assert_array_equal(mean[[0, 2]], 7.0)  # exact: 14 / 2 and 21 / 3
    # the max of an empty graph is 0 too (PyG's), not -inf, even below negative features
    negative, _ = GlobalPool("max").forward({}, -x, Segments(batch, num_graphs))
    np.testing.assert_array_equal(negative, [[-7, -7], [0, 0], [-7, -7], [0, 0]])


@pytest.mark.parametrize("reduce", REDUCES)
@given(case=batch_vectors(), seed=seeds())
def test_strict_backend_matches_numpy(reduce: str, case, seed: int) -> None:
    strict = array_module("strict")
    batch, num_graphs = case
    rng = np.random.default_rng(seed)
    x, d_out = rng.standard_normal((batch.size, 3)), rng.standard_normal((num_graphs, 3))
    pool = GlobalPool(reduce)
    out, cache = pool.forward({}, x, Segments(batch, num_graphs))
    d_x, _ = pool.backward({}, cache, d_out)
    out_s, cache_s = pool.forward(
        {}, strict.asarray(x), Segments(strict.asarray(batch), num_graphs)
    )
    d_x_s, _ = pool.backward({}, cache_s, strict.asarray(d_out))
    assert cache_s.segments.backend == "strict"  # the generic xp.add.at path
    assert max_relative_error(to_numpy(out_s), out) <= F64
    assert max_relative_error(to_numpy(d_x_s), d_x) <= F64


@pytest.mark.parametrize("reduce", REDUCES)
@given(case=batch_vectors(), seed=seeds())
@example(case=EMPTY_MIDDLE, seed=0)
def test_pyg_global_pool_parity(reduce: str, case, seed: int) -> None:
    torch = pytest.importorskip("torch")
    pyg_pool = pytest.importorskip("torch_geometric.nn.pool")
    batch, num_graphs = case
    rng = np.random.default_rng(seed)
    x, d_out = rng.standard_normal((batch.size, 3)), rng.standard_normal((num_graphs, 3))
    pool = GlobalPool(reduce)
    out, cache = pool.forward({}, x, Segments(batch, num_graphs))
    d_x, _ = pool.backward({}, cache, d_out)

    x_t = torch.tensor(x, requires_grad=True)
    function = {
        "mean": pyg_pool.global_mean_pool,
        "sum": pyg_pool.global_add_pool,
        "max": pyg_pool.global_max_pool,
    }[reduce]
    out_t = function(x_t, torch.from_numpy(batch), size=num_graphs)
    (out_t * torch.from_numpy(d_out)).sum().backward()
    assert max_relative_error(out, out_t.detach().numpy()) <= F64
    assert max_relative_error(d_x, x_t.grad.numpy()) <= F64


def test_rejects_bad_input() -> None:
    segments = Segments(np.array([0, 0, 1]), 2)
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="reduce must be one of"):
        GlobalPool("min")
    with pytest.raises(ValueError, match="segments group 3 nodes but x has 4 rows"):
        GlobalPool().forward({}, np.zeros((4, 2)), segments)
    with pytest.raises(TypeError, match="segments must be"):
        GlobalPool().forward({}, x, np.array([0, 0, 1]))
    with pytest.raises(ValueError, match="no parameters"):
        GlobalPool().forward({"W": x}, x, segments)
    with pytest.raises(ValueError, match="x must be 2-D"):
        GlobalPool().forward({}, np.zeros(3), segments)
    with pytest.raises(TypeError, match="mixed"):
        GlobalPool().forward({}, array_module("strict").asarray(x), segments)
    _, cache = GlobalPool().forward({}, x, segments)
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(2, 2\)"):
        GlobalPool().backward({}, cache, np.zeros((3, 2)))
    with pytest.raises(TypeError, match="d_out has dtype float32"):
        GlobalPool().backward({}, cache, np.zeros((2, 2), dtype=np.float32))


# -- max: ties --------------------------------------------------------------------------------

# Graph 0: nodes 0-2, channel 0 tied three ways at 2.0, channel 1 two ways at 5.0; graph 1:
# node 3 alone; graph 2: empty; graph 3: nodes 4, 5 with the max of channel 1 at node 5.
TIES_BATCH, TIES_GRAPHS = np.array([0, 0, 0, 1, 3, 3]), 4
TIES_X = np.array([[2.0, 5.0], [2.0, 1.0], [2.0, 5.0], [-3.0, -4.0], [0.5, -1.0], [0.5, 1.0]])


def test_max_ties_share_the_gradient_evenly() -> None:
    # d_out = 6 on every entry makes the shares readable: three-way ties get 2 each, two-way
    # ties 3, a unique maximum 6; graph 3's channel 0 ties two ways (0.5, 0.5).
    pool = GlobalPool("max")
    out, cache = pool.forward({}, TIES_X, Segments(TIES_BATCH, TIES_GRAPHS))
    np.testing.assert_array_equal(out, [[2, 5], [-3, -4], [0, 0], [0.5, 1]])
    d_x, _ = pool.backward({}, cache, np.full((TIES_GRAPHS, 2), 6.0))
    expected = [[2, 3], [2, 0], [2, 3], [6, 6], [3, 0], [3, 6]]
    np.testing.assert_array_equal(d_x, expected)
    d_out = np.random.default_rng(3).standard_normal((TIES_GRAPHS, 2))
    d_x, _ = pool.backward({}, cache, d_out)
    np.testing.assert_allclose(
        d_x, naive_max_backward(TIES_X, TIES_BATCH, TIES_GRAPHS, d_out), rtol=F64
    )


@given(case=batch_vectors(), seed=seeds(), levels=st.integers(1, 3))
@example(case=EMPTY_MIDDLE, seed=0, levels=1)  # every feature equal: all nodes tie
def test_max_backward_matches_the_naive_tie_rule(case, seed: int, levels: int) -> None:
    # Features drawn from a few levels, so ties are the rule rather than the exception.
    batch, num_graphs = case
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, (batch.size, 3)).astype(np.float64)
    d_out = rng.standard_normal((num_graphs, 3))
    pool = GlobalPool("max")
    _, cache = pool.forward({}, x, Segments(batch, num_graphs))
    d_x, _ = pool.backward({}, cache, d_out)
    np.testing.assert_allclose(d_x, naive_max_backward(x, batch, num_graphs, d_out), rtol=F64)


@given(case=batch_vectors(), seed=seeds(), levels=st.integers(1, 3))
def test_max_ties_match_pyg_global_max_pool(case, seed: int, levels: int) -> None:
    torch = pytest.importorskip("torch")
    pyg_pool = pytest.importorskip("torch_geometric.nn.pool")
    batch, num_graphs = case
    rng = np.random.default_rng(seed)
    # levels -0.5, 0.5, 1.5: a maximum of exactly 0 is where PyTorch loses a share (below)
    x = rng.integers(0, levels, (batch.size, 2)).astype(np.float64) - 0.5
    d_out = rng.standard_normal((num_graphs, 2))
    pool = GlobalPool("max")
    out, cache = pool.forward({}, x, Segments(batch, num_graphs))
    d_x, _ = pool.backward({}, cache, d_out)
    x_t = torch.tensor(x, requires_grad=True)  # on the CPU: scatter_reduce's even split
    out_t = pyg_pool.global_max_pool(x_t, torch.from_numpy(batch), size=num_graphs)
    (out_t * torch.from_numpy(d_out)).sum().backward()
    np.testing.assert_array_equal(out, out_t.detach().numpy())
    np.testing.assert_allclose(d_x, x_t.grad.numpy(), rtol=F64, atol=0)


def test_max_at_exactly_zero_keeps_the_whole_gradient_unlike_pyg() -> None:
    torch = pytest.importorskip("torch")
    pyg_pool = pytest.importorskip("torch_geometric.nn.pool")
    # PyG's global_max_pool is zeros(G, F).scatter_reduce_(..., "amax", include_self=False).
    # Its backward counts the zeros it started from as tied with a maximum of exactly 0
    # although the forward excluded them (pytorch/pytorch#168358 is the same count giving
    # NaN), so t tied nodes get d_out / (t + 1) and the last share is lost. refimpl keeps the
    # valid subgradient, d_out / t, whose shares sum to d_out; away from 0 the two agree
    # (test_max_ties_match_pyg_global_max_pool).
    x = np.array([[0.0, 1.0], [0.0, -1.0], [-2.0, 1.0]])
    batch = np.zeros(3, dtype=np.int64)
    pool = GlobalPool("max")
    _, cache = pool.forward({}, x, Segments(batch, 1))
    d_x, _ = pool.backward({}, cache, np.ones((1, 2)))
    np.testing.assert_array_equal(d_x, [[0.5, 0.5], [0.5, 0], [0, 0.5]])
    x_t = torch.tensor(x, requires_grad=True)
    pyg_pool.global_max_pool(x_t, torch.from_numpy(batch), size=1).sum().backward()
    np.testing.assert_allclose(x_t.grad.numpy(), [[1 / 3, 0.5], [1 / 3, 0], [0, 0.5]])
