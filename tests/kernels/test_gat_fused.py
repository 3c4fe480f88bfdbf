"""The fused GAT kernels' twin (:mod:`refimpl.kernels.gat_fused_twin`) against the literal layer.

The twin runs the kernels' loops thread by thread in NumPy; the literal path is
:class:`refimpl.nn.gat.conv.GATConv` (v1, no LipschitzNorm, no edge features) on the strict
stand-in, which takes the device's code path, and on NumPy. The forward makes the literal
path's operations in its order, so it is held bitwise (a tolerance would hide an order or
precision slip). The backward's ``d alpha`` sums the channels one by one where the literal
layer uses a BLAS product (:func:`refimpl.ops.heads.sum_channels`), so its gradients are held
at the forward tolerance, judged to each tensor's largest entry.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.graph import Graph
from refimpl.kernels import gat_fused_twin as twin
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.gat.transform import transform_backward
from refimpl.ops.heads import dot_per_head, scale_per_head, sum_per_head
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL

BACKENDS = ["strict", "numpy"]
DTYPES = [np.float32, np.float64]
ONE_NODE = Graph(np.zeros((2, 0), dtype=np.int64), 1)
EMPTY = Graph(np.zeros((2, 0), dtype=np.int64), 0)
# One node, three self-loops: every score equal, so d_pre itself is rounding (found by Hypothesis)
THREE_LOOPS = Graph(np.zeros((2, 3), dtype=np.int64), 1)
LOOPS_AND_DUPLICATES = Graph(np.array([[0, 0, 1, 2, 2, 2], [0, 0, 1, 1, 1, 3]]), 5)  # 4 isolated


def layer_and_inputs(graph, heads, channels, dropout, slope, dtype, seed, backend, kink=False):
    """``(layer, params, x, mask)`` on ``backend``; ``mask`` (E, H) over the attended edges
    (None without dropout). ``kink``: ``att_dst = -att_src``, so every self-loop's score
    sits exactly at the LeakyReLU's kink (``a . h_v - a . h_v = 0``)."""
    layer = GATConv(3, channels, heads=heads, dropout=dropout, negative_slope=slope,
                    add_self_loops=False, bias=False)  # fmt: skip
    rng = np.random.default_rng(seed)
    params = layer.init_params(rng, backend=backend, dtype=dtype)
    if kink:
        params["att_dst"] = -params["att_src"]
    x = asarray(rng.standard_normal((graph.num_nodes, 3)) * 2, backend=backend, dtype=dtype)
    mask = None
    if dropout > 0:
        mask = asarray(rng.random((graph.num_edges, heads)) >= dropout, backend=backend)
    return layer, params, x, mask


def twin_inputs(layer, params, cache, xp) -> dict:
    """What the kernels read, from the literal forward's cache, on the host."""
    src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
    return {
        "score_src": to_numpy(dot_per_head(cache.h_src, params["att_src"])),
        "score_dst": to_numpy(dot_per_head(cache.h_dst, params["att_dst"])),
        "h_src": to_numpy(cache.h_src),
        "src": to_numpy(src.index),
        "dst": to_numpy(dst.index),
        "dst_csr": tuple(to_numpy(a) for a in dst.csr_structure()),
        "src_csr": tuple(to_numpy(a) for a in src.csr_structure()),
        "keep": None if cache.dropout_cache.mask is None else to_numpy(cache.dropout_cache.mask),
        "scale": 1.0 / (1.0 - layer.dropout),
        "slope": layer.negative_slope,
    }


def run_twin_forward(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    return twin.forward(
        inputs["score_src"], inputs["score_dst"], inputs["h_src"], inputs["src"],
        *inputs["dst_csr"], inputs["keep"], inputs["scale"], inputs["slope"],
    )  # fmt: skip


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes(), (actual, expected)


def literal_forward(graph, heads, channels, dropout, slope, dtype, seed, backend, kink=False):
    layer, params, x, mask = layer_and_inputs(
        graph, heads, channels, dropout, slope, dtype, seed, backend, kink
    )
    out, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=mask)
    return layer, params, x, out, cache


CASES = given(
    graph=graphs(max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.sampled_from([0.0, 0.5]),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    dtype=st.sampled_from(DTYPES),
    seed=seeds(),
)


@pytest.mark.parametrize("backend", BACKENDS)
@CASES
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, dtype=np.float32, seed=0)
@example(graph=EMPTY, heads=1, channels=1, dropout=0.0, slope=0.2, dtype=np.float64, seed=0)
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2,
         dtype=np.float32, seed=1)  # fmt: skip
def test_forward_twin_is_bitwise_the_literal_layer(
    backend, graph, heads, channels, dropout, slope, dtype, seed
):
    layer, params, _, out, cache = literal_forward(
        graph, heads, channels, dropout, slope, dtype, seed, backend
    )
    alpha, aggregated = run_twin_forward(twin_inputs(layer, params, cache, get_array_module(out)))
    assert_bitwise_equal(alpha, to_numpy(cache.alpha))
    assert_bitwise_equal(aggregated.reshape(graph.num_nodes, heads * channels), to_numpy(out))


def fused_gradients(layer, params, x, cache, d_out) -> tuple[dict, np.ndarray]:
    """The layer's gradients with B3-B1 by the twin's kernels and the rest as the literal
    layer does it (the per-node steps the fused path keeps: the score halves' adjoints and
    the feature transform's), and the twin's ``d_pre`` (E, H)."""
    xp = get_array_module(x)
    inputs = twin_inputs(layer, params, cache, xp)
    heads, channels = layer.heads, layer.out_channels
    d_out = to_numpy(d_out).reshape(-1, heads, channels)  # (N, H, C)
    alpha = to_numpy(cache.alpha)
    d_pre, d_score_dst = twin.backward_targets(
        d_out, inputs["h_src"], alpha, inputs["score_src"], inputs["score_dst"],
        inputs["src"], *inputs["dst_csr"], inputs["keep"], inputs["scale"], inputs["slope"],
    )  # fmt: skip
    d_h_src, d_score_src = twin.backward_sources(
        d_out, alpha, d_pre, inputs["dst"], *inputs["src_csr"], inputs["keep"],
        inputs["scale"], len(inputs["score_src"]),
    )  # fmt: skip
    backend = backend_name(xp)
    on = {
        name: asarray(value, backend=backend)
        for name, value in [("d_h_src", d_h_src), ("d_score_src", d_score_src),
                            ("d_score_dst", d_score_dst)]
    }  # fmt: skip
    d_params = {
        "att_src": sum_per_head(on["d_score_src"], cache.h_src),
        "att_dst": sum_per_head(on["d_score_dst"], cache.h_dst),
    }
    d_h = on["d_h_src"] + scale_per_head(on["d_score_src"], params["att_src"])
    d_h_dst = scale_per_head(on["d_score_dst"], params["att_dst"])
    d_x, _ = transform_backward(layer, params, x, x, d_h, d_h_dst, d_params, True)
    found = {"x": to_numpy(d_x)} | {name: to_numpy(value) for name, value in d_params.items()}
    return found, d_pre


def literal_and_fused_gradients(
    graph, heads, channels, dropout, slope, dtype, seed, backend, kink=False
):
    """``(literal, fused, cache, d_out)``: the layer's gradients both ways (host arrays by
    name), the literal forward's cache and the cotangent (host)."""
    layer, params, x, out, cache = literal_forward(
        graph, heads, channels, dropout, slope, dtype, seed, backend, kink
    )
    d_out = np.random.default_rng(seed + 1).standard_normal(out.shape)
    d_out = asarray(d_out, backend=backend, dtype=dtype)
    d_x, d_params = layer.backward(params, cache, d_out)
    literal = {"x": to_numpy(d_x)} | {name: to_numpy(value) for name, value in d_params.items()}
    fused, _ = fused_gradients(layer, params, x, cache, d_out)
    return literal, fused, cache, to_numpy(d_out)


@pytest.mark.parametrize("backend", BACKENDS)
@given(
    graph=graphs(max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    dropout=st.sampled_from([0.0, 0.5]),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    dtype=st.sampled_from(DTYPES),
    seed=seeds(),
)
@example(graph=ONE_NODE, heads=2, dropout=0.5, slope=0.2, dtype=np.float32, seed=0)
@example(graph=EMPTY, heads=1, dropout=0.0, slope=0.2, dtype=np.float64, seed=0)
@example(graph=LOOPS_AND_DUPLICATES, heads=2, dropout=0.5, slope=0.2, dtype=np.float32, seed=1)
def test_backward_twin_is_bitwise_the_literal_layer_with_one_channel(
    backend, graph, heads, dropout, slope, dtype, seed
):
    # With one channel the literal d alpha's BLAS sum has one term, as the kernel's loop: every
    # other operation is the literal's own, in its order, so every gradient is its bits.
    literal, fused, _, _ = literal_and_fused_gradients(
        graph, heads, 1, dropout, slope, dtype, seed, backend
    )
    for name, value in literal.items():
        assert_bitwise_equal(fused[name], value)


def cancelled_terms(cache, d_out: np.ndarray, slope: float) -> dict[str, np.ndarray]:
    """``{"att_src", "att_dst"}`` (H, C): the sums of absolute terms behind those gradients.

    A row's softmax gradients ``d_pre_j = alpha_j (g_j - sum_j' alpha_j' g_j')`` sum to zero,
    so ``d_score_dst`` (and ``d_score_src`` where a node's edges are one row's) is rounding
    where a row's scores share the LeakyReLU's branch, and ``d_pre`` itself where they are
    equal: each is judged to ``alpha_j (|g_j| + sum_j' alpha_j' |g_j'|)`` (times the larger
    LeakyReLU factor), ``|g_j| <= scale sum_c |d_out[v, c]| |h[u, c]|``, summed per node
    against ``|h|``.
    """
    src, dst = cache.graph.edge_index_on(np)
    h, alpha = np.abs(to_numpy(cache.h_src)).astype(np.float64), to_numpy(cache.alpha)
    d_out = np.abs(d_out).reshape(h.shape)  # (N, H, C)
    g = np.einsum("ehc,ehc->eh", d_out[dst], h[src])  # (E, H)
    if cache.dropout_cache.mask is not None:
        g *= to_numpy(cache.dropout_cache.mask) * cache.dropout_cache.scale
    rows = np.zeros(h.shape[:2])  # (N, H)
    np.add.at(rows, dst, alpha * g)
    d_pre = max(1.0, slope) * alpha * (g + rows[dst])  # (E, H)
    magnitudes = {}
    for name, ends in (("att_src", src), ("att_dst", dst)):
        terms = np.zeros(h.shape[:2])  # (N, H)
        np.add.at(terms, ends, d_pre)
        magnitudes[name] = np.einsum("nh,nhc->hc", terms, h)
    return magnitudes


@pytest.mark.parametrize("backend", BACKENDS)
@CASES
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, dtype=np.float32, seed=0)
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2,
         dtype=np.float32, seed=1)  # fmt: skip
@example(graph=THREE_LOOPS, heads=2, channels=4, dropout=0.0, slope=0.2, dtype=np.float64,
         seed=0)  # fmt: skip
def test_backward_twin_matches_the_literal_layer(
    backend, graph, heads, channels, dropout, slope, dtype, seed
):
    # The channels of d alpha summed one by one (the kernel) or by BLAS (the literal layer):
    # rounding only, judged to each tensor's largest entry, and the attention vectors'
    # gradients to the terms that cancel in them (cancelled_terms).
    literal, fused, cache, d_out = literal_and_fused_gradients(
        graph, heads, channels, dropout, slope, dtype, seed, backend
    )
    magnitudes = cancelled_terms(cache, d_out, slope)
    rtol = FORWARD_RTOL[np.dtype(dtype)]
    for name, value in literal.items():
        assert fused[name].dtype == value.dtype and fused[name].shape == value.shape, name
        scale = np.maximum(np.max(np.abs(value), initial=0.0), magnitudes.get(name, 0.0))
        assert np.all(np.abs(fused[name] - value) <= rtol * scale), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_twin_takes_the_slope_at_the_kink(backend, dtype):
    # Self-loops score exactly 0 here; the LeakyReLU's derivative there is the slope (PyTorch's
    # convention, the literal layer's), and a twin taking 1 would differ at those edges.
    graph = Graph(np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 1, 2, 0]]), 3)
    _, _, _, _, cache = literal_forward(graph, 2, 1, 0.0, 0.2, dtype, 3, "numpy", kink=True)
    src, dst = cache.graph.edge_index_on(np)
    loops = src == dst
    assert np.all(to_numpy(cache.score.pre)[loops] == 0)  # the case this test is about
    literal, fused, _, _ = literal_and_fused_gradients(
        graph, 2, 1, 0.0, 0.2, dtype, 3, backend, True
    )
    for name, value in literal.items():
        assert_bitwise_equal(fused[name], value)
