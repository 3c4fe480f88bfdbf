"""SANAttention against its literal twin (refimpl.naive.san: pair by pair), output and every
gradient, and LearnedLaplacianPE's output and every gradient against its token-by-token twin,
within TWIN_RTOL on drawn batches."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from refimpl.naive.san import (
    lpe_backward,
    lpe_forward,
    san_attention_backward,
    san_attention_forward,
)
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.tolerances import TWIN_RTOL
from tests.nn.transformer.test_san import attention_setups, lpe_setups


@given(setup=attention_setups())
def test_attention_matches_the_twin(setup: tuple) -> None:
    attention, params, h, graph, e, real = setup
    out, cache = attention.forward(params, h, graph, e, real)
    d_out = np.random.default_rng(2).standard_normal(out.shape)
    (d_h, d_e), d_params = attention.backward(params, cache, d_out)
    edge_index = graph.edge_index
    twin_out, twin_scores = san_attention_forward(attention, params, h, edge_index, e, real)
    (twin_h, twin_e), twin_params = san_attention_backward(
        attention, params, h, edge_index, e, real, d_out
    )
    assert max_relative_error(out, twin_out) <= TWIN_RTOL
    assert max_relative_error(cache.scores, twin_scores) <= TWIN_RTOL
    assert list(d_params) == list(twin_params) == list(params)
    # judged on the scale of all gradients: a parameter set a batch never reads (the non-edge
    # maps when every pair is real) is exactly zero on both sides, and a gradient zero by
    # cancellation would compare noise with noise
    ours = {"d_h": d_h, "d_e": d_e, **{f"d_{k}": v for k, v in d_params.items()}}
    theirs = {"d_h": twin_h, "d_e": twin_e, **{f"d_{k}": v for k, v in twin_params.items()}}
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= TWIN_RTOL, errors


@given(setup=lpe_setups())
def test_lpe_matches_the_twin(setup: tuple) -> None:
    lpe, params, vecs, vals, valid, kwargs = setup
    out, cache = lpe.forward(params, vecs, vals, valid, **kwargs)
    twin = lpe_forward(lpe, params, vecs, vals, valid, kwargs.get("noise"))
    assert max_relative_error(out, twin) <= TWIN_RTOL
    d_out = np.random.default_rng(2).standard_normal(out.shape)
    (d_vecs, d_vals), d_params = lpe.backward(params, cache, d_out)
    (twin_vecs, twin_vals), twin_params = lpe_backward(
        lpe, params, vecs, vals, valid, d_out, kwargs.get("noise")
    )
    assert list(twin_params) == list(d_params) == list(params)
    # on the scale of all gradients: a one-channel LayerNorm centres to 0 and zeroes what
    # feeds it, exactly or up to rounding on either side
    ours = {"d_eigvecs": d_vecs, "d_eigvals": d_vals, **d_params}
    theirs = {"d_eigvecs": twin_vecs, "d_eigvals": twin_vals, **twin_params}
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= TWIN_RTOL, errors
