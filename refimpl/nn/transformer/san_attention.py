"""``SANAttention``: the multi-head attention of SAN (Kreuzer et al. 2021), as the released code of
the massive-activations study computes it (``MultiHeadAttentionLayer`` of
``gnn-lspe/layers/san_gt_layer.py`` and ``SAN/layers/graph_transformer_layer.py``).

The attention runs over a *pairs graph*: with ``full_graph=True`` every ordered pair ``u -> v``
(``u != v``) of nodes of the same graph, each marked ``real`` (an edge of the input graph) or not
(``refimpl.data.full_graph`` builds it; a pair's edge features ``e_p`` are the input edge's, and
on a non-edge what the model puts there: the released nets embed bond type 0 there, the
``feat = 0`` that ``make_full_graph`` writes). With ``full_graph=False`` it runs over the input
graph's edges, all real. With ``D = channels``, ``H = heads``, ``d = D / H`` and per head::

    F1  Q = h W_Q^T, K = h W_K^T, V = h W_V^T,        (N, H, d)  released Q, K, V
        Q2 = h W_Q_2^T, K2 = h W_K_2^T                (N, H, d)  Q_2, K_2 (full_graph)
        E = e W_E^T, E2 = e W_E_2^T                   (P, H, d)  E, E_2 (biases with ``bias``)
    F2  t_p = K_u * Q_v / sqrt(d) * E_p               (P, H, d)  p = (u -> v) real
        t_p = K2_u * Q2_v / sqrt(d) * E2_p                       p not real
                                             (src_dot_dst, scaling, imp_exp_attn)
    F3  s_p = sum_c t_p[c]                            (P, H)
    F4  w_p = exp(clamp(s_p, -5, 5)) * c_p            (P, H)     exp_real / exp_fake:
        c_p = 1 / (gamma + 1) real, gamma / (gamma + 1) not real; 1 without full_graph (exp)
    F5  wV_v = sum_{p into v} w_p V_u,  z_v = sum_{p into v} w_p     (fn.sum 'wV', 'z')
    F6  out_v = wV_v / (z_v + 1e-6)                   (N, H, d) -> (N, D), heads concatenated

Gamma enters in the exponentiated scores (F4), so it weighs real against non-real pairs both in
the numerator and in the normaliser ``z``: for ``gamma = 0`` only real pairs count, for
``gamma = 1`` both count alike; ``1 / (gamma + 1)`` itself cancels but for the ``1e-6``.
``learn_gamma=True`` makes gamma a parameter clamped to ``[0, 1]`` in F4, as the gnn-lspe SANNet
(one ``nn.Parameter`` shared by all its layers: a model sums the layers' gradients); with
``learn_gamma=False`` gamma is the fixed number the SAN repository passes (no clamp).

F1-F6 and their backward are the shared core
:class:`~refimpl.nn.transformer.pair_attention.PairAttention` (GT's and GraphiT's too), with
``c_p`` as its multiplier. Derivatives: the clamps pass the gradient strictly inside their
interval and stop it on the boundary and outside (``torch.clamp``'s derivative: at ``s = +-5``
and at ``gamma`` in ``{0, 1}`` no gradient passes). The value has no
edge term, and the edge output ``t`` of F2 is not carried to the next layer (the released SAN
layer returns ``e`` unchanged); it is kept in the cache as ``scores`` (the study's
``malog_e['attention']``).

Differences from the released code: none in the maths. The explicit-bias variant of the released
layer is not offered here: with ``full_graph`` it reads ``k_bias_2`` and ``e_bias_2``, which the
layer never creates (it raises), and without it the second ``exp`` overwrites ``score_soft``, so
the weights no longer depend on the keys (docs/guide/san.md, "Notes on the released code").
Cost: ``P = sum_g n_g (n_g - 1)`` pairs with ``full_graph``, quadratic in each graph's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool, check_nonnegative_number, check_positive_int
from refimpl.graph import Graph
from refimpl.nn.attention_common import project, project_backward
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.transformer.pair_attention import (
    PairAttention,
    PairAttentionCache,
    check_pair_inputs,
    pair_maps,
    pair_param_shapes,
)
from refimpl.validation import check_block_inputs, check_cotangent

__all__ = ["SANAttention", "SANAttentionCache"]


class SANAttentionCache(NamedTuple):
    """What :meth:`SANAttention.backward` reads: the inputs, the gamma used and the shared
    core's cache (``core``: every step of
    :class:`~refimpl.nn.transformer.pair_attention.PairAttention`).

    Attributes
    ----------
    h : (N, D) array
        The node input.
    e : (P, D) array
        The pair features.
    core : PairAttentionCache
        F1-F6.
    gamma : float
        The gamma used (clamped when learned).
    """

    h: Any
    e: Any
    core: PairAttentionCache
    gamma: float

    @property
    def scores(self) -> Any:
        """``(P, H, d)`` F2's ``t_p``, the released ``g.edata['score']``."""
        return self.core.scores


@dataclass(frozen=True)
class SANAttention:
    r"""SAN's full attention with separate parameters for real edges and non-edges.

    The released ``MultiHeadAttentionLayer.propagate_attention`` (Kreuzer et al. 2021 print no
    equation for these details; F1-F6 in the module docstring), per head ($d = D / H$
    channels) and pair $u \to v$:

    $$
    t_{uv} = \frac{K h_u \odot Q h_v}{\sqrt{d}} \odot E e_{uv}, \quad
    w_{uv} = c_{uv} \exp\left(\operatorname{clamp}\left(\textstyle\sum_c t_{uv,c}, -5, 5
    \right)\right), \quad
    \hat h_v = \frac{\sum_u w_{uv} V h_u}{\sum_u w_{uv} + 10^{-6}}
    $$

    with $c_{uv} = 1 / (\gamma + 1)$ on edges and $\gamma / (\gamma + 1)$ on other pairs (1
    without ``full_graph``), and $Q_2, K_2, E_2$ in place of $Q, K, E$ off edges.

    Parameters
    ----------
    channels : int
        ``D``, the node and edge feature width in and out (``GT_hidden_dim``).
    heads : int
        ``H``, default 8 (the study's configs); ``D`` must be divisible by it.
    full_graph : bool
        True (default): attend over every pair, with ``Q_2, K_2, E_2`` on non-edges and gamma;
        False: over the input edges only (the SAN repository's ZINC config), no gamma.
    gamma : float
        ``>= 0``, default 0.1 (gnn-lspe's ``init_gamma``; the SAN repository's ZINC config
        uses 1e-5 with ``full_graph=False``, where gamma is not read).
    learn_gamma : bool
        False (default): gamma fixed; True: a parameter ``gamma (1,)`` initialised to ``gamma``
        and clamped to ``[0, 1]`` (gnn-lspe).
    bias : bool
        Biases on the seven projections (the released ``use_bias``), default False.

    Shapes
    ------
    ``h (N, D)``, pairs graph on ``N`` nodes with ``P`` pairs, ``e (P, D)``, ``real (P,)`` bool
    (None: all real) -> ``out (N, D)``. Parameters ``W_Q, W_K, W_E, [W_Q_2, W_K_2, W_E_2], W_V``
    ``(D, D)`` (released ``Q.weight`` ...), ``b_*`` ``(D,)`` with ``bias``, ``gamma (1,)``.
    """

    channels: int
    heads: int = 8
    full_graph: bool = True
    gamma: float = 0.1
    learn_gamma: bool = False
    bias: bool = False

    def __post_init__(self) -> None:
        for name in ("channels", "heads"):
            check_positive_int(getattr(self, name), f"SANAttention {name}")
        for name in ("full_graph", "learn_gamma", "bias"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"SANAttention {name}"))
        check_nonnegative_number(self.gamma, "SANAttention gamma")
        if self.channels % self.heads:
            raise ValueError(
                f"SANAttention channels ({self.channels}) must be divisible by heads "
                f"({self.heads}): each head is d = D / H wide"
            )
        if self.learn_gamma and not self.full_graph:
            raise ValueError(
                "SANAttention learn_gamma needs full_graph=True: gamma weighs non-edges"
            )

    @property
    def node_maps(self) -> tuple[str, ...]:
        """The projections of ``h``, in parameter order."""
        return pair_maps(self.full_graph)[0]

    @property
    def edge_maps(self) -> tuple[str, ...]:
        """The projections of ``e``, in parameter order."""
        return pair_maps(self.full_graph)[1]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes, in the released module's order (Q, K, E, Q_2, K_2, E_2, V)."""
        shapes = pair_param_shapes(self.channels, self.full_graph, self.bias)
        if self.learn_gamma:
            shapes["gamma"] = (1,)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``torch.nn.Linear``'s default: weights and biases ``~ U(-1/sqrt(D), 1/sqrt(D))``
        (the distribution, not torch's draws); ``gamma`` set to the configured value."""
        bound = 1.0 / math.sqrt(self.channels)
        params = {}
        for name, shape in self.param_shapes().items():
            value = (
                np.full(shape, self.gamma) if name == "gamma" else rng.uniform(-bound, bound, shape)
            )
            params[name] = asarray(value, backend, dtype)
        return params

    # -- forward -----------------------------------------------------------------------
    def forward(
        self, params: dict[str, Any], h: Any, graph: Graph, e: Any, real: Any = None
    ) -> tuple[Any, SANAttentionCache]:
        """``out (N, D)`` for ``h (N, D)`` over the pairs ``graph`` with pair features
        ``e (P, D)`` and the ``real (P,)`` mask (None: every pair real). No randomness: the
        released attention has no dropout. Raises :class:`~refimpl.validation.NonFiniteError`
        where the output overflows the dtype."""
        xp = check_block_inputs(params, self.param_shapes(), "SANAttention", h, self.channels)
        real = check_pair_inputs("SANAttention", h, graph, e, real, self.channels, self.full_graph)
        n, heads, d = h.shape[0], self.heads, self.channels // self.heads
        gamma = self._gamma(params, xp)
        # F1 the projections (N, H, d) and (P, H, d)
        node_ys = project(params, self.node_maps, h, self.bias)
        edge_ys = project(params, self.edge_maps, e, self.bias)
        nodes = {k: y.reshape(n, heads, d) for k, y in zip(self.node_maps, node_ys, strict=True)}
        edges = {
            k: y.reshape(len(e), heads, d) for k, y in zip(self.edge_maps, edge_ys, strict=True)
        }
        # F1-F6 the shared core; F4's multiplier c_p (P, 1), none without full_graph
        multiplier = None
        if self.full_graph:
            shares = xp.where(real, 1.0 / (gamma + 1.0), gamma / (gamma + 1.0))  # (P,)
            multiplier = shares.astype(h.dtype, copy=False)[:, None]  # float32 stays float32
        out, core = PairAttention(heads, d).forward(
            nodes, edges, graph.src_segments(xp), graph.dst_segments(xp), real, multiplier
        )
        flat = out.reshape(n, self.channels)
        check_overflow(flat, "SANAttention.forward: its output", h.dtype)
        return flat, SANAttentionCache(h, e, core, gamma)

    def _gamma(self, params: dict[str, Any], xp: Any) -> float:
        if not self.learn_gamma:
            return float(self.gamma)
        return float(xp.clip(params["gamma"], 0.0, 1.0)[0])  # torch.clamp(gamma, 0, 1)

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: SANAttentionCache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``((d_h (N, D), d_e (P, D)), d_params)``."""
        check_cotangent(d_out, (cache.h.shape[0], self.channels), cache.h.dtype, cache.h)
        return backward_checked(
            lambda: self._backward(params, cache, d_out), "SANAttention", d_out.dtype
        )

    def _backward(
        self, params: dict[str, Any], c: SANAttentionCache, d_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B6-B1 of :meth:`backward` on a checked cotangent."""
        xp = get_array_module(d_out)
        n, heads, d = c.core.out.shape
        # B6-B1 (of F6-F1) the shared core, back to the projections
        grads = PairAttention(heads, d).backward(c.core, d_out.reshape(n, heads, d))
        d_params: dict[str, Any] = {}
        if self.learn_gamma:  # B4 (of F4) dc/dgamma = -1/(1+g)^2 real, +1/(1+g)^2 not real
            g = c.gamma
            sign = xp.where(c.core.real, -1.0, 1.0)[:, None] / ((1.0 + g) * (1.0 + g))
            d_gamma = (grads.multiplier * sign).sum()
            # torch.clamp(gamma, 0, 1): no gradient on the boundary or outside
            inside_gamma = 0.0 < float(params["gamma"][0]) < 1.0
            d_params["gamma"] = xp.full((1,), d_gamma if inside_gamma else 0.0, dtype=d_out.dtype)
        # B1 (of F1) the projections
        node_grads = [grads.nodes[name] for name in self.node_maps]
        edge_grads = [grads.edges[name] for name in self.edge_maps]
        d_h = project_backward(params, self.node_maps, c.h, node_grads, d_params, self.bias)
        d_e = project_backward(params, self.edge_maps, c.e, edge_grads, d_params, self.bias)
        return (d_h, d_e), {name: d_params[name] for name in params}
