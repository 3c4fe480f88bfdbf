"""``GraphiTLayer`` (GraphiT-GT's layer as released): central differences on drawn batches in
every norm, training and evaluation; torch autograd against the released ``GraphiT_GT_Layer``
(its attention and node stream written in dense torch in ``test_graphit_torch`` and
``test_gt_torch``); batch norm's running statistics; bad configuration."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from refimpl.nn.transformer.graphit_layer import GraphiTLayer
from refimpl.testing import check_gradients, max_relative_error, relative_errors
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL, GRADIENT_RTOL
from tests.nn.transformer.test_graphit import case, configs_and_batches
from tests.nn.transformer.test_san import STEP, away_from_clamp
from tests.nn.transformer.test_stream import smooth

NORMS = ["batch", "layer", "none", "layer+batch"]


def layer_case(drawn: tuple, norm: str, dropout: float = 0.2) -> tuple:
    """The layer around the drawn attention, its parameters (the attention's from ``case``),
    drifted running statistics and the inputs."""
    config, edges, n, batch, seed, _ = drawn
    att, att_params, h, graph, e, kernel, real, rng = case(dict(config), edges, n, batch, seed, 1.0)
    names = ("heads", "full_graph", "adaptive_edge_PE", "bias", "explicit_bias")
    options = {k: getattr(att, k) for k in names}
    layer = GraphiTLayer(att.channels, **options, dropout=dropout, norm=norm)
    assert layer.blocks["attention"] == att
    params = layer.init_params(rng)
    params.update({f"attention.{k}": v for k, v in att_params.items()})
    state = {k: v + 0.5 * rng.random(v.shape) for k, v in layer.init_state().items()}
    return layer, params, state, (h, graph, e, kernel, real), rng


def stream_params(params: dict) -> dict:
    return {k.removeprefix("stream."): v for k, v in params.items() if k.startswith("stream.")}


@settings(deadline=None, max_examples=40)
@given(drawn=configs_and_batches(), norm=st.sampled_from(NORMS), training=st.booleans())
def test_layer_matches_central_differences(drawn: tuple, norm: str, training: bool) -> None:
    layer, params, state, inputs, rng = layer_case(drawn, norm)
    if training and "batch" in norm:  # BatchNorm refuses one row in training
        assume(inputs[0].shape[0] >= 2)
    _, cache = layer.forward(params, *inputs, training=training, rng=rng, state=state)
    kwargs: dict[str, Any] = {"training": training, "noise": cache.noise, "state": state}
    stream = layer.blocks["stream"]
    assume(away_from_clamp(cache.attention) and smooth(stream, stream_params(params), cache.stream))
    report = check_gradients(
        layer,
        params,
        inputs,
        wrt_inputs=[0, 2],
        forward_kwargs=kwargs,
        max_entries=20,
        rng=np.random.default_rng(0),
        eps=STEP,
    )
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


@pytest.mark.parametrize("config", [0, 1, 2], ids=["study", "explicit-bias", "kernel"])
@pytest.mark.parametrize("norm", ["batch", "layer+batch"])
@pytest.mark.parametrize("training", [True, False])
def test_layer_matches_the_released_layer_in_torch(config: int, norm: str, training: bool) -> None:
    """``GraphiT_GT_Layer.forward``: the released attention, dropout, ``O_h``, residual, the
    norms (torch's own, running statistics updated or read), FFN, residual, norms; the same
    dropout masks; a batch with a one-node graph, an isolated node and a duplicate edge."""
    torch = pytest.importorskip("torch")
    from tests.nn.transformer.test_graphit_torch import released
    from tests.nn.transformer.test_gt_torch import released_stream

    configs = ({"full_graph": False}, {"bias": True, "explicit_bias": True}, {"full_graph": True})
    edges = np.array([[0, 1, 1, 2, 4], [1, 2, 2, 0, 5]])
    batch = np.array([0, 0, 0, 1, 2, 2, 2])  # graph 1 has one node, node 6 is isolated
    drawn = (configs[config], edges, 7, batch, 11, 1.0)
    layer, params, state, inputs, rng = layer_case(drawn, norm)
    out, cache = layer.forward(params, *inputs, training=training, rng=rng, state=state)
    g = rng.standard_normal(out.shape)
    (d_h, d_e), d_params = layer.backward(params, cache, g)

    h, graph, e, kernel, real = inputs
    att_params = {k.removeprefix("attention."): v for k, v in params.items() if "attention." in k}
    got = released(layer.blocks["attention"], att_params, h, graph, e, kernel, real)
    t_att, h_t, e_t = got["leaves"]
    t_stream = {k: torch.tensor(v, requires_grad=True) for k, v in params.items() if "stream." in k}
    buffers = {k: torch.tensor(v) for k, v in state.items()}
    noise = {k: torch.tensor(v) for k, v in cache.noise.items()}
    stream = layer.blocks["stream"]
    ref = released_stream(stream, t_stream, "stream", got["h_out"], h_t, training, buffers, noise)
    leaves = [h_t, e_t, *t_att.values(), *t_stream.values()]
    grads = torch.autograd.grad((ref * torch.tensor(g)).sum(), leaves, allow_unused=True)
    names = ["h", "e", *(f"attention.{k}" for k in t_att), *t_stream]
    theirs = {n: (np.zeros_like(x.detach().numpy()) if d is None else d.numpy())
              for n, x, d in zip(names, leaves, grads, strict=True)}  # fmt: skip
    rtol = FORWARD_RTOL[np.dtype(np.float64)]
    assert max_relative_error(out, ref.detach().numpy()) <= rtol
    assert max_relative_error(cache.attention_out, got["h_out"].detach().numpy()) <= rtol
    assert max_relative_error(cache.scores, got["e_attn"].detach().numpy().reshape(
        cache.scores.shape)) <= rtol  # fmt: skip
    errors = relative_errors({"h": d_h, "e": d_e, **d_params}, theirs)
    assert max(errors.values()) <= GRADIENT_RTOL[np.dtype(np.float64)], errors
    for name, value in buffers.items():  # the running statistics, updated or read
        assert max_relative_error(cache.state[name], value.numpy()) <= rtol, name


def test_batch_norm_learns_statistics_in_training_and_reads_them_in_evaluation() -> None:
    # Training updates the running statistics (from their initial values when state is None);
    # evaluation reads the ones passed and must be given them; the layer is its attention then
    # its stream, bit for bit.
    drawn = ({"full_graph": True}, np.array([[0, 1, 2], [1, 2, 0]]), 4, np.zeros(4, int), 5, 1.0)
    layer, params, _, inputs, _ = layer_case(drawn, "batch", dropout=0.0)
    trained, cache = layer.forward(params, *inputs, training=True)
    assert list(cache.state) == list(layer.state_shapes())
    assert not np.array_equal(cache.state["stream.norm1.running_mean"], np.zeros(4))
    out, eval_cache = layer.forward(params, *inputs, state=cache.state)
    assert not np.allclose(out, trained)  # running, not batch, statistics
    attention, stream = layer.blocks["attention"], layer.blocks["stream"]
    att_params = {k.removeprefix("attention."): v for k, v in params.items() if "attention." in k}
    (a, _), _ = attention.forward(att_params, *inputs)
    stream_state = {k.removeprefix("stream."): v for k, v in cache.state.items()}
    expected, _ = stream.forward(stream_params(params), a, inputs[0], state=stream_state)
    np.testing.assert_array_equal(out, expected)
    assert all(np.array_equal(eval_cache.state[k], v) for k, v in cache.state.items())
    with pytest.raises(ValueError, match="running statistics"):
        layer.forward(params, *inputs)


def test_bad_configuration_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match="GraphiTLayer channels must be a positive int"):
        GraphiTLayer(0)
    with pytest.raises(ValueError, match="norm"):
        GraphiTLayer(4, heads=2, norm="group")
