"""``fused_kernels()`` for GATv2: its fused kernels wired into the layer, against the literal layer.

On the strict stand-in a GATv2 layer inside the block runs the kernels' NumPy twins
(:mod:`refimpl.nn.gat.fused_path_v2`), so these tests hold the wiring: the arguments each
kernel receives, ``share_weights`` both ways, the dropout mask drawn as the literal layer
draws it, the backward composed around the kernels. The kernels round the score and ``M``
otherwise than the literal layer (``tests/kernels/test_gatv2_fused.py`` states the bound,
its ``magnitudes``); here it is carried through the rest of the layer, whose operations are
the same on both paths: a product ``A b`` of a ``b`` known to ``rtol m`` is known to ``rtol
|A| (m + |b|)`` (the second term: the product's own rounding of other inputs). What the
attention does not touch (``bias``, ``W_res``) is held bitwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, get_array_module, to_numpy, use_backend
from refimpl.data import contextual_sbm
from refimpl.graph import Graph
from refimpl.kernels import gatv2_fused_twin
from refimpl.models import GAT
from refimpl.nn.gat import fused_kernels
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.gat.fused_path import FusedV2ScoreCache
from refimpl.testing import check_gradients
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import GRADCHECK_RTOL
from refimpl.train import TrainConfig, train_model
from tests.kernels.test_gat_fused import EMPTY, LOOPS_AND_DUPLICATES, ONE_NODE, THREE_LOOPS
from tests.kernels.test_gatv2_fused import assert_within, magnitudes, twin_inputs
from tests.nn.gat.test_fused_path import aggregation_cotangent, assert_bitwise_equal


def make_layer(heads, channels, dropout, slope, share, loops, concat, projection_bias):
    return GATConv(3, channels, heads=heads, version="v2", share_weights=share,
                   negative_slope=slope, dropout=dropout, add_self_loops=loops, concat=concat,
                   projection_bias=projection_bias, residual=True)  # fmt: skip


def run_layer(fused, layer, graph, dtype, seed):
    """``(out, grads, cache, params, x, d_out, generator state)`` of one training forward (the
    keep-mask drawn from a generator) and backward on the strict stand-in: host arrays, and
    the cache as it is."""
    rng = np.random.default_rng(seed)
    with use_backend("strict"), fused_kernels(fused):
        params = layer.init_params(rng, backend="strict", dtype=dtype)
        x = asarray(rng.standard_normal((graph.num_nodes, 3)) * 2, dtype=dtype)
        noise = np.random.default_rng(seed + 1)
        out, cache = layer.forward(params, x, graph, training=True, rng=noise)
        d_out = np.random.default_rng(seed + 2).standard_normal(out.shape).astype(dtype)
        d_x, d_params = layer.backward(params, cache, asarray(d_out))
    grads = {"x": to_numpy(d_x)} | {name: to_numpy(value) for name, value in d_params.items()}
    state = noise.bit_generator.state
    return to_numpy(out), grads, cache, params, to_numpy(x), d_out, state


def layer_bounds(layer, cache, params, x, d_out) -> dict:
    """Each output's and gradient's bound over ``rtol`` (the module docstring), from the
    literal run's cache and strict ``params``: the attention's ``magnitudes`` carried through
    heads, residual, bias and the feature transforms."""
    xp, (heads, channels) = get_array_module(cache.h_src), (layer.heads, layer.out_channels)
    d_agg = aggregation_cotangent(d_out, heads, channels, layer.concat)  # (N, H, C)
    attention = magnitudes(twin_inputs(layer, params, cache, xp), to_numpy(cache.alpha), d_agg)
    host = {name: np.abs(to_numpy(value)) for name, value in params.items()}
    aggregated = attention["aggregated"]  # (N, H, C)
    combined = aggregated.reshape(len(x), heads * channels) if layer.concat else aggregated.mean(1)
    bounds = {
        "out": combined + np.abs(x) @ host["W_res"].T + host["bias"],
        "alpha": attention["alpha"],
        "att": attention["att"],
    }
    src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
    d_h_src, d_h_dst, _, _ = layer._attention_backward(params, cache, xp.asarray(d_agg), src, dst)
    literal = {"d_h_src": d_h_src, "d_h_dst": d_h_dst}  # d_h_dst None with shared weights
    d_x = np.abs(d_out) @ host["W_res"]
    for weight, bias, name in [("W_s", "b_s", "d_h_src"), ("W_t", "b_t", "d_h_dst")]:
        if literal[name] is not None:
            terms = attention[name] + np.abs(to_numpy(literal[name]))  # (N, H, C)
            terms = terms.reshape(len(x), heads * channels)
            bounds[weight] = terms.T @ np.abs(x)  # (H C, F)
            bounds[bias] = terms.sum(axis=0)  # (H C,)
            d_x = d_x + terms @ host[weight]  # (N, F)
    return bounds | {"x": d_x}


@given(
    graph=graphs(min_nodes=0, max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.sampled_from([0.0, 0.5]),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    share=st.booleans(),
    loops=st.booleans(),
    concat=st.booleans(),
    projection_bias=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=seeds(),
)
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, share=False, loops=True,
         concat=True, projection_bias=True, dtype=np.float32, seed=0)  # fmt: skip
@example(graph=EMPTY, heads=1, channels=1, dropout=0.0, slope=0.2, share=True, loops=False,
         concat=True, projection_bias=False, dtype=np.float64, seed=0)  # fmt: skip
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2, share=True,
         loops=False, concat=False, projection_bias=True, dtype=np.float32, seed=1)  # fmt: skip
@example(graph=THREE_LOOPS, heads=2, channels=4, dropout=0.0, slope=0.2, share=False,
         loops=False, concat=True, projection_bias=False, dtype=np.float64, seed=0)  # fmt: skip
def test_a_fused_v2_layer_matches_the_literal_layer(
    graph, heads, channels, dropout, slope, share, loops, concat, projection_bias, dtype, seed
):
    layer = make_layer(heads, channels, dropout, slope, share, loops, concat, projection_bias)
    out, grads, cache, params, x, d_out, drawn = run_layer(False, layer, graph, dtype, seed)
    fused_out, fused_grads, fused_cache, *_, fused_drawn = run_layer(
        True, layer, graph, dtype, seed
    )
    assert fused_cache.score == FusedV2ScoreCache(share)  # the kernels ran, not the literal
    assert fused_drawn == drawn  # the keep-mask drawn as the literal layer draws it
    if cache.dropout_cache.mask is None:
        assert fused_cache.dropout_cache.mask is None
    else:
        assert_bitwise_equal(
            to_numpy(fused_cache.dropout_cache.mask), to_numpy(cache.dropout_cache.mask)
        )
    bounds = layer_bounds(layer, cache, params, x, d_out)
    assert_within(to_numpy(fused_cache.alpha), to_numpy(cache.alpha), bounds["alpha"], "alpha")
    assert_within(fused_out, out, bounds["out"], "out")
    assert grads.keys() == fused_grads.keys()
    for name, value in grads.items():
        if name in ("bias", "W_res"):  # untouched by the attention: the same operations
            assert_bitwise_equal(fused_grads[name], value)
        else:
            assert_within(fused_grads[name], value, bounds[name], name)


@pytest.mark.parametrize("share", [False, True])
def test_the_fused_v2_backward_matches_central_differences(share):
    # float64 on the strict stand-in inside the block: every forward the differences take runs
    # the kernels' twin, every gradient the fused backward. Self-loops, a duplicate edge and
    # an isolated node (4); the dropout mask fixed, as check_gradients needs.
    graph = Graph(np.array([[0, 1, 2, 2, 3, 3], [1, 2, 0, 0, 3, 1]]), 5)
    layer = GATConv(3, 3, heads=2, version="v2", share_weights=share, dropout=0.5,
                    projection_bias=True, residual=True)  # fmt: skip
    rng = np.random.default_rng(7)
    with use_backend("strict"), fused_kernels():
        params = layer.init_params(rng, backend="strict")
        x = asarray(rng.standard_normal((5, 3)))
        mask = asarray(rng.random((graph.num_edges + 5 - 1, 2)) >= 0.5)  # the loop on 3 replaced
        kwargs = {"training": True, "attn_dropout_mask": mask}
        _, cache = layer.forward(params, x, graph, **kwargs)
        assert isinstance(cache.score, FusedV2ScoreCache)
        kink = min(float(abs(to_numpy(cache.h_src)[u] + to_numpy(cache.h_dst)[v]).min())
                   for u, v in zip(*cache.graph.edge_index_on(np), strict=True))  # fmt: skip
        assert kink > 1e-4  # no pre within the differences' step of the LeakyReLU's kink
        report = check_gradients(layer, params, (x, graph), forward_kwargs=kwargs)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


# -- training ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset() -> object:
    return contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=5).astype(np.float32)


def test_a_fused_v2_training_run_resumes_bit_for_bit(
    dataset: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    kernel = gatv2_fused_twin.forward
    monkeypatch.setattr(gatv2_fused_twin, "forward", lambda *a: calls.append(1) or kernel(*a))
    config = TrainConfig(epochs=4, lr=0.01, weight_decay=5e-4, checkpoint_every=2, seed=3)
    model = GAT(dataset.num_features, 4, dataset.num_classes, 2, heads=(2, 1), version="v2",
                share_weights=True, activation="elu", dropout=0.5, attn_dropout=0.5)  # fmt: skip
    with fused_kernels():
        full = train_model(model, dataset, config, out_dir=tmp_path / "full", backend="strict")
        assert calls  # the run took the kernels
        part = TrainConfig(**{**config.__dict__, "epochs": 2})
        train_model(model, dataset, part, out_dir=tmp_path / "part", backend="strict")
        resumed = train_model(
            model, dataset, config, out_dir=tmp_path / "part",
            resume=tmp_path / "part/checkpoint.npz", backend="strict",
        )  # fmt: skip
    assert resumed.final_train_loss == full.final_train_loss
    for name, value in full.params.items():
        assert_bitwise_equal(to_numpy(resumed.params[name]), to_numpy(value))
