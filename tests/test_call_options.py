"""The non-array arguments of the layers' and models' forward and backward (``training``,
``rng``, ``input_grad``) are checked at the boundary, each refused in one line naming it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from refimpl import Graph
from refimpl.models import GAT, GraphTransformer, NodeFormer
from refimpl.nn import GATConv, GraphTransformerLayer, NodeFormerConv, TransformerConv
from refimpl.ops.dropout import Dropout

GRAPH = Graph([[0, 1, 2, 3], [1, 2, 3, 0]], 4)
X = np.random.default_rng(0).standard_normal((4, 4))

BLOCKS = {
    "GATConv": GATConv(4, 2, heads=2, dropout=0.5),
    "Dropout": Dropout(0.5),
    "TransformerConv": TransformerConv(4, 2, heads=2, dropout=0.5),
    "GraphTransformerLayer": GraphTransformerLayer(4, heads=2, dropout=0.5),
    "NodeFormerConv": NodeFormerConv(4, 2),
    "GAT": GAT(4, 2, 2, num_layers=2, dropout=0.5),
    "NodeFormer": NodeFormer(4, 4, 2, num_layers=1),
    "GraphTransformer": GraphTransformer(4, 2, hidden_channels=4, num_layers=1, heads=2),
}


def _params(block: Any) -> dict:
    return {} if isinstance(block, Dropout) else block.init_params(np.random.default_rng(1))


def _forward(block: Any, params: dict, **kwargs: Any) -> tuple[Any, Any]:
    if isinstance(block, Dropout):  # a block without a graph
        return block.forward(params, X, **kwargs)
    return block.forward(params, X, GRAPH, **kwargs)


@pytest.mark.parametrize("owner", sorted(BLOCKS))
@pytest.mark.parametrize("training", ["False", 1, None])
def test_training_flag_that_is_not_a_bool_is_refused_not_read_by_its_truth(
    owner: str, training: object
) -> None:
    # Regression (issue 33, item 7): forward read ``training`` by its truth value, so the
    # string "False" switched dropout on; no test passed anything but True or False.
    block = BLOCKS[owner]
    params = _params(block)
    with pytest.raises(ValueError, match=rf"^{owner} training must be True or False"):
        _forward(block, params, training=training, rng=np.random.default_rng(2))


@pytest.mark.parametrize("owner", sorted(BLOCKS))
@pytest.mark.parametrize("rng", [0, "seed", np.random.RandomState(0)])
def test_rng_that_is_not_a_generator_is_refused_not_met_as_an_attribute_error(
    owner: str, rng: object
) -> None:
    # Regression (issue 33, item 7): an int seed reached Dropout's rng.random(...) as
    # "AttributeError: 'int' object has no attribute 'random'" (NodeFormerConv alone checked
    # it, and only when it drew); the tests passed generators or None.
    block = BLOCKS[owner]
    params = _params(block)
    with pytest.raises(TypeError, match=rf"^{owner} rng must be a numpy\.random\.Generator"):
        _forward(block, params, training=True, rng=rng)


@pytest.mark.parametrize("owner", sorted(set(BLOCKS) - {"GraphTransformerLayer", "Dropout"}))
def test_input_grad_that_is_not_a_bool_is_refused(owner: str) -> None:
    # Regression (issue 33, item 7): backward read input_grad by its truth value ("no" skipped
    # nothing, 0 skipped d_x); no test passed anything but True or False.
    block = BLOCKS[owner]
    params = _params(block)
    out, cache = _forward(block, params, rng=np.random.default_rng(2))
    with pytest.raises(ValueError, match=rf"^{owner} input_grad must be True or False"):
        block.backward(params, cache, np.ones_like(out), input_grad="no")
    d_x, _ = block.backward(params, cache, np.ones_like(out), input_grad=np.bool_(False))
    assert d_x is None  # a NumPy bool is a bool
