"""``GTLayer``: one layer of Dwivedi & Bresson's graph transformer with edge features (GT, 2021,
Eq. 9-14), as the massive-activation study's released code runs it
(``GraphTransformerLayer`` in ``graph_transformer_edge_layer.py``).

With ``D = channels`` (the node and edge streams both ``D`` wide)::

    F1  (a_h, a_e) = GTAttention(h, e)        (N, D), (E, D)   released MultiHeadAttentionLayer
    F2  h_out = TransformerStream_node(a_h, h)  (N, D)         dropout, O_h, residual, norm,
    F3  e_out = TransformerStream_edge(a_e, e)  (E, D)         FFN_h, residual, norm (and _e)

:class:`~refimpl.nn.transformer.gt_attention.GTAttention` holds F1's equations (the clamp,
the ``1e-6``, the explicit bias), :class:`~refimpl.nn.transformer.stream.TransformerStream`
F2 and F3's. ``a_h`` and ``a_e`` are what the study logs as ``malog_h['attention']`` and
``malog_e['attention']`` (``cache.attention_h``, ``cache.attention_e``).

Without edge features (``edge_features=False``, the released ``edge_feat=False``) F1's
attention is the released uniform mean (see GTAttention), F3 is skipped, ``e`` is not taken
and the layer returns ``(h_out, None)`` (the released layer returns its ``e`` unchanged).

Parameters: ``attention.{GTAttention names}``, ``node.{TransformerStream names}``,
``edge.{TransformerStream names}`` (with edge features). State (batch norm's running
statistics): ``node.norm1.running_mean`` and so on, likewise. Randomness: ``noise`` keys
``node.dropout1``, ``node.dropout2``, ``edge.dropout1``, ``edge.dropout2`` (drawn in that
order from ``rng`` when not given); ``cache.noise`` replays a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module
from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.nn.overflow import backward_checked
from refimpl.nn.stacks import block_backward, flat_param_shapes, init_flat_params, split_params
from refimpl.nn.transformer.gt_attention import GTAttention, GTAttentionCache
from refimpl.nn.transformer.stream import StreamCache, TransformerStream
from refimpl.validation import check_cotangent

__all__ = ["GTLayer", "GTLayerCache"]


class GTLayerCache(NamedTuple):
    """What :meth:`GTLayer.backward` reads, and what the massive-activation study logs.

    Attributes
    ----------
    attention : GTAttentionCache
        F1.
    node : StreamCache
        F2.
    edge : StreamCache or None
        F3, None without edge features.
    attention_h : (N, D) array
        The attention's node output, the released ``malog_h['attention']``.
    attention_e : (E, D) array or None
        The attention's edge output, the released ``malog_e['attention']``; None without
        edge features.
    state : dict
        The running statistics after this call (a new dict).
    noise : dict
        The keep-masks used, as forward(noise=...) takes them.
    """

    attention: GTAttentionCache
    node: StreamCache
    edge: StreamCache | None
    attention_h: Any
    attention_e: Any
    state: dict[str, Any]
    noise: dict[str, Any]


@dataclass(frozen=True)
class GTLayer:
    r"""Dwivedi & Bresson's GT layer with edge features as released: :class:`GTAttention`, then
    a :class:`TransformerStream` on the nodes and one on the edges (GT Eq. 9-14; the module
    docstring has the steps).

    With $(\hat h, \hat e)$ = :class:`GTAttention` $(h, e)$, each stream
    (:class:`TransformerStream`: the output projection, residuals, norms and FFN of Dwivedi &
    Bresson (2021) Eq. (9)-(14), in the released order) maps an attention output $a$ and its
    input $x$ to

    $$
    z = \operatorname{Norm}_1\left(x + \operatorname{Drop}(a) W_O^\top + b_O\right), \quad
    y = \operatorname{Norm}_2\left(z + \operatorname{Drop}\left(\operatorname{ReLU}(z W_1^\top
    + b_1)\right) W_2^\top + b_2\right)
    $$

    with $(a, x) = (\hat h, h)$ for the node output and $(\hat e, e)$ for the edge output.

    Parameters
    ----------
    channels : int
        ``D``, the width of ``h``, ``e`` and the outputs (the released ``in_dim = out_dim``).
    heads : int
        ``H``, dividing ``D``; default 8 (the study's ZINC configs).
    ffn_channels : int or None
        The FFNs' hidden width; None (default) is ``2 D``, as released.
    dropout : float
        Both streams' dropout (F1 and F6 of each), in ``[0, 1)``; default 0.
    norm : str
        ``"batch"`` (default, as released), ``"layer"``, ``"none"`` or ``"layer+batch"``.
    residual : bool
        The streams' residual connections; default True.
    edge_features : bool
        Edge features and the edge stream (default True; False: the released
        ``edge_feat=False``, uniform attention).
    qkv_bias : bool
        Biases on ``Q``, ``K``, ``V``, ``proj_e`` (the released ``use_bias``); default False.
    explicit_bias : bool
        The released explicit-bias attention (``k_bias``, ``e_bias``, ``v_bias``); default
        False.

    Shapes
    ------
    h : (N, D); e : (E, D) (None without edge features); outputs (N, D) and (E, D) or None.
    """

    channels: int  # D
    heads: int = 8  # H
    ffn_channels: int | None = None  # None: 2 D
    dropout: float = 0.0
    norm: str = "batch"  # the released default
    residual: bool = True
    edge_features: bool = True  # the released edge_feat
    qkv_bias: bool = False  # the released use_bias
    explicit_bias: bool = False
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "GTLayer channels")
        for name in ("residual", "edge_features", "qkv_bias", "explicit_bias"):
            object.__setattr__(self, name, check_bool(getattr(self, name), f"GTLayer {name}"))
        flag = self.edge_features
        d = self.channels
        stream = TransformerStream(d, self.ffn_channels, self.dropout, self.norm, self.residual)
        blocks: dict[str, Any] = {
            "attention": GTAttention(
                d, d, self.heads, d if flag else None, self.qkv_bias, self.explicit_bias
            ),
            "node": stream,
        }
        if flag:
            blocks["edge"] = stream
        object.__setattr__(self, "blocks", blocks)

    # -- parameters and state -----------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    def _streams(self) -> list[str]:
        return ["node", "edge"] if self.edge_features else ["node"]

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{stream}.{TransformerStream state name}`` and shapes; ``{}`` without batch norm."""
        return {
            f"{prefix}.{name}": shape
            for prefix in self._streams()
            for name, shape in self.blocks[prefix].state_shapes().items()
        }

    def init_state(self, backend: str | None = None, dtype: Any = np.float64) -> dict[str, Any]:
        """Fresh running statistics of both streams' batch norms."""
        return {
            f"{prefix}.{name}": value
            for prefix in self._streams()
            for name, value in self.blocks[prefix].init_state(backend, dtype).items()
        }

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        h: Any,
        graph: Graph,
        e: Any = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> tuple[tuple[Any, Any], GTLayerCache]:
        """``((h_out (N, D), e_out (E, D) or None), cache)``; ``state`` as
        :meth:`TransformerStream.forward` takes it, with the stream's prefix (None: fresh
        statistics, training only); masks from ``noise`` or drawn from ``rng``."""
        noise, state = dict(noise or {}), None if state is None else dict(state)
        streams = self._streams()
        keys = [f"{s}.{k}" for s in streams for k in ("dropout1", "dropout2")]
        unknown = sorted(set(noise) - set(keys))
        if unknown:
            raise ValueError(f"noise has unknown keys {unknown}; GTLayer takes {keys}")
        if state is not None:
            unknown = sorted(set(state) - set(self.state_shapes()))
            if unknown:
                raise ValueError(
                    f"state has unknown keys {unknown}; create it with GTLayer.init_state"
                )
        # F1 the attention (its forward checks h, graph and e)
        (a_h, a_e), attention = self.blocks["attention"].forward(
            split_params(self.blocks, params, "attention"), h, graph, e
        )
        caches, new_state, used = {}, {}, {}
        outputs = {}
        for prefix, a, x in (("node", a_h, h), ("edge", a_e, e))[: len(streams)]:
            # F2 / F3 the stream
            outputs[prefix], caches[prefix] = self.blocks[prefix].forward(
                split_params(self.blocks, params, prefix),
                a,
                x,
                training=training,
                rng=rng,
                noise=_unprefixed(noise, prefix),
                state=None if state is None else _unprefixed(state, prefix),
            )
            new_state.update({f"{prefix}.{k}": v for k, v in caches[prefix].state.items()})
            used.update({f"{prefix}.{k}": v for k, v in caches[prefix].noise.items()})
        cache = GTLayerCache(
            attention, caches["node"], caches.get("edge"), a_h, a_e, new_state, used
        )
        return (outputs["node"], outputs.get("edge")), cache

    # -- backward ----------------------------------------------------------------------
    def backward(
        self, params: dict[str, Any], cache: GTLayerCache, d_out: tuple[Any, Any]
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """Gradients of ``<d_h_out, h_out> + <d_e_out, e_out>`` for ``d_out = (d_h_out,
        d_e_out)`` (``d_e_out`` None: the edge output is unused, as after the last layer):
        ``((d_h (N, D), d_e (E, D) or None), d_params)``."""
        if not isinstance(d_out, tuple) or len(d_out) != 2:
            raise TypeError(
                "GTLayer.backward takes d_out = (d_h_out, d_e_out), d_e_out None when the edge "
                f"output is unused; got {type(d_out).__name__}"
            )
        d_h_out, d_e_out = d_out
        out = cache.node.out
        check_cotangent(d_h_out, out.shape, out.dtype, out, name="d_h_out")
        if d_e_out is not None:
            if cache.edge is None:
                raise ValueError(
                    "d_e_out was given but this GTLayer has no edge output "
                    "(edge_features=False); pass d_out = (d_h_out, None)"
                )
            edge_out = cache.edge.out
            check_cotangent(d_e_out, edge_out.shape, edge_out.dtype, out, name="d_e_out")
        return backward_checked(
            lambda: self._backward(params, cache, d_h_out, d_e_out), "GTLayer", out.dtype
        )

    def _backward(
        self, params: dict[str, Any], cache: GTLayerCache, d_h_out: Any, d_e_out: Any
    ) -> tuple[tuple[Any, Any], dict[str, Any]]:
        """B3-B1 of :meth:`backward` on checked cotangents."""
        blocks, d_params = self.blocks, {}
        # B3 (of F3) the edge stream; without a cotangent its parameters get zeros
        d_a_e = d_res_e = None
        if cache.edge is not None:
            d_e = (
                d_e_out
                if d_e_out is not None
                else get_array_module(d_h_out).zeros_like(cache.edge.out)
            )
            d_a_e, d_res_e = block_backward(blocks, params, "edge", cache.edge, d_e, d_params)
        # B2 (of F2) the node stream
        d_a_h, d_res_h = block_backward(blocks, params, "node", cache.node, d_h_out, d_params)
        # B1 (of F1) the attention; h and e also fed the residuals of F2 and F3
        d_h, d_e = block_backward(
            blocks, params, "attention", cache.attention, (d_a_h, d_a_e), d_params
        )
        d_h = d_h + d_res_h
        if d_e is not None:
            d_e = d_e + d_res_e
        return (d_h, d_e), {name: d_params[name] for name in params}


def _unprefixed(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``values`` under ``{prefix}.``, without the prefix."""
    return {
        k.removeprefix(f"{prefix}."): v for k, v in values.items() if k.startswith(f"{prefix}.")
    }
