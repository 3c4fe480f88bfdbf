"""Every field of every public configuration dataclass refuses what it cannot mean, in one line
naming the class and the field (issue 33, item 7): flags take only bools, counts and seeds only
ints, rates only finite numbers, names only the names listed."""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from refimpl.fields import check_bool
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.nn import GATConv, GraphTransformerLayer, NodeFormerConv, TransformerConv
from refimpl.nn.nodeformer.kernel_attention import KernelizedSoftmax
from refimpl.nn.nodeformer.random_features import PositiveRandomFeatures
from refimpl.nn.norms.batchnorm import BatchNorm
from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.norms.pairnorm import PairNorm
from refimpl.nn.transformer.graphit_attention import GraphiTAttention
from refimpl.nn.transformer.graphit_layer import GraphiTLayer
from refimpl.nn.transformer.gt_attention import GTAttention
from refimpl.nn.transformer.gt_layer import GTLayer
from refimpl.nn.transformer.pair_attention import PairAttention
from refimpl.nn.transformer.san_attention import SANAttention
from refimpl.nn.transformer.san_layer import SANLayer
from refimpl.nn.transformer.stream import TransformerStream
from refimpl.ops.linear import Linear
from refimpl.train import GraphTrainConfig, TrainConfig

# class -> a valid construction to vary one field of (GATConv in v2: projection_bias needs it)
BASES: dict[type, Callable[..., Any]] = {
    GATConv: lambda **kw: GATConv(4, 3, **{"version": "v2", **kw}),
    TransformerConv: lambda **kw: TransformerConv(4, 3, **kw),
    GraphTransformerLayer: lambda **kw: GraphTransformerLayer(4, **{"heads": 2, **kw}),
    NodeFormerConv: lambda **kw: NodeFormerConv(4, 3, **{"num_random_features": 5, **kw}),
    KernelizedSoftmax: lambda **kw: KernelizedSoftmax(**kw),
    PositiveRandomFeatures: lambda **kw: PositiveRandomFeatures(**kw),
    Linear: lambda **kw: Linear(4, 3, **kw),
    LayerNorm: lambda **kw: LayerNorm(3, "node", **kw),
    PairNorm: lambda **kw: PairNorm(**kw),
    GAT: lambda **kw: GAT(4, 3, 3, **{"num_layers": 2, **kw}),
    NodeFormer: lambda **kw: NodeFormer(
        4, **{"hidden_channels": 4, "out_channels": 3, "num_layers": 1, **kw}
    ),
    # the study's flags on an architecture that reads both (GraphiT-GT)
    GraphTransformer: lambda **kw: GraphTransformer(
        4,
        **{"hidden_channels": 4, "num_layers": 1, "heads": 2, **kw},
        **({"arch": "graphit"} if {"explicit_bias", "full_graph"} & set(kw) else {}),
        **({"full_graph": False} if "explicit_bias" in kw else {}),  # the released refusal
    ),
    BatchNorm: lambda **kw: BatchNorm(3, **kw),
    TransformerStream: lambda **kw: TransformerStream(4, **kw),
    GTAttention: lambda **kw: GTAttention(4, 4, **{"heads": 2, "edge_dim": 3, **kw}),
    GTLayer: lambda **kw: GTLayer(4, **{"heads": 2, **kw}),
    PairAttention: lambda **kw: PairAttention(2, 2, **{"explicit_bias": True, **kw}),
    GraphiTAttention: lambda **kw: GraphiTAttention(
        4, heads=2, **kw, **({"full_graph": False} if "explicit_bias" in kw else {})
    ),
    GraphiTLayer: lambda **kw: GraphiTLayer(
        4, heads=2, **kw, **({"full_graph": False} if "explicit_bias" in kw else {})
    ),
    SANAttention: lambda **kw: SANAttention(4, **{"heads": 2, **kw}),
    SANLayer: lambda **kw: SANLayer(4, **{"heads": 2, **kw}),
    TrainConfig: lambda **kw: TrainConfig(**kw),
    GraphTrainConfig: lambda **kw: GraphTrainConfig(**kw),
}
CONFIG_PACKAGES = ("refimpl.nn", "refimpl.models", "refimpl.ops", "refimpl.train")


def _flags(cls: type, optional: bool = False) -> list[str]:
    """The init fields annotated ``bool`` (``bool | None`` with ``optional``)."""
    wanted = "bool | None" if optional else "bool"
    return [f.name for f in dataclasses.fields(cls) if f.init and f.type == wanted]


def _configuration_classes() -> set[type]:
    """Every dataclass defined in the configuration packages that has a flag."""
    found = set()
    for package_name in CONFIG_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and dataclasses.is_dataclass(value)
                    and value.__module__ == module.__name__
                    and (_flags(value) or _flags(value, optional=True))
                ):
                    found.add(value)
    return found


FLAGS = [(cls, name) for cls in BASES for name in _flags(cls)]
# KernelizedSoftmax, an inner block, takes a Python bool only ("must be a bool")
NUMPY_FLAGS = [(cls, name) for cls, name in FLAGS if cls is not KernelizedSoftmax]
OPTIONAL_FLAGS = [(cls, name) for cls in BASES for name in _flags(cls, optional=True)]


def test_every_configuration_class_with_a_flag_is_held_here() -> None:
    # A new dataclass with a bool field must join BASES, so its flags are tested below.
    assert _configuration_classes() <= set(BASES), _configuration_classes() - set(BASES)
    assert len(FLAGS) >= 30  # the table found the flags: none skipped by an annotation typo


@pytest.mark.parametrize(("cls", "name"), FLAGS, ids=[f"{c.__name__}.{n}" for c, n in FLAGS])
@pytest.mark.parametrize("bad", ["False", "", 0, 1, 0.0, None, [True], np.array(True)])
def test_a_string_false_is_refused_not_read_as_true(cls: type, name: str, bad: object) -> None:
    # GATConv(concat="False") concatenated heads, and every flag of every configuration took
    # any value by its truth value (342 silent wrong results in the reliability harness): the
    # layer tests passed real bools only, and only NodeFormer's classes checked theirs.
    message = rf"^{cls.__name__} {name} must be (True or False|a bool), got "
    with pytest.raises(ValueError, match=message):
        BASES[cls](**{name: bad})


@pytest.mark.parametrize(
    ("cls", "name"), NUMPY_FLAGS, ids=[f"{c.__name__}.{n}" for c, n in NUMPY_FLAGS]
)
@pytest.mark.parametrize("flag", [True, False])
def test_a_numpy_bool_flag_is_stored_as_a_python_bool(cls: type, name: str, flag: bool) -> None:
    built = BASES[cls](**{name: np.bool_(flag)})
    assert type(getattr(built, name)) is bool and getattr(built, name) is flag
    assert built == BASES[cls](**{name: flag})


@pytest.mark.parametrize(
    ("cls", "name"), OPTIONAL_FLAGS, ids=[f"{c.__name__}.{n}" for c, n in OPTIONAL_FLAGS]
)
def test_a_tri_state_flag_takes_none_or_a_bool(cls: type, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__} {name} must be None, True or False"):
        BASES[cls](**{name: "False"})
    assert getattr(BASES[cls](**{name: np.bool_(True)}), name) is True
    assert getattr(BASES[cls](**{name: None}), name) is None


NOT_AN_INT = [math.nan, math.inf, 1e308, 1.5, 0.5, "2", [2], None, True, 2 + 1j, np.array(2.0)]
NOT_A_RATE = [math.nan, math.inf, -math.inf, -1, "0.1", [0.1], None, True, 1j, 10**400]
NOT_A_SEED = [-1, math.nan, 0.5, "0", [0], None, True, 1j, np.array(0.0), ""]

# (class, field, bad values, the message's start after "<class> <field> must be ")
FIELDS = [
    (TrainConfig, "epochs", [*NOT_AN_INT, 0, -1], "a positive int"),
    (TrainConfig, "lr", [*NOT_A_RATE, 0], "a finite number > 0"),
    (TrainConfig, "weight_decay", NOT_A_RATE, "a finite number >= 0"),
    (
        TrainConfig,
        "loss_threshold",
        [v for v in NOT_A_RATE if v is not None],
        "a finite number >= 0",
    ),
    (TrainConfig, "checkpoint_every", [*NOT_AN_INT, -1], "an int >= 0"),
    (TrainConfig, "seed", NOT_A_SEED, "an int >= 0"),
    (TrainConfig, "init", [["xavier"], np.array(1.0), None, "balanced"], "one of "),
    (TrainConfig, "optimizer", [["adam"], None, "rmsprop"], "one of 'sgd', 'adam'"),
    (GraphTrainConfig, "lr", [*NOT_A_RATE, 0], "a finite number > 0"),
    (GraphTrainConfig, "weight_decay", NOT_A_RATE, "a finite number >= 0"),
    (GraphTrainConfig, "seed", NOT_A_SEED, "an int >= 0"),
    (GraphTrainConfig, "checkpoint_every", [*NOT_AN_INT, -1], "an int >= 0"),
    (GAT, "activation", [["relu"], np.array(1.0), None, "tanh"], "one of 'elu', 'identity'"),
    (GAT, "activation_slope", [*NOT_A_RATE, -0.01], "a finite number >= 0"),
    (GAT, "negative_slope", [10**400], "a finite number >= 0"),
    (NodeFormer, "eval_seed", NOT_A_SEED, "an int >= 0"),
    (TransformerConv, "dropout", ["0.0", [0.0], None, 1j, math.nan, 1.0], "a probability"),
    (GraphTransformerLayer, "ffn_channels", [0, -1, False, "", 0.5, math.nan], "a positive int"),
    (GraphTransformer, "ffn_channels", [0, -1, False, "", 0.5, math.nan], "a positive int"),
]
FIELD_CASES = [(cls, name, bad, start) for cls, name, bads, start in FIELDS for bad in bads]


@pytest.mark.parametrize(
    ("cls", "name", "bad", "start"),
    FIELD_CASES,
    ids=[f"{c.__name__}.{n}={b!r}" for c, n, b, _ in FIELD_CASES],
)
def test_unchecked_fields_are_refused_at_construction_naming_class_and_field(
    cls: type, name: str, bad: object, start: str
) -> None:
    # TrainConfig(epochs=nan) failed in training with "'float' object cannot be interpreted
    # as an integer", seed="0" and checkpoint_every=0.5 were accepted, init=[...] said
    # "unhashable", NodeFormer's eval_seed got NumPy's seed messages, GAT's activation_slope
    # was never read unless the activation was leaky_relu, ffn_channels=-1 was refused as
    # "Linear out_features" and 0 meant the default: the tests fed each field one bad value
    # of one kind, and the models' tests never built these configurations at all.
    message = rf"^{cls.__name__} {name} must be {re.escape(start)}.*, got "
    with pytest.raises(ValueError, match=message) as error:
        BASES[cls](**{name: bad})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (TrainConfig, "seed", np.int64(3)),
        (TrainConfig, "loss_threshold", 0),
        (TrainConfig, "checkpoint_every", 0),
        (TrainConfig, "optimizer", "SGD"),  # make_optimizer's names are case-blind
        (GraphTrainConfig, "seed", 2**40),
        (NodeFormer, "eval_seed", np.uint8(7)),
        (GAT, "activation_slope", 0),
        (GraphTransformerLayer, "ffn_channels", np.int64(5)),
        (GraphTransformer, "ffn_channels", None),
    ],
)
def test_the_checks_keep_every_value_that_means_something(
    cls: type, name: str, value: object
) -> None:
    assert getattr(BASES[cls](**{name: value}), name) == value


def test_a_numpy_bool_config_is_json_ready() -> None:
    # A NumPy bool is no JSON value: a config written out (golden files, run records) from a
    # layer built with concat=np.True_ would fail there, far from the cause.
    conv = GATConv(4, 3, concat=np.True_, bias=np.False_)
    assert {type(conv.concat), type(conv.bias)} == {bool}
    assert check_bool(np.True_, "GATConv concat") is True
