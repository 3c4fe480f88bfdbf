"""GTAttention against its literal twin (refimpl.naive.gt_attention): both outputs and every
gradient (h, e, each parameter) within TWIN_RTOL, with random cotangents, in every
configuration (edge features or the released ones, qkv biases, explicit bias) on drawn graphs
(isolated nodes, duplicate edges, self-loops, empty edge sets)."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from refimpl.naive.gt_attention import gt_attention_backward, gt_attention_forward
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.tolerances import TWIN_RTOL
from tests.nn.transformer.test_gt_attention import attention_setups


@given(setup=attention_setups(max_nodes=7))
def test_attention_equals_its_literal_twin(setup: tuple) -> None:
    attention, params, h, graph, e = setup
    (h_out, e_out), cache = attention.forward(params, h, graph, e)
    twin_h, twin_e, steps = gt_attention_forward(attention, params, h, graph.edge_index, e)
    assert max_relative_error(h_out, twin_h) <= TWIN_RTOL
    assert (e_out is None) == (twin_e is None)
    if e_out is not None:
        assert max_relative_error(e_out, twin_e) <= TWIN_RTOL
    rng = np.random.default_rng(0)
    d_h_out = rng.standard_normal(h_out.shape)
    d_e_out = None if e_out is None else rng.standard_normal(e_out.shape)
    (d_h, d_e), d_params = attention.backward(params, cache, (d_h_out, d_e_out))
    twin_d_h, twin_d_e, twin_d_params = gt_attention_backward(
        attention, params, h, e, steps, d_h_out, d_e_out
    )
    ours = {"h": d_h, **d_params}
    twin = {"h": twin_d_h, **twin_d_params}
    if e is not None:
        ours["e"], twin["e"] = d_e, twin_d_e
    errors = relative_errors(ours, twin)
    assert max(errors.values()) <= TWIN_RTOL, errors
