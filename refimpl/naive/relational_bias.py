"""Literal twin of NodeFormer's relational bias (Eq. 8, Alg. 1 line 9, as the authors' code).

Per head ``h``, with values ``V (N, H, C)``, gates ``b_rel (r, H)`` and ``r`` dense
operators ``A_j (N, N)``::

    out_h = sum_{j=1..r} f(b_rel[j-1, h]) A_j V_h,     f = sigmoid | identity    (Eq. 8)

``A_hat = D_in^(-1/2) A D_out^(-1/2)``: edge ``u -> v`` adds ``1 / sqrt(d_in(v) d_out(u))``
to ``A_hat[v, u]`` (degrees count duplicate edges and self-loops; a node with no incoming
edge has a zero row, so its bias is 0). ``powers="paper"``: ``A_j = A_hat^j``;
``"authors"``: ``A_j`` is the normalised operator of the pattern of ``A^(2^(j-1))`` (the
code squares the binarised adjacency: each pair joined by such a walk is one edge). The
graph is taken as given: ``NodeFormerConv`` prepares it (self-loops) before the bias.

The layer (a ``RelationalBias``) is read for ``mode``, ``order`` and ``powers`` only;
``params`` holds ``b_rel`` as ``NodeFormerConv``'s do. Dense matrices and per-edge loops,
NumPy on the host, float64, no shared code with :mod:`refimpl.nn.nodeformer.relational_bias`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.graph import Graph

__all__ = [
    "RelationalBiasTwinCache",
    "normalized_adjacency",
    "relational_bias_backward",
    "relational_bias_forward",
    "relational_operators",
]


def normalized_adjacency(edges: list[tuple[int, int]], n: int) -> np.ndarray:
    """``A_hat (N, N)``, ``A_hat[v, u] = sum over edges u -> v of 1 / sqrt(d_in(v) d_out(u))``."""
    d_in, d_out = np.zeros(n), np.zeros(n)
    for u, v in edges:
        d_out[u] += 1
        d_in[v] += 1
    a_hat = np.zeros((n, n))
    for u, v in edges:
        a_hat[v, u] += 1.0 / math.sqrt(d_in[v] * d_out[u])
    return a_hat


def relational_operators(layer: Any, graph: Graph) -> list[np.ndarray]:
    """``[A_1, ..., A_r]``, each ``(N, N)``, as ``layer.powers`` says (module docstring)."""
    n = graph.num_nodes
    edges = [(int(u), int(v)) for u, v in np.asarray(graph.edge_index).T]
    a_hat = normalized_adjacency(edges, n)
    if layer.powers == "paper":
        return [np.linalg.matrix_power(a_hat, j) for j in range(1, layer.order + 1)]
    operators = [a_hat]
    reach = np.zeros((n, n), dtype=bool)  # reach[u, v]: an edge (then a walk) u -> v
    for u, v in edges:
        reach[u, v] = True
    for _ in range(layer.order - 1):
        reach = (reach.astype(np.int64) @ reach.astype(np.int64)) > 0  # walks twice as long
        pairs = [(u, v) for u in range(n) for v in range(n) if reach[u, v]]
        operators.append(normalized_adjacency(pairs, n))
    return operators


class RelationalBiasTwinCache(NamedTuple):
    """What :func:`relational_bias_backward` reads."""

    v: np.ndarray  # (N, H, C) values
    f: np.ndarray  # (r, H) gates f(b_rel)
    operators: np.ndarray  # (r, N, N) A_1 .. A_r


def relational_bias_forward(
    layer: Any, params: dict, v: np.ndarray, graph: Graph
) -> tuple[np.ndarray, RelationalBiasTwinCache]:
    """``sum_j f(b_rel[j]) A_j V``: ``v (N, H, C) -> (N, H, C)``, and the cache."""
    b_rel = params["b_rel"]  # (r, H)
    # F1 gates f(b_rel): the sigmoid 1 / (1 + e^{-b}) or b itself  (r, H)
    f = 1.0 / (1.0 + np.exp(-b_rel)) if layer.mode == "sigmoid" else b_rel
    # F2 the operators A_1 .. A_r (no parameters)  (r, N, N)
    operators = np.stack(relational_operators(layer, graph))
    # F3 out[v, h] = sum_j f[j, h] sum_u A_j[v, u] V[u, h]  (N, H, C)
    out = np.einsum("jh,jvu,uhc->vhc", f, operators, v)
    return out, RelationalBiasTwinCache(v, f, operators)


def relational_bias_backward(
    layer: Any, params: dict, cache: RelationalBiasTwinCache, d_out: np.ndarray
) -> tuple[np.ndarray, dict]:
    """Gradients of ``<d_out, out>``: ``(d_v (N, H, C), {"b_rel": (r, H)})``."""
    v, f, operators = cache
    # B3 (of F3) d_V[u, h] = sum_j f[j, h] sum_v A_j[v, u] d_out[v, h]  (N, H, C);
    #    d_f[j, h] = sum_{v, u} d_out[v, h] . A_j[v, u] V[u, h]  (r, H)
    d_v = np.einsum("jh,jvu,vhc->uhc", f, operators, d_out)
    d_f = np.einsum("vhc,jvu,uhc->jh", d_out, operators, v)
    # B1 (of F1) the sigmoid's derivative f (1 - f), or 1
    d_b_rel = d_f * f * (1.0 - f) if layer.mode == "sigmoid" else d_f
    return d_v, {"b_rel": d_b_rel}
