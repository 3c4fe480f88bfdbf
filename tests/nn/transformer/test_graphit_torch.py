"""``GraphiTAttention`` against torch autograd (float64) of the released ``MultiHeadAttentionLayer``
of gnn-lspe/layers/graphit_gt_layer.py, written here with index ops in place of DGL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from tests.autograd import compare_with_autograd
from tests.nn.transformer.test_graphit import case, configs_and_batches

torch = pytest.importorskip("torch")


def released(att, params: dict, h, graph, e, kernel, real) -> dict:
    """The released propagate_attention / propagate_attention_explicit_bias, line by line."""
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h_t, e_t = torch.tensor(h, requires_grad=True), torch.tensor(e, requires_grad=True)
    heads, d = att.heads, att.channels // att.heads
    src, dst = (torch.tensor(row) for row in graph.edge_index)

    def linear(name, x):  # nn.Linear(in, out, bias=use_bias)
        y = x @ t[f"W_{name}"].T
        return (y + t[f"b_{name}"]) if att.bias else y

    view = lambda x: x.view(-1, heads, d)  # noqa: E731
    q_h, k_h, v_h, e_h = (
        view(linear(n, x)) for n, x in (("Q", h_t), ("K", h_t), ("V", h_t), ("E", e_t))
    )
    score = k_h[src] * q_h[dst]  # src_dot_dst('K_h', 'Q_h') on real ids
    if att.full_graph:  # ... and src_dot_dst('K_2h', 'Q_2h') on fake ids
        fake = ~torch.tensor(real)
        q2, k2, e2 = view(linear("Q_2", h_t)), view(linear("K_2", h_t)), view(linear("E_2", e_t))
        score = torch.where(fake[:, None, None], k2[src] * q2[dst], score)
    score = score / np.sqrt(d)  # scaling('score', sqrt(out_dim))
    factor = e_h if not att.full_graph else torch.where(fake[:, None, None], e2, e_h)
    score = score * factor  # imp_exp_attn('score', 'E' / 'E_2')
    if att.explicit_bias:
        k_bias = t["k_bias"].reshape(heads, d, 1)
        e_bias = t["e_bias"].reshape(heads, 1, d)
        v_bias = t["v_bias"].reshape(heads, 1, d)
        score_bias = (torch.transpose(q_h[dst], 0, 1) @ k_bias).transpose(0, 1)  # (P, H, 1)
        score_bias = score_bias / np.sqrt(d)
        bias = (torch.transpose(score_bias, 0, 1) @ e_bias).transpose(0, 1)
        score = score + bias  # imp_exp_attn_bias
        soft = torch.exp(score.sum(-1, keepdim=True).clamp(-5, 5))  # exp('score') ...
        soft = torch.exp(score_bias.sum(-1, keepdim=True).clamp(-5, 5))  # ... overwritten
        message = v_h[src] * soft + (torch.transpose(soft, 0, 1) @ v_bias).transpose(0, 1)
    else:
        soft = torch.exp(score.sum(-1, keepdim=True).clamp(-5, 5))  # exp('score')
        if att.full_graph and att.adaptive_edge_PE:  # adaptive_edge_PE('score_soft', 'k_RW')
            k_rw = torch.tensor(kernel)[:, None].repeat(1, heads).unsqueeze(-1)
            soft = k_rw * soft
        message = v_h[src] * soft  # fn.src_mul_edge('V_h', 'score_soft')
    n = h.shape[0]
    wv = torch.zeros(n, heads, d, dtype=torch.float64).index_add(0, dst, message)
    z = torch.zeros(n, heads, 1, dtype=torch.float64).index_add(0, dst, soft)
    h_out = wv / (z + torch.full_like(z, 1e-6))
    return {
        "h_out": h_out.reshape(n, -1),
        "e_attn": score.reshape(len(e), att.channels),
        "leaves": (t, h_t, e_t),
    }


@settings(deadline=None, max_examples=25)
@given(configs_and_batches())
def test_graphit_attention_matches_the_released_layer(drawn) -> None:
    att, params, h, graph, e, kernel, real, rng = case(*drawn)
    (out, scores), cache = att.forward(params, h, graph, e, kernel, real)
    d_out, d_scores = rng.standard_normal(out.shape), rng.standard_normal(scores.shape)
    (d_h, d_e), d_params = att.backward(params, cache, (d_out, d_scores))
    ours = {"h_out": out, "e_attn": scores, "d_h": d_h, "d_e": d_e}
    ours.update({f"d_{k}": v for k, v in d_params.items()})

    def reference() -> dict:
        got = released(att, params, h, graph, e, kernel, real)
        t, h_t, e_t = got["leaves"]
        loss = (got["h_out"] * torch.tensor(d_out)).sum() + (
            got["e_attn"] * torch.tensor(d_scores)
        ).sum()
        leaves = [h_t, e_t, *t.values()]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        result = {"h_out": got["h_out"], "e_attn": got["e_attn"]}
        names = ["d_h", "d_e", *(f"d_{k}" for k in t)]
        for name, leaf, grad in zip(names, leaves, grads, strict=True):
            result[name] = torch.zeros_like(leaf) if grad is None else grad
        return {k: v.detach().numpy() for k, v in result.items()}

    comparison = compare_with_autograd(ours, reference, outputs=("h_out", "e_attn"))
    assert comparison.passed, comparison.table()
