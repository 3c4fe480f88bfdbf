"""``GraphiTAttention``: the attention of the massive-activation study's GraphiT-GT (the released
``MultiHeadAttentionLayer`` of ``gnn-lspe/layers/graphit_gt_layer.py``): GT's scores on a pairs
graph, re-weighted by GraphiT's random-walk kernel (Mialon et al. 2021, Sec. 4.1).

The attention runs over a *pairs graph* (``P`` pairs ``u -> v``): with ``full_graph=True``
every ordered pair of nodes of one graph, each marked ``real`` or not
(:func:`refimpl.data.full_graph.full_graph`), the pair's kernel value ``kappa_p``
(:func:`refimpl.data.graph_kernels.random_walk_kernel`, the released ``k_RW``) and pair
features ``e_p``; with ``full_graph=False`` the input edges, all real, no kernel. With
``D = channels``, ``H = heads``, ``d = D / H``, per head::

    F1  Q, K, V = h W_Q^T, h W_K^T, h W_V^T             (N, H, d)  Q, K, V
        Q2, K2 = h W_Q_2^T, h W_K_2^T                   (N, H, d)  Q_2, K_2 (full_graph)
        E, E2 = e W_E^T, e W_E_2^T                      (P, H, d)  E, E_2
    F2  t_p = K_u * Q_v / sqrt(d) * E_p                 (P, H, d)  real p = (u -> v)
        t_p = K2_u * Q2_v / sqrt(d) * E2_p                         other p
                          (src_dot_dst, scaling, imp_exp_attn: t is the returned e_attn)
    F3  s_p = sum_c t_p[c]                              (P, H)
    F4  w_p = exp(clamp(s_p, -5, 5)) * kappa_p          (P, H)     exp, adaptive_edge_PE
        (kappa_p = 1 unless full_graph and adaptive_edge_PE, as released)
    F5  wV_v = sum_{p into v} w_p V_u,  z_v = sum_{p into v} w_p    (fn.sum 'wV', 'z')
    F6  out_v = wV_v / (z_v + 1e-6)                     (N, H, d) -> (N, D)

**explicit_bias** (the study's remedy for massive activations, ``--explicit_bias True``;
``propagate_attention_explicit_bias``) adds per-head vectors ``k_bias, e_bias, v_bias (H, d)``
(released shapes ``(H, d, 1)``, ``(H, 1, d)``, ``(H, 1, d)``)::

    F2' b_p = Q_v . k_bias / sqrt(d)                    (P, H)     score_bias
        t_p = K_u * Q_v / sqrt(d) * E_p + b_p e_bias    (P, H, d)  imp_exp_attn_bias
    F3' s_p = b_p                                       (P, H)
    F5' wV_v = sum_{p into v} w_p (V_u + v_bias)                   src_mul_edge_bias

F3' is what the released code computes, not what it meant: ``exp('score')`` and then
``exp('score_bias')`` both write ``score_soft``, so the second overwrites the first and the
weights read ``b_p`` only, the same for every pair into ``v``. With it every node takes the
mean of ``V_u + v_bias`` over its in-neighbours (times ``z / (z + 1e-6)``), and the keys and
edge features reach only the returned scores ``t``. refimpl computes what was run; the guide
(docs/guide/graphit.md) lists this. The released branch with ``full_graph`` reads ``k_bias_2``
and ``e_bias_2``, which the layer never creates, so that combination is refused.

What the study ran: every GraphiT config (``gnn-lspe/configs/GraphiT_*``) sets
``full_graph: false``, and the kernel is applied only ``if self.adaptive_edge_PE and
self.full_graph``, so the runs of the study used no kernel (``adaptive_edge_PE: true``,
``p_steps: 16``, ``gamma: 0.25`` have no effect there): GT's attention over the input edges.
Here a ``kernel`` passed where it is not read is refused instead of ignored.

F1-F6 and their backward are the shared core
:class:`~refimpl.nn.transformer.pair_attention.PairAttention` (GT's and SAN's too; F3' is its
``overwrite``); this block makes the projections, checks its inputs and passes the kernel as
the core's multiplier. Derivatives: the clamp passes the gradient strictly inside ``(-5, 5)``
and stops it on the boundary and outside (``torch.clamp``'s derivative). The kernel is data (no
gradient). Cost: ``O(P H d)``; ``P = sum_g n_g (n_g - 1)`` with ``full_graph``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool, check_positive_int
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
from refimpl.validation import check_block_inputs, check_cotangent, check_input

__all__ = ["GraphiTAttention", "GraphiTAttentionCache"]


class GraphiTAttentionCache(NamedTuple):
    """What :meth:`GraphiTAttention.backward` reads: the inputs and the shared core's cache
    (``core``: every step of :class:`~refimpl.nn.transformer.pair_attention.PairAttention`).

    Attributes
    ----------
    h : (N, D) array
        The node input.
    e : (P, D) array
        The pair features.
    core : PairAttentionCache
        F1-F6.
    """

    h: Any
    e: Any
    core: PairAttentionCache

    @property
    def scores(self) -> Any:
        """``(P, H, d)`` F2's ``t_p``, the released ``e_attn``."""
        return self.core.scores


@dataclass(frozen=True)
class GraphiTAttention:
    r"""GraphiT-GT's attention as released (module docstring: F1-F6, explicit bias F2'-F5').

    Per head ($d = D / H$ channels) and pair $u \to v$ (GraphiT-GT as the massive-activation
    study released it; Mialon et al. 2021's kernel as the multiplier):

    $$
    t_{uv} = \frac{K h_u \odot Q h_v}{\sqrt{d}} \odot E e_{uv}, \quad
    w_{uv} = c_{uv} \exp\left(\operatorname{clamp}\left(\textstyle\sum_c t_{uv,c}, -5, 5
    \right)\right), \quad
    \hat h_v = \frac{\sum_u w_{uv} V h_u}{\sum_u w_{uv} + 10^{-6}}
    $$

    with $c_{uv} = \kappa_{uv}$, the pair's kernel value, with ``full_graph`` and
    ``adaptive_edge_PE`` (else 1), and $Q_2, K_2, E_2$ in place of $Q, K, E$ on non-edges.

    Parameters
    ----------
    channels : int
        ``D``, the node and pair feature width in and out (``GT_hidden_dim``).
    heads : int
        ``H``, default 8 (the study's configs); ``D`` must be divisible by it.
    full_graph : bool
        False (default, every config of the study): attend over the input edges, all real;
        True: over all pairs, with ``Q_2, K_2, E_2`` on non-edges.
    adaptive_edge_PE : bool
        Multiply the exponentiated scores by the pair's kernel value (F4); read only with
        ``full_graph``, as released. Default True (the study's configs).
    bias : bool
        Biases on the projections (the released ``use_bias``, on in the study's explicit-bias
        runs), default False.
    explicit_bias : bool
        The released explicit-bias branch (F2', F3', F5'), default False; not with
        ``full_graph``.

    Shapes
    ------
    ``h (N, D)``, pairs graph on ``N`` nodes with ``P`` pairs, ``e (P, D)``, ``kernel (P,)``
    (only with ``full_graph`` and ``adaptive_edge_PE``), ``real (P,)`` bool (None: all real)
    -> ``(out (N, D), scores (P, D))``. Parameters ``W_Q, W_K, W_E, [W_Q_2, W_K_2, W_E_2],
    W_V (D, D)`` (released ``Q.weight`` ...), ``b_* (D,)`` with ``bias``, ``k_bias, e_bias,
    v_bias (H, d)`` with ``explicit_bias``.
    """

    channels: int
    heads: int = 8
    full_graph: bool = False
    adaptive_edge_PE: bool = True  # the released name, kept for the mapping
    bias: bool = False
    explicit_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("channels", "heads"):
            check_positive_int(getattr(self, name), f"GraphiTAttention {name}")
        for name in ("full_graph", "adaptive_edge_PE", "bias", "explicit_bias"):
            flag = check_bool(getattr(self, name), f"GraphiTAttention {name}")
            object.__setattr__(self, name, flag)
        if self.channels % self.heads:
            raise ValueError(
                f"GraphiTAttention channels ({self.channels}) must be divisible by heads "
                f"({self.heads}): each head is d = D / H wide"
            )
        if self.explicit_bias and self.full_graph:
            raise ValueError(
                "GraphiTAttention explicit_bias needs full_graph=False: the released "
                "explicit-bias branch reads k_bias_2 and e_bias_2 on non-edges, which it never "
                "defines"
            )

    @property
    def reads_kernel(self) -> bool:
        """Whether F4 multiplies by the kernel (``full_graph and adaptive_edge_PE``)."""
        return self.full_graph and self.adaptive_edge_PE

    @property
    def node_maps(self) -> tuple[str, ...]:
        """The projections of ``h``, in parameter order."""
        return pair_maps(self.full_graph)[0]

    @property
    def edge_maps(self) -> tuple[str, ...]:
        """The projections of ``e``, in parameter order."""
        return pair_maps(self.full_graph)[1]

    @property
    def core(self) -> PairAttention:
        """The shared attention core; the explicit bias with the released overwrite (F3')."""
        d = self.channels // self.heads
        return PairAttention(self.heads, d, self.explicit_bias, overwrite=self.explicit_bias)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes in the released module's order (Q, K, E, Q_2, K_2, E_2, V, then
        k_bias, e_bias, v_bias)."""
        shapes = pair_param_shapes(self.channels, self.full_graph, self.bias)
        if self.explicit_bias:
            for name in ("k_bias", "e_bias", "v_bias"):
                shapes[name] = (self.heads, self.channels // self.heads)
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``torch.nn.Linear``'s default distribution ``U(-1/sqrt(D), 1/sqrt(D))`` for weights
        and biases, standard normal for the explicit biases (the released ``torch.randn``)."""
        bound = 1.0 / math.sqrt(self.channels)
        params = {}
        for name, shape in self.param_shapes().items():
            if name.endswith("_bias"):
                value = rng.standard_normal(shape)
            else:
                value = rng.uniform(-bound, bound, shape)
            params[name] = asarray(value, backend, dtype)
        return params

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        h: Any,
        graph: Graph,
        e: Any,
        kernel: Any = None,
        real: Any = None,
    ) -> tuple[tuple[Any, Any], GraphiTAttentionCache]:
        """``(out (N, D), scores (P, D))`` for ``h (N, D)`` over the pairs ``graph`` with pair
        features ``e (P, D)``, ``kernel (P,)`` and ``real (P,)``. No randomness: the released
        attention has no dropout. Raises :class:`~refimpl.validation.NonFiniteError` where
        the output overflows the dtype."""
        xp = check_block_inputs(params, self.param_shapes(), "GraphiTAttention", h, self.channels)
        real = check_pair_inputs(
            "GraphiTAttention", h, graph, e, real, self.channels, self.full_graph
        )
        kernel = self._check_kernel(h, graph, kernel)
        n, pairs, heads, d = h.shape[0], graph.num_edges, self.heads, self.channels // self.heads
        # F1 the projections (N, H, d) and (P, H, d)
        node_ys = project(params, self.node_maps, h, self.bias)
        edge_ys = project(params, self.edge_maps, e, self.bias)
        nodes = {k: y.reshape(n, heads, d) for k, y in zip(self.node_maps, node_ys, strict=True)}
        edges = {
            k: y.reshape(pairs, heads, d) for k, y in zip(self.edge_maps, edge_ys, strict=True)
        }
        # F1-F6 the shared core; F4's multiplier the kernel (P, 1)
        multiplier = kernel[:, None] if self.reads_kernel else None
        out, core = self.core.forward(
            nodes, edges, graph.src_segments(xp), graph.dst_segments(xp), real, multiplier,
            self._biases(params),
        )  # fmt: skip
        flat = out.reshape(n, self.channels)
        check_overflow(flat, "GraphiTAttention.forward: its output", h.dtype)
        return (flat, core.scores.reshape(pairs, self.channels)), GraphiTAttentionCache(h, e, core)

    def _check_kernel(self, h: Any, graph: Graph, kernel: Any) -> Any:
        """The kernel ``(P,)`` in ``h``'s dtype where F4 reads it; refused where it does not."""
        if not self.reads_kernel:
            if kernel is not None:
                raise ValueError(
                    "GraphiTAttention reads kernel only with full_graph=True and "
                    "adaptive_edge_PE=True (as released: the study's full_graph=False runs "
                    "ignore k_RW); pass kernel=None"
                )
            return None
        if kernel is None:
            raise ValueError(
                "GraphiTAttention with full_graph and adaptive_edge_PE needs kernel (P,): "
                "refimpl.data.graph_kernels.random_walk_kernel on the pairs"
            )
        check_input(kernel, "kernel", shape=(graph.num_edges,))
        get_array_module(kernel, h)  # TypeError if kernel is on another backend
        return kernel.astype(h.dtype, copy=False)

    def _biases(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """The explicit biases ``(H, d)`` the core reads; None without them."""
        if not self.explicit_bias:
            return None
        return {name: params[name] for name in ("k_bias", "e_bias", "v_bias")}

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: GraphiTAttentionCache, d_outputs: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_out, out> + <d_scores, scores>`` for ``d_outputs = (d_out (N, D),
        d_scores (P, D) or None)``: ``((d_h (N, D), d_e (P, D)), d_params)``."""
        if not isinstance(d_outputs, tuple) or len(d_outputs) != 2:
            raise TypeError(
                "GraphiTAttention.backward takes d_outputs = (d_out, d_scores or None), "
                f"got {type(d_outputs).__name__}"
            )
        d_out, d_scores = d_outputs
        n, pairs = cache.h.shape[0], cache.e.shape[0]
        check_cotangent(d_out, (n, self.channels), cache.h.dtype, cache.h)
        if d_scores is not None:
            check_cotangent(
                d_scores, (pairs, self.channels), cache.h.dtype, cache.h, name="d_scores"
            )
        return backward_checked(
            lambda: self._backward(params, cache, d_out, d_scores), "GraphiTAttention", d_out.dtype
        )

    def _backward(
        self, params: dict[str, Any], c: GraphiTAttentionCache, d_out: Any, d_scores: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B6-B1 of :meth:`backward` on checked cotangents."""
        n, heads, d = c.core.out.shape
        # B6-B1 (of F6-F1) the shared core, back to the projections
        d_t = None if d_scores is None else d_scores.reshape(c.scores.shape)
        grads = self.core.backward(c.core, d_out.reshape(n, heads, d), d_t, self._biases(params))
        d_params: dict[str, Any] = dict(grads.biases)
        # B1 (of F1) the projections
        node_grads = [grads.nodes[name] for name in self.node_maps]
        edge_grads = [grads.edges[name] for name in self.edge_maps]
        d_h = project_backward(params, self.node_maps, c.h, node_grads, d_params, self.bias)
        d_e = project_backward(params, self.edge_maps, c.e, edge_grads, d_params, self.bias)
        return (d_h, d_e), {name: d_params[name] for name in params}
