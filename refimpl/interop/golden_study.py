"""Input builders of the golden cases of the massive-activation study's blocks and
architectures (GT, GraphiT-GT, SAN, their transformer stream, MLPReadout): the inputs each
case stores and how they enter ``forward`` (:class:`~refimpl.interop.golden_cases.CaseData`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.backend import to_numpy
from refimpl.data.full_graph import full_graph
from refimpl.data.graph_kernels import random_walk_kernel
from refimpl.graph import Graph
from refimpl.interop.golden_inputs import BATCH, BATCH_EDGES, NUM_NODES, CaseData, graph_model_case
from refimpl.models import GraphTransformer
from refimpl.nn import GraphiTLayer, LearnedLaplacianPE, MLPReadout, SANAttention, TransformerStream
from refimpl.nn.transformer.san_lpe import eigenpairs_padded


def study_transformer_inputs(block: GraphTransformer, rng: np.random.Generator) -> CaseData:
    """The study's architectures: the batch of two graphs (without its self-loop where the
    attention runs over all pairs, whose full graph has no self pair), training with fresh
    BatchNorm statistics, SAN's learned encoding on the graphs' own padded eigenpairs."""
    edges = BATCH_EDGES
    if block.arch != "gt" and block.full_graph:
        edges = edges[:, edges[0] != edges[1]]
    n = BATCH.size
    inputs = {
        "x": rng.standard_normal((n, block.in_channels)),
        "edge_index": edges.copy(),
        "num_nodes": np.array(n, np.int64),
        "edge_attr": rng.standard_normal((edges.shape[1], block.edge_dim)),
        "batch": BATCH.copy(),
    }
    if block.lpe_eigenpairs:
        node_ptr = np.array([0, 4, n])
        vectors, values, valid = eigenpairs_padded(Graph(edges, n), block.lpe_eigenpairs, node_ptr)
        inputs["pe"] = np.stack([vectors, values, valid.astype(np.float64)], axis=2)
    else:
        inputs["pe"] = rng.standard_normal((n, block.pe_dim))
    return graph_model_case(inputs)


def readout_inputs(block: MLPReadout, rng: np.random.Generator) -> CaseData:
    """MLPReadout: ``x (G, D)``, pooled graph representations."""
    inputs = {"x": rng.standard_normal((3, block.in_channels))}
    return CaseData(inputs, ("input/x",), ("x",))


def stream_inputs(block: TransformerStream, rng: np.random.Generator) -> CaseData:
    """TransformerStream in training: the attention's output and the residual input (M, D),
    fresh BatchNorm statistics, dropout masks drawn once and stored."""
    inputs = {
        "attn_out": rng.standard_normal((NUM_NODES, block.channels)),
        "residual_in": rng.standard_normal((NUM_NODES, block.channels)),
    }
    return CaseData(
        inputs,
        ("input/attn_out", "input/residual_in"),
        ("attn_out", "residual_in"),
        kwargs={"training": True},
        noise_kwarg="noise",
        draw_noise=True,
    )


def pairs_inputs(block: Any, rng: np.random.Generator) -> CaseData:
    """SANAttention, SANLayer, GraphiTLayer over the full graph of the two-graph batch (its
    self-loop dropped: the full graph has no self pair): ``x (N, D)``, the pairs' features
    ``e (P, D)``, ``real (P,)``, GraphiT's random-walk kernel ``(P,)``; the layers in training
    with fresh BatchNorm statistics and stored masks."""
    edges = BATCH_EDGES[:, BATCH_EDGES[0] != BATCH_EDGES[1]]
    n = BATCH.size
    pairs = full_graph(edges, n, BATCH)
    inputs = {
        "x": rng.standard_normal((n, block.channels)),
        "edge_index": to_numpy(pairs.graph.edge_index),
        "num_nodes": np.array(n, np.int64),
        "e": rng.standard_normal((pairs.num_pairs, block.channels)),
        "real": to_numpy(pairs.real),
    }
    array_kwargs = {"real": "input/real"}
    if isinstance(block, GraphiTLayer):
        inputs["kernel"] = to_numpy(random_walk_kernel(pairs.graph, edges, n, BATCH))
        array_kwargs["kernel"] = "input/kernel"
    if isinstance(block, SANAttention):
        return CaseData(
            inputs, ("input/x", "graph", "input/e"), ("x", "e"), array_kwargs=array_kwargs
        )
    return CaseData(
        inputs,
        ("input/x", "graph", "input/e"),
        ("x", "e"),
        kwargs={"training": True},
        array_kwargs=array_kwargs,
        noise_kwarg="noise",
        draw_noise=True,
    )


def eigenpairs_inputs(block: LearnedLaplacianPE, rng: np.random.Generator) -> CaseData:
    """LearnedLaplacianPE in training on the two-graph batch's padded eigenpairs (graph 1 has
    fewer nodes than eigenpairs), dropout masks drawn once and stored."""
    vectors, values, valid = eigenpairs_padded(
        Graph(BATCH_EDGES, BATCH.size), 4, np.array([0, 4, BATCH.size])
    )
    inputs = {"eigvecs": vectors, "eigvals": values, "valid": valid}
    return CaseData(
        inputs,
        ("input/eigvecs", "input/eigvals", "input/valid"),
        ("eigvecs", "eigvals"),
        kwargs={"training": True},
        noise_kwarg="noise",
        draw_noise=True,
    )
