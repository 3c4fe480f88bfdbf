"""GATConv: finite differences, the naive loop version, properties, strict backend, bad input."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.backend import to_numpy
from refimpl.kernels.segment import segment_sum
from refimpl.naive.gat import gat_forward
from refimpl.nn import GATConv
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing import strict as strict_xp
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL
from refimpl.validation import NonFiniteError

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]


@st.composite
def setups(
    draw: st.DrawFn,
    dropout: bool | None = None,
    version: str | None = None,
    lipschitz_norms: list[str | None] | None = None,
) -> tuple:
    """A configured layer, its float64 parameters, features, a graph and forward kwargs.

    ``version`` fixes the version; ``lipschitz_norms`` lists the modes to draw from
    (default: every mode the version accepts).
    """
    graph = draw(graphs())
    version = draw(st.sampled_from(["v1", "v2"])) if version is None else version
    modes = [None, "paper", "reference-code"] if version == "v1" else [None, "paper"]
    modes = modes if lipschitz_norms is None else lipschitz_norms
    conv = GATConv(
        in_channels=draw(st.integers(1, 4)),
        out_channels=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 4)),
        concat=draw(st.booleans()),
        version=version,
        share_weights=draw(st.booleans()),
        negative_slope=draw(st.sampled_from([0.2, 0.01, 0.5])),
        add_self_loops=draw(st.booleans()),
        bias=draw(st.booleans()),
        dropout=0.0,
        lipschitz_norm=draw(st.sampled_from(modes)),
    )
    rng = np.random.default_rng(draw(seeds()))
    params = conv.init_params(rng)
    # Random (not zero) bias, and attention scaled up so softmaxes are far from uniform.
    params = {
        k: v + rng.standard_normal(v.shape) if k == "bias" else v * 2.0 for k, v in params.items()
    }
    x = rng.standard_normal((graph.num_nodes, conv.in_channels))
    kwargs: dict = {}
    if dropout if dropout is not None else draw(st.booleans()):
        conv = replace(conv, dropout=0.4)
        num_edges = conv.prepare_graph(graph).num_edges
        kwargs = {"training": True, "attn_dropout_mask": rng.random((num_edges, conv.heads)) >= 0.4}
    return conv, params, x, graph, kwargs


def kink_distance(cache: object) -> float:
    """Smallest |LeakyReLU input|: finite differences are meaningless within eps of the kink."""
    pre = cache.score.pre
    return float(np.min(np.abs(pre))) if pre.size else np.inf


# -- gradients ---------------------------------------------------------------------------------


@given(setup=setups())
@example(  # regression pin: a single node whose only edge is the added self-loop
    setup=(
        GATConv(2, 2, heads=2, version="v2"),
        {
            "W_s": np.array([[0.3, -1.2], [0.7, 0.1], [-0.4, 0.9], [1.1, 0.5]]),
            "W_t": np.array([[0.2, 0.4], [-0.8, 0.6], [0.3, -0.3], [0.9, -1.0]]),
            "att": np.array([[1.3, -0.7], [0.4, 0.8]]),
            "bias": np.array([0.1, -0.2, 0.3, 0.4]),
        },
        np.array([[0.5, -1.5]]),
        Graph(np.zeros((2, 0), dtype=np.int64), 1),
        {},
    )
)
def test_backward_matches_central_differences(setup: tuple) -> None:
    conv, params, x, graph, kwargs = setup
    _, cache = conv.forward(params, x, graph, **kwargs)
    assume(kink_distance(cache) > 1e-4)
    report = check_gradients(conv, params, (x, graph), forward_kwargs=kwargs, max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=setups(), seed=seeds())
def test_residual_backward_matches_central_differences(setup: tuple, seed: int) -> None:
    # PyG's residual=True (issue 22): out + x W_res^T before the bias; W_res and x's second
    # path both receive gradient.
    conv, params, x, graph, kwargs = setup
    conv = replace(conv, residual=True)
    w_res = np.random.default_rng(seed).standard_normal(conv.param_shapes()["W_res"])
    params = {name: params.get(name, w_res) for name in conv.param_shapes()}
    _, cache = conv.forward(params, x, graph, **kwargs)
    assume(kink_distance(cache) > 1e-4)
    report = check_gradients(conv, params, (x, graph), forward_kwargs=kwargs, max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("concat", [True, False])
def test_residual_adds_the_inputs_projection_before_the_bias(concat: bool) -> None:
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    plain = GATConv(3, 2, heads=2, concat=concat)
    skip = replace(plain, residual=True)
    assert skip.param_shapes()["W_res"] == ((4 if concat else 2), 3)  # PyG's res.weight
    rng = np.random.default_rng(4)
    params = skip.init_params(rng)
    x = rng.standard_normal((3, 3))
    with_skip, _ = skip.forward(params, x, graph)
    without, _ = plain.forward({k: v for k, v in params.items() if k != "W_res"}, x, graph)
    np.testing.assert_allclose(with_skip, without + x @ params["W_res"].T, rtol=RTOL64, atol=0)


def test_gradient_check_catches_a_wrong_backward() -> None:
    # The check must be able to fail: break the attention gradient and watch it.
    graph = Graph(np.array([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    conv = GATConv(3, 2, heads=2, version="v2")
    rng = np.random.default_rng(1)
    params = {k: v * 2 for k, v in conv.init_params(rng).items()}
    x = rng.standard_normal((3, 3))

    class Broken:
        forward = staticmethod(conv.forward)

        @staticmethod
        def backward(params: dict, cache: object, d_out: np.ndarray) -> tuple:
            d_x, d_params = conv.backward(params, cache, d_out)
            return d_x, {**d_params, "att": d_params["att"] * 1.01}

    report = check_gradients(Broken(), params, (x, graph))
    assert report.by_name()["param:att"].max_rel_error > 1e-3
    assert report.by_name()["param:W_s"].max_rel_error <= GRADCHECK_RTOL


# -- against the naive loop version ----------------------------------------------------------


@given(setup=setups())
def test_forward_matches_naive_loops(setup: tuple) -> None:
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(params, x, graph, **kwargs)
    keep = kwargs.get("attn_dropout_mask")
    expected, edges, alpha = gat_forward(conv, params, x, graph.edge_index, attn_keep=keep)
    assert max_relative_error(out, expected) <= RTOL64
    edge_index, attention = conv.attention_weights(cache)
    np.testing.assert_array_equal(edge_index, edges)
    assert max_relative_error(attention, alpha) <= RTOL64


# -- properties ------------------------------------------------------------------------------


@given(setup=setups(dropout=False))
def test_attention_over_incoming_edges_sums_to_one(setup: tuple) -> None:
    conv, params, x, graph, _ = setup
    _, cache = conv.forward(params, x, graph)
    used = cache.graph
    sums = segment_sum(cache.alpha, used.dst_segments(np))  # (N, H)
    has_incoming = used.in_degree() > 0
    np.testing.assert_allclose(sums[has_incoming], 1.0, rtol=0, atol=1e-14)
    assert np.all(sums[~has_incoming] == 0)


@given(setup=setups(dropout=False), seed=seeds())
def test_permuting_nodes_permutes_outputs(setup: tuple, seed: int) -> None:
    conv, params, x, graph, _ = setup
    perm = np.random.default_rng(seed).permutation(graph.num_nodes)  # new node i = old perm[i]
    new_label = np.argsort(perm)  # old node j -> new label
    permuted = Graph(new_label[graph.edge_index], graph.num_nodes)
    out, _ = conv.forward(params, x, graph)
    out_permuted, _ = conv.forward(params, x[perm], permuted)
    assert max_relative_error(out_permuted, out[perm]) <= RTOL64


@given(setup=setups(dropout=False), seed=seeds())
def test_reordering_edges_changes_nothing(setup: tuple, seed: int) -> None:
    conv, params, x, graph, _ = setup
    order = np.random.default_rng(seed).permutation(graph.num_edges)
    out, cache = conv.forward(params, x, graph)
    out_reordered, _ = conv.forward(params, x, Graph(graph.edge_index[:, order], graph.num_nodes))
    assert max_relative_error(out_reordered, out) <= RTOL64
    d_out = np.random.default_rng(seed).standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    _, cache_reordered = conv.forward(params, x, Graph(graph.edge_index[:, order], graph.num_nodes))
    d_x_reordered, d_params_reordered = conv.backward(params, cache_reordered, d_out)
    errors = relative_errors({**d_params_reordered, "x": d_x_reordered}, {**d_params, "x": d_x})
    assert max(errors.values()) <= RTOL64, errors


@given(setup=setups(dropout=False))
def test_one_head_concat_equals_mean(setup: tuple) -> None:
    conv, params, x, graph, _ = setup
    conv = replace(conv, heads=1, concat=True)
    params = conv.init_params(np.random.default_rng(0))
    out_concat, _ = conv.forward(params, x, graph)
    out_mean, _ = replace(conv, concat=False).forward(params, x, graph)
    np.testing.assert_array_equal(out_concat, out_mean)


@given(setup=setups(dropout=False), seed=seeds())
def test_shared_weights_equal_separate_weights_tied(setup: tuple, seed: int) -> None:
    # Independent routes must agree: v2 with W_t := W_s equals share_weights=True, and the
    # shared gradient is the sum of the two separate ones.
    conv, _params, x, graph, _ = setup
    # "reference-code" is GATv1-only; its v2 counterpart is the paper's norm
    lipschitz = "paper" if conv.lipschitz_norm is not None else None
    shared = replace(conv, version="v2", share_weights=True, lipschitz_norm=lipschitz)
    separate = replace(shared, share_weights=False)
    tied = separate.init_params(np.random.default_rng(seed))
    tied["W_t"] = tied["W_s"].copy()
    shared_params = {k: v for k, v in tied.items() if k != "W_t"}
    out_shared, cache_shared = shared.forward(shared_params, x, graph)
    out_separate, cache_separate = separate.forward(tied, x, graph)
    assert max_relative_error(out_shared, out_separate) <= RTOL64
    d_out = np.random.default_rng(seed).standard_normal(out_shared.shape)
    _, d_shared = shared.backward(shared_params, cache_shared, d_out)
    _, d_separate = separate.backward(tied, cache_separate, d_out)
    errors = relative_errors(
        {"W_s": d_shared["W_s"]}, {"W_s": d_separate["W_s"] + d_separate["W_t"]}
    )
    assert errors["W_s"] <= RTOL64


def test_node_without_incoming_edges_outputs_the_bias() -> None:
    graph = Graph(np.array([[0, 1], [1, 0]]), 3)  # node 2 is isolated
    conv = GATConv(2, 3, heads=2, add_self_loops=False)
    params = conv.init_params(np.random.default_rng(0))
    params["bias"] = np.arange(6.0)
    out, _ = conv.forward(params, np.ones((3, 2)), graph)
    np.testing.assert_array_equal(out[2], params["bias"])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_equal_scores_give_uniform_attention_exactly(version: str) -> None:
    graph = Graph(np.array([[0, 1, 2, 2, 3, 3], [1, 1, 1, 0, 0, 0]]), 4)  # duplicate 3 -> 0
    conv = GATConv(3, 2, heads=2, version=version)
    params = {
        k: np.zeros_like(v) if k.startswith("att") else v
        for k, v in conv.init_params(np.random.default_rng(0)).items()
    }
    _, cache = conv.forward(params, np.random.default_rng(1).standard_normal((4, 3)), graph)
    degree = cache.graph.in_degree()[cache.graph.edge_index[1]]  # (E,)
    np.testing.assert_array_equal(cache.alpha, np.repeat(1.0 / degree[:, None], 2, axis=1))


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("scale", [1e3, -1e3])
def test_extreme_scores_stay_finite(version: str, scale: float) -> None:
    graph = Graph(np.array([[0, 1, 2, 3], [1, 2, 3, 1]]), 4)
    conv = GATConv(2, 2, heads=1, version=version)
    params = conv.init_params(np.random.default_rng(0))
    params = {k: v * abs(scale) if k.startswith("att") else v for k, v in params.items()}
    x = np.random.default_rng(2).standard_normal((4, 2)) * np.sign(scale)
    out, cache = conv.forward(params, x, graph)
    d_x, d_params = conv.backward(params, cache, np.ones_like(out))
    assert np.isfinite(out).all() and np.isfinite(d_x).all()
    assert all(np.isfinite(v).all() for v in d_params.values())
    sums = segment_sum(cache.alpha, cache.graph.dst_segments(np))
    np.testing.assert_allclose(sums, 1.0, atol=1e-15)


def test_drawn_dropout_mask_is_reproducible_and_returned() -> None:
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    conv = GATConv(2, 2, heads=3, dropout=0.5)
    params = conv.init_params(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((3, 2))
    out_a, cache_a = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(7))
    out_b, _ = conv.forward(params, x, graph, training=True, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(out_a, out_b)
    keep = cache_a.alpha_dropped != 0
    out_c, _ = conv.forward(params, x, graph, training=True, attn_dropout_mask=keep)
    np.testing.assert_array_equal(out_a, out_c)
    out_eval, _ = conv.forward(params, x, graph, training=False)
    assert not np.array_equal(out_a, out_eval)


# -- the strict stand-in: no stray NumPy in the math ---------------------------------------


@given(setup=setups())
def test_strict_backend_matches_numpy(setup: tuple) -> None:
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)

    to_strict = strict_xp.asarray
    strict_kwargs = {k: to_strict(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    strict_params = {k: to_strict(v) for k, v in params.items()}
    out_s, cache_s = conv.forward(strict_params, to_strict(x), graph, **strict_kwargs)
    assert isinstance(out_s, strict_xp.StrictArray)
    d_x_s, d_params_s = conv.backward(strict_params, cache_s, to_strict(d_out))
    assert max_relative_error(to_numpy(out_s), out) <= RTOL64
    errors = relative_errors({**d_params_s, "x": d_x_s}, {**d_params, "x": d_x})
    assert max(errors.values()) <= RTOL64, errors


def test_float32_stays_float32() -> None:
    graph = Graph(np.array([[0, 1, 2], [1, 2, 0]]), 3)
    for version in ("v1", "v2"):
        conv = GATConv(4, 2, heads=2, version=version)
        params = conv.init_params(np.random.default_rng(0), dtype=np.float32)
        x = np.ones((3, 4), dtype=np.float32)
        out, cache = conv.forward(params, x, graph)
        d_x, d_params = conv.backward(params, cache, np.ones_like(out))
        assert out.dtype == d_x.dtype == np.float32
        assert all(v.dtype == np.float32 for v in d_params.values())


# -- bad input -----------------------------------------------------------------------------


def _layer() -> tuple[GATConv, dict, np.ndarray, Graph]:
    conv = GATConv(3, 2, heads=2)
    return (
        conv,
        conv.init_params(np.random.default_rng(0)),
        np.ones((4, 3)),
        Graph(np.array([[0, 1, 2], [1, 2, 3]]), 4),
    )


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda p, x, g: (p, np.ones((4, 5)), g), ValueError, r"x must have shape \(\*, 3\)"),
        (lambda p, x, g: (p, np.ones(3), g), ValueError, "x must have shape"),
        (lambda p, x, g: (p, np.ones((5, 3)), g), ValueError, "x has 5 rows but the graph has 4"),
        (
            lambda p, x, g: (p, np.where(np.eye(4, 3) > 0, np.nan, x), g),
            ValueError,
            "NaN or infinity",
        ),
        (lambda p, x, g: (p, np.full((4, 3), np.inf), g), ValueError, "NaN or infinity"),
        (lambda p, x, g: (p, np.ones((4, 3), dtype=np.int64), g), TypeError, "floating-point"),
        (lambda p, x, g: (p, x.astype(np.float32), g), TypeError, "x has dtype float32 but params"),
        (lambda p, x, g: (p, x.tolist(), g), TypeError, "x must be an array"),
        (lambda p, x, g: (p, x, g.edge_index), TypeError, "graph must be a refimpl.Graph"),
        (
            lambda p, x, g: ({k: v for k, v in p.items() if k != "att_src"}, x, g),
            ValueError,
            r"missing \['att_src'\]",
        ),
        (lambda p, x, g: ({**p, "W_s": p["W"]}, x, g), ValueError, r"unexpected \['W_s'\]"),
        (
            lambda p, x, g: ({**p, "W": p["W"].T}, x, g),
            ValueError,
            r"params\['W'\] must have shape",
        ),
        (
            lambda p, x, g: ({**p, "att_dst": p["att_dst"] * np.nan}, x, g),
            ValueError,
            "NaN or infinity",
        ),
    ],
)
def test_bad_input_gives_a_clear_error(mutate: object, error: type, match: str) -> None:
    conv, params, x, graph = _layer()
    params, x, graph = mutate(params, x, graph)
    with pytest.raises(error, match=match):
        conv.forward(params, x, graph)


def test_bad_upstream_gradient_shape() -> None:
    conv, params, x, graph = _layer()
    _out, cache = conv.forward(params, x, graph)
    with pytest.raises(ValueError, match=r"d_out must be an array of the output's shape \(4, 4\)"):
        conv.backward(params, cache, np.ones((4, 2)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": 0}, "heads must be a positive int"),
        ({"version": "v3"}, "version must be"),
        ({"dropout": 1.0}, r"GATConv dropout must be a probability in \[0, 1\)"),
        ({"dropout": float("nan")}, r"GATConv dropout must be a probability in \[0, 1\)"),
        ({"dropout": "0.5"}, r"GATConv dropout must be a probability in \[0, 1\)"),
        ({"negative_slope": -0.1}, "GATConv negative_slope must be a finite number >= 0"),
        ({"negative_slope": float("nan")}, "GATConv negative_slope must be a finite number"),
        ({"negative_slope": float("inf")}, "GATConv negative_slope must be a finite number"),
        ({"fill_value": 10**400, "edge_dim": 2}, "fill_value must be finite numbers"),
        ({"fill_value": np.array([1.0, 2.0]), "edge_dim": 3}, "has 2 numbers but edge_dim is 3"),
        ({"out_channels": 2.5}, "positive int"),
    ],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GATConv(**{"in_channels": 3, "out_channels": 2, **kwargs})


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_float32_gradient_overflow_is_refused_in_one_line(version: str) -> None:
    # Regression: float32 GATConv.backward at x = 1e38 returned non-finite gradients, or an
    # inner block's "d_y contains NaN", which blamed a cotangent the caller never saw. The
    # forward is finite (each output a convex combination of messages) where d alpha, a sum
    # over channels of h * d_out, is not; no test had run backward near float32's largest.
    graph = Graph(np.array([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]]), 4)
    conv = GATConv(5, 3, version=version)
    params = conv.init_params(np.random.default_rng(0), dtype=np.float32)
    x = (1e38 * np.random.default_rng(1).uniform(0.5, 1.0, (4, 5))).astype(np.float32)
    out, cache = conv.forward(params, x, graph)
    assert np.isfinite(out).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow warning on the way
        with pytest.raises(NonFiniteError, match="gradient overflowed float32") as info:
            conv.backward(params, cache, np.ones_like(out))
    assert str(info.value) == (
        "GATConv.backward: a gradient overflowed float32 though every input was finite; run "
        "in float64 (cast the inputs and the parameters)"
    )
    # what the message advises: float64 holds the same numbers' gradients
    params = {name: value.astype(np.float64) for name, value in params.items()}
    out, cache = conv.forward(params, x.astype(np.float64), graph)
    d_x, d_params = conv.backward(params, cache, np.ones_like(out))
    assert all(np.isfinite(g).all() for g in [d_x, *d_params.values()])


def test_bad_graph_indices_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="out of range"):
        Graph(np.array([[0, 4], [1, 2]]), 4)
    with pytest.raises(ValueError, match="negative"):
        Graph(np.array([[0, -1], [1, 2]]), 4)
    with pytest.raises(TypeError, match="integer"):
        Graph(np.array([[0.0, 1.0], [1.0, 2.0]]), 4)


def test_dropout_in_training_needs_a_source_of_randomness() -> None:
    conv, params, x, graph = _layer()
    with pytest.raises(ValueError, match="rng"):
        replace(conv, dropout=0.5).forward(params, x, graph, training=True)
    with pytest.raises(ValueError, match="mask"):
        replace(conv, dropout=0.5).forward(
            params, x, graph, training=True, attn_dropout_mask=np.ones((2, 2), dtype=bool)
        )
