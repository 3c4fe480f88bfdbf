"""An overflow inside a layer is refused in one line (refimpl.nn.overflow), never returned as
NaN, infinity or a silently wrong finite value, on every public layer that can overflow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from refimpl import Graph
from refimpl.nn import (
    Attention,
    GATConv,
    GraphTransformerLayer,
    LayerNorm,
    MultiHeadAttention,
    NodeFormerConv,
    PairNorm,
    TransformerAttention,
    TransformerConv,
)
from refimpl.validation import NonFiniteError

# the layers compute in the dtype and overflow there; NumPy's warnings say so before the error
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

GRAPH = Graph([[0, 1, 2, 3, 4, 5, 6, 1, 3], [1, 2, 3, 4, 5, 6, 0, 0, 5]], 7)
FLOAT64_FIX = r"overflowed float64 though every input was finite; scale the inputs"


def _x(shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _backward(layer: Any, params: dict, *inputs: Any, scale: float = 1.0, **kwargs: Any) -> Any:
    """Forward, then backward with a random cotangent of the output's shape and dtype, times
    ``scale``."""
    out, cache = layer.forward(params, *inputs, **kwargs)
    return layer.backward(params, cache, _x(out.shape, out.dtype) * scale)


def test_transformer_conv_overflow_is_refused_not_returned_as_nan() -> None:
    # Regression (issue 33, item 7): features times 1e200 made TransformerConv's scores
    # infinite, and its output and gradients NaN, returned without a word (GATConv already
    # refused them); no test fed a TransformerConv values near the dtype's end.
    conv = TransformerConv(4, 3, heads=2)
    params = conv.init_params(np.random.default_rng(1))
    with pytest.raises(
        NonFiniteError, match=rf"^TransformerConv\.forward: its output {FLOAT64_FIX}"
    ):
        conv.forward(params, _x((7, 4)) * 1e200, GRAPH)
    params32 = conv.init_params(np.random.default_rng(1), dtype=np.float32)
    with pytest.raises(NonFiniteError, match=r"overflowed float32 .*; run in float64"):
        conv.forward(params32, _x((7, 4), np.float32) * np.float32(1e20), GRAPH)


@pytest.mark.parametrize("lipschitz_norm", [None, "paper"])
def test_transformer_conv_gradient_overflow_is_refused_not_returned_as_nan(
    lipschitz_norm: str | None,
) -> None:
    # Regression (issue 33, item 7): TransformerConv's backward checked nothing, so gradients
    # that overflowed (here the weights' d_W = d_q^T x, features times 1e100 and a cotangent
    # times 1e250, each finite) came back infinite or NaN without a word.
    conv = TransformerConv(4, 3, heads=2, lipschitz_norm=lipschitz_norm)
    params = conv.init_params(np.random.default_rng(1))
    with pytest.raises(
        NonFiniteError, match=rf"^TransformerConv\.backward: a gradient {FLOAT64_FIX}"
    ):
        _backward(conv, params, _x((7, 4)) * 1e100, GRAPH, scale=1e250)


def test_graph_transformer_layer_gradient_overflow_is_refused_not_returned_as_nan() -> None:
    # Regression (issue 33, item 7): the layer's gradients overflowed (without LayerNorm,
    # features times 1e100 and a cotangent times 1e250) and came back as NaN unreported.
    layer = GraphTransformerLayer(4, heads=2, layer_norm=False, lipschitz_norm="paper")
    params = layer.init_params(np.random.default_rng(1))
    with pytest.raises(NonFiniteError, match=r"^GraphTransformerLayer\.backward: a gradient"):
        _backward(layer, params, _x((7, 4)) * 1e100, GRAPH, scale=1e250)


def test_nodeformer_conv_gradient_overflow_is_refused_not_returned_as_nan() -> None:
    # Regression: the probe of every public layer (issue 33, item 7) found NodeFormerConv's
    # parameter gradients NaN for features times 1e150, unreported.
    conv = NodeFormerConv(4, 3, heads=2)
    params = conv.init_params(np.random.default_rng(1))
    with pytest.raises(NonFiniteError, match=r"^NodeFormerConv\.backward: a gradient"):
        _backward(conv, params, _x((7, 4)) * 1e150, GRAPH, rng=np.random.default_rng(2))


@pytest.mark.parametrize(
    ("norm", "params", "statistic"),
    [
        (LayerNorm(4, "node"), {"weight": np.ones(4), "bias": np.zeros(4)}, "the variance of x"),
        (LayerNorm(4, "graph", affine=False), {}, "the variance of x"),
        (PairNorm("PN"), {}, "the squared norms of x"),
        (PairNorm("PN-SCS"), {}, "the squared norms of x"),
    ],
)
def test_norms_refuse_an_overflowed_statistic_that_zeroed_their_output(
    norm: Any, params: dict, statistic: str
) -> None:
    # Regression: the variance (LayerNorm) or the squared norms (PairNorm) of x times 1e200
    # overflowed to infinity, so x / sqrt(inf) = 0 and the output was the bias (or zero):
    # finite and wrong, where both norms are scale-invariant. The reliability harness asks only
    # finiteness of huge inputs, so it passed them too.
    x = _x((5, 4))
    name = type(norm).__name__
    with pytest.raises(NonFiniteError, match=rf"^{name}\.forward: {statistic} {FLOAT64_FIX}"):
        norm.forward(params, x * 1e200)


def test_layer_norm_gradient_overflow_is_refused_not_returned_as_nan() -> None:
    # Regression: the bias gradient sums the cotangent over the rows, 20 times 1e307 here:
    # infinite from finite inputs, returned as it was.
    norm = LayerNorm(4, "node")
    params = norm.init_params(None)
    out, cache = norm.forward(params, _x((20, 4)))
    with pytest.raises(NonFiniteError, match=rf"^LayerNorm\.backward: a gradient {FLOAT64_FIX}"):
        norm.backward(params, cache, np.full(out.shape, 1e307))


@pytest.mark.parametrize("normalization", ["linear", "lipschitz"])
def test_lipschitz_norm_refuses_a_denominator_that_overflowed_to_infinity(
    normalization: str,
) -> None:
    # Regression: LipschitzNorm's denominators square their inputs (||X^T||_(inf,2)), so for X
    # times 1e160 they were infinite while the raw scores were not: every score became 0 and
    # the attention uniform, a finite wrong output (Att(cX) must be c Att(X)).
    attention = Attention(4, 3, normalization)
    params = attention.init_params(np.random.default_rng(1))
    with pytest.raises(
        NonFiniteError, match=rf"^LipschitzNorm: the score denominator {FLOAT64_FIX}"
    ):
        attention.forward(params, _x((4, 7)) * 1e160)


@pytest.mark.parametrize("conv", [
    TransformerConv(4, 3, heads=2, lipschitz_norm="paper"),
    GATConv(4, 3, heads=2, version="v2", lipschitz_norm="paper"),
])  # fmt: skip
def test_neighbourhood_lipschitz_norm_refuses_an_overflowed_denominator(conv: Any) -> None:
    # Regression: the per-neighbourhood denominators (TransformerConv's D_v = max{ua, uw, aw},
    # GATConv's ||a|| max ||x_uv||) hold norms of vectors times 1e160, infinite while the raw
    # scores (their products with vectors times 1e-160) are finite: the scores became 0.
    params = conv.init_params(np.random.default_rng(1))
    big, small = ("W_q", "W_k") if isinstance(conv, TransformerConv) else ("W_s", "att")
    params[big], params[small] = params[big] * 1e160, params[small] * 1e-160
    with pytest.raises(NonFiniteError, match=r"^LipschitzNorm: the score denominator overflowed"):
        conv.forward(params, _x((7, 4)), GRAPH)


@pytest.mark.parametrize("layer", [
    TransformerAttention(4),
    TransformerAttention(4, "lipschitz"),
    MultiHeadAttention(12, 4, 3, heads=2, normalization="lipschitz"),
])  # fmt: skip
def test_dense_attention_overflow_is_refused_not_returned_as_nan(layer: Any) -> None:
    # Regression: the dense attention blocks of the LipschitzNorm paper returned NaN outputs
    # and gradients for inputs times 1e200 (queries times keys overflow), unreported.
    params = layer.init_params(np.random.default_rng(1))
    with pytest.raises(NonFiniteError, match=r"overflowed float64 though every input was"):
        _backward(layer, params, _x((12, 7)) * 1e200)
