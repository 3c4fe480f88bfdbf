"""``fused_kernels()``: the fused GAT kernels wired into the layer, against the literal layer.

On the strict stand-in (the CuPy code path on NumPy) a layer inside the block runs the kernels'
NumPy twins (:mod:`refimpl.nn.gat.fused_path`), so these tests hold the wiring: the arguments each
kernel receives, the dropout mask drawn as the literal layer draws it, the backward composed
around the kernels. The forward is held bitwise. The backward is bitwise where the channels
of ``d alpha`` are at most two (a sum of two terms rounds once, in any order) and otherwise
held as ``tests/kernels/test_gat_fused.py`` holds the twins (``FORWARD_RTOL`` of each tensor's
largest entry, the attention vectors' gradients of the terms that cancel in them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refimpl.backend import asarray, to_numpy, use_backend
from refimpl.data import contextual_sbm
from refimpl.graph import Graph
from refimpl.kernels import gat_fused_twin
from refimpl.models import GAT
from refimpl.nn.gat import fused_kernels
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.gat.fused_path import FusedELU, FusedScoreCache, FusedV2ScoreCache
from refimpl.ops.activations import ELU
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.strict import count_launches
from refimpl.testing.tolerances import FORWARD_RTOL
from refimpl.train import TrainConfig, train_model
from refimpl.validation import check_input
from tests.kernels.test_gat_fused import (
    EMPTY,
    LOOPS_AND_DUPLICATES,
    ONE_NODE,
    THREE_LOOPS,
    assert_bitwise_equal,
    cancelled_terms,
)


def run_layer(fused, graph, heads, channels, dropout, slope, dtype, seed, loops, concat):
    """``(out, grads by name, cache, generator state after forward)`` of one training forward
    (the keep-mask drawn from a generator) and backward on the strict stand-in (host arrays)."""
    options = {"concat": concat, "dropout": dropout, "add_self_loops": loops, "residual": True}
    layer = GATConv(3, channels, heads=heads, negative_slope=slope, **options)
    rng = np.random.default_rng(seed)
    with use_backend("strict"), fused_kernels(fused):
        params = layer.init_params(rng, backend="strict", dtype=dtype)
        x = asarray(rng.standard_normal((graph.num_nodes, 3)) * 2, dtype=dtype)
        noise = np.random.default_rng(seed + 1)
        out, cache = layer.forward(params, x, graph, training=True, rng=noise)
        d_out = asarray(np.random.default_rng(seed + 2).standard_normal(out.shape), dtype=dtype)
        d_x, d_params = layer.backward(params, cache, d_out)
    grads = {"x": to_numpy(d_x)} | {name: to_numpy(value) for name, value in d_params.items()}
    return to_numpy(out), grads, cache, noise.bit_generator.state


def aggregation_cotangent(d_out: np.ndarray, heads: int, channels: int, concat: bool) -> np.ndarray:
    """The aggregation's cotangent ``(N, H, C)`` from the layer's ``d_out`` (step B8)."""
    shape = (d_out.shape[0], heads, channels)
    return d_out.reshape(shape) if concat else np.broadcast_to(d_out[:, None, :] / heads, shape)


@given(
    graph=graphs(min_nodes=0, max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.sampled_from([0.0, 0.5]),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=seeds(),
    loops=st.booleans(),
    concat=st.booleans(),
)
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, dtype=np.float32, seed=0,
         loops=True, concat=True)  # fmt: skip
@example(graph=EMPTY, heads=1, channels=1, dropout=0.0, slope=0.2, dtype=np.float64, seed=0,
         loops=False, concat=True)  # fmt: skip
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2,
         dtype=np.float32, seed=1, loops=False, concat=False)  # fmt: skip
@example(graph=THREE_LOOPS, heads=2, channels=4, dropout=0.0, slope=0.2, dtype=np.float64,
         seed=0, loops=False, concat=True)  # fmt: skip
def test_a_fused_layer_is_the_literal_layer(
    graph, heads, channels, dropout, slope, dtype, seed, loops, concat
):
    case = (graph, heads, channels, dropout, slope, dtype, seed, loops, concat)
    out, grads, cache, drawn = run_layer(False, *case)
    fused_out, fused_grads, fused_cache, fused_drawn = run_layer(True, *case)
    assert isinstance(fused_cache.score, FusedScoreCache)  # the kernels ran, not the literal
    assert fused_drawn == drawn  # the keep-mask drawn as the literal layer draws it
    if cache.dropout_cache.mask is None:
        assert fused_cache.dropout_cache.mask is None
    else:
        assert_bitwise_equal(
            to_numpy(fused_cache.dropout_cache.mask), to_numpy(cache.dropout_cache.mask)
        )
    assert_bitwise_equal(to_numpy(fused_cache.alpha), to_numpy(cache.alpha))
    assert_bitwise_equal(fused_out, out)
    if channels <= 2:
        for name, value in grads.items():
            assert_bitwise_equal(fused_grads[name], value)
        return
    d_out = np.random.default_rng(seed + 2).standard_normal(out.shape).astype(dtype)
    magnitudes = cancelled_terms(
        cache, aggregation_cotangent(d_out, heads, channels, concat), slope
    )
    rtol = FORWARD_RTOL[np.dtype(dtype)]
    for name, value in grads.items():
        assert fused_grads[name].dtype == value.dtype and fused_grads[name].shape == value.shape
        scale = np.maximum(np.max(np.abs(value), initial=0.0), magnitudes.get(name, 0.0))
        assert np.all(np.abs(fused_grads[name] - value) <= rtol * scale), name


def test_a_given_mask_is_used_and_a_wrong_one_refused_in_one_line():
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    layer = GATConv(3, 2, heads=2, dropout=0.5)  # 4 edges + 3 loops attended
    with use_backend("strict"):
        params = layer.init_params(np.random.default_rng(0), backend="strict")
        x = asarray(np.random.default_rng(1).standard_normal((3, 3)))
        mask = asarray(np.random.default_rng(2).random((7, 2)) >= 0.5)
        expected, _ = layer.forward(params, x, graph, training=True, attn_dropout_mask=mask)
        with fused_kernels():
            out, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=mask)
            assert isinstance(cache.score, FusedScoreCache) and cache.dropout_cache.mask is mask
            assert_bitwise_equal(to_numpy(out), to_numpy(expected))
            with pytest.raises(ValueError, match=r"attn_dropout_mask must have shape \(7, 2\)"):
                layer.forward(params, x, graph, training=True, attn_dropout_mask=mask[:6])
            with pytest.raises(TypeError, match="attn_dropout_mask must be a boolean array"):
                layer.forward(params, x, graph, training=True, attn_dropout_mask=mask * 1.0)
            with pytest.raises(ValueError, match="needs randomness: pass rng="):
                layer.forward(params, x, graph, training=True)


FALLBACKS = {  # layers the kernels do not cover, GATv1 and GATv2: (layer, its input)
    **{
        f"{version} {name}": (GATConv(*args, version=version, **options), extra)
        for version in ("v1", "v2")
        for name, (args, options, extra) in {
            "LipschitzNorm": ((3, 2), {"lipschitz_norm": "paper"}, None),
            "edge features": ((3, 2), {"edge_dim": 2}, "edge_attr"),
            "bipartite": (((3, 3), 2), {}, "pair"),
            "a pair into one in_channels": ((3, 2), {}, "pair"),
        }.items()
    },
    "v2 shared, a pair": (GATConv(3, 2, version="v2", share_weights=True), "pair"),
}


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_a_layer_the_kernels_do_not_cover_runs_its_literal_path_inside_the_block(name):
    layer, extra = FALLBACKS[name]
    pair = extra == "pair"
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3, num_dst_nodes=3 if pair else None)
    rng = np.random.default_rng(0)
    with use_backend("strict"):
        params = layer.init_params(rng, backend="strict")
        x = asarray(rng.standard_normal((3, 3)))
        x = (x, asarray(rng.standard_normal((3, 3)))) if pair else x
        edge_attr = asarray(rng.standard_normal((3, 2))) if extra == "edge_attr" else None
        expected, _ = layer.forward(params, x, graph, edge_attr)
        with fused_kernels():
            out, cache = layer.forward(params, x, graph, edge_attr)
    assert not isinstance(cache.score, (FusedScoreCache, FusedV2ScoreCache))
    assert_bitwise_equal(to_numpy(out), to_numpy(expected))


def test_numpy_and_code_outside_the_block_take_the_literal_path():
    layer = GATConv(3, 2, heads=2)
    graph = Graph(np.array([[0, 1], [1, 0]]), 2)
    params = layer.init_params(np.random.default_rng(0))
    with fused_kernels():
        _, cache = layer.forward(params, np.ones((2, 3)), graph)
        with fused_kernels(False), use_backend("strict"):
            _, strict_cache = layer.forward(asarray_all(params), asarray(np.ones((2, 3))), graph)
    assert not isinstance(cache.score, FusedScoreCache)
    assert not isinstance(strict_cache.score, FusedScoreCache)
    with pytest.raises(ValueError, match="fused_kernels enabled must be True or False, got 1"):
        with fused_kernels(1):
            pass


def asarray_all(params: dict) -> dict:
    return {name: asarray(value, backend="strict") for name, value in params.items()}


# -- ELU -------------------------------------------------------------------------------------


@given(
    x=st.sampled_from([np.float32, np.float64]).flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(max_dims=2, max_side=6),
                                 elements=st.floats(-1e3, 1e3, width=np.dtype(dtype).itemsize * 8))
    ),
    alpha=st.sampled_from([1.0, 0.5, 2.0]),
    seed=seeds(),
)  # fmt: skip
@example(x=np.array([0.0, -0.0, -1e-30, 1e-30, -800.0, 3.0]), alpha=1.0, seed=0)
def test_the_fused_elu_is_the_literal_elu_in_one_launch_each_way(x, alpha, seed):
    d_y = np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype)
    with use_backend("strict"):
        x, d_y = asarray(x), asarray(d_y)
        y, cache = ELU(alpha).forward({}, x)
        d_x, _ = ELU(alpha).backward({}, cache, d_y)
        with count_launches() as checks:
            check_input(d_y)
        with count_launches() as forward:
            fused_y, fused_cache = FusedELU(alpha).forward({}, x)
        with count_launches() as backward:
            fused_d_x, _ = FusedELU(alpha).backward({}, fused_cache, d_y)
    assert_bitwise_equal(to_numpy(fused_y), to_numpy(y))
    assert_bitwise_equal(to_numpy(fused_d_x), to_numpy(d_x))
    # each way one kernel besides the finiteness check the literal ELU makes too
    assert (forward.launches, backward.launches) == (checks.launches + 1, checks.launches + 1)


def test_the_fused_elu_refuses_what_the_literal_elu_refuses():
    with use_backend("strict"):
        x = asarray(np.array([1.0, np.nan]))
        with pytest.raises(ValueError, match="x contains NaN or infinity"):
            FusedELU().forward({}, x)
        _, cache = FusedELU().forward({}, asarray(np.ones(2)))
        with pytest.raises(ValueError, match="d_y must be an array of the output's shape"):
            FusedELU().backward({}, cache, asarray(np.ones(3)))


# -- training ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset() -> object:
    return contextual_sbm(40, 2, np.random.default_rng(0), feature_dim=5).astype(np.float32)


def gat(dataset: object) -> GAT:
    # two classes and two channels per head: every sum of d alpha has at most two terms, so
    # the fused backward is the literal one bit for bit and so is every step of the run
    return GAT(dataset.num_features, 2, dataset.num_classes, 2, heads=(2, 1), version="v1",
               bias=True, activation="elu", dropout=0.5, attn_dropout=0.5)  # fmt: skip


def test_a_fused_training_run_is_the_literal_run_and_resumes_bit_for_bit(
    dataset: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    kernel = gat_fused_twin.forward
    monkeypatch.setattr(gat_fused_twin, "forward", lambda *a: calls.append(1) or kernel(*a))
    config = TrainConfig(epochs=4, lr=0.01, weight_decay=5e-4, checkpoint_every=2, seed=3)
    model = gat(dataset)
    literal = train_model(model, dataset, config, backend="strict")
    assert not calls
    with fused_kernels():
        full = train_model(model, dataset, config, out_dir=tmp_path / "full", backend="strict")
    assert calls  # the fused run took the kernels
    assert full.final_train_loss == literal.final_train_loss
    for name, value in literal.params.items():
        assert_bitwise_equal(to_numpy(full.params[name]), to_numpy(value))
    part = TrainConfig(**{**config.__dict__, "epochs": 2})
    with fused_kernels():
        train_model(model, dataset, part, out_dir=tmp_path / "part", backend="strict")
        resumed = train_model(
            model, dataset, config, out_dir=tmp_path / "part",
            resume=tmp_path / "part/checkpoint.npz", backend="strict",
        )  # fmt: skip
    assert resumed.final_train_loss == full.final_train_loss
    for name, value in full.params.items():
        assert_bitwise_equal(to_numpy(resumed.params[name]), to_numpy(value))
