"""Flat parameter dicts of stacked blocks: ``{prefix}.{name}`` keys, in block order.

A stack (a model, or a layer made of sub-blocks) holds its parameterised blocks in
a ``dict`` from prefix to block, in parameter order; every block has
``param_shapes()`` and ``init_params(rng, backend=, dtype=)``. These helpers give
the stack's flat layout, its initialisation and one block's view of it, so the
layout is written once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["flat_param_shapes", "init_flat_params", "split_params"]


def flat_param_shapes(blocks: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{prefix}.{name}`` and shape of every block's parameters, in block order."""
    return {
        f"{prefix}.{name}": shape
        for prefix, block in blocks.items()
        for name, shape in block.param_shapes().items()
    }


def init_flat_params(
    blocks: dict[str, Any], rng: np.random.Generator, backend: str | None, dtype: Any
) -> dict[str, Any]:
    """Each block's own ``init_params``, drawn from ``rng`` in block order, flattened."""
    return {
        f"{prefix}.{name}": value
        for prefix, block in blocks.items()
        for name, value in block.init_params(rng, backend=backend, dtype=dtype).items()
    }


def split_params(blocks: dict[str, Any], params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The parameters of ``blocks[prefix]`` under the block's own names."""
    return {name: params[f"{prefix}.{name}"] for name in blocks[prefix].param_shapes()}
