"""NodeFormer's edge-level loss for one layer (Eq. 10) from ``pi_uv`` of Eq. 12, with its backward.

For the edges ``u -> v`` of ``conv.prepare_graph(graph)`` (the graph the layer's
relational bias uses: self-loops included by default, as the authors' ``adjs[0]``), the
query is the target ``v`` and the key the source ``u`` (PyG's direction, as the
relational bias and the authors' ``kernelized_softmax``)::

    pi_e,h = phi(y_v)^T phi(y'_u) / phi(y_v)^T sum_w phi(y'_w)                      (Eq. 12)
    L_e    = -1/(Z H) sum_h sum_{e = (u -> v)} log(pi_e,h) / d_in(v)                 (Eq. 10)

per head ``h``, with ``phi`` of Eq. 4 on the layer's ``omega`` and no Gumbel noise
(Eq. 12), ``y = t s q``, ``y' = t s k`` (``s`` the layer's qk factor) and:

| ``convention`` | ``t`` (what ``pi`` estimates) | ``Z`` |
| --- | --- | --- |
| ``"paper"`` | 1: ``softmax_u(s^2 q_v.k_u)`` | ``N`` (Eq. 10's ``1 / N``) |
| ``"authors"`` | ``1/sqrt(tau)``: the attention without noise (Eq. 5) | ``E``: the code's mean |

Eq. 12 (no ``tau``) is the categorical distribution the Gumbel-Softmax samples from
(Thm 2, Sec. 3.1), the code queries ``query_prime`` / ``key_prime`` of the
attention, which carry ``1/sqrt(tau)``. ``d_in(v)`` counts duplicate edges and the
self-loop, so ``sum_e 1/d_in(v) = N`` when every node has an incoming edge. The paper
has no heads in Eq. 10; the code (and both conventions) average over them. ``E = 0``
gives ``L_e = 0`` (an empty sum; the code's mean would be NaN). The model-level
``L_e`` is the mean over layers and the objective ``L_s + lambda L_e`` (Sec. 3.4):
the caller's job (the code: ``loss -= lamda * mean(link_loss_)``, its ``link_loss``
being ``-L_e``).

Computation, in the log domain: with ``a_i(y) = w_i^T y - ||y||^2 / 2`` (Eq. 4's
exponent; the ``1/sqrt(m)`` cancels)::

    log pi_e = LSE_i (a_i(y_v) + a_i(y'_u)) - LSE_i (a_i(y_v) + LSE_w a_i(y'_w))

Every log-sum-exp is shifted by its own max, so no term underflows to ``log 0``: the
ratio of stabilised features (:class:`~refimpl.nn.nodeformer.random_features.PositiveRandomFeatures`
with ``"row"`` queries and ``"global"`` keys, whose shifts cancel in Eq. 12) equals
it where nothing underflows, but a key far below the largest gives ``pi = 0`` there.
The code adds ``1e-6`` to every feature (not done here; it changes ``pi``).

Backward: ``d log pi`` flows into ``a`` through the softmax weights of each
log-sum-exp, then into ``y`` (``d_y = d_a omega - rowsum(d_a) y``), then into
``W_q, b_q, W_k, b_k`` and ``x``. ``omega`` is noise (no gradient); the other
parameters get zeros, so ``d_params`` is keyed like ``params`` and adds to the layer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.graph import Graph
from refimpl.kernels.segment import gather, segment_sum
from refimpl.nn.attention_common import project_backward
from refimpl.nn.nodeformer.conv import NodeFormerCache, NodeFormerConv
from refimpl.nn.nodeformer.random_features import feature_exponent, feature_exponent_backward
from refimpl.validation import check_params, check_scalar_cotangent

__all__ = ["EDGE_LOSS_CONVENTIONS", "EdgeLossCache", "NodeFormerEdgeLoss"]

EDGE_LOSS_CONVENTIONS = ("paper", "authors")


class EdgeLossCache(NamedTuple):
    """What :meth:`NodeFormerEdgeLoss.backward` reads (``E`` edges of the layer's graph).

    Attributes
    ----------
    x : array, (N, F)
        The layer's input.
    graph : Graph
        The layer's prepared graph.
    omega : array, (m, C)
        The layer's projection, held fixed.
    y_q : array, (N, H, C)
        ``t s q``: what the query features are taken of.
    y_k : array, (N, H, C)
        ``t s k``.
    a_q : array, (N, H, m)
        Eq. 4's exponents of ``y_q``.
    a_k : array, (N, H, m)
        Eq. 4's exponents of ``y_k``.
    log_key_sums : array, (H, m)
        ``LSE_w a_k[w]``.
    log_numerators : array, (E, H)
        ``LSE_i (a_q[v] + a_k[u])``.
    log_denominators : array, (N, H)
        ``LSE_i (a_q[v] + log_key_sums)``.
    log_pi : array, (E, H)
        ``log pi_e,h`` of Eq. 12.
    coefficients : array, (E,)
        ``1 / (d_in(v) Z H)``: ``L_e = -sum_{e,h} coefficients_e log pi_e,h``.
    """

    x: Any
    graph: Graph
    omega: Any
    y_q: Any
    y_k: Any
    a_q: Any
    a_k: Any
    log_key_sums: Any
    log_numerators: Any
    log_denominators: Any
    log_pi: Any
    coefficients: Any


@dataclass(frozen=True)
class NodeFormerEdgeLoss:
    r"""NodeFormer's edge-level loss (Wu et al. 2022 Eq. (10)) of one :class:`NodeFormerConv`
    layer, from its forward cache.

    For the edges $e = (u \to v)$ of the layer's graph and each head $h$, with $\phi$ of
    Eq. (4) on the layer's $\boldsymbol{\omega}$, $\mathbf{y}_v = t\,\mathbf{q}_v$ and
    $\mathbf{y}'_u = t\,\mathbf{k}_u$ (Eq. (12), then Eq. (10) averaged over the heads):

    $$
    \pi_{e h} = \frac{\phi(\mathbf{y}_v)^\top \phi(\mathbf{y}'_u)}
    {\phi(\mathbf{y}_v)^\top \sum_w \phi(\mathbf{y}'_w)},
    \qquad
    \mathcal{L}_e = -\frac{1}{Z H} \sum_h \sum_{e = (u \to v)}
    \frac{\log \pi_{e h}}{d_{in}(v)}
    $$

    with $t$ and $Z$ set by ``convention`` (the module docstring's table).

    Parameters
    ----------
    conv : NodeFormerConv
        The layer whose forward cache the loss reads.
    convention : {"paper", "authors"}, default "paper"
        ``"paper"``: $t = 1$ ($\pi$ of Eq. (12)) and $Z = N$; ``"authors"``: $t =
        1/\sqrt{\tau}$ (the layer's attention without noise) and $Z = E$, the authors'
        mean over edges.

    Shapes
    ------
    - **input**: ``params`` the layer's; ``layer_cache`` its :class:`NodeFormerCache`
    - **output**: $\mathcal{L}_e$, a 0-d array
    - **backward**: ``d_loss`` a scalar (default 1); returns ``d_x`` $(N, F)$ and
      ``d_params`` keyed as the layer's ``params``, to add to the layer's own gradients
    """

    conv: NodeFormerConv
    convention: str = "paper"  # "paper": pi of Eq. 12, 1/N | "authors": tau in pi, mean over E

    def __post_init__(self) -> None:
        if not isinstance(self.conv, NodeFormerConv):
            raise TypeError(f"conv must be a NodeFormerConv, got {type(self.conv).__name__}")
        if self.convention not in EDGE_LOSS_CONVENTIONS:
            raise ValueError(
                f"NodeFormerEdgeLoss convention must be one of {EDGE_LOSS_CONVENTIONS}, "
                f"got {self.convention!r}"
            )

    def forward(self, params: dict[str, Any], layer_cache: NodeFormerCache) -> tuple[Any, Any]:
        """``L_e`` of the layer whose forward returned ``layer_cache``, and the cache."""
        conv = self.conv
        check_params(params, conv.param_shapes(), "NodeFormerEdgeLoss (the layer's params)")
        if not isinstance(layer_cache, NodeFormerCache):
            raise TypeError(
                "layer_cache must be the NodeFormerCache of NodeFormerConv.forward, got "
                f"{type(layer_cache).__name__}"
            )
        if layer_cache.q.shape[1:] != (conv.heads, conv.out_channels):
            raise ValueError(
                f"layer_cache holds heads of shape {tuple(layer_cache.q.shape[1:])} but this "
                f"layer has (heads, out_channels) = {(conv.heads, conv.out_channels)}"
            )
        q, k, graph = layer_cache.q, layer_cache.k, layer_cache.graph
        omega = layer_cache.noise["projection"]
        xp = get_array_module(q)
        src, dst = graph.src_segments(xp), graph.dst_segments(xp)
        t = 1.0 if self.convention == "paper" else 1.0 / math.sqrt(conv.tau)
        # E1 what the features are taken of (N, H, C); q and k carry the qk factor s
        y_q, y_k = q * t, k * t
        # E2 Eq. 4 exponents (N, H, m)
        a_q, a_k = feature_exponent(y_q, omega), feature_exponent(y_k, omega)
        # E3 log of the key sum of Eq. 12, per head and feature (H, m)
        log_key_sums = _logsumexp(a_k, axis=0)
        # E4 per edge the log numerator (E, H), per query the log denominator (N, H)
        log_numerators = _logsumexp(gather(a_q, dst) + gather(a_k, src), axis=2)
        log_denominators = _logsumexp(a_q + log_key_sums[None], axis=2)
        # E5 log pi_e,h (Eq. 12)  (E, H)
        log_pi = log_numerators - gather(log_denominators, dst)
        # E6 Eq. 10: weights 1 / (d_in(v) Z H)  (E,)
        scale = graph.num_nodes if self.convention == "paper" else max(graph.num_edges, 1)
        in_degree = gather(dst.counts(), dst).astype(q.dtype)  # (E,) >= 1
        coefficients = 1.0 / (in_degree * (scale * conv.heads))
        loss = -xp.sum(coefficients[:, None] * log_pi)
        cache = EdgeLossCache(
            layer_cache.x,
            graph,
            omega,
            y_q,
            y_k,
            a_q,
            a_k,
            log_key_sums,
            log_numerators,
            log_denominators,
            log_pi,
            coefficients,
        )
        return loss, cache

    def backward(
        self, params: dict[str, Any], cache: EdgeLossCache, d_loss: Any = 1.0
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``d_loss * L_e``: ``(d_x (N, in), d_params keyed like params)``."""
        conv, x = self.conv, cache.x
        xp = get_array_module(x)
        d_loss = check_scalar_cotangent(d_loss, x)
        src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
        a_q, a_k, omega = cache.a_q, cache.a_k, cache.omega
        # B6 (of E6) d log pi_e,h = -d_loss * coefficients_e  (E, 1), the same for every head
        d_log_pi = (-d_loss * cache.coefficients)[:, None]
        # B5 (of E5)
        d_log_numerators = d_log_pi  # (E, 1), broadcast over heads
        d_log_denominators = -segment_sum(d_log_pi, dst)  # (N, 1)
        # B4 (of E4) through each LSE: its softmax weights over the features
        edge_weights = xp.exp(
            gather(a_q, dst) + gather(a_k, src) - cache.log_numerators[..., None]
        )  # (E, H, m)
        d_edges = d_log_numerators[..., None] * edge_weights  # (E, H, m)
        d_a_q = segment_sum(d_edges, dst)  # (N, H, m)
        d_a_k = segment_sum(d_edges, src)
        node_weights = xp.exp(
            a_q + cache.log_key_sums[None] - cache.log_denominators[..., None]
        )  # (N, H, m)
        d_nodes = d_log_denominators[..., None] * node_weights  # (N, H, m)
        d_a_q = d_a_q + d_nodes
        d_log_key_sums = xp.sum(d_nodes, axis=0)  # (H, m)
        # B3 (of E3) through LSE_w: the softmax over the keys, per head and feature
        d_a_k = d_a_k + d_log_key_sums[None] * xp.exp(a_k - cache.log_key_sums[None])
        # B2 (of E2) a = y omega^T - ||y||^2 / 2: d_y = d_a omega - rowsum(d_a) y  (N, H, C)
        d_y_q = feature_exponent_backward(cache.y_q, omega, d_a_q)
        d_y_k = feature_exponent_backward(cache.y_k, omega, d_a_k)
        # B1 (of E1) and the layer's F2 (y = t s (W x + b)) and F1 (the projections)
        factor = conv.qk_factor * (1.0 if self.convention == "paper" else 1.0 / math.sqrt(conv.tau))
        d_params: dict[str, Any] = {}
        d_x = project_backward(
            params, "qk", x, [d_y_q, d_y_k], d_params, conv.bias, factors=(factor, factor)
        )
        return d_x, {
            name: d_params[name] if name in d_params else xp.zeros_like(value)
            for name, value in params.items()
        }


def _logsumexp(a: Any, axis: int) -> Any:
    """``log sum exp`` along ``axis``, shifted by the max (finite for finite ``a``)."""
    xp = get_array_module(a)
    top = xp.max(a, axis=axis, keepdims=True)
    return xp.squeeze(top, axis=axis) + xp.log(xp.sum(xp.exp(a - top), axis=axis))
