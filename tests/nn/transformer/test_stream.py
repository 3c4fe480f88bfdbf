"""TransformerStream (the released GT layer's skeleton around an attention output): finite
differences, the steps F1-F9 written out in NumPy as the released ``forward`` reads, mask replay,
empty streams, running statistics, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.nn.transformer.stream import STREAM_NORMS, TransformerStream
from refimpl.testing import check_gradients, max_relative_error
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
STEP = 1e-5  # as the layer tests: curvature is excluded by `smooth` below, not by the step
AVAILABLE_NORMS = sorted(STREAM_NORMS)


@st.composite
def stream_setups(draw: st.DrawFn, min_rows: int = 0) -> tuple:
    """A small stream, float64 parameters moved off their init, attention output, residual
    input, running statistics and forward kwargs with fixed dropout masks."""
    stream = TransformerStream(
        channels=draw(st.integers(1, 4)),
        ffn_channels=draw(st.sampled_from([None, 1, 3])),
        dropout=draw(st.sampled_from([0.0, 0.3])),
        norm=draw(st.sampled_from(AVAILABLE_NORMS)),
        residual=draw(st.booleans()),
    )
    rows = draw(st.integers(min_rows, 6))
    training = draw(st.booleans())
    if training and "batch" in stream.norm:
        rows = max(rows, 2)  # BatchNorm (and torch's) refuses one row in training; 0 is passed
        if draw(st.booleans()):
            rows = 0
    rng = np.random.default_rng(draw(seeds()))
    params = {
        name: value + 0.3 * rng.standard_normal(value.shape)
        for name, value in stream.init_params(rng).items()
    }
    state = {
        name: value + 0.5 * rng.random(value.shape)  # running variances stay positive
        for name, value in stream.init_state().items()
    }
    attn_out = rng.standard_normal((rows, stream.channels))
    residual_in = rng.standard_normal((rows, stream.channels))
    kwargs: dict[str, Any] = {"training": training, "state": state}
    if training:
        _, cache = stream.forward(params, attn_out, residual_in, rng=rng, **kwargs)
        kwargs["noise"] = cache.noise
    return stream, params, attn_out, residual_in, kwargs


def reference(
    stream: TransformerStream, p: dict, a: np.ndarray, x: np.ndarray, training: bool,
    state: dict, noise: dict,
) -> tuple[np.ndarray, dict]:  # fmt: skip
    """F1-F9 as ``GraphTransformerLayer.forward`` of the released GT code reads, in NumPy,
    torch's LayerNorm and BatchNorm1d written out (eps 1e-5, momentum 0.1, running variance
    unbiased)."""
    new_state = dict(state)

    def drop(key: str, v: np.ndarray) -> np.ndarray:
        return v * noise[key] / (1 - stream.dropout) if key in noise else v

    def layer_norm(prefix: str, v: np.ndarray) -> np.ndarray:
        centred = v - v.mean(1, keepdims=True)
        var = (centred**2).mean(1, keepdims=True)
        return centred / np.sqrt(var + 1e-5) * p[f"{prefix}.weight"] + p[f"{prefix}.bias"]

    def batch_norm(prefix: str, v: np.ndarray) -> np.ndarray:
        if v.shape[0] == 0:
            return v
        if training:
            mean, var = v.mean(0), v.var(0)
            unbiased = v.var(0, ddof=1) if v.shape[0] > 1 else np.full(v.shape[1], np.nan)
            old_mean, old_var = state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"]
            new_state[f"{prefix}.running_mean"] = 0.9 * old_mean + 0.1 * mean
            new_state[f"{prefix}.running_var"] = 0.9 * old_var + 0.1 * unbiased
        else:
            mean, var = state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"]
        return (v - mean) / np.sqrt(var + 1e-5) * p[f"{prefix}.weight"] + p[f"{prefix}.bias"]

    def norm(step: int, v: np.ndarray) -> np.ndarray:
        kinds = STREAM_NORMS[stream.norm]
        for kind in kinds:
            prefix = f"norm{step}" if len(kinds) == 1 else f"{kind}_norm{step}"
            if v.shape[0]:
                v = layer_norm(prefix, v) if kind == "layer" else batch_norm(prefix, v)
        return v

    h = drop("dropout1", a)
    h = h @ p["output.W"].T + p["output.b"]  # O_h
    if stream.residual:
        h = x + h
    h = norm(1, h)
    h_in2 = h
    h = np.maximum(h @ p["ffn1.W"].T + p["ffn1.b"], 0)  # FFN_h_layer1, relu
    h = drop("dropout2", h)
    h = h @ p["ffn2.W"].T + p["ffn2.b"]  # FFN_h_layer2
    if stream.residual:
        h = h_in2 + h
    return norm(2, h), new_state


def smooth(stream: TransformerStream, params: dict, cache: Any) -> bool:
    """Central differences with STEP are accurate: every norm's denominator and every FFN
    pre-activation (F5's ReLU input, recomputed from the cache) is far from its non-smooth
    point on the scale of the step."""
    pre_activation = cache.ffn1.x @ params["ffn1.W"].T + params["ffn1.b"]  # (M, d_ff)
    if np.abs(pre_activation).min(initial=np.inf) <= 1e3 * STEP:
        return False
    layer_roots = [c.denominator for _, c in cache.norm1 + cache.norm2 if hasattr(c, "root")]
    # a LayerNorm over one channel centres to 0 whatever the step: smooth
    layer_ok = stream.channels == 1 or all(np.all(r > 1e4 * STEP) for r in layer_roots)
    batch_roots = [
        1 / c.inv_std for _, c in cache.norm1 + cache.norm2 if getattr(c, "training", False)
    ]
    return layer_ok and all(np.all(r > 1e4 * STEP) for r in batch_roots)


@given(setup=stream_setups())
def test_stream_matches_central_differences(setup: tuple) -> None:
    stream, params, attn_out, residual_in, kwargs = setup
    _, cache = stream.forward(params, attn_out, residual_in, **kwargs)
    assume(smooth(stream, params, cache))
    report = check_gradients(
        stream,
        params,
        (attn_out, residual_in),
        forward_kwargs=kwargs,
        max_entries=20,
        rng=np.random.default_rng(0),
        eps=STEP,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@given(setup=stream_setups())
def test_stream_is_the_released_order(setup: tuple) -> None:
    """Dropout before W_O, the second dropout between the FFN layers, norms after each
    residual: a stream wired in another order (the supplement's) fails this."""
    stream, params, attn_out, residual_in, kwargs = setup
    out, cache = stream.forward(params, attn_out, residual_in, **kwargs)
    expected, expected_state = reference(
        stream, params, attn_out, residual_in, kwargs["training"], kwargs["state"],
        kwargs.get("noise", {}),
    )  # fmt: skip
    assert max_relative_error(out, expected) <= RTOL64
    assert list(cache.state) == list(expected_state)
    for name, value in expected_state.items():
        np.testing.assert_allclose(cache.state[name], value, rtol=RTOL64, atol=0)


def test_mask_replay_is_exact_and_drawn_in_order() -> None:
    """forward(noise=cache.noise) repeats a training step bit for bit; the masks are drawn
    dropout1 (M, D) then dropout2 (M, d_ff)."""
    rng = np.random.default_rng(3)
    stream = TransformerStream(4, ffn_channels=6, dropout=0.25, norm="layer")
    params = stream.init_params(rng)
    a, x = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    out, cache = stream.forward(params, a, x, training=True, rng=np.random.default_rng(9))
    assert list(cache.noise) == ["dropout1", "dropout2"]
    replay, _ = stream.forward(params, a, x, training=True, noise=cache.noise)
    np.testing.assert_array_equal(out, replay)
    draws = np.random.default_rng(9)
    np.testing.assert_array_equal(cache.noise["dropout1"], draws.random((5, 4)) >= 0.25)
    np.testing.assert_array_equal(cache.noise["dropout2"], draws.random((5, 6)) >= 0.25)


@pytest.mark.parametrize("norm", AVAILABLE_NORMS)
def test_empty_stream_gives_empty_output_and_zero_gradients(norm: str) -> None:
    """A graph without edges leaves the edge stream no rows: LayerNorm alone refuses them,
    so the stream passes them through its norms, changes no statistics and returns zeros."""
    stream = TransformerStream(3, norm=norm)
    rng = np.random.default_rng(0)
    params, state = stream.init_params(rng), stream.init_state()
    empty = np.zeros((0, 3))
    out, cache = stream.forward(params, empty, empty, training=True, rng=rng, state=state)
    assert out.shape == (0, 3) and cache.noise == {}
    for name, value in state.items():
        np.testing.assert_array_equal(cache.state[name], value)
    (d_a, d_x), d_params = stream.backward(params, cache, np.zeros((0, 3)))
    assert d_a.shape == d_x.shape == (0, 3)
    assert list(d_params) == list(params)
    for name, value in d_params.items():
        np.testing.assert_array_equal(value, np.zeros_like(params[name]))


def test_without_residual_the_input_gets_no_gradient() -> None:
    stream = TransformerStream(2, norm="layer", residual=False)
    rng = np.random.default_rng(1)
    params = stream.init_params(rng)
    a, x = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    out, cache = stream.forward(params, a, x)
    np.testing.assert_array_equal(stream.forward(params, a, x + 1.0)[0], out)
    (_, d_x), _ = stream.backward(params, cache, rng.standard_normal((3, 2)))
    np.testing.assert_array_equal(d_x, np.zeros((3, 2)))


def test_parameter_names_and_default_ffn_width() -> None:
    shapes = TransformerStream(4, norm="layer").param_shapes()
    assert list(shapes) == [
        "output.W", "output.b", "norm1.weight", "norm1.bias", "ffn1.W", "ffn1.b", "ffn2.W",
        "ffn2.b", "norm2.weight", "norm2.bias",
    ]  # fmt: skip
    assert shapes["ffn1.W"] == (8, 4) and shapes["ffn2.W"] == (4, 8)  # d_ff = 2 D, as released
    assert "norm1.weight" not in TransformerStream(4, norm="none").param_shapes()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"channels": 0}, "positive int"),
        ({"channels": 2, "ffn_channels": 0}, "positive int"),
        ({"channels": 2, "dropout": 1.0}, "probability"),
        ({"channels": 2, "norm": "group"}, "must be one of"),
        ({"channels": 2, "residual": "no"}, "True or False"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformerStream(**kwargs)


def test_bad_inputs_are_rejected_in_one_line() -> None:
    stream = TransformerStream(2, norm="layer")
    params = stream.init_params(np.random.default_rng(0))
    a = np.ones((3, 2))
    with pytest.raises(ValueError, match="unknown keys"):
        stream.forward(params, a, a, noise={"dropout3": None})
    with pytest.raises(ValueError, match="residual_in"):
        stream.forward(params, a, np.ones((4, 2)))
    with pytest.raises(TypeError, match="residual_in has dtype float32"):
        stream.forward(params, a, a.astype(np.float32))
    with pytest.raises(ValueError, match="state does not match"):
        stream.forward(params, a, a, state={"norm1.running_mean": np.zeros(2)})


def test_batch_norm_in_evaluation_needs_its_running_statistics() -> None:
    """Evaluation reads the running statistics: fresh ones would be a silent default."""
    stream = TransformerStream(2)  # norm="batch", the released default
    params = stream.init_params(np.random.default_rng(0))
    a = np.random.default_rng(1).standard_normal((4, 2))
    with pytest.raises(ValueError, match="pass state="):
        stream.forward(params, a, a)
    _, cache = stream.forward(params, a, a, training=True)  # fresh statistics, updated
    assert list(cache.state) == [
        "norm1.running_mean", "norm1.running_var", "norm2.running_mean", "norm2.running_var",
    ]  # fmt: skip
    assert not np.array_equal(cache.state["norm1.running_mean"], np.zeros(2))
    out, _ = stream.forward(params, a, a, state=cache.state)
    assert out.shape == (4, 2)
