"""The canonical cases of the golden vectors: which blocks, configurations and inputs
:mod:`refimpl.interop.golden` exports and verifies.

A case is a name, a class from :data:`REGISTRY` with constructor arguments, and an input
builder returning :class:`CaseData` (the inputs, how they enter ``forward``, the noise).
Adding a case is one ``_case(...)`` entry in ``CASES``; its seed comes from its name, so
adding one changes no other case's file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.graph import Graph
from refimpl.interop.golden_inputs import (
    BATCH,
    BATCH_EDGES,
    EDGES,
    NUM_NODES,
    CaseData,
    graph_model_case,
)
from refimpl.interop.golden_study import (
    eigenpairs_inputs,
    pairs_inputs,
    readout_inputs,
    stream_inputs,
    study_transformer_inputs,
)
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.nn import (
    AllPairSoftmax,
    Attention,
    GATConv,
    GraphiTLayer,
    GraphTransformerLayer,
    KernelizedSoftmax,
    LayerNorm,
    LearnedLaplacianPE,
    MLPReadout,
    MultiHeadAttention,
    NodeFormerConv,
    PairNorm,
    PositiveRandomFeatures,
    SANAttention,
    SANLayer,
    TransformerAttention,
    TransformerConv,
    TransformerStream,
)
from refimpl.nn.nodeformer.random_features import draw_projection

__all__ = ["CASES", "GOLDEN_CASES", "REGISTRY", "CaseData", "GoldenCase"]  # CaseData: re-export

# The classes verify may rebuild, by the name the manifest records: an allow-list, not eval.
REGISTRY: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        GATConv,
        TransformerConv,
        NodeFormerConv,
        PairNorm,
        LayerNorm,
        Attention,
        TransformerAttention,
        MultiHeadAttention,
        PositiveRandomFeatures,
        KernelizedSoftmax,
        AllPairSoftmax,
        GraphTransformerLayer,
        GAT,
        NodeFormer,
        GraphTransformer,
        MLPReadout,
        TransformerStream,
        SANAttention,
        SANLayer,
        GraphiTLayer,
        LearnedLaplacianPE,
    )
}


@dataclass(frozen=True)
class GoldenCase:
    """One canonical configuration: ``cls(**kwargs)`` on the inputs ``build(block, rng)``."""

    name: str
    cls: type
    kwargs: dict[str, Any]
    build: Callable[[Any, np.random.Generator], CaseData]
    description: str

    @property
    def seed(self) -> int:
        """Fixed per case and independent of its position in the list."""
        return int(hashlib.sha256(self.name.encode()).hexdigest()[:8], 16)


# -- inputs ------------------------------------------------------------------------------------


def _graph_inputs(rng: np.random.Generator, width: int, edge_dim: int | None = None) -> dict:
    inputs = {
        "x": rng.standard_normal((NUM_NODES, width)),
        "edge_index": EDGES.copy(),
        "num_nodes": np.array(NUM_NODES, np.int64),
    }
    if edge_dim is not None:
        inputs["edge_attr"] = rng.standard_normal((EDGES.shape[1], edge_dim))
    return inputs


def _gat_conv(block: GATConv, rng: np.random.Generator) -> CaseData:
    inputs = _graph_inputs(rng, block.in_channels, block.edge_dim)
    if block.edge_dim is not None:  # edge features: one row per edge of the graph given
        return CaseData(
            inputs,
            ("input/x", "graph"),
            ("x", "edge_attr"),
            array_kwargs={"edge_attr": "input/edge_attr"},
        )
    if not block.dropout:
        return CaseData(inputs, ("input/x", "graph"), ("x",))
    attended = block.prepare_graph(Graph(EDGES, NUM_NODES)).num_edges  # E' with the loops
    mask = rng.random((attended, block.heads)) >= block.dropout
    return CaseData(
        inputs,
        ("input/x", "graph"),
        ("x",),
        kwargs={"training": True},
        array_kwargs={"attn_dropout_mask": "noise/attn_dropout_mask"},
        noise={"attn_dropout_mask": mask},
    )


def _transformer_conv(block: TransformerConv, rng: np.random.Generator) -> CaseData:
    inputs = _graph_inputs(rng, block.in_channels, block.edge_dim)
    if block.edge_dim is None:
        return CaseData(inputs, ("input/x", "graph"), ("x",))
    return CaseData(
        inputs,
        ("input/x", "graph"),
        ("x", "edge_attr"),
        array_kwargs={"edge_attr": "input/edge_attr"},
    )


def _graph_block_training(block: Any, rng: np.random.Generator) -> CaseData:
    """NodeFormerConv, GraphTransformerLayer, GAT, NodeFormer: training, noise from cache.noise."""
    width = block.channels if isinstance(block, GraphTransformerLayer) else block.in_channels
    edge_dim = getattr(block, "edge_dim", None)
    inputs = _graph_inputs(rng, width, edge_dim)
    return CaseData(
        inputs,
        ("input/x", "graph"),
        ("x", "edge_attr") if edge_dim else ("x",),
        kwargs={"training": True},
        array_kwargs={"edge_attr": "input/edge_attr"} if edge_dim else {},
        noise_kwarg="noise",
        draw_noise=True,
    )


def _nodeformer_conv_eval(block: NodeFormerConv, rng: np.random.Generator) -> CaseData:
    omega = draw_projection(rng, block.num_random_features, block.out_channels, block.projection)
    return CaseData(
        _graph_inputs(rng, block.in_channels),
        ("input/x", "graph"),
        ("x",),
        kwargs={"training": False},
        noise={"projection": omega},
        noise_kwarg="noise",
    )


def _node_rows(block: Any, rng: np.random.Generator) -> CaseData:
    """PairNorm, LayerNorm: ``x (N, C)``, one graph."""
    width = getattr(block, "channels", 3)
    return CaseData({"x": rng.standard_normal((NUM_NODES, width))}, ("input/x",), ("x",))


def _columns(block: Any, rng: np.random.Generator) -> CaseData:
    """The dense attention of LipschitzNorm: ``x (rows, n)``, input vectors as columns."""
    if isinstance(block, MultiHeadAttention):
        rows = block.in_dim
    elif isinstance(block, TransformerAttention):
        rows = 3 * block.dim  # (Q||K||V) stacked by rows
    else:
        rows = block.dim
    return CaseData({"x": rng.standard_normal((rows, 5))}, ("input/x",), ("x",))


def _features(block: PositiveRandomFeatures, rng: np.random.Generator) -> CaseData:
    """``phi(x)`` of NodeFormer Eq. 4: ``x (N, d)``, the projection ``omega (m, d)`` as noise."""
    noise = {"omega": draw_projection(rng, 5, 3, "iid")}
    inputs = {"x": 0.5 * rng.standard_normal((NUM_NODES, 3))}
    return CaseData(inputs, ("input/x", "noise/omega"), ("x",), noise=noise)


def _all_pair(block: Any, rng: np.random.Generator, samples: int = 3) -> CaseData:
    """KernelizedSoftmax / AllPairSoftmax: ``q, k (N, d)``, ``v (N, d_v)``, Gumbel ``(N, K)``."""
    n, d, d_v = NUM_NODES, 3, 2
    inputs = {
        "q": 0.5 * rng.standard_normal((n, d)),
        "k": 0.5 * rng.standard_normal((n, d)),
        "v": rng.standard_normal((n, d_v)),
    }
    noise, args = {}, ["input/q", "input/k", "input/v"]
    if isinstance(block, KernelizedSoftmax):
        noise["omega"] = draw_projection(rng, 8, d, "orthogonal")
        args.append("noise/omega")
    array_kwargs = {}
    if samples:
        noise["gumbel"] = -np.log(-np.log(rng.random((n, samples))))
        array_kwargs["gumbel"] = "noise/gumbel"
    return CaseData(inputs, tuple(args), ("q", "k", "v"), array_kwargs=array_kwargs, noise=noise)


def _graph_transformer(block: GraphTransformer, rng: np.random.Generator) -> CaseData:
    n = BATCH.size
    inputs = {
        "x": rng.standard_normal((n, block.in_channels)),
        "edge_index": BATCH_EDGES.copy(),
        "num_nodes": np.array(n, np.int64),
        "edge_attr": rng.standard_normal((BATCH_EDGES.shape[1], block.edge_dim)),
        "pe": rng.standard_normal((n, block.pe_dim)),
        "batch": BATCH.copy(),
    }
    return graph_model_case(inputs)


def _case(name: str, cls: type, build: Callable, description: str, **kwargs: Any) -> GoldenCase:
    return GoldenCase(name, cls, kwargs, build, description)


# fmt: off
CASES: tuple[GoldenCase, ...] = (
    _case("gatconv_v1", GATConv, _gat_conv, "GATv1, 2 heads concatenated", in_channels=4,
          out_channels=3, heads=2),
    _case("gatconv_v1_mean_no_self_loops", GATConv, _gat_conv,
          "GATv1 heads averaged, no self-loops: node 5 has zero in-degree (output = bias)",
          in_channels=4, out_channels=3, heads=2, concat=False, add_self_loops=False),
    _case("gatconv_v2_shared", GATConv, _gat_conv, "GATv2, W_s = W_t", in_channels=4,
          out_channels=3, heads=2, version="v2", share_weights=True),
    _case("gatconv_v2_separate", GATConv, _gat_conv, "GATv2, separate W_s and W_t",
          in_channels=4, out_channels=3, heads=2, version="v2", negative_slope=0.1),
    _case("gatconv_v1_lipschitz_paper", GATConv, _gat_conv, "GATv1 + LipschitzNorm (paper)",
          in_channels=4, out_channels=3, heads=2, lipschitz_norm="paper"),
    _case("gatconv_v2_lipschitz_paper", GATConv, _gat_conv, "GATv2 + LipschitzNorm (paper)",
          in_channels=4, out_channels=3, heads=2, version="v2", lipschitz_norm="paper"),
    _case("gatconv_v1_lipschitz_reference_code", GATConv, _gat_conv,
          "GATv1 + LipschitzNorm as the authors' code", in_channels=4, out_channels=3,
          heads=2, lipschitz_norm="reference-code"),
    # The released code mixes heads and nodes when H > 1 (refimpl.nn.lipschitz.
    # neighbourhood_norm), so only one head is a case its port can reproduce.
    _case("gatconv_v1_lipschitz_reference_code_one_head", GATConv, _gat_conv,
          "GATv1 + LipschitzNorm as the authors' code, one head: the case a port of the "
          "released code (which mixes heads when H > 1) reproduces", in_channels=4,
          out_channels=3, heads=1, lipschitz_norm="reference-code"),
    _case("gatconv_v1_attention_dropout", GATConv, _gat_conv,
          "GATv1 training with attention dropout, keep-mask given", in_channels=4,
          out_channels=3, heads=2, dropout=0.4),
    # PyG's options beyond the papers (issue 22): edge features with the added loops' fill
    # (the graph's self-loop 4 -> 4 is dropped with its features), GATv2's projection biases
    _case("gatconv_v1_edge_features", GATConv, _gat_conv,
          "GATv1 with edge features (PyG edge_dim), the added loops' features the mean of "
          "each node's incoming ones", in_channels=4, out_channels=3, heads=2, edge_dim=2),
    _case("gatconv_v2_edge_features_max_fill_biases", GATConv, _gat_conv,
          "GATv2 as PyG's defaults train it: projection biases, edge features, the added "
          "loops' features the max of each node's incoming ones, residual", in_channels=4,
          out_channels=3, heads=2, version="v2", edge_dim=3, fill_value="max",
          projection_bias=True, residual=True),
    _case("transformerconv", TransformerConv, _transformer_conv, "UniMP / PyG TransformerConv",
          in_channels=4, out_channels=3, heads=2),
    _case("transformerconv_edge_beta_root", TransformerConv, _transformer_conv,
          "edge features, gated root weight (beta), heads averaged", in_channels=4,
          out_channels=3, heads=2, concat=False, beta=True, edge_dim=3, root_weight=True),
    _case("transformerconv_lipschitz_paper", TransformerConv, _transformer_conv,
          "LipschitzNorm Eq. 19 per target and head", in_channels=4, out_channels=3, heads=2,
          lipschitz_norm="paper"),
    _case("nodeformerconv_train_gumbel", NodeFormerConv, _graph_block_training,
          "training: projection and Gumbel noise given, sigmoid relational bias of order 2",
          in_channels=4, out_channels=3, heads=2, num_random_features=5, num_samples=3,
          relational_bias="sigmoid", rb_order=2),
    _case("nodeformerconv_eval_authors", NodeFormerConv, _nodeformer_conv_eval,
          "evaluation: projection given, identity relational bias, the authors' powers and "
          "d^(-1/4) scale", in_channels=4, out_channels=3, heads=2, num_random_features=5,
          relational_bias="identity", rb_order=2, rb_powers="authors", qk_scale="sqrt_d",
          projection="iid"),
    _case("pairnorm_pn", PairNorm, _node_rows, "PairNorm PN (PyG)", mode="PN"),
    _case("pairnorm_pn_si", PairNorm, _node_rows, "PairNorm PN-SI, eps outside the root",
          mode="PN-SI", scale=2.0),
    _case("pairnorm_pn_scs", PairNorm, _node_rows, "PairNorm PN-SCS (the authors' code)",
          mode="PN-SCS"),
    _case("layernorm_node", LayerNorm, _node_rows, "LayerNorm per node (torch.nn.LayerNorm)",
          channels=3, mode="node"),
    _case("layernorm_graph", LayerNorm, _node_rows, "LayerNorm over the graph (PyG default)",
          channels=3, mode="graph"),
    _case("attention_linear_score", Attention, _columns, "LipschitzNorm Eq. 4, g = Q^T X",
          dim=3, num_outputs=2),
    _case("attention_eq17", Attention, _columns, "normalised linear score, Eq. 17", dim=3,
          num_outputs=2, normalization="linear"),
    _case("attention_eq15", Attention, _columns, "Lipschitz-normalised score, Eq. 15",
          dim=3, num_outputs=2, normalization="lipschitz", alpha=2.0),
    _case("transformer_attention", TransformerAttention, _columns, "Eq. 7", dim=2),
    _case("transformer_attention_eq19", TransformerAttention, _columns, "Eq. 19", dim=2,
          normalization="lipschitz"),
    _case("multihead_transformer", MultiHeadAttention, _columns, "Eq. 5 with Eq. 7 heads",
          in_dim=3, head_dim=2, out_dim=3, heads=2),
    _case("multihead_transformer_eq19", MultiHeadAttention, _columns,
          "Eq. 5 with Eq. 19 heads", in_dim=3, head_dim=2, out_dim=3, heads=2,
          normalization="lipschitz"),
    _case("multihead_linear_eq17", MultiHeadAttention, _columns, "Eq. 5 with Eq. 17 heads",
          in_dim=3, head_dim=2, out_dim=3, heads=2, kind="linear", normalization="linear",
          num_outputs=2),
    _case("positive_random_features", PositiveRandomFeatures, _features,
          "NodeFormer Eq. 4 as printed"),
    _case("positive_random_features_row", PositiveRandomFeatures, _features,
          "Eq. 4 with the per-row shift differentiated", stabilizer="row"),
    _case("kernelized_softmax", KernelizedSoftmax, functools.partial(_all_pair, samples=0),
          "NodeFormer Eq. 5", tau=0.5),
    _case("kernelized_softmax_gumbel", KernelizedSoftmax, _all_pair,
          "NodeFormer Eq. 7 / Alg. 1, K = 3 samples", tau=0.5),
    _case("allpair_softmax_gumbel", AllPairSoftmax, _all_pair, "NodeFormer Eq. 6, exact",
          tau=0.5),
    _case("graph_transformer_layer", GraphTransformerLayer, _graph_block_training,
          "supplement Eq. 3-13: edge features, dropout masks given", channels=4, heads=2,
          edge_dim=2, dropout=0.2, attn_dropout=0.3),
    _case("gat_model", GAT, _graph_block_training,
          "2-layer GATv2, separate weights, biases, residual, input and attention dropout",
          in_channels=4, hidden_channels=3, out_channels=2, num_layers=2, heads=(2, 1),
          share_weights=False, bias=True, activation="elu", dropout=0.3, attn_dropout=0.2,
          residual=True),
    _case("nodeformer_model", NodeFormer, _graph_block_training,
          "2 layers, training noise given, dropout; edge loss off so L = sum(c * out)",
          in_channels=4, hidden_channels=4, out_channels=2, num_layers=2, heads=2,
          num_random_features=5, num_samples=3, dropout=0.2, edge_loss_weight=0.0),
    _case("graph_transformer_model", GraphTransformer, _graph_transformer,
          "graph level, batch of 2 graphs, global node, edge features, pe, dropout masks given",
          in_channels=3, out_channels=2, hidden_channels=4, num_layers=2, heads=2, edge_dim=2,
          pe_dim=2, global_node=True, pool="mean", dropout=0.1, attn_dropout=0.1),
    # the massive-activation study's architectures (issue 34), BatchNorm in training mode
    _case("graph_transformer_gt", GraphTransformer, study_transformer_inputs,
          "Dwivedi & Bresson's GT as released: edge stream, BatchNorm, explicit bias, dropout "
          "masks given, max readout", in_channels=3, out_channels=2, hidden_channels=4,
          num_layers=2, heads=2, edge_dim=2, pe_dim=2, pool="max", dropout=0.1, arch="gt",
          explicit_bias=True),
    _case("graph_transformer_graphit", GraphTransformer, study_transformer_inputs,
          "GraphiT-GT over all pairs, attention weighted by the 16-step random-walk kernel, "
          "BatchNorm, sum readout", in_channels=3, out_channels=2, hidden_channels=4,
          num_layers=2, heads=2, edge_dim=2, pe_dim=2, pool="sum", arch="graphit"),
    _case("graph_transformer_san", GraphTransformer, study_transformer_inputs,
          "SAN over all pairs (gamma 0.1), its learned Laplacian encoding of 3 eigenpairs with "
          "dropout masks given, LayerNorm, mean readout", in_channels=3, out_channels=2,
          hidden_channels=8, num_layers=2, heads=2, edge_dim=2, pool="mean", arch="san",
          norm="layer", lpe_eigenpairs=3, lpe_channels=4),
    _case("mlp_readout", MLPReadout, readout_inputs, "the released MLPReadout, widths 8, 4, 2, 2",
          in_channels=8, out_channels=2),
    _case("transformer_stream_batch_norm", TransformerStream, stream_inputs,
          "the released O / residual / BatchNorm / FFN skeleton in training, dropout masks given",
          channels=4, dropout=0.2),
    _case("transformer_stream_layer_and_batch", TransformerStream, stream_inputs,
          "the skeleton with LayerNorm then BatchNorm (the released layer_norm and batch_norm "
          "both on)", channels=4, norm="layer+batch"),
    _case("san_attention", SANAttention, pairs_inputs,
          "SAN's full attention: edge and non-edge parameter sets, gamma 0.1", channels=4,
          heads=2),
    _case("san_layer", SANLayer, pairs_inputs, "SAN's attention and the released node stream, "
          "BatchNorm in training, dropout masks given", channels=4, heads=2, dropout=0.1),
    _case("graphit_layer", GraphiTLayer, pairs_inputs, "GraphiT-GT over all pairs weighted by the "
          "random-walk kernel, the released node stream, BatchNorm in training", channels=4,
          heads=2, full_graph=True),
    _case("learned_laplacian_pe", LearnedLaplacianPE, eigenpairs_inputs,
          "SAN's learned Laplacian encoding: 2 encoder layers over 4 padded eigenpairs, dropout "
          "masks given", channels=4, heads=2, ffn_channels=8),
)
# fmt: on

GOLDEN_CASES: tuple[str, ...] = tuple(case.name for case in CASES)
