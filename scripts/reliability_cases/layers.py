"""The layers' forward and backward: ``GATConv`` (v1, v2, edge features with every fill
value, bipartite input, sparse CSR features), ``Linear``, ``TransformerConv``,
``NodeFormerConv`` and ``GraphTransformerLayer``.

References: the literal twins (:mod:`refimpl.naive.gat_v1`, ``gat_v2``,
``transformer_conv``) for GATConv and TransformerConv, the dense formula for Linear, and
for the NodeFormer and graph-transformer layers the layer itself on the repaired input with
the same noise (their twins cover pieces, not the whole layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from refimpl import Graph
from refimpl.naive import gat_v1, gat_v2, transformer_conv
from refimpl.nn import GATConv, GraphTransformerLayer, NodeFormerConv, TransformerConv
from refimpl.ops.linear import Linear
from reliability_cases.arrays import Spec, spec_cases
from reliability_cases.corruptions import Corruption
from reliability_cases.outcomes import Case, as_host

N, F, E_DIM = 7, 4, 2  # nodes, features: no two sizes equal, so a transposed array is wrong
# Sources -> targets: a duplicate edge, two self-loops, nodes 3, 4, 6 with no incoming edge.
EDGES = np.array([[0, 1, 2, 3, 3, 1, 5, 4, 2, 0], [1, 2, 0, 0, 1, 1, 5, 2, 2, 1]])
N_DST = 4  # a bipartite graph's targets (sources: N)
BIPARTITE = np.array([[0, 1, 2, 3, 5, 4, 0, 6], [1, 2, 0, 0, 1, 3, 1, 2]])
FILL_VALUES = ("mean", "add", "sum", "max", "min", "mul", None, 0.5, (0.5, -2.0))


def _rng(label: str) -> np.random.Generator:
    """One generator per configuration, seeded by its label: the same inputs every run."""
    return np.random.default_rng(list(label.encode()))


def _features(rng: np.random.Generator, rows: int, cols: int, sparse: bool) -> Any:
    x = rng.standard_normal((rows, cols))
    if sparse:  # about half the entries stored, an empty row
        x[rng.random(x.shape) < 0.5] = 0.0
        x[0] = 0.0
        return sp.csr_matrix(x)
    return x


def _with_nonzero_bias(params: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Zero-initialised biases would hide a bias that is read wrongly."""
    return {
        k: v + 0.1 * rng.standard_normal(v.shape) if k.startswith("b") else v
        for k, v in params.items()
    }


def _graph_inputs(
    label: str,
    layer: Any,
    bipartite: bool,
    sparse: bool = False,
    edge_dim: int | None = None,
    in_sizes: tuple[int, int] = (F, F),
) -> Any:
    """A builder of fresh inputs for a layer on the fixed graph."""

    def build() -> dict[str, Any]:
        rng = _rng(label)
        params = _with_nonzero_bias(layer.init_params(rng), rng)
        if bipartite:
            graph = Graph(BIPARTITE, N, num_dst_nodes=N_DST)
            x: Any = (
                _features(rng, N, in_sizes[0], sparse),
                _features(rng, N_DST, in_sizes[1], sparse),
            )
        else:
            graph, x = Graph(EDGES, N), _features(rng, N, F, sparse)
        inputs = {"params": params, "x": x, "graph": graph}
        if edge_dim is not None:
            shape = (graph.num_edges,) if edge_dim == 1 else (graph.num_edges, edge_dim)
            inputs["edge_attr"] = rng.standard_normal(shape)  # (E,): PyG's 1-D form
        rows = N_DST if bipartite else N
        width = layer.heads * layer.out_channels if layer.concat else layer.out_channels
        inputs["d_out"] = rng.standard_normal((rows, width))
        return inputs

    return build


def _forward_backward(layer: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    args = [inputs["params"], inputs["x"], inputs["graph"]]
    if "edge_attr" in inputs:
        args.append(inputs["edge_attr"])
    out, cache = layer.forward(*args)
    return {"out": out, "grads": layer.backward(inputs["params"], cache, inputs["d_out"])}


def _dense(x: Any) -> Any:
    return tuple(map(as_host, x)) if isinstance(x, tuple) else as_host(x)


def _gat_twin(layer: GATConv, inputs: dict[str, Any]) -> dict[str, Any]:
    twin = gat_v1 if layer.version == "v1" else gat_v2
    forward = twin.gat_v1_forward if layer.version == "v1" else twin.gat_v2_forward
    backward = twin.gat_v1_backward if layer.version == "v1" else twin.gat_v2_backward
    edge_attr = inputs.get("edge_attr")
    flat = edge_attr is not None and edge_attr.ndim == 1
    if flat:
        edge_attr = edge_attr[:, None]
    params, x = inputs["params"], _dense(inputs["x"])
    out, cache = forward(layer, params, x, inputs["graph"], None, edge_attr)
    d_inputs, d_params = backward(layer, params, cache, inputs["d_out"])
    if flat:  # d_edge_attr shaped as the edge_attr given
        d_inputs = (d_inputs[0], d_inputs[1][:, 0])
    return {"out": out, "grads": (d_inputs, d_params)}


def gat_specs() -> list[Spec]:
    base = [
        ("v1", {"version": "v1", "heads": 2}),
        ("v2", {"version": "v2", "heads": 2}),
        (
            "v2 shared, biases, mean of heads, residual",
            {
                "version": "v2",
                "share_weights": True,
                "projection_bias": True,
                "concat": False,
                "residual": True,
                "heads": 2,
            },
        ),
        ("v1 LipschitzNorm", {"version": "v1", "lipschitz_norm": "paper"}),
        ("v2 no self-loops", {"version": "v2", "add_self_loops": False, "heads": 2}),
    ]
    configs = [(label, kw, False, False) for label, kw in base]
    configs += [
        (
            f"v1 edge_dim=2 fill={fill!r}",
            {"version": "v1", "edge_dim": 2, "fill_value": fill, "heads": 2},
            False,
            False,
        )
        for fill in FILL_VALUES
    ]
    configs += [
        (
            f"v2 edge_dim=2 fill={fill!r}",
            {"version": "v2", "edge_dim": 2, "fill_value": fill},
            False,
            False,
        )
        for fill in ("mean", "mul", "max")
    ]
    configs += [
        ("v2 edge_dim=1, 1-D edge_attr", {"version": "v2", "edge_dim": 1}, False, False),
        ("v1 bipartite (4, 5)", {"version": "v1", "in_channels": (F, 5), "heads": 2}, True, False),
        ("v2 bipartite (4, 5)", {"version": "v2", "in_channels": (F, 5)}, True, False),
        ("v1 sparse x", {"version": "v1", "heads": 2}, False, True),
        ("v2 sparse x, residual", {"version": "v2", "residual": True}, False, True),
    ]
    specs = []
    for label, kwargs, bipartite, sparse in configs:
        kwargs = {"in_channels": F, "out_channels": 3, **kwargs}
        layer = GATConv(**kwargs)
        label = f"GATConv {label}"
        edge_dim = layer.edge_dim
        build = _graph_inputs(label, layer, bipartite, sparse, edge_dim, layer.in_sizes)
        extra = ()
        if edge_dim is None:  # edge features given to a layer built without edge_dim
            extra = (
                (
                    "edge_attr",
                    Corruption("given, no edge_dim", lambda _: np.ones((10, 2))),
                ),
            )
        if not bipartite:  # PyG's pair (x, x) on one node set
            extra += (("x", Corruption("pair (x, x)", lambda x: (x, x), lambda x: x)),)
        specs.append(
            Spec(
                label,
                build,
                lambda i, c=layer: _forward_backward(c, i),
                lambda i, c=layer: _gat_twin(c, i),
                extra=extra,
            )
        )
    return specs


def _linear_reference(layer: Linear, inputs: dict[str, Any]) -> dict[str, Any]:
    params, x, d_y = inputs["params"], as_host(inputs["x"]), inputs["d_out"]
    out = x @ params["W"].T + (params["b"] if layer.bias else 0)
    d_params = {"W": d_y.T @ x}
    if layer.bias:
        d_params["b"] = d_y.sum(axis=0)
    return {"out": out, "grads": (d_y @ params["W"], d_params)}


def linear_specs() -> list[Spec]:
    specs = []
    for label, bias, sparse in (
        ("bias", True, False),
        ("no bias", False, False),
        ("sparse x", True, True),
    ):
        layer, label = Linear(F, 3, bias=bias), f"Linear {label}"

        def build(layer: Linear = layer, label: str = label, sparse: bool = sparse) -> dict:
            rng = _rng(label)
            params = _with_nonzero_bias(layer.init_params(rng), rng)
            x = _features(rng, N, F, sparse)
            return {"params": params, "x": x, "d_out": rng.standard_normal((N, 3))}

        def call(inputs: dict[str, Any], layer: Linear = layer) -> dict[str, Any]:
            out, cache = layer.forward(inputs["params"], inputs["x"])
            return {"out": out, "grads": layer.backward(inputs["params"], cache, inputs["d_out"])}

        specs.append(Spec(label, build, call, lambda i, c=layer: _linear_reference(c, i)))
    return specs


def _transformer_twin(layer: TransformerConv, inputs: dict[str, Any]) -> dict[str, Any]:
    params, x, d_out = inputs["params"], inputs["x"], inputs["d_out"]
    edge_index, edge_attr = inputs["graph"].edge_index, inputs.get("edge_attr")
    out = transformer_conv.transformer_conv_forward(layer, params, x, edge_index, edge_attr)[0]
    grads = transformer_conv.transformer_conv_backward(
        layer, params, x, edge_index, d_out, edge_attr
    )
    return {"out": out, "grads": grads}


def transformer_specs() -> list[Spec]:
    configs = [
        ("default", {}, False),
        ("2 heads, mean, beta", {"heads": 2, "concat": False, "beta": True}, False),
        ("edge_dim=2", {"edge_dim": E_DIM, "heads": 2}, False),
        ("LipschitzNorm", {"lipschitz_norm": "paper"}, False),
        ("no root weight", {"root_weight": False, "bias": False}, False),
        ("bipartite (4, 5)", {"in_channels": (F, 5), "heads": 2}, True),
    ]
    specs = []
    for label, kwargs, bipartite in configs:
        layer = TransformerConv(**{"in_channels": F, "out_channels": 3, **kwargs})
        label = f"TransformerConv {label}"
        build = _graph_inputs(label, layer, bipartite, False, layer.edge_dim, layer.in_sizes)
        specs.append(
            Spec(
                label,
                build,
                lambda i, c=layer: _forward_backward(c, i),
                lambda i, c=layer: _transformer_twin(c, i),
            )
        )
    return specs


def nodeformer_specs() -> list[Spec]:
    configs = [
        ("default", {}),
        ("2 heads, relational bias r=2", {"heads": 2, "relational_bias": "sigmoid", "rb_order": 2}),
        ("sqrt_d scale, identity bias", {"qk_scale": "sqrt_d", "relational_bias": "identity"}),
    ]
    specs = []
    for label, kwargs in configs:
        layer = NodeFormerConv(F, 3, num_random_features=5, **kwargs)
        label = f"NodeFormerConv {label}"

        def build(layer: NodeFormerConv = layer, label: str = label) -> dict[str, Any]:
            rng = _rng(label)
            params = _with_nonzero_bias(layer.init_params(rng), rng)
            return {
                "params": params,
                "x": rng.standard_normal((N, F)),
                "graph": Graph(EDGES, N),
                "noise": {"projection": rng.standard_normal((5, 3))},
                "d_out": rng.standard_normal((N, 3)),
            }

        def call(inputs: dict[str, Any], layer: NodeFormerConv = layer) -> dict[str, Any]:
            params = inputs["params"]
            out, cache = layer.forward(params, inputs["x"], inputs["graph"], noise=inputs["noise"])
            return {"out": out, "grads": layer.backward(params, cache, inputs["d_out"])}

        specs.append(Spec(label, build, call, call))  # the layer on the repaired input
    return specs


def graph_transformer_layer_specs() -> list[Spec]:
    configs = [
        ("default", {}),
        ("edge_dim=2", {"edge_dim": E_DIM}),
        ("LipschitzNorm, no LayerNorm", {"lipschitz_norm": "paper", "layer_norm": False}),
    ]
    specs = []
    for label, kwargs in configs:
        layer = GraphTransformerLayer(F, heads=2, **kwargs)
        label = f"GraphTransformerLayer {label}"

        def build(layer: GraphTransformerLayer = layer, label: str = label) -> dict[str, Any]:
            rng = _rng(label)
            params = _with_nonzero_bias(layer.init_params(rng), rng)
            inputs = {"params": params, "h": rng.standard_normal((N, F)), "graph": Graph(EDGES, N)}
            if layer.edge_dim:
                inputs["edge_attr"] = rng.standard_normal((EDGES.shape[1], layer.edge_dim))
            inputs["d_out"] = rng.standard_normal((N, F))
            return inputs

        def call(inputs: dict[str, Any], layer: GraphTransformerLayer = layer) -> dict:
            args = [inputs["params"], inputs["h"], inputs["graph"]]
            if "edge_attr" in inputs:
                args.append(inputs["edge_attr"])
            out, cache = layer.forward(*args)
            return {"out": out, "grads": layer.backward(inputs["params"], cache, inputs["d_out"])}

        specs.append(Spec(label, build, call, call))  # the layer on the repaired input
    return specs


def cases() -> list[Case]:
    specs = (
        gat_specs()
        + linear_specs()
        + transformer_specs()
        + nodeformer_specs()
        + graph_transformer_layer_specs()
    )
    return [case for spec in specs for case in spec_cases(spec)]
