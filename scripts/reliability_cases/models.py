"""The models' forward and backward: ``GAT``, ``NodeFormer`` and ``GraphTransformer``.

References: for a GAT without residuals, the literal GATConv twins stacked with ReLU between
them, forward and backward written out here; for the others, the model itself on the
repaired input (NodeFormer in evaluation: its projections come from ``eval_seed``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl import Graph
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.naive import gat_v1, gat_v2
from reliability_cases.arrays import Spec, spec_cases
from reliability_cases.layers import EDGES, F, N, _dense, _features, _rng, _with_nonzero_bias
from reliability_cases.outcomes import Case

CLASSES = 3
# Two graphs in one batch: nodes 0-3 and 4-6, each edge inside its graph.
BATCH = np.array([0, 0, 0, 0, 1, 1, 1])
BATCH_EDGES = np.array([[0, 1, 2, 3, 1, 4, 5, 6, 5], [1, 2, 0, 0, 1, 5, 6, 4, 4]])


def _gat_reference(model: GAT, inputs: dict[str, Any]) -> dict[str, Any]:
    """The stacked twins: ``h = relu(conv_l(h))`` between layers, logits from the last."""
    twin = gat_v1 if model.version == "v1" else gat_v2
    forward = twin.gat_v1_forward if model.version == "v1" else twin.gat_v2_forward
    backward = twin.gat_v1_backward if model.version == "v1" else twin.gat_v2_backward
    params, graph = inputs["params"], inputs["graph"]
    h, caches, pre = _dense(inputs["x"]), [], []
    for i, conv in enumerate(model.layers):
        z, cache = forward(conv, model.layer_params(params, i), h, graph)
        caches.append(cache)
        pre.append(z)
        h = z if i == model.num_layers - 1 else np.maximum(z, 0.0)
    d_h, d_params = inputs["d_out"], {}
    for i in reversed(range(model.num_layers)):
        if i < model.num_layers - 1:
            d_h = d_h * (pre[i] > 0)  # ReLU's derivative, 0 at the kink as PyTorch's
        d_h, d_layer = backward(model.layers[i], model.layer_params(params, i), caches[i], d_h)
        d_params.update({f"layer{i}.{name}": value for name, value in d_layer.items()})
    return {"out": h, "grads": (d_h, {name: d_params[name] for name in params})}


def _gat_specs() -> list[Spec]:
    configs = [
        ("v2, 2 layers, 2 heads", {"heads": 2}, False, True),
        (
            "v1, 3 layers, bias, heads (2, 1, 1)",
            {"version": "v1", "num_layers": 3, "heads": (2, 1, 1), "bias": True},
            False,
            True,
        ),
        ("v2, sparse x", {"heads": 2}, True, True),
        (
            "v2, residual, PairNorm, LipschitzNorm",
            {"residual": True, "pairnorm": "PN", "lipschitz_norm": "paper"},
            False,
            False,
        ),
    ]
    specs = []
    for label, kwargs, sparse, twins in configs:
        model = GAT(
            **{
                "in_channels": F,
                "hidden_channels": 3,
                "out_channels": CLASSES,
                "num_layers": 2,
                **kwargs,
            }
        )
        label = f"GAT {label}"

        def build(model: GAT = model, label: str = label, sparse: bool = sparse) -> dict:
            rng = _rng(label)
            params = _with_nonzero_bias(model.init_params(rng), rng)
            x = _features(rng, N, F, sparse)
            return {
                "params": params,
                "x": x,
                "graph": Graph(EDGES, N),
                "d_out": rng.standard_normal((N, CLASSES)),
            }

        def call(inputs: dict[str, Any], model: GAT = model) -> dict[str, Any]:
            out, cache = model.forward(inputs["params"], inputs["x"], inputs["graph"])
            return {"out": out, "grads": model.backward(inputs["params"], cache, inputs["d_out"])}

        reference = (lambda i, m=model: _gat_reference(m, i)) if twins else call
        specs.append(Spec(label, build, call, reference))
    return specs


def _nodeformer_specs() -> list[Spec]:
    configs = [
        ("1 layer, no relational bias", {"num_layers": 1, "relational_bias": None}),
        ("2 layers, relational bias, ELU", {"activation": True, "heads": 2}),
    ]
    specs = []
    for label, kwargs in configs:
        model = NodeFormer(
            F, hidden_channels=4, out_channels=CLASSES, num_random_features=5, **kwargs
        )
        label = f"NodeFormer {label}"

        def build(model: NodeFormer = model, label: str = label) -> dict[str, Any]:
            rng = _rng(label)
            params = _with_nonzero_bias(model.init_params(rng), rng)
            return {
                "params": params,
                "x": rng.standard_normal((N, F)),
                "graph": Graph(EDGES, N),
                "d_out": rng.standard_normal((N, CLASSES)),
            }

        def call(inputs: dict[str, Any], model: NodeFormer = model) -> dict[str, Any]:
            out, cache = model.forward(inputs["params"], inputs["x"], inputs["graph"])
            return {"out": out, "grads": model.backward(inputs["params"], cache, inputs["d_out"])}

        specs.append(Spec(label, build, call, call))  # the model on the repaired input
    return specs


def _graph_transformer_specs() -> list[Spec]:
    configs = [
        ("graph level, mean pool, edge_dim=2, pe_dim=3", {"edge_dim": 2, "pe_dim": 3}),
        ("graph level, sum pool, global node", {"pool": "sum", "global_node": True}),
        ("node level", {"pool": None}),
    ]
    specs = []
    for label, kwargs in configs:
        model = GraphTransformer(
            F, out_channels=2, hidden_channels=4, num_layers=1, heads=2, **kwargs
        )
        label = f"GraphTransformer {label}"

        def build(model: GraphTransformer = model, label: str = label) -> dict[str, Any]:
            rng = _rng(label)
            params = _with_nonzero_bias(model.init_params(rng), rng)
            inputs: dict[str, Any] = {
                "params": params,
                "x": rng.standard_normal((N, F)),
                "graph": Graph(BATCH_EDGES, N),
            }
            if model.edge_dim:
                inputs["edge_attr"] = rng.standard_normal((BATCH_EDGES.shape[1], model.edge_dim))
            if model.pe_dim:
                inputs["pe"] = rng.standard_normal((N, model.pe_dim))
            rows = N
            if model.pool is not None:
                inputs["batch"], inputs["num_graphs"], rows = BATCH.copy(), 2, 2
            inputs["d_out"] = rng.standard_normal((rows, 2))
            return inputs

        def call(inputs: dict[str, Any], model: GraphTransformer = model) -> dict[str, Any]:
            keywords = {
                k: inputs[k] for k in ("edge_attr", "pe", "batch", "num_graphs") if k in inputs
            }
            out, cache = model.forward(inputs["params"], inputs["x"], inputs["graph"], **keywords)
            return {"out": out, "grads": model.backward(inputs["params"], cache, inputs["d_out"])}

        specs.append(Spec(label, build, call, call, domains={"num_graphs": "pos_int?"}))
    return specs


def cases() -> list[Case]:
    specs = _gat_specs() + _nodeformer_specs() + _graph_transformer_specs()
    return [case for spec in specs for case in spec_cases(spec)]
