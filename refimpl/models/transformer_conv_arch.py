"""The graph transformer of the massive-activations supplement's Sec. 2 inside
:class:`~refimpl.models.graph_transformer.GraphTransformer` (``arch="transformer-conv"``, the
default): steps F1-F8 of that module's docstring, on inputs ``GraphTransformer.forward`` has
checked, each layer a :class:`~refimpl.nn.transformer.graph_transformer_layer.GraphTransformerLayer`
over the attention graph of :mod:`refimpl.models.attention_graph`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module, to_numpy
from refimpl.kernels.segment import Segments
from refimpl.models.attention_graph import AttentionGraph, _GlobalEmbedding, attention_graph
from refimpl.nn.stacks import block_backward, split_params
from refimpl.nn.transformer.graph_transformer_layer import (
    GraphTransformerLayer,
    GraphTransformerLayerCache,
)
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.ops.activations import ReLU, SignCache
from refimpl.ops.linear import Linear, LinearCache
from refimpl.ops.pooling import GlobalPool
from refimpl.validation import NonFiniteError, check_optional_input

__all__ = [
    "GraphTransformerCache",
    "conv_activations",
    "conv_backward",
    "conv_blocks",
    "conv_forward",
]


class GraphTransformerCache(NamedTuple):
    """What :meth:`GraphTransformer.backward` reads (None for a step switched off).

    Attributes
    ----------
    attention_graph : AttentionGraph
        The graph the layers attended over (self-loops, global nodes, edge types).
    input : LinearCache
        F1.
    pe : LinearCache or None
        F2.
    edge : LinearCache or None
        F4.
    layers : tuple of GraphTransformerLayerCache
        F5.
    pool : object
        F7: GlobalPool's cache (graph level).
    head1 : LinearCache or None
        F8 (graph level).
    relu : SignCache or None
        F8.
    head : LinearCache
        F8's second linear, or F7' (node level).
    batch : Segments or None
        The real nodes grouped by graph (graph level).
    noise : dict
        The masks used, as forward(noise=...) takes them.
    """

    attention_graph: AttentionGraph
    input: LinearCache
    pe: LinearCache | None
    edge: LinearCache | None
    layers: tuple[GraphTransformerLayerCache, ...]
    pool: Any
    head1: LinearCache | None
    relu: SignCache | None
    head: LinearCache
    batch: Segments | None
    noise: dict[str, Any]


def _edge_features(model: Any) -> bool:
    """Whether the layers read edge features: given ones, or the global node's types."""
    return model.edge_dim is not None or model.global_node


def _num_types(model: Any) -> int:
    return 3 if model.global_node else 1


def conv_blocks(model: Any) -> dict[str, Any]:
    """The parameterised blocks by parameter prefix, in parameter order.

    Parameters
    ----------
    model : GraphTransformer
        With ``arch="transformer-conv"``.

    Returns
    -------
    dict
        ``{prefix: block}``: ``input``, ``pe``, ``edge``, ``global``, ``layer{l}``, the head.
    """
    d = model.hidden_channels
    layer = GraphTransformerLayer(  # raises on heads, dropouts, lipschitz_norm
        d,
        heads=model.heads,
        ffn_channels=model.ffn_channels,
        edge_dim=d if _edge_features(model) else None,
        dropout=model.dropout,
        attn_dropout=model.attn_dropout,
        layer_norm=model.layer_norm,
        lipschitz_norm=model.lipschitz_norm,
    )
    blocks: dict[str, Any] = {"input": Linear(model.in_channels, d)}
    if model.pe_dim:
        blocks["pe"] = Linear(model.pe_dim, d)
    if _edge_features(model):
        blocks["edge"] = Linear((model.edge_dim or 0) + _num_types(model), d)
    if model.global_node:
        blocks["global"] = _GlobalEmbedding(d)
    for i in range(model.num_layers):
        blocks[f"layer{i}"] = layer
    if model.pool is None:
        blocks["head"] = Linear(d, model.out_channels)
    else:
        blocks["head1"] = Linear(d, d)
        blocks["head2"] = Linear(d, model.out_channels)
    return blocks


def conv_forward(
    model: Any,
    params: dict[str, Any],
    x: Any,
    graph: Any,
    edge_attr: Any,
    pe: Any,
    batch_host: Any,
    num_graphs: int,
    training: bool,
    rng: np.random.Generator | None,
    noise: dict[str, Any],
) -> tuple[Any, GraphTransformerCache]:
    """F1-F8 on checked inputs.

    Parameters
    ----------
    model : GraphTransformer
        With ``arch="transformer-conv"``.
    params, x, graph, edge_attr, pe, training, rng, noise
        As :meth:`GraphTransformer.forward` takes them, checked (``noise`` a dict).
    batch_host : (N,) int64 host array
        The graph of every node.
    num_graphs : int
        ``G``.

    Returns
    -------
    out : (G, out_channels) or (N, out_channels) array
    cache : GraphTransformerCache
    """
    n = x.shape[0]
    xp = get_array_module(x)
    structure = attention_graph(graph, batch_host, num_graphs, model.global_node)
    check_optional_input(pe, "pe", "pe_dim", model.pe_dim or None, n, x, "GraphTransformer")
    blocks, used = model.blocks, {}
    sub = lambda prefix: split_params(blocks, params, prefix)  # noqa: E731

    # F1 input embedding (N, D)
    h, input_cache = blocks["input"].forward(sub("input"), x)
    # F2 positional encodings (N, D)
    pe_cache = None
    if model.pe_dim:
        p, pe_cache = blocks["pe"].forward(sub("pe"), pe)
        h = h + p
    # F3 global nodes (N + G, D)
    if model.global_node:
        g = xp.broadcast_to(params["global.embedding"], (num_graphs, model.hidden_channels))
        h = xp.concatenate([h, g], axis=0)
    # F4 edge embedding (E', D): input features on input edges, zeros elsewhere, and types
    e, edge_cache = None, None
    if _edge_features(model):
        types = structure.on("edge_types", xp, x.dtype)  # (E', T)
        if model.edge_dim is not None:
            raw = xp.zeros((types.shape[0], model.edge_dim), dtype=x.dtype)  # (E', edge_dim)
            raw[: int(structure.kept.sum())] = edge_attr[structure.on("kept", xp)]
            types = xp.concatenate([raw, types], axis=1)
        e, edge_cache = blocks["edge"].forward(sub("edge"), types)
    # F5 the layers (N', D)
    layers = []
    for i in range(model.num_layers):
        prefix = f"layer{i}"
        layer_noise = {
            key.removeprefix(f"{prefix}."): value
            for key, value in noise.items()
            if key.startswith(f"{prefix}.")
        }
        try:
            h, layer_cache = blocks[prefix].forward(
                sub(prefix), h, structure.graph, e, training, rng, layer_noise
            )
        except NonFiniteError as err:  # finite params and input: an overflow in the layer
            raise NonFiniteError(f"in {prefix}: {err}") from err
        used.update({f"{prefix}.{key}": value for key, value in layer_cache.noise.items()})
        layers.append(layer_cache)
    unknown = sorted(set(noise) - set(used))
    if unknown:
        raise ValueError(
            f"noise has keys {unknown} this forward does not use (used: {sorted(used)})"
        )
    # F6 the real nodes (N, D)
    h = h[:n]
    if model.pool is None:
        # F7' node-level head (N, out)
        out, head = blocks["head"].forward(sub("head"), h)
        pool_cache = head1 = relu = segments = None
    else:
        # F7 pooling per graph (G, D)
        segments = structure.on("batch", xp)
        p, pool_cache = GlobalPool(model.pool).forward({}, h, segments)
        # F8 MLP head (G, out)
        p, head1 = blocks["head1"].forward(sub("head1"), p)
        p, relu = ReLU().forward({}, p)
        out, head = blocks["head2"].forward(sub("head2"), p)
    cache = GraphTransformerCache(
        structure,
        input_cache,
        pe_cache,
        edge_cache,
        tuple(layers),
        pool_cache,
        head1,
        relu,
        head,
        segments,
        used,
    )
    return out, cache


def conv_backward(
    model: Any, params: dict[str, Any], cache: GraphTransformerCache, d_out: Any, input_grad: bool
) -> tuple[Any, dict[str, Any]]:
    """B8-B1: ``(d_inputs, d_params)`` as :meth:`GraphTransformer.backward` returns them.

    Parameters
    ----------
    model : GraphTransformer
        With ``arch="transformer-conv"``.
    params, cache, d_out, input_grad
        As :meth:`GraphTransformer.backward` takes them, ``d_out`` checked.

    Returns
    -------
    tuple
        ``(d_inputs, d_params)``.
    """
    x = cache.input.x
    xp = get_array_module(x)
    blocks, d_params = model.blocks, {}

    if model.pool is None:
        # B7' (of F7')
        d_h = block_backward(blocks, params, "head", cache.head, d_out, d_params)
    else:
        # B8 (of F8), B7 (of F7)
        d_p = block_backward(blocks, params, "head2", cache.head, d_out, d_params)
        d_p, _ = ReLU().backward({}, cache.relu, d_p)
        d_p = block_backward(blocks, params, "head1", cache.head1, d_p, d_params)
        d_h, _ = GlobalPool(model.pool).backward({}, cache.pool, d_p)
    # B6 (of F6) the global nodes' rows get no gradient from the head
    structure = cache.attention_graph
    num_global = structure.graph.num_nodes - structure.num_nodes
    if num_global:
        d_h = xp.concatenate([d_h, xp.zeros((num_global, d_h.shape[1]), d_h.dtype)])
    # B5 (of F5) the layers; every layer reads the same edge embedding e
    d_e = None
    for i in reversed(range(model.num_layers)):
        d_inputs = block_backward(blocks, params, f"layer{i}", cache.layers[i], d_h, d_params)
        if _edge_features(model):
            d_h, d_e_layer = d_inputs
            d_e = d_e_layer if d_e is None else d_e + d_e_layer
        else:
            d_h = d_inputs
    # B4 (of F4) the edge embedding; the input's columns of the kept edges
    d_edge_attr = None
    if _edge_features(model):
        edge_input = model.edge_dim is not None  # the type columns alone need no gradient
        d_types = block_backward(
            blocks, params, "edge", cache.edge, d_e, d_params, input_grad=edge_input
        )
        if model.edge_dim is not None:
            kept = structure.kept
            d_edge_attr = xp.zeros((kept.size, model.edge_dim), dtype=x.dtype)  # (E, edge_dim)
            d_edge_attr[structure.on("kept", xp)] = d_types[: int(kept.sum()), : model.edge_dim]
    # B3 (of F3) the global embedding is broadcast to every global node: sum their rows
    if model.global_node:
        d_params["global.embedding"] = d_h[structure.num_nodes :].sum(axis=0)
        d_h = d_h[: structure.num_nodes]
    # B2 (of F2) positional encodings
    d_pe = None
    if model.pe_dim:
        d_pe = block_backward(blocks, params, "pe", cache.pe, d_h, d_params)
    # B1 (of F1) input embedding
    d_x = block_backward(blocks, params, "input", cache.input, d_h, d_params, input_grad=input_grad)
    d_inputs = [d_x]
    if model.edge_dim is not None:
        d_inputs.append(d_edge_attr)
    if model.pe_dim:
        d_inputs.append(d_pe)
    result = d_inputs[0] if len(d_inputs) == 1 else tuple(d_inputs)
    return result, {name: d_params[name] for name in params}


def conv_activations(model: Any, cache: GraphTransformerCache) -> dict[str, tuple[Any, Any]]:
    """What :meth:`GraphTransformer.activations` returns for this architecture.

    Parameters
    ----------
    model : GraphTransformer
        With ``arch="transformer-conv"``.
    cache : GraphTransformerCache
        Of a forward of ``model``.

    Returns
    -------
    dict
        ``{name: (rows, graph of every row)}``.
    """
    structure = cache.attention_graph
    edge_graph = structure.row_graph[to_numpy(structure.graph.edge_index[1])]
    result = {}
    for i, layer in enumerate(cache.layers):
        scores = TransformerConv.score_vectors(layer.attention)  # (E', H, d_k)
        result[f"layer{i}.scores"] = (scores.reshape(scores.shape[0], -1), edge_graph)
        result[f"layer{i}.output"] = (layer.out, structure.row_graph)
    return result
