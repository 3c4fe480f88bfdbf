"""GraphTransformerLayer against torch autograd: Eq. 3-13 (and LipschitzNorm Eq. 19 per head and
target) written in torch from the equations, over edges with scatter operations, same masks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from refimpl.nn.transformer.graph_transformer_layer import GraphTransformerLayer
from refimpl.testing import max_relative_error, relative_errors
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.nn.transformer.test_graph_transformer_layer import layer_setups

torch = pytest.importorskip("torch")

RTOL = FORWARD_RTOL[np.dtype(np.float64)]
# gradients: two exact formulations, differing in summation order along a deeper chain; judged
# against the largest gradient entry (relative_errors): some are zero by cancellation (b_k,
# whose shift the softmax ignores) and are pure rounding on both sides
GRAD_RTOL = 1e-10


def scatter_max(values: Any, index: Any, num: int) -> Any:
    """Per-target maximum over edges, (E, H) -> (num, H); empty targets give 0."""
    out = torch.zeros((num, values.shape[1]), dtype=values.dtype)
    expanded = index[:, None].expand(-1, values.shape[1])
    return out.scatter_reduce(0, expanded, values, reduce="amax", include_self=False)


def torch_layer(
    layer: GraphTransformerLayer, p: dict, h: Any, edge_index: Any, e: Any, noise: dict
) -> Any:
    """The layer's output from the equations, every sum over edges an ``index_add``."""
    n, d = h.shape
    heads, c = layer.heads, d // layer.heads
    src, dst = edge_index

    def project(name: str, x: Any) -> Any:
        y = x @ p[f"attention.W_{name}"].T
        if f"attention.b_{name}" in p:
            y = y + p[f"attention.b_{name}"]
        return y.reshape(x.shape[0], heads, c)

    q, k, v = project("q", h), project("k", h), project("v", h)  # (N, H, C)
    k_edge, v_edge = k[src], v[src]  # (E, H, C)
    if e is not None:  # Eq. 12-13 with PyG's shared W^E
        edge_term = project("e", e)
        k_edge, v_edge = k_edge + edge_term, v_edge + edge_term
    raw = (q[dst] * k_edge).sum(-1)  # (E, H)
    if layer.lipschitz_norm == "paper":  # Eq. 19 with Q = q_v, K and V the edges into v
        u = q.norm(dim=-1)[dst]
        a = scatter_max(k_edge.norm(dim=-1), dst, n)[dst]
        w = scatter_max(v_edge.norm(dim=-1), dst, n)[dst]
        denominator = torch.maximum(torch.maximum(u * a, u * w), a * w)
        scores = raw / denominator
    else:
        scores = raw / math.sqrt(c)  # Eq. 6
    # Eq. 6-7: softmax over each target's incoming edges (the shift is a constant)
    shift = scatter_max(scores, dst, n).detach()[dst]
    exp = torch.exp(scores - shift)
    alpha = exp / torch.zeros((n, heads), dtype=h.dtype).index_add(0, dst, exp)[dst]
    if "attn_dropout" in noise:
        alpha = alpha * torch.tensor(noise["attn_dropout"]) / (1 - layer.attn_dropout)
    # Eq. 8: heads, concatenated
    heads_out = torch.zeros((n, heads, c), dtype=h.dtype).index_add(
        0, dst, alpha[..., None] * v_edge
    )

    def drop(key: str, x: Any) -> Any:
        return x * torch.tensor(noise[key]) / (1 - layer.dropout) if key in noise else x

    def norm(name: str, x: Any) -> Any:
        if not layer.layer_norm:
            return x
        weight, bias = p[f"{name}.weight"], p[f"{name}.bias"]
        return torch.nn.functional.layer_norm(x, (d,), weight, bias, eps=1e-5)

    attended = drop("dropout1", heads_out.reshape(n, d) @ p["output.W"].T + p["output.b"])  # Eq. 9
    z = norm("norm1", h + attended)  # Eq. 11
    ffn = torch.relu(z @ p["ffn1.W"].T + p["ffn1.b"]) @ p["ffn2.W"].T + p["ffn2.b"]  # Eq. 10
    return norm("norm2", z + drop("dropout2", ffn))  # Eq. 11


@settings(max_examples=40)
@given(setup=layer_setups())
def test_layer_matches_torch_autograd(setup: tuple) -> None:
    layer, params, h, graph, edge_attr, kwargs = setup
    out, cache = layer.forward(params, h, graph, edge_attr, **kwargs)
    cotangent = np.random.default_rng(1).standard_normal(out.shape)
    d_inputs, d_params = layer.backward(params, cache, cotangent)

    t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    t_h = torch.tensor(h, requires_grad=True)
    t_e = None if edge_attr is None else torch.tensor(edge_attr, requires_grad=True)
    edge_index = torch.tensor(graph.edge_index)
    t_out = torch_layer(layer, t_params, t_h, edge_index, t_e, kwargs.get("noise", {}))
    assert max_relative_error(out, t_out.detach().numpy()) <= RTOL
    wrt = [t_h] + ([t_e] if t_e is not None else []) + list(t_params.values())
    grads = torch.autograd.grad(t_out, wrt, torch.tensor(cotangent), allow_unused=True)
    ours = [d_inputs] if edge_attr is None else list(d_inputs)
    ours += [d_params[k] for k in params]
    names = ["h"] + (["edge_attr"] if edge_attr is not None else []) + list(params)
    expected = {
        name: np.zeros_like(mine) if theirs is None else theirs.numpy()
        for name, mine, theirs in zip(names, ours, grads, strict=True)
    }
    errors = relative_errors(dict(zip(names, ours, strict=True)), expected)
    assert max(errors.values()) <= GRAD_RTOL, errors
