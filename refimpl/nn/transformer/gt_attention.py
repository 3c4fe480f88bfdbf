"""``GTAttention``: the edge-aware multi-head attention of Dwivedi & Bresson's graph transformer
(GT, 2021, Eq. 10-12 with edge features), as the massive-activation study's released code
computes it (``MultiHeadAttentionLayer`` in ``graph_transformer_edge_layer.py``).

For an edge ``u -> v`` (``u`` the source, ``v`` the target), head ``h`` with ``d_k = D / H``
channels, ``c`` a channel, ``P`` the projected edge features::

    F1  q_v = Q h_v,  k_u = K h_u,  val_u = V h_u      (N, H, d_k)   Q, K, V (no bias)
        P_uv = E e_uv                                   (E, H, d_k)   proj_e
    F2  a_uv,c = k_u,c q_v,c / sqrt(d_k)                (E, H, d_k)   src_dot_dst, scaling
    F3  s_uv,c = a_uv,c P_uv,c                          (E, H, d_k)   imp_exp_attn
    F4  w_uv = exp(clamp(sum_c s_uv,c, -5, 5))          (E, H)        exp
    F5  z_v = sum_{u in N(v)} w_uv;  m_v = sum_u w_uv val_u           send_and_recv
    F6  h_out_v = m_v / (z_v + 1e-6)                    (N, H, d_k)   heads concatenated (N, D)
        e_out_uv = s_uv                                 (E, H, d_k)   out_edge_features, (E, D)

Two constants are the authors', not the paper's softmax: the clamp to ``[-5, 5]`` ("for
softmax numerical stability") and the ``1e-6`` added to every denominator. The clamp's
derivative is torch's: 1 strictly inside ``(-5, 5)``, 0 on the boundary and outside (so an
edge whose score sum is exactly 5 passes no gradient back through its weight). A node
without incoming edges gets ``h_out = 0 / 1e-6 = 0``.

``explicit_bias=True`` is the released ``propagate_attention_explicit_bias``, with three
per-head parameters ``k_bias (H, d_k, 1)``, ``e_bias (H, 1, d_k)``, ``v_bias (H, 1, d_k)``
(drawn standard normal, as ``torch.randn``)::

    F2' b_uv = q_v . k_bias / sqrt(d_k)                 (E, H)   a bias key every target reads
    F3' s_uv,c = a_uv,c P_uv,c + b_uv e_bias_c          (E, H, d_k)
    F5' m_v = sum_u w_uv (val_u + v_bias)                        a bias value every edge sends

so ``sum_c s`` gains ``b_uv sum_c e_bias_c``, and each message the constant ``v_bias``
weighted like the value it is added to: ``m_v = sum_u w_uv val_u + z_v v_bias``.

Without edge features (``edge_dim=None``; the released ``edge_feat=False``) the released code
replaces the scores by ones (``imp_exp_attn`` and ``exp`` with ``edge_feat=False``):
``s = 1``, every ``w_uv = exp(min(d_k, 5))``, so the attention is a plain mean over the
incoming edges (``h_out_v = w sum_u val_u / (deg_v w + 1e-6)``), ``Q``, ``K`` (and
``k_bias``, ``e_bias``) get zero gradient, and there is no edge output (``e_out`` is None;
the released layer passes its ``e`` through unchanged). This is reproduced, not repaired.

Parameters, with the released names: ``W_q (D, in)`` (``Q.weight``), ``b_q`` (``Q.bias``,
with ``qkv_bias``), ``W_k``, ``b_k``, ``W_v``, ``b_v``, ``W_e (D, edge_dim)``
(``proj_e.weight``, with ``edge_dim``), ``b_e``, then ``k_bias``, ``e_bias``, ``v_bias``
(with ``explicit_bias``). The linears are Glorot-uniform with zero biases (the project's
initialisation; the released code keeps ``torch.nn.Linear``'s default).

The equations above and their backward are computed by the shared core
:class:`~refimpl.nn.transformer.pair_attention.PairAttention` (F1-F6, B6-B1), which GraphiT-GT
and SAN also use; this block makes the projections, checks its inputs and maps its parameters
(``k_bias (H, d_k, 1)`` is the core's ``(H, d_k)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.nn.attention_common import glorot, project, project_backward
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.nn.transformer.pair_attention import (
    CLAMP,
    DENOMINATOR_EPS,
    PairAttention,
    PairAttentionCache,
)
from refimpl.validation import (
    check_block_inputs,
    check_cotangent,
    check_graph_rows,
    check_optional_input,
)

__all__ = ["CLAMP", "DENOMINATOR_EPS", "GTAttention", "GTAttentionCache"]


class GTAttentionCache(NamedTuple):
    """What :meth:`GTAttention.backward` reads; the core's steps under GT's names.

    Attributes
    ----------
    h : (N, in) array
        The node input.
    e : (E, edge_dim) array or None
        The edge input, or None.
    core : PairAttentionCache
        F1-F6.
    """

    h: Any
    e: Any
    core: PairAttentionCache

    @property
    def e_out(self) -> Any:
        """``(E, H, d_k)`` F3's scores, the edge output; None without edge features."""
        return self.core.scores

    @property
    def scores(self) -> Any:
        """The same array as :attr:`e_out` (the name GraphiT's and SAN's caches use)."""
        return self.core.scores

    @property
    def inside(self) -> Any:
        """``(E, H)`` bool, ``-5 < sum_c s < 5`` (F4); None without edge features."""
        return self.core.inside

    @property
    def w(self) -> Any:
        """``(E, H)`` F4's weights."""
        return self.core.weights

    @property
    def z(self) -> Any:
        """``(N, H)`` F5's sums of weights."""
        return self.core.z

    @property
    def h_out(self) -> Any:
        """``(N, H, d_k)`` F6."""
        return self.core.out


@dataclass(frozen=True)
class GTAttention:
    r"""Dwivedi & Bresson's edge-aware graph attention as released (``MultiHeadAttentionLayer``
    of ``graph_transformer_edge_layer.py``): channel-wise scores scaled by the projected edge
    features, ``exp(clamp(., -5, 5))`` weights, ``1e-6`` in the denominator (the module
    docstring has the steps and the explicit-bias variant).

    Per head ($d_k = D / H$ channels) and edge $u \to v$, Dwivedi & Bresson (2021) Eq. (10)-(12)
    as released (the channel-wise product by the edge term, the clamp and the $10^{-6}$ are the
    released code's):

    $$
    s_{uv} = \frac{K h_u \odot Q h_v}{\sqrt{d_k}} \odot E e_{uv}, \quad
    w_{uv} = \exp\left(\operatorname{clamp}\left(\textstyle\sum_c s_{uv,c}, -5, 5\right)\right)
    $$

    $$
    \hat h_v = \frac{\sum_{u} w_{uv} V h_u}{\sum_{u} w_{uv} + 10^{-6}}, \quad
    \hat e_{uv} = s_{uv}
    $$

    Parameters
    ----------
    in_channels : int
        Width of the node input ``h`` (the released ``in_dim``).
    out_channels : int
        ``D``, the concatenated heads' width (the released layer's ``out_dim``); divisible by
        ``heads``.
    heads : int
        ``H``; default 8 (the study's ZINC configs). ``d_k = D / H``.
    edge_dim : int or None
        Width of the edge input ``e`` (``in_dim`` in the released layer, whose edge stream
        has the nodes' width); None (default): no edge features, the released
        ``edge_feat=False`` (uniform attention: module docstring).
    qkv_bias : bool
        Biases on ``Q``, ``K``, ``V`` and ``proj_e`` (the released ``use_bias``); default
        False.
    explicit_bias : bool
        The released ``propagate_attention_explicit_bias`` with ``k_bias``, ``e_bias``,
        ``v_bias``; default False.

    Shapes
    ------
    h : (N, in_channels); e : (E, edge_dim) or None; h_out : (N, D); e_out : (E, D) or None.
    """

    in_channels: int
    out_channels: int  # D
    heads: int = 8  # H
    edge_dim: int | None = None  # None: the released edge_feat=False
    qkv_bias: bool = False  # the released use_bias (default False)
    explicit_bias: bool = False  # propagate_attention_explicit_bias

    def __post_init__(self) -> None:
        for name in ("in_channels", "out_channels", "heads"):
            check_positive_int(getattr(self, name), f"GTAttention {name}")
        if self.edge_dim is not None:
            check_positive_int(self.edge_dim, "GTAttention edge_dim")
        for name in ("qkv_bias", "explicit_bias"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"GTAttention {name}"))
        if self.out_channels % self.heads:
            raise ValueError(
                f"GTAttention out_channels ({self.out_channels}) must be divisible by heads "
                f"({self.heads}): each head is d_k = D / H wide"
            )

    @property
    def head_channels(self) -> int:
        """``d_k = D / H``."""
        return self.out_channels // self.heads

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order (module docstring)."""
        d, heads, d_k = self.out_channels, self.heads, self.head_channels
        sizes = [("q", self.in_channels), ("k", self.in_channels), ("v", self.in_channels)]
        if self.edge_dim is not None:
            sizes.append(("e", self.edge_dim))
        shapes: dict[str, tuple[int, ...]] = {}
        for name, size in sizes:
            shapes[f"W_{name}"] = (d, size)
            if self.qkv_bias:
                shapes[f"b_{name}"] = (d,)
        if self.explicit_bias:
            shapes.update(k_bias=(heads, d_k, 1), e_bias=(heads, 1, d_k), v_bias=(heads, 1, d_k))
        return shapes

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot-uniform weights and zero biases, then the explicit biases standard normal
        (``torch.randn``), drawn from ``rng`` in parameter order."""
        params = {}
        for name, shape in self.param_shapes().items():
            if name.startswith("W_"):
                value = glorot(rng, shape, shape)
            elif name.startswith("b_"):
                value = np.zeros(shape)
            else:
                value = rng.standard_normal(shape)
            params[name] = asarray(value, backend=backend, dtype=dtype)
        return params

    # -- forward -----------------------------------------------------------------------
    @property
    def core(self) -> PairAttention:
        """The shared attention core in this configuration."""
        return PairAttention(self.heads, self.head_channels, self.explicit_bias)

    def forward(
        self, params: dict[str, Any], h: Any, graph: Graph, e: Any = None
    ) -> tuple[tuple[Any, Any], GTAttentionCache]:
        """``((h_out (N, D), e_out (E, D) or None), cache)`` for ``h (N, in_channels)`` on
        ``graph`` with edge features ``e (E, edge_dim)`` (None without ``edge_dim``). Raises
        :class:`~refimpl.validation.NonFiniteError` where an output overflows the dtype."""
        xp = check_block_inputs(params, self.param_shapes(), "GTAttention", h, self.in_channels)
        check_graph_rows(h, graph)
        check_optional_input(e, "e", "edge_dim", self.edge_dim, graph.num_edges, h, "GTAttention")
        n, heads, d_k = h.shape[0], self.heads, self.head_channels
        # F1 projections (N, H, d_k), (E, H, d_k); without edge features only the values
        names = "v" if self.edge_dim is None else "qkv"
        ys = project(params, names, h, self.qkv_bias)
        nodes = {name.upper(): y.reshape(n, heads, d_k) for name, y in zip(names, ys, strict=True)}
        edges = {}
        if self.edge_dim is not None:
            (proj,) = project(params, "e", e, self.qkv_bias)
            edges["E"] = proj.reshape(graph.num_edges, heads, d_k)
        # F2-F6 the shared core
        out, core = self.core.forward(
            nodes, edges, graph.src_segments(xp), graph.dst_segments(xp), biases=_biases(params)
        )
        outputs = (out.reshape(n, self.out_channels), _flat(core.scores))
        check_overflow(outputs, "GTAttention.forward: its output", h.dtype)
        return outputs, GTAttentionCache(h, e, core)

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: GTAttentionCache, d_out: tuple[Any, Any]
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_h_out, h_out> + <d_e_out, e_out>`` for ``d_out = (d_h_out (N, D),
        d_e_out (E, D) or None)`` (None: the edge output is not used): ``((d_h (N, in), d_e
        (E, edge_dim) or None), d_params)``. Raises
        :class:`~refimpl.validation.NonFiniteError` where a gradient overflows the dtype."""
        if not isinstance(d_out, tuple) or len(d_out) != 2:
            raise TypeError(
                "GTAttention.backward takes d_out = (d_h_out, d_e_out), d_e_out None when the "
                f"edge output is unused; got {type(d_out).__name__}"
            )
        d_h_out, d_e_out = d_out
        n, dtype = cache.h.shape[0], cache.h.dtype
        check_cotangent(d_h_out, (n, self.out_channels), dtype, cache.h, name="d_h_out")
        if d_e_out is not None:
            if cache.e_out is None:
                raise ValueError(
                    "d_e_out was given but this GTAttention has no edge output (edge_dim=None); "
                    "pass d_out = (d_h_out, None)"
                )
            rows = cache.e_out.shape[0]
            check_cotangent(d_e_out, (rows, self.out_channels), dtype, cache.h, name="d_e_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_h_out, d_e_out), "GTAttention", dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: GTAttentionCache, d_h_out: Any, d_e_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B6-B1 of :meth:`backward` on checked cotangents."""
        n, heads, d_k = cache.h.shape[0], self.heads, self.head_channels
        # B6-B2 (of F6-F2) the shared core, with the biases in its (H, d_k) shapes
        d_scores = None if d_e_out is None else d_e_out.reshape(cache.e_out.shape)
        grads = self.core.backward(
            cache.core, d_h_out.reshape(n, heads, d_k), d_scores, _biases(params)
        )
        d_params = {name: grad.reshape(params[name].shape) for name, grad in grads.biases.items()}
        # B1 (of F1) the projections
        if self.edge_dim is None:  # F2-F4 were constants: Q, K and the score biases get 0
            xp = get_array_module(grads.nodes["V"])
            unused = [f"{kind}_{name}" for name in "qk" for kind in "Wb"] + ["k_bias", "e_bias"]
            d_params.update(
                {name: xp.zeros_like(params[name]) for name in unused if name in params}
            )
            d_h = project_backward(
                params, "v", cache.h, [grads.nodes["V"]], d_params, self.qkv_bias
            )
            return (d_h, None), {name: d_params[name] for name in params}
        d_nodes = [grads.nodes[name] for name in "QKV"]
        d_h = project_backward(params, "qkv", cache.h, d_nodes, d_params, self.qkv_bias)
        d_e = project_backward(params, "e", cache.e, [grads.edges["E"]], d_params, self.qkv_bias)
        return (d_h, d_e), {name: d_params[name] for name in params}


def _biases(params: dict[str, Any]) -> dict[str, Any] | None:
    """The explicit biases in the core's ``(H, d_k)`` shapes (None without them)."""
    if "k_bias" not in params:
        return None
    return {
        "k_bias": params["k_bias"][:, :, 0],
        "e_bias": params["e_bias"][:, 0, :],
        "v_bias": params["v_bias"][:, 0, :],
    }


def _flat(values: Any) -> Any:
    """``(E, H, d_k)`` -> ``(E, H d_k)`` (heads concatenated), None stays None; the width
    spelled out, as -1 cannot be resolved for ``E = 0``."""
    return None if values is None else values.reshape(values.shape[0], math.prod(values.shape[1:]))
