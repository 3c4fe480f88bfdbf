"""``GraphiTAttention`` against its literal twin: outputs at 1e-12, gradients at 1e-10."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from refimpl.naive.graphit import graphit_attention_backward, graphit_attention_forward
from refimpl.testing.tolerances import GRADIENT_RTOL, TWIN_RTOL
from tests.nn.transformer.test_graphit import case, configs_and_batches


def assert_twin(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


@settings(deadline=None, max_examples=40)
@given(configs_and_batches())
def test_graphit_attention_equals_its_literal_twin(drawn) -> None:
    att, params, h, graph, e, kernel, real, rng = case(*drawn)
    (out, scores), cache = att.forward(params, h, graph, e, kernel, real)
    twin_out, twin_scores = graphit_attention_forward(att, params, h, graph, e, kernel, real)
    assert_twin(out, twin_out, TWIN_RTOL)
    assert_twin(scores, twin_scores, TWIN_RTOL)
    d_out, d_scores = rng.standard_normal(out.shape), rng.standard_normal(scores.shape)
    (d_h, d_e), d_params = att.backward(params, cache, (d_out, d_scores))
    t_h, t_e, t_params = graphit_attention_backward(
        att, params, h, graph, e, kernel, real, d_out, d_scores
    )
    gradient_rtol = GRADIENT_RTOL[np.dtype(np.float64)]
    assert_twin(d_h, t_h, gradient_rtol)
    assert_twin(d_e, t_e, gradient_rtol)
    assert list(d_params) == list(params)
    for name in params:
        assert_twin(d_params[name], t_params[name], gradient_rtol)
