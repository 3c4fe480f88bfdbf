"""The torch peer of ``bench_nodeformer.py``: one NodeFormer layer written in torch from the
paper's equations, linear in N, with autograd for the backward.

The same layer as :func:`bench_nodeformer.nodeformer_layer` (``refimpl`` ``NodeFormerConv``:
d in and out, one head, ``m`` random features, ``K`` Gumbel samples, temperature ``tau``,
sigmoid relational bias of order 1, one self-loop per node), per head and sample ``s``::

    phi(y)  = exp(y omega^T - |y|^2 / 2) / sqrt(m)                    (Eq. 4)
    Z       = (1/K) sum_s  phi(q / sqrt tau) [sum_u e^{g_us / tau} phi(k_u / sqrt tau) v_u^T]
                         / phi(q / sqrt tau) [sum_u e^{g_us / tau} phi(k_u / sqrt tau)]
                                                                      (Eq. 7 in its linear form)
    Z      += sigmoid(b_rel) A_hat V,  A_hat = D_in^(-1/2) (A + I) D_out^(-1/2)   (Eq. 8, the code)
    out     = Z W_o^T + b_o

The exponents are shifted before ``exp`` (by each query's largest, and by the largest over
all keys of a sample), which cancels in the ratio, as the authors' code and refimpl do; in
float32 the unshifted ``phi`` underflows. ``A_hat`` is a torch sparse matrix built once per
graph (refimpl also caches its graph structures). ``tests/scripts`` holds this peer equal to
refimpl's layer in float64 on the same noise.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["normalised_adjacency", "peer_layer"]


def normalised_adjacency(edge_index: Any, num_nodes: int, dtype: Any) -> Any:
    """``A_hat`` (N, N) sparse: existing self-loops removed, one added per node, edge
    ``u -> v`` at ``[v, u]`` weighing ``1 / sqrt(d_in(v) d_out(u))`` (duplicates add)."""
    src, dst = torch.as_tensor(edge_index[0]), torch.as_tensor(edge_index[1])
    keep = src != dst
    loops = torch.arange(num_nodes)
    src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
    ones = torch.ones(src.shape[0], dtype=dtype)
    d_in = torch.zeros(num_nodes, dtype=dtype).index_add_(0, dst, ones)
    d_out = torch.zeros(num_nodes, dtype=dtype).index_add_(0, src, ones)
    weights = d_in[dst].rsqrt() * d_out[src].rsqrt()
    indices = torch.stack([dst, src])
    shape = (num_nodes, num_nodes)
    return torch.sparse_coo_tensor(indices, weights, shape, check_invariants=True).coalesce()


def _phi_exponent(y: Any, omega: Any) -> Any:
    """Eq. 4's exponent ``y omega^T - |y|^2 / 2``: (N, d) -> (N, m)."""
    return y @ omega.T - 0.5 * (y * y).sum(1, keepdim=True)


def peer_layer(params: dict, x: Any, adjacency: Any, omega: Any, gumbel: Any, tau: float) -> Any:
    """The layer's output (N, C) for one head: ``params`` W_q, b_q, W_k, b_k, W_v, b_v,
    W_o, b_o (refimpl's shapes) and b_rel (1, 1); ``omega (m, C)``, ``gumbel (N, 1, K)``."""
    q = (x @ params["W_q"].T + params["b_q"]) / math.sqrt(tau)  # (N, C)
    k = (x @ params["W_k"].T + params["b_k"]) / math.sqrt(tau)
    v = x @ params["W_v"].T + params["b_v"]
    scale = 1 / math.sqrt(omega.shape[0])
    query_exponent = _phi_exponent(q, omega)  # (N, m)
    phi_q = torch.exp(query_exponent - query_exponent.amax(1, keepdim=True).detach()) * scale
    key_exponent = _phi_exponent(k, omega)  # (N, m)
    z = torch.zeros_like(v)
    samples = gumbel.shape[2]
    for s in range(samples):
        weighted = key_exponent + gumbel[:, 0, s, None] / tau  # (N, m): e^{g/tau} phi(k)
        phi_k = torch.exp(weighted - weighted.max().detach()) * scale
        numerator = phi_q @ (phi_k.T @ v)  # (N, m) @ (m, C)
        denominator = phi_q @ phi_k.sum(0)  # (N,)
        z = z + numerator / denominator[:, None]
    z = z / samples + torch.sigmoid(params["b_rel"][0, 0]) * torch.sparse.mm(adjacency, v)
    return z @ params["W_o"].T + params["b_o"]
