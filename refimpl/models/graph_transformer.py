"""``GraphTransformer``: the graph transformer of the massive-activations supplement (Sec. 2),
for graph-level (pooled) or node-level outputs, with hand-written backward.

With ``D = hidden_channels`` and a batch of ``G`` graphs on ``N`` nodes (one graph
when ``batch`` is None)::

    F1  h    = x W_in^T + b_in                      (N, D)  Eq. 1, input embedding
    F2  h   += pe W_pe^T + b_pe                     (N, D)  Eq. 2, P from Laplacian
                                                            eigenvectors (pe_dim > 0)
    F3  h    = [h ; g_1 .. g_G]                     (N+G, D) global_node: one node per
                                                            graph, embedding ``global.embedding``
    F4  e    = [edge_attr | types] W_e^T + b_e      (E', D) edge embedding (see below)
        for l = 0 .. L-1:
    F5  h    = GraphTransformerLayer_l(h, e)        (N', D) Eq. 3-13
    F6  h    = h[:N]                                (N, D)  drop the global nodes
    F7  p    = Pool(h)                              (G, D)  mean or sum per graph
    F8  out  = ReLU(p W_1^T + b_1) W_2^T + b_2      (G, out) y = MLP(Pool(H)), Sec. 2
        node-level (pool=None) instead:
    F7' out  = h W_out^T + b_out                    (N, out)

The layers attend over the attention graph of :mod:`refimpl.models.attention_graph`
(Eq. 7's mask; with ``global_node``, Eq. 14's global nodes). F4 embeds its edge features,
the input's ``edge_attr`` (zeros on added edges) and one-hot edge types, read by every
layer's ``W^E`` (Eq. 12-13); without ``edge_dim`` and ``global_node`` there is no F4.

Pooling runs over the real nodes; the global nodes only mix information during the layers.
Positional encodings are an input (``refimpl.data.positional``): random sign flips belong to the
training loop, so the model is a deterministic function of its inputs and its ``noise``.

Parameters, in order: ``input.W (D, in)``, ``input.b``, ``pe.W (D, pe_dim)``, ``pe.b``
(pe_dim > 0), ``edge.W (D, edge_dim + types)``, ``edge.b`` (edge features),
``global.embedding (D,)`` (global_node), per layer ``layer{l}.{GraphTransformerLayer names}``,
then ``head1.W (D, D)``, ``head1.b``, ``head2.W (out, D)``, ``head2.b`` (graph level) or
``head.W (out, D)``, ``head.b`` (node level). ``init_params``: each block's own (Glorot-uniform
linears with zero biases, attention as PyG's ``TransformerConv``, LayerNorm ones and zeros, a
zero global embedding).

Randomness: ``noise`` keys ``layer{l}.attn_dropout``, ``layer{l}.dropout1``,
``layer{l}.dropout2`` (the layer's keys), drawn from ``rng`` in layer order when not given and
used; ``cache.noise`` replays a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module, to_numpy
from refimpl.fields import check_bool, check_positive_int
from refimpl.graph import Graph
from refimpl.kernels.segment import Segments
from refimpl.models.attention_graph import (
    AttentionGraph,
    _check_batch,
    _GlobalEmbedding,
    attention_graph,
)
from refimpl.nn.stacks import (
    block_backward,
    flat_param_shapes,
    init_flat_params,
    split_params,
)
from refimpl.nn.transformer.graph_transformer_layer import (
    GraphTransformerLayer,
    GraphTransformerLayerCache,
)
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.ops.activations import ReLU, SignCache
from refimpl.ops.linear import Linear, LinearCache
from refimpl.ops.pooling import GlobalPool
from refimpl.validation import (
    NonFiniteError,
    check_block_inputs,
    check_cotangent,
    check_graph_rows,
    check_optional_input,
    check_rng,
)

__all__ = ["GraphTransformer", "GraphTransformerCache"]

POOLS = ("mean", "sum", None)


class GraphTransformerCache(NamedTuple):
    """What :meth:`GraphTransformer.backward` reads (None for a step switched off)."""

    attention_graph: AttentionGraph
    input: LinearCache  # F1
    pe: LinearCache | None  # F2
    edge: LinearCache | None  # F4
    layers: tuple[GraphTransformerLayerCache, ...]  # F5
    pool: Any  # F7: GlobalPool's cache (graph level)
    head1: LinearCache | None  # F8 (graph level)
    relu: SignCache | None  # F8
    head: LinearCache  # F8's second linear, or F7' (node level)
    batch: Segments | None  # the real nodes grouped by graph (graph level)
    noise: dict[str, Any]  # the masks used, as forward(noise=...) takes them


@dataclass(frozen=True)
class GraphTransformer:
    """Input and positional embeddings, ``num_layers`` graph-transformer layers, pooling and an
    MLP head (or a node-level linear head); see the module docstring."""

    in_channels: int
    out_channels: int = 1  # targets (regression) or labels
    hidden_channels: int = 64  # D
    num_layers: int = 4  # L
    heads: int = 4  # H
    ffn_channels: int | None = None  # d_ff; None: 2 D
    edge_dim: int | None = None  # columns of the input's edge_attr; None: none
    pe_dim: int = 0  # columns of the positional encodings; 0: none (Eq. 2 off)
    global_node: bool = False  # Eq. 14
    pool: str | None = "mean"  # "mean" | "sum" (graph level) | None (node level)
    dropout: float = 0.0  # inside every layer (F3, F7 of the layer)
    attn_dropout: float = 0.0
    layer_norm: bool = True  # Eq. 11
    lipschitz_norm: str | None = None  # None | "paper" (LipschitzNorm Eq. 19 per head)
    # the parameterised blocks by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("in_channels", "out_channels", "hidden_channels", "num_layers"):
            check_positive_int(getattr(self, name), f"GraphTransformer {name}")
        if self.edge_dim is not None:  # None: no edge features
            check_positive_int(self.edge_dim, "GraphTransformer edge_dim")
        if isinstance(self.pe_dim, bool) or not isinstance(self.pe_dim, int) or self.pe_dim < 0:
            raise ValueError(f"GraphTransformer pe_dim must be an int >= 0, got {self.pe_dim!r}")
        if self.pe_dim:  # at most 2**31 - 1, as every size
            check_positive_int(self.pe_dim, "GraphTransformer pe_dim")
        if self.pool not in POOLS:
            raise ValueError(f"GraphTransformer pool must be one of {POOLS}, got {self.pool!r}")
        for name in ("global_node", "layer_norm"):  # "False" would read as true
            object.__setattr__(
                self, name, check_bool(getattr(self, name), f"GraphTransformer {name}")
            )
        if self.ffn_channels is not None:  # 0 would mean the default, 2 D, silently
            check_positive_int(self.ffn_channels, "GraphTransformer ffn_channels")
        d = self.hidden_channels
        layer = GraphTransformerLayer(  # raises on heads, dropouts, lipschitz_norm
            d,
            heads=self.heads,
            ffn_channels=self.ffn_channels,
            edge_dim=d if self._edge_features else None,
            dropout=self.dropout,
            attn_dropout=self.attn_dropout,
            layer_norm=self.layer_norm,
            lipschitz_norm=self.lipschitz_norm,
        )
        blocks: dict[str, Any] = {"input": Linear(self.in_channels, d)}
        if self.pe_dim:
            blocks["pe"] = Linear(self.pe_dim, d)
        if self._edge_features:
            blocks["edge"] = Linear((self.edge_dim or 0) + self._num_types, d)
        if self.global_node:
            blocks["global"] = _GlobalEmbedding(d)
        for i in range(self.num_layers):
            blocks[f"layer{i}"] = layer
        if self.pool is None:
            blocks["head"] = Linear(d, self.out_channels)
        else:
            blocks["head1"] = Linear(d, d)
            blocks["head2"] = Linear(d, self.out_channels)
        object.__setattr__(self, "blocks", blocks)

    @property
    def _edge_features(self) -> bool:
        """Whether the layers read edge features: given ones, or the global node's types."""
        return self.edge_dim is not None or self.global_node

    @property
    def _num_types(self) -> int:
        return 3 if self.global_node else 1

    @property
    def deterministic_training(self) -> bool:
        """Whether a training forward draws nothing (no dropout)."""
        return self.dropout == 0 and self.attn_dropout == 0

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``{block}.{name}`` and shapes, in order (module docstring)."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self,
        rng: np.random.Generator,
        init: str = "xavier",
        backend: str | None = None,
        dtype: Any = np.float64,
    ) -> dict[str, Any]:
        """Each block's own initialisation, drawn from ``rng`` in parameter order."""
        if init != "xavier":
            raise ValueError(
                f"GraphTransformer supports init='xavier' only (each block's default), got {init!r}"
            )
        return init_flat_params(self.blocks, rng, backend, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        graph: Graph,
        edge_attr: Any = None,
        pe: Any = None,
        batch: Any = None,
        num_graphs: int | None = None,
        training: bool = False,
        rng: np.random.Generator | None = None,
        noise: dict[str, Any] | None = None,
    ) -> tuple[Any, GraphTransformerCache]:
        """Outputs ``(G, out)`` (graph level) or ``(N, out)`` (node level), and the cache.

        Parameters
        ----------
        x : (N, in_channels) float array
        graph : Graph on N nodes (block-diagonal for a batch, ``refimpl.data.collate``)
        edge_attr : (E, edge_dim) float array, with ``edge_dim`` only
        pe : (N, pe_dim) float array, with ``pe_dim`` only (``refimpl.data.laplacian_pe``)
        batch : (N,) int array, optional
            The graph of every node, ``0 <= batch < num_graphs``; None: one graph. No edge
            may join two graphs (a block-diagonal batch, as ``refimpl.data.collate`` makes).
        num_graphs : int, optional
            ``G``; default ``batch.max() + 1``.
        training, rng, noise
            Dropout: masks from ``noise`` (keys in the module docstring) or ``rng``.
        """
        check_block_inputs(params, self.param_shapes(), "GraphTransformer", x, self.in_channels)
        check_graph_rows(x, graph)
        check_bool(training, "GraphTransformer training")
        check_rng(rng, "GraphTransformer rng")
        n = x.shape[0]
        xp = get_array_module(x)
        batch_host, num_graphs = _check_batch(batch, num_graphs, n, graph.edge_index)
        structure = attention_graph(graph, batch_host, num_graphs, self.global_node)
        check_optional_input(
            edge_attr,
            "edge_attr",
            "edge_dim",
            self.edge_dim,
            graph.num_edges,
            x,
            "GraphTransformer",
        )
        check_optional_input(pe, "pe", "pe_dim", self.pe_dim or None, n, x, "GraphTransformer")
        noise = dict(noise or {})
        blocks, used = self.blocks, {}
        sub = lambda prefix: split_params(blocks, params, prefix)  # noqa: E731

        # F1 input embedding (N, D)
        h, input_cache = blocks["input"].forward(sub("input"), x)
        # F2 positional encodings (N, D)
        pe_cache = None
        if self.pe_dim:
            p, pe_cache = blocks["pe"].forward(sub("pe"), pe)
            h = h + p
        # F3 global nodes (N + G, D)
        if self.global_node:
            g = xp.broadcast_to(params["global.embedding"], (num_graphs, self.hidden_channels))
            h = xp.concatenate([h, g], axis=0)
        # F4 edge embedding (E', D): input features on input edges, zeros elsewhere, and types
        e, edge_cache = None, None
        if self._edge_features:
            types = structure.on("edge_types", xp, x.dtype)  # (E', T)
            if self.edge_dim is not None:
                raw = xp.zeros((types.shape[0], self.edge_dim), dtype=x.dtype)  # (E', edge_dim)
                raw[: int(structure.kept.sum())] = edge_attr[structure.on("kept", xp)]
                types = xp.concatenate([raw, types], axis=1)
            e, edge_cache = blocks["edge"].forward(sub("edge"), types)
        # F5 the layers (N', D)
        layers = []
        for i in range(self.num_layers):
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
        if self.pool is None:
            # F7' node-level head (N, out)
            out, head = blocks["head"].forward(sub("head"), h)
            pool_cache = head1 = relu = segments = None
        else:
            # F7 pooling per graph (G, D)
            segments = structure.on("batch", xp)
            p, pool_cache = GlobalPool(self.pool).forward({}, h, segments)
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

    # -- backward ----------------------------------------------------------------------
    def backward(
        self,
        params: dict[str, Any],
        cache: GraphTransformerCache,
        d_out: Any,
        input_grad: bool = True,
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_inputs, d_params)`` with ``d_inputs`` = ``d_x``,
        or the tuple ``(d_x[, d_edge_attr][, d_pe])`` when the model takes those inputs
        (``d_x`` is None with ``input_grad=False``)."""
        x = cache.input.x
        xp = get_array_module(x)
        rows = x.shape[0] if self.pool is None else cache.batch.num_segments
        check_cotangent(d_out, (rows, self.out_channels), x.dtype, x, name="d_out")
        check_bool(input_grad, "GraphTransformer input_grad")
        blocks, d_params = self.blocks, {}

        if self.pool is None:
            # B7' (of F7')
            d_h = block_backward(blocks, params, "head", cache.head, d_out, d_params)
        else:
            # B8 (of F8), B7 (of F7)
            d_p = block_backward(blocks, params, "head2", cache.head, d_out, d_params)
            d_p, _ = ReLU().backward({}, cache.relu, d_p)
            d_p = block_backward(blocks, params, "head1", cache.head1, d_p, d_params)
            d_h, _ = GlobalPool(self.pool).backward({}, cache.pool, d_p)
        # B6 (of F6) the global nodes' rows get no gradient from the head
        structure = cache.attention_graph
        num_global = structure.graph.num_nodes - structure.num_nodes
        if num_global:
            d_h = xp.concatenate([d_h, xp.zeros((num_global, d_h.shape[1]), d_h.dtype)])
        # B5 (of F5) the layers; every layer reads the same edge embedding e
        d_e = None
        for i in reversed(range(self.num_layers)):
            d_inputs = block_backward(blocks, params, f"layer{i}", cache.layers[i], d_h, d_params)
            if self._edge_features:
                d_h, d_e_layer = d_inputs
                d_e = d_e_layer if d_e is None else d_e + d_e_layer
            else:
                d_h = d_inputs
        # B4 (of F4) the edge embedding; the input's columns of the kept edges
        d_edge_attr = None
        if self._edge_features:
            edge_input = self.edge_dim is not None  # the type columns alone need no gradient
            d_types = block_backward(
                blocks, params, "edge", cache.edge, d_e, d_params, input_grad=edge_input
            )
            if self.edge_dim is not None:
                kept = structure.kept
                d_edge_attr = xp.zeros((kept.size, self.edge_dim), dtype=x.dtype)  # (E, edge_dim)
                d_edge_attr[structure.on("kept", xp)] = d_types[: int(kept.sum()), : self.edge_dim]
        # B3 (of F3) the global embedding is broadcast to every global node: sum their rows
        if self.global_node:
            d_params["global.embedding"] = d_h[structure.num_nodes :].sum(axis=0)
            d_h = d_h[: structure.num_nodes]
        # B2 (of F2) positional encodings
        d_pe = None
        if self.pe_dim:
            d_pe = block_backward(blocks, params, "pe", cache.pe, d_h, d_params)
        # B1 (of F1) input embedding
        d_x = block_backward(
            blocks, params, "input", cache.input, d_h, d_params, input_grad=input_grad
        )
        d_inputs = [d_x]
        if self.edge_dim is not None:
            d_inputs.append(d_edge_attr)
        if self.pe_dim:
            d_inputs.append(d_pe)
        result = d_inputs[0] if len(d_inputs) == 1 else tuple(d_inputs)
        return result, {name: d_params[name] for name in params}

    # -- inspection ----------------------------------------------------------------------
    def activations(self, cache: GraphTransformerCache) -> dict[str, tuple[Any, Any]]:
        """Per layer, the tensors the massive-activation analysis reads, each with the graph of
        every row: ``layer{l}.scores`` ``((E', H*d_k), (E',))`` the per-edge score vectors
        before the sum over a head's channels (``TransformerConv.score_vectors``), and
        ``layer{l}.output`` ``((N', D), (N',))`` the layer's node outputs (global nodes
        included). Graph ids are host int64 arrays."""
        structure = cache.attention_graph
        edge_graph = structure.row_graph[to_numpy(structure.graph.edge_index[1])]
        result = {}
        for i, layer in enumerate(cache.layers):
            scores = TransformerConv.score_vectors(layer.attention)  # (E', H, d_k)
            result[f"layer{i}.scores"] = (scores.reshape(scores.shape[0], -1), edge_graph)
            result[f"layer{i}.output"] = (layer.out, structure.row_graph)
        return result
