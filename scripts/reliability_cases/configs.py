"""Configuration objects: every field of the layers, models, ``TrainConfig``,
``GraphTrainConfig`` and the optimisers set to NaN, infinity, huge, negative, zero, a
fraction, a string, a list, None, a bool, a complex number, NumPy scalars.

Each field has a domain (a positive int, a probability, one of some names, ...). A value
that stands for a valid one (``2.0`` for 2, ``1`` for True) may be accepted, and then the
object must work as if built with that value: it is *used* (a layer's forward on a small
graph, a model's, two epochs of training, an optimiser step) and the result compared with
the same use of the object built with the valid value. Any other value must be refused,
at construction or, naming the field, on first use.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from refimpl import Graph
from refimpl.data import karate_club, synthetic_molecules
from refimpl.init import INITIALISERS
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.nn import GATConv, GraphTransformerLayer, NodeFormerConv, TransformerConv
from refimpl.ops.linear import Linear
from refimpl.optim import SGD, Adam
from refimpl.train import GraphTrainConfig, TrainConfig, train_graph_model, train_model
from reliability_cases.corruptions import scalar_corruptions, scalar_repair, scalar_valid
from reliability_cases.layers import EDGES, F, N
from reliability_cases.models import BATCH, BATCH_EDGES
from reliability_cases.outcomes import Case, difference

REAL_BOOL = "bool"
ATTENTION = "choice:paper,reference-code?"


def _graph_use(obj: Any) -> Any:
    """A layer's or model's forward on the fixed graph (edge features when configured)."""
    rng = np.random.default_rng(0)
    params = obj.init_params(rng)
    x = rng.standard_normal((N, getattr(obj, "in_sizes", (F,))[0]))
    args: list[Any] = [params, x, Graph(EDGES, N)]
    if getattr(obj, "edge_dim", None):
        args.append(rng.standard_normal((EDGES.shape[1], obj.edge_dim)))
    if isinstance(obj, NodeFormerConv):
        return obj.forward(*args, rng=np.random.default_rng(1))[0]
    return obj.forward(*args)[0]


def _linear_use(obj: Linear) -> Any:
    rng = np.random.default_rng(0)
    return obj.forward(obj.init_params(rng), rng.standard_normal((N, obj.in_features)))[0]


def _graph_transformer_use(obj: GraphTransformer) -> Any:
    rng = np.random.default_rng(0)
    keywords: dict[str, Any] = {}
    if obj.edge_dim:
        keywords["edge_attr"] = rng.standard_normal((BATCH_EDGES.shape[1], obj.edge_dim))
    if obj.pe_dim:
        keywords["pe"] = rng.standard_normal((N, obj.pe_dim))
    if obj.pool is not None:
        keywords |= {"batch": BATCH, "num_graphs": 2}
    x = rng.standard_normal((N, obj.in_channels))
    return obj.forward(obj.init_params(rng), x, Graph(BATCH_EDGES, N), **keywords)[0]


def _optimizer_use(obj: Any) -> Any:
    params = {"w": np.array([1.0, -2.0, 0.5])}
    grads = {"w": np.array([0.3, 0.1, -0.2])}
    state = obj.init(params)
    for _ in range(2):
        params, state = obj.step(params, grads, state)
    return params


def _capped(config: Any) -> Any:
    """The configuration with at most two epochs (a valid huge count is the user's to run)."""
    epochs = config.epochs
    return (
        dataclasses.replace(config, epochs=2) if isinstance(epochs, int) and epochs > 2 else config
    )


@functools.cache
def _karate() -> Any:
    return karate_club()


@functools.cache
def _molecules() -> tuple[Any, Any, Any, Any]:
    data = synthetic_molecules(12, seed=0)
    return data, data.subset(range(8)), data.subset(range(8, 10)), data.subset(range(10, 12))


def _train_use(config: TrainConfig) -> Any:
    model = GAT(34, 4, 2, num_layers=2)
    result = train_model(model, _karate(), _capped(config))
    return {"loss": np.array(result.final_train_loss), "params": result.params}


def _graph_train_use(config: GraphTrainConfig) -> Any:
    data, train, val, test = _molecules()
    model = GraphTransformer(
        data.num_node_features,
        data.num_targets,
        hidden_channels=4,
        num_layers=1,
        heads=2,
        edge_dim=data.num_edge_features,
    )
    result = train_graph_model(model, train, val, test, _capped(config))
    return {"loss": np.array(result.final_train_loss), "params": result.params}


# class -> (valid base arguments, {field: domain}, use)
OBJECTS: dict[type, tuple[dict[str, Any], dict[str, str], Any]] = {
    GATConv: (
        {"in_channels": F, "out_channels": 3},
        {
            "in_channels": "pos_int",
            "out_channels": "pos_int",
            "heads": "pos_int",
            "concat": REAL_BOOL,
            "version": "choice:v1,v2",
            "share_weights": REAL_BOOL,
            "negative_slope": "nonneg_real",
            "add_self_loops": REAL_BOOL,
            "bias": REAL_BOOL,
            "dropout": "prob",
            "lipschitz_norm": ATTENTION,
            "residual": REAL_BOOL,
            "edge_dim": "pos_int?",
            "projection_bias": REAL_BOOL,
        },
        _graph_use,
    ),
    TransformerConv: (
        {"in_channels": F, "out_channels": 3},
        {
            "heads": "pos_int",
            "concat": REAL_BOOL,
            "beta": REAL_BOOL,
            "dropout": "prob",
            "edge_dim": "pos_int?",
            "bias": REAL_BOOL,
            "root_weight": REAL_BOOL,
            "lipschitz_norm": "choice:paper?",
        },
        _graph_use,
    ),
    NodeFormerConv: (
        {"in_channels": F, "out_channels": 3, "num_random_features": 5},
        {
            "heads": "pos_int",
            "num_random_features": "pos_int",
            "tau": "pos_real",
            "num_samples": "pos_int",
            "use_gumbel": REAL_BOOL,
            "relational_bias": "choice:sigmoid,identity?",
            "rb_order": "pos_int",
            "rb_powers": "choice:paper,authors",
            "qk_scale": "choice:paper,sqrt_d",
            "projection": "choice:orthogonal,iid",
            "bias": REAL_BOOL,
            "add_self_loops": REAL_BOOL,
        },
        _graph_use,
    ),
    GraphTransformerLayer: (
        {"channels": F, "heads": 2},
        {
            "channels": "pos_int",
            "heads": "pos_int",
            "ffn_channels": "pos_int?",
            "edge_dim": "pos_int?",
            "dropout": "prob",
            "attn_dropout": "prob",
            "layer_norm": REAL_BOOL,
            "qkv_bias": REAL_BOOL,
            "lipschitz_norm": "choice:paper?",
        },
        _graph_use,
    ),
    Linear: (
        {"in_features": F, "out_features": 3},
        {"in_features": "pos_int", "out_features": "pos_int", "bias": REAL_BOOL},
        _linear_use,
    ),
    GAT: (
        {"in_channels": F, "hidden_channels": 3, "out_channels": 3, "num_layers": 2},
        {
            "hidden_channels": "pos_int",
            "out_channels": "pos_int",
            "num_layers": "pos_int",
            "heads": "pos_int",
            "version": "choice:v1,v2",
            "share_weights": REAL_BOOL,
            "bias": REAL_BOOL,
            "activation": "choice:relu,leaky_relu,elu,identity",
            "activation_slope": "nonneg_real",
            "dropout": "prob",
            "attn_dropout": "prob",
            "residual": REAL_BOOL,
            "negative_slope": "nonneg_real",
            "add_self_loops": REAL_BOOL,
            "concat": REAL_BOOL,
            "lipschitz_norm": ATTENTION,
            "pairnorm": "choice:PN,PN-SI,PN-SCS?",
        },
        _graph_use,
    ),
    NodeFormer: (
        {
            "in_channels": F,
            "hidden_channels": 4,
            "out_channels": 3,
            "num_layers": 1,
            "num_random_features": 5,
        },
        {
            "hidden_channels": "pos_int",
            "heads": "pos_int",
            "tau": "pos_real",
            "num_samples": "pos_int",
            "use_gumbel": REAL_BOOL,
            "relational_bias": "choice:sigmoid,identity?",
            "rb_order": "pos_int",
            "residual": REAL_BOOL,
            "layer_norm": REAL_BOOL,
            "activation": REAL_BOOL,
            "dropout": "prob",
            "edge_loss_weight": "nonneg_real",
            "edge_loss_convention": "choice:paper,authors",
            "eval_seed": "nonneg_int",
        },
        _graph_use,
    ),
    GraphTransformer: (
        {"in_channels": F, "out_channels": 2, "hidden_channels": 4, "num_layers": 1, "heads": 2},
        {
            "out_channels": "pos_int",
            "hidden_channels": "pos_int",
            "num_layers": "pos_int",
            "ffn_channels": "pos_int?",
            "edge_dim": "pos_int?",
            "pe_dim": "nonneg_int",
            "global_node": REAL_BOOL,
            "pool": "choice:mean,sum?",
            "dropout": "prob",
            "attn_dropout": "prob",
            "layer_norm": REAL_BOOL,
            "lipschitz_norm": "choice:paper?",
        },
        _graph_transformer_use,
    ),
    TrainConfig: (
        {"epochs": 2},
        {
            "epochs": "pos_int",
            "optimizer": "choice:adam,sgd",
            "lr": "pos_real",
            "weight_decay": "nonneg_real",
            "loss_threshold": "nonneg_real?",
            "checkpoint_every": "nonneg_int",
            "seed": "nonneg_int",
            "init": "choice:" + ",".join(sorted(INITIALISERS)),
            "diagnostics": REAL_BOOL,
            "batch_size": "pos_int?",
        },
        _train_use,
    ),
    GraphTrainConfig: (
        {"epochs": 1, "batch_size": 4},
        {
            "epochs": "pos_int",
            "batch_size": "pos_int",
            "lr": "pos_real",
            "weight_decay": "nonneg_real",
            "loss": "choice:l1,mse,bce?",
            "seed": "nonneg_int",
            "sign_flip": REAL_BOOL,
            "checkpoint_every": "nonneg_int",
            "dtype": "choice:float32,float64",
            "eval_batch_size": "pos_int",
        },
        _graph_train_use,
    ),
    SGD: ({"lr": 0.1}, {"lr": "pos_real", "weight_decay": "nonneg_real"}, _optimizer_use),
    Adam: (
        {},
        {"lr": "pos_real", "eps": "pos_real", "weight_decay": "nonneg_real"},
        _optimizer_use,
    ),
}


def _as_if(use: Any, cls: type, arguments: dict[str, Any], value: Any) -> str | None:
    """Whether ``value`` is what the object built from the valid ``arguments`` gives."""
    return difference(value, use(cls(**arguments)), 0.0)


def _field_cases(cls: type, base: dict[str, Any], name: str, domain: str, use: Any) -> list:
    default = base.get(name, next(f.default for f in dataclasses.fields(cls) if f.name == name))
    out = []
    for label, bad in scalar_corruptions(default):
        check = None
        if scalar_valid(bad, domain):
            repaired = scalar_repair(bad, domain)
            check = functools.partial(_as_if, use, cls, {**base, name: repaired})
        out.append(
            Case(
                f"{cls.__name__} | {name} | {label} ({bad!r})",
                lambda bad=bad: use(cls(**{**base, name: bad})),
                check,
                () if check else (name,),  # a refusal of a valid value need not name the field
            )
        )
    return out


def cases() -> list[Case]:
    out = []
    for cls, (base, domains, use) in OBJECTS.items():
        out.append(
            Case(
                f"{cls.__name__} | valid fields",
                lambda c=cls, b=base, u=use: u(c(**b)),
                lambda value, c=cls, b=base, u=use: difference(value, u(c(**b)), 0.0),
            )
        )
        for name, domain in domains.items():
            out += _field_cases(cls, base, name, domain, use)
    return out
