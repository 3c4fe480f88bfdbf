"""GTAttention and GTLayer against torch autograd: the released ``graph_transformer_edge_layer.py``
(``MultiHeadAttentionLayer``, ``GraphTransformerLayer``) written here in dense torch, each DGL
step an edge gather or an ``index_add`` over targets, torch's own BatchNorm1d / LayerNorm
functions, the same dropout masks; and the authors' two constants (the clamp, the 1e-6) each
broken to see the parity fail."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given

from refimpl import Graph
from refimpl.nn.transformer.gt_attention import GTAttention
from refimpl.nn.transformer.gt_layer import GTLayer
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL
from tests.nn.transformer.test_gt_attention import attention_setups

torch = pytest.importorskip("torch")

RTOL = FORWARD_RTOL[np.dtype(np.float64)]
GRAD_RTOL = GRADIENT_RTOL[np.dtype(np.float64)]


def released_attention(
    attention: Any, p: dict, h: Any, edge_index: Any, e: Any, clamp: float = 5.0,
    eps: float = 1e-6,
) -> tuple[Any, Any]:  # fmt: skip
    """``MultiHeadAttentionLayer.forward`` with ``propagate_attention`` or its explicit-bias
    twin, step by step; ``clamp`` and ``eps`` are the authors' constants, exposed to break."""
    n, heads = h.shape[0], attention.heads
    d = attention.out_channels // heads
    src, dst = edge_index

    def linear(name: str, x: Any) -> Any:  # self.Q / K / V / proj_e
        y = x @ p[f"W_{name}"].T
        return y + p[f"b_{name}"] if f"b_{name}" in p else y

    Q_h, K_h, V_h = (linear(k, h).view(n, heads, d) for k in "qkv")
    edge_feat = e is not None
    proj_e = linear("e", e).view(-1, heads, d) if edge_feat else torch.ones(src.shape[0], heads, d)
    score = K_h[src] * Q_h[dst]  # src_dot_dst
    if attention.explicit_bias:  # src_dot_dst_bias
        score_bias = (Q_h[dst].transpose(0, 1) @ p["k_bias"]).transpose(0, 1)  # (E, H, 1)
        score_bias = score_bias / np.sqrt(d)  # scaling('score_bias')
    score = score / np.sqrt(d)  # scaling
    if attention.explicit_bias:  # imp_exp_attn_bias
        bias = (score_bias.transpose(0, 1) @ p["e_bias"]).transpose(0, 1)
        score = score * proj_e + bias
    elif edge_feat:  # imp_exp_attn
        score = score * proj_e
    else:
        score = torch.ones_like(score * proj_e)
    e_out = score if edge_feat else None  # out_edge_features
    if edge_feat:  # exp
        score = torch.exp(score.sum(-1, keepdim=True).clamp(-clamp, clamp))
    else:
        score = torch.exp(torch.ones_like(score).sum(-1, keepdim=True).clamp(-clamp, clamp))
    V_msg = V_h[src] * score  # fn.src_mul_edge / src_mul_edge_bias
    if attention.explicit_bias:
        V_msg = V_msg + (score.transpose(0, 1) @ p["v_bias"]).transpose(0, 1)
    wV = torch.zeros(n, heads, d, dtype=h.dtype).index_add(0, dst, V_msg)  # fn.sum
    z = torch.zeros(n, heads, 1, dtype=h.dtype).index_add(0, dst, score)
    h_out = wV / (z + torch.full_like(z, eps))
    return h_out.reshape(n, heads * d), (None if e_out is None else e_out.reshape(-1, heads * d))


def released_stream(stream: Any, p: dict, prefix: str, a: Any, x: Any, training: bool,
                    buffers: dict, noise: dict) -> Any:  # fmt: skip
    """One stream of ``GraphTransformerLayer.forward`` (``_h`` or ``_e``), torch's norms
    updating ``buffers`` in place as the modules' running statistics."""
    d = stream.channels

    def drop(key: str, v: Any) -> Any:
        return v * noise[key] / (1 - stream.dropout) if key in noise else v

    def norms(step: int, v: Any) -> Any:
        for kind in ("layer", "batch"):
            if kind not in stream.norm:
                continue
            name = f"norm{step}" if "+" not in stream.norm else f"{kind}_norm{step}"
            w, b = p[f"{prefix}.{name}.weight"], p[f"{prefix}.{name}.bias"]
            if kind == "layer":
                v = torch.nn.functional.layer_norm(v, (d,), w, b, 1e-5)
            elif v.shape[0]:
                mean = buffers[f"{prefix}.{name}.running_mean"]
                var = buffers[f"{prefix}.{name}.running_var"]
                v = torch.nn.functional.batch_norm(v, mean, var, w, b, training, 0.1, 1e-5)
        return v

    v = drop("dropout1", a)  # F.dropout
    v = v @ p[f"{prefix}.output.W"].T + p[f"{prefix}.output.b"]  # O_h
    if stream.residual:
        v = x + v
    v = norms(1, v)
    v_in2 = v
    v = torch.relu(v @ p[f"{prefix}.ffn1.W"].T + p[f"{prefix}.ffn1.b"])  # FFN_h_layer1
    v = drop("dropout2", v)
    v = v @ p[f"{prefix}.ffn2.W"].T + p[f"{prefix}.ffn2.b"]  # FFN_h_layer2
    if stream.residual:
        v = v_in2 + v
    return norms(2, v)


def leaves(values: dict) -> dict:
    return {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}


def attention_parity(setup: tuple, **constants: float) -> dict[str, float]:
    """The largest relative errors of outputs and gradients, ours against the released code."""
    attention, params, h, graph, e = setup
    (h_out, e_out), cache = attention.forward(params, h, graph, e)
    rng = np.random.default_rng(1)
    g_h = rng.standard_normal(h_out.shape)
    g_e = None if e_out is None else rng.standard_normal(e_out.shape)
    (d_h, d_e), d_params = attention.backward(params, cache, (g_h, g_e))
    tp, th = leaves(params), torch.tensor(h, requires_grad=True)
    te = None if e is None else torch.tensor(e, requires_grad=True)
    ref_h, ref_e = released_attention(
        attention, tp, th, torch.tensor(np.array(graph.edge_index)), te, **constants
    )
    loss = (ref_h * torch.tensor(g_h)).sum()
    if ref_e is not None:
        loss = loss + (ref_e * torch.tensor(g_e)).sum()
    inputs = [th, *tp.values()] + ([te] if te is not None else [])
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    ours = {"h": d_h, **d_params} | ({"e": d_e} if e is not None else {})
    names = ["h", *tp] + (["e"] if e is not None else [])
    theirs = {n: (g if g is not None else torch.zeros_like(x)).detach().numpy()
              for n, g, x in zip(names, grads, inputs, strict=True)}  # fmt: skip
    errors = {"h_out": max_relative_error(h_out, ref_h.detach().numpy())}
    if e_out is not None:
        errors["e_out"] = max_relative_error(e_out, ref_e.detach().numpy())
    errors["gradients"] = max(relative_errors(ours, theirs).values())
    return errors


@given(setup=attention_setups())
def test_attention_matches_the_released_code(setup: tuple) -> None:
    errors = attention_parity(setup)
    assert errors["gradients"] <= GRAD_RTOL, errors
    assert max(v for k, v in errors.items() if k != "gradients") <= RTOL, errors


def constants_case() -> tuple:
    """Scores beyond the clamp and targets with one incoming edge of small weight: both
    constants change the result far beyond the tolerances."""
    rng = np.random.default_rng(4)
    attention = GTAttention(3, 4, heads=2, edge_dim=3, explicit_bias=True)
    params = {k: 3 * v for k, v in attention.init_params(rng).items()}
    # no isolated node: eps = 0 would make its output 0 / 0
    graph = Graph(np.array([[0, 1, 2, 3, 3, 0], [1, 2, 2, 0, 3, 3]]), 4)
    h, e = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    return attention, params, h, graph, e


def test_parity_fails_without_the_clamp_or_the_eps() -> None:
    """The parity above is not blind to the authors' constants: dropping either one (clamp at
    infinity, eps 0) moves the released output far beyond the tolerance."""
    setup = constants_case()
    assert max(attention_parity(setup).values()) <= GRAD_RTOL
    assert attention_parity(setup, clamp=math.inf)["h_out"] > 1e-3
    assert attention_parity(setup, eps=0.0)["h_out"] > 1e-6


@pytest.mark.parametrize("norm", ["batch", "layer+batch"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("explicit_bias", [False, True])
def test_layer_matches_the_released_code(norm: str, training: bool, explicit_bias: bool) -> None:
    """The whole layer with BatchNorm in training (batch statistics, running statistics
    updated) and evaluation (running statistics read), dropout masks shared; a graph with a
    self-loop, a duplicate edge and an isolated node."""
    rng = np.random.default_rng(7)
    layer = GTLayer(4, heads=2, dropout=0.2, norm=norm, explicit_bias=explicit_bias)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    state = {k: v + 0.5 * rng.random(v.shape) for k, v in layer.init_state().items()}
    graph = Graph(np.array([[0, 1, 1, 2, 2, 3, 0], [1, 2, 2, 0, 2, 1, 3]]), 5)
    h, e = rng.standard_normal((5, 4)), rng.standard_normal((7, 4))
    (h_out, e_out), cache = layer.forward(
        params, h, graph, e, training=training, rng=rng, state=state
    )
    g_h, g_e = rng.standard_normal(h_out.shape), rng.standard_normal(e_out.shape)
    (d_h, d_e), d_params = layer.backward(params, cache, (g_h, g_e))

    tp, th, te = (
        leaves(params),
        torch.tensor(h, requires_grad=True),
        torch.tensor(e, requires_grad=True),
    )
    buffers = {k: torch.tensor(v) for k, v in state.items()}
    noise = {k: torch.tensor(v) for k, v in cache.noise.items()}
    sub = {k.removeprefix("attention."): v for k, v in tp.items() if k.startswith("attention.")}
    a_h, a_e = released_attention(layer.blocks["attention"], sub, th,
                                  torch.tensor(np.array(graph.edge_index)), te)  # fmt: skip
    stream = layer.blocks["node"]
    masks = {s: {k[5:]: v for k, v in noise.items() if k.startswith(s)} for s in ("node", "edge")}
    ref_h = released_stream(stream, tp, "node", a_h, th, training, buffers, masks["node"])
    ref_e = released_stream(stream, tp, "edge", a_e, te, training, buffers, masks["edge"])
    loss = (ref_h * torch.tensor(g_h)).sum() + (ref_e * torch.tensor(g_e)).sum()
    grads = torch.autograd.grad(loss, [th, te, *tp.values()])
    theirs = dict(zip(["h", "e", *tp], (g.numpy() for g in grads), strict=True))
    assert max_relative_error(h_out, ref_h.detach().numpy()) <= RTOL
    assert max_relative_error(e_out, ref_e.detach().numpy()) <= RTOL
    np.testing.assert_allclose(cache.attention_h, a_h.detach().numpy(), rtol=RTOL, atol=0)
    errors = relative_errors({"h": d_h, "e": d_e, **d_params}, theirs)
    assert max(errors.values()) <= GRAD_RTOL, errors
    for name, value in buffers.items():  # the running statistics, updated or read
        assert max_relative_error(cache.state[name], value.numpy()) <= RTOL, name
