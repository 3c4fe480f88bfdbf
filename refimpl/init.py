"""Initialisation schemes for the models' ordered parameter dicts.

A scheme is ``fn(model, rng) -> {name: host float64 array}``, keyed and ordered
as ``model.param_shapes()``; ``model.init_params(rng, init=NAME)`` moves the
result to the backend and dtype. Every scheme leaves residual weights
(``res_W``) at zero, so that a balanced network stays balanced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["INITIALISERS", "init_xavier"]


def init_xavier(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each layer's ``GATConv.init_params`` (Glorot uniform, PyG-style); zero bias and res_W.

    Draw order: layer 0's weights and attention in ``GATConv.param_shapes``
    order, then layer 1's, ...; zeros draw nothing. So this equals calling
    ``conv.init_params(rng)`` for each of ``model.layers`` in turn.
    """
    drawn = {}
    for i, conv in enumerate(model.layers):
        for name, value in conv.init_params(rng, backend="numpy").items():
            drawn[f"layer{i}.{name}"] = value
    # Whatever the layers do not own (the residual weights) starts at zero.
    return {name: drawn.get(name, np.zeros(shape)) for name, shape in model.param_shapes().items()}


# Schemes by name. The balanced ones (GAT-balance Procedure 2.6: Bal_X, Bal_O) go here.
INITIALISERS: dict[str, Callable[[Any, np.random.Generator], dict[str, np.ndarray]]] = {
    "xavier": init_xavier,
}
