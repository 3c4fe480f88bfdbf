"""Literal twins of the massive-activation study's three layers, forward and backward: GT's
``GTLayer`` (:mod:`refimpl.nn.transformer.gt_layer`), GraphiT-GT's ``GraphiTLayer`` and SAN's
``SANLayer`` (:mod:`refimpl.nn.transformer.graphit_layer`, ``san_layer``).

Never optimised: each layer is its attention's literal twin (per edge or per pair:
:mod:`refimpl.naive.gt_attention`, :mod:`refimpl.naive.graphit`, :mod:`refimpl.naive.san`)
followed by the stream's (row by row: :mod:`refimpl.naive.stream`), as the released
``forward`` methods read; NumPy on the host, float64, no cache (the backward runs the forward
again). The layers are read for their configuration only (their attention block and their
stream blocks). Steps numbered as the layers'::

    GT (GraphTransformerLayer.forward, graph_transformer_edge_layer.py)
    F1  (a_h, a_e) = GTAttention(h, e)                   attention
    F2  h_out = Stream_node(a_h, h)                      dropout, O_h, .., batch_norm2_h
    F3  e_out = Stream_edge(a_e, e)                      dropout, O_e, .., batch_norm2_e
    B3  (of F3) d_a_e, d_e = edge stream backward  (a zero cotangent when d_e_out is None)
    B2  (of F2) d_a_h, d_h = node stream backward
    B1  (of F1) the attention's backward; d_h, d_e add the residuals' shares

    GraphiT-GT (GraphiT_GT_Layer.forward) and SAN (SAN_GT_Layer.forward)
    F1  a = Attention(h, pairs, e, ...)                  attention_h (GraphiT: its scores unused)
    F2  out = Stream(a, h)                               dropout, O_h, .., batch_norm2_h
    B2  (of F2) d_a, d_h = stream backward
    B1  (of F1) the attention's backward (GraphiT: a zero cotangent on its scores); d_h adds
        the residual's share; d_e is the attention's alone (e passes through the layer)

Parameters, state and noise keys are the layers': ``attention.*``, ``node.*`` and ``edge.*``
(GT) or ``stream.*`` (GraphiT, SAN); noise keys ``node.dropout1`` .. (GT) or ``dropout1``,
``dropout2`` (GraphiT, SAN), the masks a layer's ``cache.noise`` holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.graph import Graph
from refimpl.naive.graphit import graphit_attention_backward, graphit_attention_forward
from refimpl.naive.gt_attention import gt_attention_backward, gt_attention_forward
from refimpl.naive.san import san_attention_backward, san_attention_forward
from refimpl.naive.stream import stream_backward, stream_forward

__all__ = [
    "graphit_layer_backward",
    "graphit_layer_forward",
    "gt_layer_backward",
    "gt_layer_forward",
    "san_layer_backward",
    "san_layer_forward",
]


def _under(values: dict | None, prefix: str) -> dict:
    """The entries of ``values`` under ``{prefix}.``, without the prefix."""
    start = f"{prefix}."
    return {k[len(start) :]: v for k, v in (values or {}).items() if k.startswith(start)}


def _with(values: dict, prefix: str) -> dict:
    """``values`` with every key under ``{prefix}.``."""
    return {f"{prefix}.{k}": v for k, v in values.items()}


# -- GT ----------------------------------------------------------------------------------------


def gt_layer_forward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray | None = None,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray | None], dict]:
    """``((h_out (N, D), e_out (E, D) or None), state after the call)`` of ``GTLayer``
    ``layer``, literally."""
    streams = ["node", "edge"] if layer.edge_features else ["node"]
    # F1 the attention, edge by edge
    a_h, a_e, _ = gt_attention_forward(
        layer.blocks["attention"], _under(params, "attention"), h, graph.edge_index, e
    )
    outputs, new_state = {}, {}
    # F2, F3 the streams, row by row
    for prefix, a, x in (("node", a_h, h), ("edge", a_e, e))[: len(streams)]:
        outputs[prefix], own = stream_forward(
            layer.blocks[prefix],
            _under(params, prefix),
            a,
            x,
            training,
            _under(state, prefix),
            _under(noise, prefix),
        )
        new_state.update(_with(own, prefix))
    return (outputs["node"], outputs.get("edge")), new_state


def gt_layer_backward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray | None,
    d_out: tuple[np.ndarray, np.ndarray | None],
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray | None], dict]:
    """``((d_h, d_e or None), d_params)`` of ``<d_h_out, h_out> + <d_e_out, e_out>`` for
    ``d_out = (d_h_out, d_e_out)`` (``d_e_out`` None: the edge output unused): the forward
    again, then B3 to B1."""
    d_h_out, d_e_out = d_out
    attention, att_params = layer.blocks["attention"], _under(params, "attention")
    a_h, a_e, steps = gt_attention_forward(attention, att_params, h, graph.edge_index, e)
    d_params: dict = {}
    # B3 (of F3) the edge stream
    d_a_e = d_res_e = None
    if layer.edge_features:
        d_e_stream = np.zeros_like(a_e) if d_e_out is None else d_e_out
        (d_a_e, d_res_e), own = stream_backward(
            layer.blocks["edge"],
            _under(params, "edge"),
            a_e,
            e,
            d_e_stream,
            training,
            _under(state, "edge"),
            _under(noise, "edge"),
        )
        d_params.update(_with(own, "edge"))
    # B2 (of F2) the node stream
    (d_a_h, d_res_h), own = stream_backward(
        layer.blocks["node"],
        _under(params, "node"),
        a_h,
        h,
        d_h_out,
        training,
        _under(state, "node"),
        _under(noise, "node"),
    )
    d_params.update(_with(own, "node"))
    # B1 (of F1) the attention; h and e also fed the streams' residuals
    d_h, d_e, own = gt_attention_backward(attention, att_params, h, e, steps, d_a_h, d_a_e)
    d_params.update(_with(own, "attention"))
    d_h = d_h + d_res_h
    if d_e is not None:
        d_e = d_e + d_res_e
    return (d_h, d_e), {name: d_params[name] for name in params}


# -- GraphiT-GT and SAN: an attention, then one node stream ------------------------------------


def _node_stream_forward(
    layer: Any,
    params: dict,
    a: np.ndarray,
    h: np.ndarray,
    training: bool,
    state: Any,
    noise: Any,
) -> tuple[np.ndarray, dict]:
    """F2 of GraphiT-GT's and SAN's layers: ``(out, state after the call, keys stream.*)``."""
    out, own = stream_forward(
        layer.blocks["stream"],
        _under(params, "stream"),
        a,
        h,
        training,
        _under(state, "stream"),
        noise,
    )
    return out, _with(own, "stream")


def _node_stream_backward(
    layer: Any,
    params: dict,
    a: np.ndarray,
    h: np.ndarray,
    d_out: np.ndarray,
    training: bool,
    state: Any,
    noise: Any,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """B2 of GraphiT-GT's and SAN's layers: ``(d_a, d_h of the residual, d_params stream.*)``."""
    (d_a, d_residual), own = stream_backward(
        layer.blocks["stream"],
        _under(params, "stream"),
        a,
        h,
        d_out,
        training,
        _under(state, "stream"),
        noise,
    )
    return d_a, d_residual, _with(own, "stream")


def graphit_layer_forward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray,
    kernel: Any = None,
    real: Any = None,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[np.ndarray, dict]:
    """``(out (N, D), state after the call)`` of ``GraphiTLayer`` ``layer``, literally."""
    # F1 the attention, pair by pair (its scores feed nothing further)
    a, _ = graphit_attention_forward(
        layer.blocks["attention"], _under(params, "attention"), h, graph, e, kernel, real
    )
    # F2 the node stream, row by row
    return _node_stream_forward(layer, params, a, h, training, state, noise)


def graphit_layer_backward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray,
    kernel: Any,
    real: Any,
    d_out: np.ndarray,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """``((d_h, d_e), d_params)`` of ``<d_out, out>``: the forward again, then B2, B1."""
    attention, att_params = layer.blocks["attention"], _under(params, "attention")
    a, scores = graphit_attention_forward(attention, att_params, h, graph, e, kernel, real)
    # B2 (of F2)
    d_a, d_residual, d_params = _node_stream_backward(
        layer, params, a, h, d_out, training, state, noise
    )
    # B1 (of F1): the scores are unused, so their cotangent is zero
    d_h, d_e, own = graphit_attention_backward(
        attention, att_params, h, graph, e, kernel, real, d_a, np.zeros_like(scores)
    )
    d_params.update(_with(own, "attention"))
    return (d_h + d_residual, d_e), {name: d_params[name] for name in params}


def san_layer_forward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray,
    real: Any = None,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[np.ndarray, dict]:
    """``(out (N, D), state after the call)`` of ``SANLayer`` ``layer``, literally."""
    # F1 the attention, pair by pair
    a, _ = san_attention_forward(
        layer.blocks["attention"], _under(params, "attention"), h, graph.edge_index, e, real
    )
    # F2 the node stream, row by row
    return _node_stream_forward(layer, params, a, h, training, state, noise)


def san_layer_backward(
    layer: Any,
    params: dict,
    h: np.ndarray,
    graph: Graph,
    e: np.ndarray,
    real: Any,
    d_out: np.ndarray,
    training: bool = False,
    state: dict | None = None,
    noise: dict | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """``((d_h, d_e), d_params)`` of ``<d_out, out>``: the forward again, then B2, B1."""
    attention, att_params = layer.blocks["attention"], _under(params, "attention")
    a, _ = san_attention_forward(attention, att_params, h, graph.edge_index, e, real)
    # B2 (of F2)
    d_a, d_residual, d_params = _node_stream_backward(
        layer, params, a, h, d_out, training, state, noise
    )
    # B1 (of F1)
    (d_h, d_e), own = san_attention_backward(
        attention, att_params, h, graph.edge_index, e, real, d_a
    )
    d_params.update(_with(own, "attention"))
    return (d_h + d_residual, d_e), {name: d_params[name] for name in params}
