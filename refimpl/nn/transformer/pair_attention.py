"""``PairAttention``: the attention core that the massive-activation study's three graph
transformers share, written once: GT (Dwivedi & Bresson 2021,
:class:`~refimpl.nn.transformer.gt_attention.GTAttention`), GraphiT-GT (Mialon et al. 2021,
:class:`~refimpl.nn.transformer.graphit_attention.GraphiTAttention`) and SAN (Kreuzer et al.
2021, :class:`~refimpl.nn.transformer.san_attention.SANAttention`). Each released
``MultiHeadAttentionLayer.propagate_attention`` (``graph_transformer_edge_layer.py``,
``graphit_gt_layer.py``, ``san_gt_layer.py``) computes it; the blocks keep their own
projections, checks, multiplier and variant, and call this.

Over a graph of pairs ``p = u -> v`` (``P`` pairs: the input edges, or with ``full_graph``
every ordered pair of a graph, marked ``real`` or not), head by head with ``d`` channels,
from the block's projections ``Q, K, V (N, H, d)``, ``E (P, H, d)`` and, where ``real`` is
given, ``Q_2, K_2 (N, H, d)``, ``E_2 (P, H, d)`` for the pairs that are not edges::

    F1  q_p = Q_v, k_p = K_u, f_p = E_p    (Q_2_v, K_2_u, E_2_p where not real)  (P, H, d)
    F2  a_p = k_p q_p / sqrt(d)                              (P, H, d)  src_dot_dst, scaling
    F3  t_p = a_p f_p;  s_p = sum_c t_p,c                    (P, H, d), (P, H)  imp_exp_attn
    F4  w_p = exp(clamp(s_p, -5, 5)) c_p                     (P, H)     exp
    F5  z_v = sum_{p into v} w_p;  m_v = sum_{p into v} w_p V_u          send_and_recv
    F6  out_v = m_v / (z_v + 1e-6)                           (N, H, d)

``c_p`` is the block's multiplier (GraphiT: the kernel value; SAN: ``1 / (gamma + 1)`` on real
pairs, ``gamma / (gamma + 1)`` on the others; GT: none). ``t`` is the block's edge output
(GT's ``e_out``, GraphiT's ``e_attn``, SAN's logged scores).

``explicit_bias`` (the released ``propagate_attention_explicit_bias``; ``k_bias``, ``e_bias``,
``v_bias (H, d)``)::

    F2' b_p = q_p . k_bias / sqrt(d)                         (P, H)     src_dot_dst_bias
    F3' t_p = a_p f_p + b_p e_bias;  s_p = sum_c t_p,c                  imp_exp_attn_bias
        (``overwrite``: s_p = b_p, GraphiT's released overwrite of score_soft)
    F5' m_v = sum_{p into v} w_p (V_u + v_bias) = sum_p w_p V_u + z_v v_bias  src_mul_edge_bias

Without ``Q``, ``K`` and ``E`` (GT's released ``edge_feat=False``) F1-F3 are skipped: every
score channel is 1, so ``w_p = exp(min(d, 5))`` and there is no edge output.

The authors' constants: the clamp to ``[-5, 5]`` and the ``1e-6``. The clamp's derivative is
torch's (``torch.clamp`` in float64, checked in ``tests/nn/transformer/test_gt_torch.py``): 1
strictly inside ``(-5, 5)``, 0 on the boundary and outside.

Backward (``g`` the cotangent of ``out``, ``g_t`` that of ``t``, None: unused)::

    B6  d_m_v = g_v / (z_v + 1e-6);  d_z_v = -sum_c d_m_v,c out_v,c
    B5  d_w_p = d_m_v . V_u + d_z_v;  d_V_u = sum_{p from u} w_p d_m_v
        B5' d_v_bias = sum_v z_v d_m_v;  d_z_v += d_m_v . v_bias
    B4  d_s_p = d_w_p w_p [-5 < s_p < 5];  d_c_p = d_w_p exp(clamp(s_p, -5, 5))
    B3  d_t_p = d_s_p (every channel) + g_t_p;  d_f_p = d_t_p a_p;  d_a_p = d_t_p f_p
        B3' d_b_p = d_t_p . e_bias (+ d_s_p with overwrite, where d_t_p has no d_s_p);
            d_e_bias = sum_p b_p d_t_p
    B2  d_k_p = d_a_p q_p / sqrt(d);  d_q_p = d_a_p k_p / sqrt(d)
        B2' d_q_p += d_b_p k_bias / sqrt(d);  d_k_bias = sum_p d_b_p q_p / sqrt(d)
    B1  d_Q_v = sum_{p into v} d_q_p, d_K_u = sum_{p from u} d_k_p, d_E = d_f (real pairs;
        the others to Q_2, K_2, E_2)

The module also holds what GraphiT's and SAN's blocks share around the core: their projections'
names (:func:`pair_maps`, :func:`pair_param_shapes`) and their input checks
(:func:`check_pair_inputs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments, gather, segment_sum
from refimpl.ops.heads import dot_per_head, scale_per_head, sum_channels, sum_per_head
from refimpl.ops.propagate import propagate, propagate_backward
from refimpl.validation import check_array, check_input

__all__ = [
    "CLAMP",
    "DENOMINATOR_EPS",
    "PairAttention",
    "PairAttentionCache",
    "PairAttentionGrads",
    "check_pair_inputs",
    "pair_maps",
    "pair_param_shapes",
]

CLAMP = 5.0  # exp(clamp(score, -5, 5)) in the released ``exp``: "for numerical stability"
DENOMINATOR_EPS = 1e-6  # wV / (z + 1e-6) in the released ``forward``: "adding eps"


class PairAttentionCache(NamedTuple):
    """What :meth:`PairAttention.backward` reads (None where the configuration has no step).

    Attributes
    ----------
    src : Segments
        The pairs by source u.
    dst : Segments
        The pairs by target v.
    real : (P,) bool array or None
        Which pairs are input edges; None: every pair real (no ``Q_2, K_2, E_2``).
    values : (N, H, d) array
        V.
    q_pairs : (P, H, d) array or None
        F1 q_p; None without scores (GT's edge_feat=False).
    k_pairs : (P, H, d) array
        F1 k_p.
    e_pairs : (P, H, d) array
        F1 f_p.
    a : (P, H, d) array
        F2.
    score_bias : (P, H) array or None
        F2' b_p, None without explicit_bias.
    scores : (P, H, d) array or None
        F3 t_p, the edge output; None without scores.
    raw : (P, H) array or None
        F3 s_p before the clamp; None without scores.
    inside : (P, H) bool array or None
        -5 < s_p < 5 (F4); None without scores.
    exps : (P, H) array
        F4 exp(clamp(s_p, -5, 5)).
    multiplier : (P, H) or (P, 1) array, or None
        F4 ``c_p``; None: 1.
    weights : (P, H) array
        F4 w_p.
    z : (N, H) array
        F5.
    out : (N, H, d) array
        F6.
    """

    src: Segments
    dst: Segments
    real: Any
    values: Any
    q_pairs: Any
    k_pairs: Any
    e_pairs: Any
    a: Any
    score_bias: Any
    scores: Any
    raw: Any
    inside: Any
    exps: Any
    multiplier: Any
    weights: Any
    z: Any
    out: Any


class PairAttentionGrads(NamedTuple):
    """What :meth:`PairAttention.backward` returns, by the forward's names.

    Attributes
    ----------
    nodes : dict
        D of V, Q, K (and Q_2, K_2 with real), (N, H, d).
    edges : dict
        D of E (and E_2 with real), (P, H, d).
    biases : dict
        D of k_bias, e_bias, v_bias (H, d), with explicit_bias.
    multiplier : (P, H) array or None
        D of c_p (B4), None without a multiplier.
    """

    nodes: dict[str, Any]
    edges: dict[str, Any]
    biases: dict[str, Any]
    multiplier: Any


@dataclass(frozen=True)
class PairAttention:
    r"""The shared attention core: channel-wise scores ``k q / sqrt(d) * f``, weights
    ``exp(clamp(sum_c, -5, 5)) c``, ``out = sum w V / (sum w + 1e-6)`` (module docstring:
    F1-F6, the explicit bias F2'-F5', the backward B6-B1).

    Per head ($d$ channels) and pair $u \to v$, with a per-pair multiplier $c_{uv}$ (1, a
    kernel value or SAN's $\gamma$ weights: Dwivedi & Bresson 2021 Eq. (10)-(12) as released):

    $$
    t_{uv} = \frac{K h_u \odot Q h_v}{\sqrt{d}} \odot E e_{uv}, \quad
    w_{uv} = c_{uv} \exp\left(\operatorname{clamp}\left(\textstyle\sum_c t_{uv,c}, -5, 5
    \right)\right), \quad
    \hat h_v = \frac{\sum_u w_{uv} V h_u}{\sum_u w_{uv} + 10^{-6}}
    $$

    Parameters
    ----------
    heads : int
        ``H``.
    head_channels : int
        ``d``, the channels of one head.
    explicit_bias : bool
        The released explicit-bias branch (``k_bias``, ``e_bias``, ``v_bias``); default False.
    overwrite : bool
        With ``explicit_bias``: the weights read ``s_p = b_p`` only, as GraphiT's released
        ``exp('score_bias')`` overwrites ``exp('score')``; default False (GT's sum).

    Shapes
    ------
    ``nodes``: ``V`` and (with scores) ``Q``, ``K`` ``(N, H, d)``, ``Q_2``, ``K_2`` with
    ``real``; ``edges``: ``E`` (and ``E_2``) ``(P, H, d)``; ``real (P,)`` bool or None;
    ``multiplier (P, H)``, ``(P, 1)`` or None; ``biases`` ``(H, d)`` each -> ``out (N, H, d)``.
    """

    heads: int  # H
    head_channels: int  # d
    explicit_bias: bool = False  # propagate_attention_explicit_bias
    overwrite: bool = False  # GraphiT's released score_soft overwrite

    def __post_init__(self) -> None:
        for name in ("heads", "head_channels"):
            check_positive_int(getattr(self, name), f"PairAttention {name}")
        for name in ("explicit_bias", "overwrite"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"PairAttention {name}"))
        if self.overwrite and not self.explicit_bias:
            raise ValueError("PairAttention overwrite needs explicit_bias: it replaces s by b")

    def forward(
        self,
        nodes: dict[str, Any],
        edges: dict[str, Any],
        src: Segments,
        dst: Segments,
        real: Any = None,
        multiplier: Any = None,
        biases: dict[str, Any] | None = None,
    ) -> tuple[Any, PairAttentionCache]:
        """``(out (N, H, d), cache)`` from the blocks' checked projections (class docstring);
        without ``Q`` in ``nodes`` the scores are the released ``edge_feat=False`` ones."""
        xp, d = src.xp, self.head_channels
        scale = 1 / math.sqrt(d)
        values = nodes["V"]
        q_pairs = k_pairs = e_pairs = a = score_bias = scores = raw = inside = None
        if "Q" in nodes:
            # F1 per pair: the real pairs' projections, or the others' (P, H, d)
            q_pairs, k_pairs, e_pairs = gather(nodes["Q"], dst), gather(nodes["K"], src), edges["E"]
            if real is not None:
                mask = real[:, None, None]  # (P, 1, 1)
                q_pairs = xp.where(mask, q_pairs, gather(nodes["Q_2"], dst))
                k_pairs = xp.where(mask, k_pairs, gather(nodes["K_2"], src))
                e_pairs = xp.where(mask, e_pairs, edges["E_2"])
            # F2 channel-wise key times query, scaled (P, H, d)
            a = k_pairs * q_pairs * scale
            # F3 times the projected pair features; F3' plus the explicit bias
            scores = a * e_pairs
            if self.explicit_bias:  # F2' the bias score (P, H)
                score_bias = dot_per_head(q_pairs, biases["k_bias"]) * scale
                scores += scale_per_head(score_bias, biases["e_bias"])
            raw = score_bias if self.overwrite else sum_channels(scores)  # (P, H)
            # F4 clamped exponential (P, H)
            inside = (raw > -CLAMP) & (raw < CLAMP)  # the clamp's derivative, torch's
            exps = xp.exp(xp.clip(raw, -CLAMP, CLAMP))
        else:  # F1-F4 the released edge_feat=False: the scores are ones, w = exp(min(d, 5))
            exps = xp.full((src.num_items, self.heads), math.exp(min(d, CLAMP)), values.dtype)
        weights = exps if multiplier is None else exps * multiplier
        # F5 weighted sums over each target's incoming pairs; F5' the bias value
        z = segment_sum(weights, dst)  # (N, H)
        m = propagate(values, weights, src, dst)  # (N, H, d)
        if self.explicit_bias:
            m = m + z[:, :, None] * biases["v_bias"]
        # F6 normalise with the authors' eps (N, H, d)
        out = m / (z + DENOMINATOR_EPS)[:, :, None]
        cache = PairAttentionCache(
            src, dst, real, values, q_pairs, k_pairs, e_pairs, a, score_bias, scores, raw,
            inside, exps, multiplier, weights, z, out,
        )  # fmt: skip
        return out, cache

    def backward(
        self,
        cache: PairAttentionCache,
        d_out: Any,
        d_scores: Any = None,
        biases: dict[str, Any] | None = None,
    ) -> PairAttentionGrads:
        """Gradients of ``<d_out, out> + <d_scores, t>`` for ``d_out (N, H, d)`` and
        ``d_scores (P, H, d)`` (None: the edge output is unused); B6-B1 of the module
        docstring, on cotangents the block checked."""
        c, d = cache, self.head_channels
        scale = 1 / math.sqrt(d)
        d_biases: dict[str, Any] = {}
        # B6 (of F6) the quotient m / (z + eps)
        d_m = d_out / (c.z + DENOMINATOR_EPS)[:, :, None]  # (N, H, d)
        d_z = -sum_channels(d_m * c.out)  # (N, H)
        if self.explicit_bias:  # B5 (of F5') m += z v_bias
            d_biases["v_bias"] = sum_per_head(c.z, d_m)  # (H, d)
            d_z = d_z + dot_per_head(d_m, biases["v_bias"])
        # B5 (of F5) the weighted sums: d_w from the values and from z
        d_values, d_w = propagate_backward(c.values, c.weights, d_m, c.src, c.dst)
        d_w = d_w + gather(d_z, c.dst)  # (P, H)
        # B4 (of F4) the multiplier, the exponential and the clamp (0 on the boundary)
        d_multiplier = None if c.multiplier is None else d_w * c.exps
        if c.scores is None:  # F1-F3 were constants: nothing but V has a gradient
            return PairAttentionGrads({"V": d_values}, {}, d_biases, d_multiplier)
        d_raw = d_w * c.weights * c.inside  # (P, H)
        # B3 (of F3) the channel sum broadcasts d_s; the edge output adds its own cotangent
        if self.overwrite:  # s = b: the scores t reach only the edge output
            xp = get_array_module(d_raw)
            d_t = xp.zeros_like(c.scores) if d_scores is None else d_scores
        else:
            d_t = _repeat_channels(d_raw, d)  # (P, H, d)
            if d_scores is not None:
                d_t += d_scores
        d_e_pairs = d_t * c.a  # (P, H, d)
        d_a = d_t * c.e_pairs
        # B2 (of F2) k q / sqrt(d): each side gets the other
        d_q_pairs = c.k_pairs * d_a * scale  # (P, H, d)
        d_k_pairs = c.q_pairs * d_a * scale
        if self.explicit_bias:  # B3' (of F3') and B2' (of F2') the bias score, scaled
            d_b = dot_per_head(d_t, biases["e_bias"])  # (P, H)
            if self.overwrite:
                d_b = d_b + d_raw
            d_b = d_b * scale
            d_biases["k_bias"] = sum_per_head(d_b, c.q_pairs)
            d_biases["e_bias"] = sum_per_head(c.score_bias, d_t)
            d_q_pairs += scale_per_head(d_b, biases["k_bias"])
        # B1 (of F1) pairs back to nodes: real pairs to Q, K, E, the others to Q_2, K_2, E_2
        d_nodes, d_edges = {"V": d_values}, {}
        if c.real is None:
            d_nodes["Q"], d_nodes["K"] = (
                segment_sum(d_q_pairs, c.dst),
                segment_sum(d_k_pairs, c.src),
            )
            d_edges["E"] = d_e_pairs
        else:
            for suffix, mask in (("", c.real), ("_2", ~c.real)):
                mask = mask[:, None, None]  # (P, 1, 1)
                d_nodes[f"Q{suffix}"] = segment_sum(d_q_pairs * mask, c.dst)
                d_nodes[f"K{suffix}"] = segment_sum(d_k_pairs * mask, c.src)
                d_edges[f"E{suffix}"] = d_e_pairs * mask
        return PairAttentionGrads(d_nodes, d_edges, d_biases, d_multiplier)


def _repeat_channels(values: Any, channels: int) -> Any:
    """``(P, H)`` -> ``(P, H, channels)``, each entry repeated over the channels (the adjoint
    of :func:`~refimpl.ops.heads.sum_channels`); a new array."""
    return get_array_module(values).repeat(values[:, :, None], channels, axis=2)


# -- what GraphiT's and SAN's blocks share around the core ------------------------------------
def pair_maps(full_graph: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The projections of ``h``, ``Q, K, [Q_2, K_2,] V``, and of ``e``, ``E[, E_2]``, in order.

    Parameters
    ----------
    full_graph : bool
        Whether the ``_2`` maps for the non-edges of a full graph exist.
    """
    if full_graph:
        return ("Q", "K", "Q_2", "K_2", "V"), ("E", "E_2")
    return ("Q", "K", "V"), ("E",)


def pair_param_shapes(channels: int, full_graph: bool, bias: bool) -> dict[str, tuple[int, ...]]:
    """``W_* (D, D)`` (and ``b_* (D,)``) in the released order ``Q, K, E, [Q_2, K_2, E_2,] V``.

    Parameters
    ----------
    channels : int
        ``D``.
    full_graph : bool
        With the ``_2`` maps.
    bias : bool
        With the biases.
    """
    order = ("Q", "K", "E", "Q_2", "K_2", "E_2", "V") if full_graph else ("Q", "K", "E", "V")
    shapes: dict[str, tuple[int, ...]] = {}
    for name in order:
        shapes[f"W_{name}"] = (channels, channels)
        if bias:
            shapes[f"b_{name}"] = (channels,)
    return shapes


def check_pair_inputs(
    owner: str, h: Any, graph: Any, e: Any, real: Any, channels: int, full_graph: bool
) -> Any:
    """Check the pairs graph, the pair features and the ``real`` mask, in one line each.

    Parameters
    ----------
    owner : str
        The layer's name, for the messages.
    h : (N, D) array
        The node features.
    graph : Graph
        The pairs graph, on ``h``'s rows.
    e : (P, channels) array
        The pair features, in ``h``'s dtype.
    real : (P,) bool array or None
        Which pairs are edges (None: all; non-edges only with ``full_graph``).
    channels : int
        ``D``, the width of ``e``.
    full_graph : bool
        Whether the layer attends over non-edges.

    Returns
    -------
    (P,) bool array or None
        The mask the core reads: ``real`` with ``full_graph`` (True where None), else None.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"{owner} graph must be a refimpl.Graph, got {type(graph).__name__}")
    if graph.num_nodes != h.shape[0]:
        raise ValueError(
            f"{owner}: h has {h.shape[0]} rows but the pairs graph has {graph.num_nodes} "
            "nodes; pass the graph the features belong to"
        )
    check_input(e, "e", shape=(graph.num_edges, channels))
    if e.dtype != h.dtype:
        raise TypeError(f"e has dtype {e.dtype} but h has {h.dtype}; cast e")
    if real is None:
        return get_array_module(h).ones(graph.num_edges, dtype=bool) if full_graph else None
    check_array(real, "real", shape=(graph.num_edges,), floating=False)
    get_array_module(real, h)  # TypeError if real is on another backend
    if real.dtype.kind != "b":
        raise TypeError(f"real must be a bool array (True = an edge), got {real.dtype}")
    if not full_graph and not bool(real.all()):
        raise ValueError(
            f"{owner} with full_graph=False attends over edges only, but real marks non-edges; "
            "use full_graph=True or pass the input graph with real=None"
        )
    return real if full_graph else None
