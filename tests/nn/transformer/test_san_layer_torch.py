"""SANLayer against torch autograd (float64): the released ``SAN_GT_Layer.forward``
(``gnn-lspe/layers/san_gt_layer.py``) written here in dense torch, its attention the released
``MultiHeadAttentionLayer`` (``released_attention`` of ``test_san_torch``) and its node stream
the lines GT's layer shares (``released_stream`` of ``test_gt_torch``: torch's own batch_norm
and layer_norm, the running statistics updated in training and read in evaluation), the same
dropout masks; outputs and running statistics within FORWARD_RTOL, every gradient within
GRADIENT_RTOL, on drawn batches in every norm."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL
from tests.nn.transformer.test_gt_torch import released_stream  # skips itself without torch
from tests.nn.transformer.test_san import attention_setups
from tests.nn.transformer.test_san_torch import released_attention

torch = pytest.importorskip("torch")

RTOL = FORWARD_RTOL[np.dtype(np.float64)]
GRAD_RTOL = GRADIENT_RTOL[np.dtype(np.float64)]


def released_layer(
    layer: SANLayer, p: dict, h: Any, edge_index: Any, e: Any, real: Any, training: bool,
    buffers: dict, noise: dict,
) -> tuple[Any, Any]:  # fmt: skip
    """``SAN_GT_Layer.forward``, line for line: ``(h, h_attn_out)``."""
    h_in1 = h  # for first residual connection
    attention = {k.removeprefix("attention."): v for k, v in p.items() if "attention." in k}
    # h_attn_out, e_attn_out = self.attention_h(g, h, e); h = h_attn_out.view(-1, out_channels)
    h_attn = released_attention(layer.blocks["attention"], attention, h, edge_index, e, real)
    # F.dropout, O_h, residual, layer_norm1_h / batch_norm1_h, FFN_h_layer1, relu, F.dropout,
    # FFN_h_layer2, residual, layer_norm2_h / batch_norm2_h: GT's node stream, line for line
    stream = layer.blocks["stream"]
    out = released_stream(stream, p, "stream", h_attn, h_in1, training, buffers, noise)
    return out, h_attn  # return h, None


@given(setup=attention_setups(), norm=st.sampled_from(["batch", "layer", "none", "layer+batch"]),
       training=st.booleans())  # fmt: skip
def test_layer_matches_the_released_layer_in_torch(setup: tuple, norm: str, training: bool) -> None:
    attention, attention_params, h, graph, e, real = setup
    if training and "batch" in norm:  # BatchNorm (torch's too) refuses one row in training
        assume(h.shape[0] >= 2)
    layer = SANLayer(
        attention.channels, heads=attention.heads, full_graph=attention.full_graph,
        gamma=attention.gamma, learn_gamma=attention.learn_gamma, bias=attention.bias,
        dropout=0.2, norm=norm,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    params.update({f"attention.{k}": v for k, v in attention_params.items()})
    state = {k: v + 0.5 * rng.random(v.shape) for k, v in layer.init_state().items()}
    out, cache = layer.forward(params, h, graph, e, real, training=training, rng=rng, state=state)
    d_out = rng.standard_normal(out.shape)
    (d_h, d_e), d_params = layer.backward(params, cache, d_out)

    t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    t_h, t_e = torch.tensor(h, requires_grad=True), torch.tensor(e, requires_grad=True)
    mask = torch.ones(graph.num_edges, dtype=torch.bool) if real is None else torch.tensor(real)
    buffers = {k: torch.tensor(v) for k, v in state.items()}
    noise = {k: torch.tensor(v) for k, v in cache.noise.items()}
    ref, ref_attention = released_layer(
        layer, t_params, t_h, torch.tensor(graph.edge_index), t_e, mask, training, buffers, noise
    )
    leaves = [t_h, t_e, *t_params.values()]
    grads = torch.autograd.grad(ref, leaves, torch.tensor(d_out), allow_unused=True)
    names = ["h", "e", *params]
    ours = dict(zip(names, [d_h, d_e, *d_params.values()], strict=True))
    theirs = {
        name: np.zeros_like(ours[name]) if g is None else g.numpy()
        for name, g in zip(names, grads, strict=True)
    }
    assert max_relative_error(out, ref.detach().numpy()) <= RTOL
    assert max_relative_error(cache.attention_out, ref_attention.detach().numpy()) <= RTOL
    errors = relative_errors(ours, theirs)  # on the scale of all gradients (zero by cancellation)
    assert max(errors.values()) <= GRAD_RTOL, errors
    assert list(cache.state) == list(buffers)
    for name, value in buffers.items():  # the running statistics, updated or read
        assert max_relative_error(cache.state[name], value.numpy()) <= RTOL, name
