"""The massive-activation study's three graph transformers inside
:class:`~refimpl.models.graph_transformer.GraphTransformer`: ``arch="gt"`` (Dwivedi & Bresson's GT
with its edge stream), ``"graphit"`` (GraphiT-GT) and ``"san"`` (SAN), as the study's released
code assembles them (``graph_transformer_net.py``, ``graphit_net.py``, ``san_net.py``).

With ``D = hidden_channels``, a batch of ``G`` graphs on ``N`` nodes and the attention graph
``A`` (the input edges; for GraphiT and SAN with ``full_graph``, every ordered pair of nodes of
a graph, :func:`refimpl.data.full_graph.full_graph`)::

    F1  h = x W_in^T + b_in                     (N, D - d_lpe)   embedding_h
    F2  h += pe W_pe^T + b_pe                   (N, D)   embedding_lap_pos_enc (pe_dim > 0:
                                                         Laplacian or random-walk encodings)
        or  h = [h ; LPE(eigenpairs)]            (N, D)   SAN's learned Laplacian encoding
    F3  e = [edge_attr | non-edge] W_e^T + b_e  (|A|, D) embedding_e; "non-edge" is 1 on pairs
                                                         that are no input edge (the released
                                                         bond type 0), GraphiT and SAN only
    F4  kernel = K_RW or K_diff on A            (|A|,)   GraphiT with full_graph
        for l = 0 .. L-1:
    F5  GT:      (h, e) = GTLayer_l(h, e)                edge stream: e is the layer's output
        GraphiT: h = GraphiTLayer_l(h, e, kernel)        e read by every layer
        SAN:     h = SANLayer_l(h, e)
    F6  p = Pool(h)                             (G, D)   readout: mean, sum or max per graph
    F7  out = MLPReadout(p)                     (G, out) (node level: MLPReadout(h), (N, out))

GT without edge features runs the released ``edge_feat=False``: uniform attention and no edge
stream (see :class:`~refimpl.nn.transformer.gt_attention.GTAttention`). Everything random
(dropout) is inside the layers and the learned encoding; BatchNorm's running statistics are the
model's state (``GraphTransformer.init_state``), updated by a training forward into
``cache.state``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module, to_numpy
from refimpl.data.full_graph import FullGraph, full_graph
from refimpl.data.graph_kernels import diffusion_kernel, random_walk_kernel
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments
from refimpl.nn.readout import MLPReadout, MLPReadoutCache
from refimpl.nn.stacks import block_backward, split_params
from refimpl.nn.transformer.graphit_layer import GraphiTLayer
from refimpl.nn.transformer.gt_layer import GTLayer
from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.nn.transformer.san_lpe import LearnedLaplacianPE
from refimpl.ops.linear import Linear, LinearCache
from refimpl.ops.pooling import GlobalPool
from refimpl.validation import NonFiniteError

__all__ = [
    "StudyCache",
    "study_activations",
    "study_backward",
    "study_blocks",
    "study_forward",
]


class StudyCache(NamedTuple):
    """What the backward of a study architecture reads (None for a step switched off).

    Attributes
    ----------
    graph : Graph
        The attention graph A.
    pairs : FullGraph or None
        A's pairs with full_graph (GraphiT, SAN), else None.
    kernel : (|A|,) array or None
        F4, or None.
    input : LinearCache
        F1.
    pe : object
        F2: LinearCache, LearnedLaplacianPECache, or None.
    edge : LinearCache or None
        F3.
    layers : tuple
        F5, each layer's cache.
    pool : object
        F6 (graph level).
    readout : MLPReadoutCache
        F7.
    batch : Segments or None
        The nodes grouped by graph (graph level).
    node_graph : (N,) int64 host array
        The graph of every node.
    num_edges : int
        E, the input's edges.
    state : dict
        The running statistics after this forward.
    noise : dict
        The masks used, as forward(noise=...) takes them.
    """

    graph: Graph
    pairs: FullGraph | None
    kernel: Any
    input: LinearCache
    pe: Any
    edge: LinearCache | None
    layers: tuple
    pool: Any
    readout: MLPReadoutCache
    batch: Segments | None
    node_graph: Any
    num_edges: int
    state: dict[str, Any]
    noise: dict[str, Any]


def study_blocks(model: Any) -> dict[str, Any]:
    """The parameterised blocks of ``model`` by parameter prefix, in parameter order.

    Parameters
    ----------
    model : GraphTransformer
        With a study ``arch`` (``"gt"``, ``"graphit"``, ``"san"``).

    Returns
    -------
    dict
        ``{prefix: block}``: ``input``, ``lpe`` or ``pe``, ``edge``, ``layer{l}``, ``readout``.
    """
    d = model.hidden_channels
    lpe = model.lpe_channels if model.lpe_eigenpairs else 0
    blocks: dict[str, Any] = {"input": Linear(model.in_channels, d - lpe)}
    if model.lpe_eigenpairs:
        blocks["lpe"] = LearnedLaplacianPE(lpe)
    elif model.pe_dim:
        blocks["pe"] = Linear(model.pe_dim, d)
    edge_columns = (model.edge_dim or 0) + (model.arch != "gt")  # + the non-edge column
    if edge_columns:
        blocks["edge"] = Linear(edge_columns, d)
    layer = _layer(model)
    for i in range(model.num_layers):
        blocks[f"layer{i}"] = layer
    blocks["readout"] = MLPReadout(d, model.out_channels)
    return blocks


def _layer(model: Any) -> Any:
    """The layer every step F5 runs (one configuration, each layer its own parameters)."""
    common = {"heads": model.heads, "dropout": model.dropout, "norm": model.norm}
    if model.arch == "gt":
        return GTLayer(
            model.hidden_channels,
            ffn_channels=model.ffn_channels,
            edge_features=model.edge_dim is not None,
            explicit_bias=model.explicit_bias,
            **common,
        )
    if model.arch == "graphit":
        return GraphiTLayer(
            model.hidden_channels,
            full_graph=model.full_graph,
            explicit_bias=model.explicit_bias,
            **common,
        )
    return SANLayer(model.hidden_channels, full_graph=model.full_graph, gamma=model.gamma, **common)


def _attention_graph(model: Any, graph: Graph, batch: Any) -> tuple[Graph, FullGraph | None]:
    """``A``: the input graph, or its full graph (GraphiT and SAN with ``full_graph``)."""
    if model.arch == "gt" or not model.full_graph:
        return graph, None
    pairs = full_graph(graph.edge_index, graph.num_nodes, batch)
    return pairs.graph, pairs


def _kernel(model: Any, graph: Graph, pairs: FullGraph | None, batch: Any, dtype: Any) -> Any:
    """F4: GraphiT's kernel on the pairs (None where the attention reads none)."""
    if model.arch != "graphit" or pairs is None:
        return None
    if model.kernel == "random-walk":
        values = random_walk_kernel(
            pairs.graph,
            graph.edge_index,
            graph.num_nodes,
            batch,
            p=model.kernel_steps,
            gamma=model.kernel_gamma,
        )
    else:
        values = diffusion_kernel(
            pairs.graph, graph.edge_index, graph.num_nodes, batch, beta=model.kernel_beta
        )
    return values.astype(dtype, copy=False)


def study_forward(
    model: Any,
    params: dict[str, Any],
    x: Any,
    graph: Graph,
    edge_attr: Any,
    pe: Any,
    batch: Any,
    num_graphs: int,
    training: bool,
    rng: np.random.Generator | None,
    noise: dict[str, Any],
    state: dict[str, Any] | None,
) -> tuple[Any, StudyCache]:
    """F1-F7 on checked inputs.

    Parameters
    ----------
    model : GraphTransformer
        With a study ``arch``.
    params, x, graph, edge_attr, pe, training, rng, noise, state
        As :meth:`GraphTransformer.forward` takes them, checked (``noise`` a dict).
    batch : (N,) int64 host array
        The graph of every node.
    num_graphs : int
        ``G``.

    Returns
    -------
    out : (G, out_channels) or (N, out_channels) array
    cache : StudyCache
    """
    xp = get_array_module(x)
    blocks, used, new_state = model.blocks, {}, {}
    sub = lambda prefix: split_params(blocks, params, prefix)  # noqa: E731
    # F1 input embedding (N, D - d_lpe)
    h, input_cache = blocks["input"].forward(sub("input"), x)
    # F2 positional encodings (N, D)
    pe_cache = None
    if model.lpe_eigenpairs:
        eigvecs, eigvals, valid = pe[:, :, 0], pe[:, :, 1], pe[:, :, 2] > 0.5
        p, pe_cache = blocks["lpe"].forward(
            sub("lpe"), eigvecs, eigvals, valid, training, rng, _under(noise, "lpe")
        )
        used.update({f"lpe.{k}": v for k, v in pe_cache.noise.items()})
        h = xp.concatenate([h, p], axis=1)
    elif model.pe_dim:
        p, pe_cache = blocks["pe"].forward(sub("pe"), pe)
        h = h + p
    # F3 edge embedding (|A|, D)
    batch_device = xp.asarray(batch)
    attention, pairs = _attention_graph(model, graph, batch_device)
    e, edge_cache, real = None, None, None
    if "edge" in blocks:
        if pairs is None:
            columns = [] if edge_attr is None else [edge_attr]
            if model.arch != "gt":  # every edge is an input edge: the non-edge column is 0
                columns.append(xp.zeros((graph.num_edges, 1), dtype=x.dtype))
        else:
            real = pairs.real
            columns = [] if edge_attr is None else [pairs.pair_features(edge_attr)]
            columns.append((~real)[:, None].astype(x.dtype))
        e, edge_cache = blocks["edge"].forward(sub("edge"), xp.concatenate(columns, axis=1))
    # F4 GraphiT's kernel (|A|,)
    kernel = _kernel(model, graph, pairs, batch_device, x.dtype)
    # F5 the layers
    layers = []
    for i in range(model.num_layers):
        prefix = f"layer{i}"
        options = {
            "training": training,
            "rng": rng,
            "noise": _under(noise, prefix),
            "state": None if state is None else _under(state, prefix),
        }
        if model.arch == "graphit":
            options.update(kernel=kernel, real=real)
        elif model.arch == "san":
            options["real"] = real
        try:
            out, layer_cache = blocks[prefix].forward(sub(prefix), h, attention, e, **options)
        except NonFiniteError as err:  # finite params and input: an overflow in the layer
            raise NonFiniteError(f"in {prefix}: {err}") from err
        h, e = out if model.arch == "gt" else (out, e)
        used.update({f"{prefix}.{k}": v for k, v in layer_cache.noise.items()})
        new_state.update({f"{prefix}.{k}": v for k, v in layer_cache.state.items()})
        layers.append(layer_cache)
    unknown = sorted(set(noise) - set(used))
    if unknown:
        raise ValueError(
            f"noise has keys {unknown} this forward does not use (used: {sorted(used)})"
        )
    segments = pool_cache = None
    if model.pool is not None:
        # F6 readout per graph (G, D)
        segments = Segments(batch_device, num_graphs)
        h, pool_cache = GlobalPool(model.pool).forward({}, h, segments)
    # F7 MLP readout (G, out) or (N, out)
    out, readout = blocks["readout"].forward(sub("readout"), h)
    cache = StudyCache(
        attention, pairs, kernel, input_cache, pe_cache, edge_cache, tuple(layers), pool_cache,
        readout, segments, batch, graph.num_edges, new_state, used,
    )  # fmt: skip
    return out, cache


def study_backward(
    model: Any, params: dict[str, Any], cache: StudyCache, d_out: Any, input_grad: bool
) -> tuple[Any, dict[str, Any]]:
    """B7-B1: ``(d_inputs, d_params)`` as :meth:`GraphTransformer.backward` returns them.

    Parameters
    ----------
    model : GraphTransformer
        With a study ``arch``.
    params, cache, d_out, input_grad
        As :meth:`GraphTransformer.backward` takes them, ``d_out`` checked.

    Returns
    -------
    tuple
        ``(d_inputs, d_params)``.
    """
    blocks, d_params = model.blocks, {}
    # B7 (of F7), B6 (of F6)
    d_h = block_backward(blocks, params, "readout", cache.readout, d_out, d_params)
    if model.pool is not None:
        d_h, _ = GlobalPool(model.pool).backward({}, cache.pool, d_h)
    # B5 (of F5) the layers: GT's edge stream carries d_e back layer by layer (none comes from
    # the last layer's edge output); GraphiT's and SAN's layers all read the same e
    d_e = None
    for i in reversed(range(model.num_layers)):
        prefix = f"layer{i}"
        if model.arch == "gt":
            d_h, d_e = block_backward(blocks, params, prefix, cache.layers[i], (d_h, d_e), d_params)
        else:
            d_h, d_e_layer = block_backward(blocks, params, prefix, cache.layers[i], d_h, d_params)
            d_e = d_e_layer if d_e is None else d_e + d_e_layer
    # B3 (of F3) the edge embedding; the input's columns of the real pairs
    d_edge_attr = None
    if "edge" in blocks:
        edge_input = model.edge_dim is not None
        d_columns = block_backward(
            blocks, params, "edge", cache.edge, d_e, d_params, input_grad=edge_input
        )
        if edge_input:
            d_edge_attr = d_columns[:, : model.edge_dim]
            if cache.pairs is not None:  # the pairs read their first duplicate's features
                d_edge_attr = _pair_features_backward(cache.pairs, d_edge_attr, cache.num_edges)
    # B2 (of F2) positional encodings
    d_pe = None
    if model.lpe_eigenpairs:
        width = d_h.shape[1] - model.lpe_channels
        d_vecs, d_vals = block_backward(blocks, params, "lpe", cache.pe, d_h[:, width:], d_params)
        d_h = d_h[:, :width]
        d_pe = get_array_module(d_h).zeros((*cache.pe.valid.shape, 3), dtype=d_h.dtype)
        d_pe[:, :, 0], d_pe[:, :, 1] = d_vecs, d_vals  # the validity column: no gradient
    elif model.pe_dim:
        d_pe = block_backward(blocks, params, "pe", cache.pe, d_h, d_params)
    # B1 (of F1) input embedding
    d_x = block_backward(blocks, params, "input", cache.input, d_h, d_params, input_grad=input_grad)
    d_inputs = [d_x]
    if model.edge_dim is not None:
        d_inputs.append(d_edge_attr)
    if model.pe_dim or model.lpe_eigenpairs:
        d_inputs.append(d_pe)
    result = d_inputs[0] if len(d_inputs) == 1 else tuple(d_inputs)
    return result, {name: d_params[name] for name in params}


def _pair_features_backward(pairs: FullGraph, d_pair: Any, num_edges: int) -> Any:
    """The adjoint of ``FullGraph.pair_features``: each real pair's row ``(P, B)`` back to the
    edge it read, ``(E, B)`` (a duplicate edge other than the first reads nothing)."""
    xp = get_array_module(d_pair)
    real = xp.asarray(pairs.real)
    d_edge = xp.zeros((num_edges, d_pair.shape[1]), dtype=d_pair.dtype)
    d_edge[xp.asarray(pairs.edge_id)[real]] = d_pair[real]
    return d_edge


def study_activations(model: Any, cache: StudyCache) -> dict[str, tuple[Any, Any]]:
    """Per layer, what the study logs, each with the graph of every row (host int64).

    ``layer{l}.h.attention`` (the released ``malog_h['attention']``, ``(N, D)``),
    ``layer{l}.e.attention`` (``malog_e['attention']``, the per-edge score vectors ``(|A|,
    D)``), ``layer{l}.h.output`` ``(N, D)`` and, for GT's edge stream, ``layer{l}.e.output``
    ``(E, D)``.

    Parameters
    ----------
    model : GraphTransformer
        With a study ``arch``.
    cache : StudyCache
        Of a forward of ``model``.

    Returns
    -------
    dict
        ``{name: (rows, graph of every row)}``.
    """
    node_graph = cache.node_graph
    edge_graph = node_graph[to_numpy(cache.graph.edge_index[1])]
    result = {}
    for i, layer in enumerate(cache.layers):
        if model.arch == "gt":
            result[f"layer{i}.h.attention"] = (layer.attention_h, node_graph)
            if layer.attention_e is not None:
                result[f"layer{i}.e.attention"] = (layer.attention_e, edge_graph)
            result[f"layer{i}.h.output"] = (layer.node.out, node_graph)
            if layer.edge is not None:
                result[f"layer{i}.e.output"] = (layer.edge.out, edge_graph)
        else:
            scores = layer.attention.scores  # (|A|, H, d)
            result[f"layer{i}.h.attention"] = (layer.attention_out, node_graph)
            result[f"layer{i}.e.attention"] = (scores.reshape(scores.shape[0], -1), edge_graph)
            result[f"layer{i}.h.output"] = (layer.out, node_graph)
    return result


def _under(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``values`` under ``{prefix}.``, without the prefix."""
    return {
        k.removeprefix(f"{prefix}."): v for k, v in values.items() if k.startswith(f"{prefix}.")
    }
