"""LipschitzNorm inside GAT (Sec. 5: norms and maxima taken per head and per target
neighbourhood): a Lipschitz bound for one target's output, derived here, checked on the
library's ``GATConv(lipschitz_norm="paper")`` Jacobians.

The paper states no bound for this form; one follows from its Lemma 1 argument. For a target
``v`` and one head, with ``x_u`` the score's input for the edge ``u -> v`` (v2: ``W_s h_u +
W_t h_v``; v1: ``[W h_u; W h_v]``), ``M = max_k ||x_k||`` over ``v``'s neighbourhood and
scores ``e_u = s(x_u) / (||a|| M)`` (``|s(x)| <= ||a|| ||x||``, ``s`` ``||a||``-Lipschitz for
a LeakyReLU slope <= 1), the output ``out_v = sum_u alpha_u W_s h_u`` has

    D out_v = sum_u alpha_u W_s dh_u + sum_u alpha_u (de_u - mean_alpha de) (W_s h_u - c)

for any centre ``c`` (the weights' changes sum to 0), and ``|de_u| <= 2 max_k ||dx_k|| / M``.
With ``c = -W_t h_v`` (v2: ``W_s h_u - c = x_u``) or ``c`` the weighted mean of ``W h_u``
(v1: ``||W h_u|| <= M``), Cauchy-Schwarz over ``alpha`` bounds the second sum by
``2 max_k ||dx_k||``, so with spectral norms ``||.||``:

    v2:  ||D out_v|| <= 3 ||W_s|| + 2 ||W_t||          (as a map from dH, Frobenius)
    v1:  ||D out_v|| <= (1 + 2 sqrt(2)) ||W||

per head (its rows of the weights), whatever the inputs: no input makes it blow up, not even
neighbourhoods whose ``x_u`` all nearly vanish (``M -> 0``), which the cases include. The
check measures ``||D out_v|| / bound`` per target and head from the layer's own backward.
"""

from __future__ import annotations

import math

import numpy as np

from proofs_check.registry import Context, WorstCase, check
from refimpl.graph import Graph
from refimpl.nn import GATConv

__all__ = ["gat_target_bound", "target_jacobians"]


def gat_target_bound(conv: GATConv, params: dict, head: int) -> float:
    """The bound above for ``conv``'s head ``head``: ``3 ||W_s|| + 2 ||W_t||`` (v2) or
    ``(1 + 2 sqrt2) ||W||`` (v1), spectral norms of the head's rows."""
    rows = slice(head * conv.out_channels, (head + 1) * conv.out_channels)
    if conv.version == "v1":
        return (1 + 2 * math.sqrt(2)) * float(np.linalg.norm(params["W"][rows], 2))
    w_s = float(np.linalg.norm(params["W_s"][rows], 2))
    w_t = w_s if conv.share_weights else float(np.linalg.norm(params["W_t"][rows], 2))
    return 3 * w_s + 2 * w_t


def target_jacobians(conv: GATConv, params: dict, x: np.ndarray, graph: Graph) -> np.ndarray:
    """``||D out_v,h||_2`` for every target ``v`` and head ``h``, ``(N, H)``: the layer's
    backward with a unit cotangent per output entry gives the Jacobian's rows."""
    out, cache = conv.forward(params, x, graph)
    n, heads, channels = x.shape[0], conv.heads, conv.out_channels
    rows = np.zeros((n, heads, channels, x.size))
    for v in range(n):
        for h in range(heads):
            for c in range(channels):
                cotangent = np.zeros_like(out)
                cotangent[v, h * channels + c] = 1.0
                d_x, _ = conv.backward(params, cache, cotangent)
                rows[v, h, c] = d_x.reshape(-1)
    return np.linalg.norm(rows, ord=2, axis=(2, 3))  # spectral norm per (v, h)


def _case(rng: np.random.Generator, collapsed: bool) -> tuple[GATConv, dict, np.ndarray, Graph]:
    """A random layer and graph; ``collapsed``: v2 with every score input ``x_u`` of target 0
    of size ~1e-6 (``M -> 0``), where the normalised scores turn fastest."""
    version = "v2" if collapsed else str(rng.choice(["v1", "v2"]))
    channels = int(rng.integers(1, 4))
    conv = GATConv(channels, channels, heads=int(rng.integers(1, 3)), version=version,
                   share_weights=bool(rng.integers(2)), lipschitz_norm="paper",
                   negative_slope=float(rng.choice([0.2, 0.5, 1.0])), concat=True,
                   add_self_loops=bool(rng.integers(2)), bias=False)  # fmt: skip
    params = {k: rng.standard_normal(v.shape) for k, v in conv.init_params(rng).items()}
    n = int(rng.integers(2, 7))
    edges = rng.integers(0, n, size=(2, int(rng.integers(1, 3 * n + 1))))
    x = rng.standard_normal((n, channels)) * 10.0 ** rng.uniform(-1, 1, size=(n, 1))
    if collapsed:  # one head: W_s h_u = -W_t h_0 + 1e-6 d_u for 0's in-neighbours u
        conv = GATConv(channels, channels, version="v2", lipschitz_norm="paper",
                       add_self_loops=False, bias=False)  # fmt: skip
        params = {k: rng.standard_normal(v.shape) for k, v in conv.init_params(rng).items()}
        sources = np.arange(1, n)
        edges = np.stack([sources, np.zeros_like(sources)])
        target = params["W_t"] @ x[0]
        for u in sources:
            wanted = -target + 1e-6 * rng.standard_normal(channels)
            x[u] = np.linalg.lstsq(params["W_s"], wanted, rcond=None)[0]
    return conv, params, x, Graph(edges, n)


@check(
    id="lipschitz.gat_neighbourhood",
    paper="LipschitzNorm",
    statement="GAT with per-neighbourhood LipschitzNorm (Sec. 5), per target and head: "
    "||D out_v|| <= 3||W_s|| + 2||W_t|| (v2), (1 + 2 sqrt2)||W|| (v1); derived, ratio",
)
def gat_neighbourhood(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    for case in range(max(ctx.cases // 2, 2)):
        conv, params, x, graph = _case(ctx.rng, collapsed=case % 4 == 1)
        norms = target_jacobians(conv, params, x, graph)  # (N, H)
        bounds = np.array([gat_target_bound(conv, params, h) for h in range(conv.heads)])
        worst.add(norms / bounds, 1.0 + 1e-9)  # rounding of the Jacobian's entries
    return worst
