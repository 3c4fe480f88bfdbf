"""GATConv against torch autograd on a straightforward torch formulation (skipped without torch).

The torch side is written from the equations in a few lines with ``index_add``
and ``scatter_reduce``; autograd differentiates it, so agreement checks our
hand-written backward against an independent derivative, not only against
finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from tests.autograd import compare_with_autograd
from tests.nn.gat.test_conv import setups

torch = pytest.importorskip("torch")


def torch_gat(
    conv: object, params: dict, x: object, edge_index: np.ndarray, keep: object
) -> object:
    """GATConv forward in torch, PyG semantics, for autograd to differentiate."""
    n, heads, channels = x.shape[0], conv.heads, conv.out_channels
    src, dst = (torch.tensor(row) for row in edge_index)
    if conv.add_self_loops:
        not_loop = src != dst
        loops = torch.arange(n)
        src, dst = torch.cat([src[not_loop], loops]), torch.cat([dst[not_loop], loops])
    if conv.version == "v1":
        h_src = h_dst = (x @ params["W"].T).view(n, heads, channels)
        pre = (h_src * params["att_src"]).sum(-1)[src] + (h_dst * params["att_dst"]).sum(-1)[dst]
        if conv.lipschitz_norm is not None:
            pre = pre / lipschitz_denominator_v1(conv, params, h_src, src, dst)
        scores = torch.nn.functional.leaky_relu(pre, conv.negative_slope)
    else:
        h_src = (x @ params["W_s"].T).view(n, heads, channels)
        w_t = params["W_s"] if conv.share_weights else params["W_t"]
        h_dst = (x @ w_t.T).view(n, heads, channels)
        hidden = torch.nn.functional.leaky_relu(h_src[src] + h_dst[dst], conv.negative_slope)
        scores = (hidden * params["att"]).sum(-1)
        if conv.lipschitz_norm is not None:
            # LipschitzNorm Sec. 5: ||a_h|| * max over N(v) of ||W_s h_u + W_t h_v||
            radius = neighbourhood_max((h_src[src] + h_dst[dst]).norm(dim=-1), dst, n)[dst]
            scores = scores / (params["att"].norm(dim=-1) * radius)
    top = (
        torch.full((n, heads), -torch.inf, dtype=x.dtype)
        .scatter_reduce(0, dst[:, None].expand(-1, heads), scores, reduce="amax")
        .detach()
    )
    weights = torch.exp(scores - top[dst])
    alpha = weights / torch.zeros(n, heads, dtype=x.dtype).index_add(0, dst, weights)[dst]
    if keep is not None:
        alpha = alpha * keep / (1 - conv.dropout)
    out = torch.zeros(n, heads, channels, dtype=x.dtype).index_add(
        0, dst, h_src[src] * alpha[..., None]
    )
    out = out.reshape(n, heads * channels) if conv.concat else out.mean(1)
    return out + params["bias"] if conv.bias else out


def neighbourhood_max(values: object, dst: object, n: int) -> object:
    """``(N, H)`` maximum of the ``(E, H)`` values over each target's incoming edges."""
    heads = values.shape[1]
    return torch.full((n, heads), -torch.inf, dtype=values.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, heads), values, reduce="amax"
    )


def lipschitz_denominator_v1(
    conv: object, params: dict, h: object, src: object, dst: object
) -> object:
    """GATv1 LipschitzNorm denominators (E, H), written from the formulas in torch."""
    squared = (h * h).sum(-1)  # (N, H)
    largest = neighbourhood_max(squared[src], dst, h.shape[0])[dst]  # (E, H)
    att_norm = torch.cat([params["att_src"], params["att_dst"]], dim=-1).norm(dim=-1)  # (H,)
    if conv.lipschitz_norm == "paper":
        return att_norm * torch.sqrt(largest + squared[dst])
    # the released code (github.com/gdasoulas/LipschitzNorm), per head
    return 4 * att_norm * torch.sqrt(largest + squared[src]) + 1e-12


@given(setup=setups())
def test_forward_and_gradients_match_torch_autograd(setup: tuple) -> None:
    assert_agrees_with_autograd(setup)


def assert_agrees_with_autograd(setup: tuple) -> None:
    """Output and input and parameter gradients equal autograd's on ``torch_gat``, each entry
    within the rounding autograd shows there (``tests.autograd``)."""
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    keep = kwargs.get("attn_dropout_mask")

    def reference() -> dict:
        t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        t_x = torch.tensor(x, requires_grad=True)
        t_keep = None if keep is None else torch.tensor(keep, dtype=torch.float64)
        t_out = torch_gat(conv, t_params, t_x, graph.edge_index, t_keep)
        t_out.backward(torch.tensor(d_out))
        return {"out": t_out, "x": t_x.grad, **{k: v.grad for k, v in t_params.items()}}

    ours = {"out": out, "x": d_x, **d_params}
    comparison = compare_with_autograd(ours, reference, outputs=["out"])
    assert comparison.passed, comparison.table()
