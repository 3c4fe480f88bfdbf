"""Flat parameter dicts of stacked blocks: ``{prefix}.{name}`` keys, in block order.

A stack (a model, or a layer made of sub-blocks) holds its parameterised blocks in
a ``dict`` from prefix to block, in parameter order; every block has
``param_shapes()`` and ``init_params(rng, backend=, dtype=)``. These helpers give
the stack's flat layout, its initialisation, one block's view of it and, in the
backward pass, the collection of each block's gradients back into the flat layout,
so the layout is written once.

Gradients are collected into ``d_params`` as the backward walks the blocks: a key
met a second time (a parameter read by two steps) gets ``d_params[key] + grad``,
the earlier term first, so the sum is rounded in the order of the walk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl.validation import NonFiniteError

__all__ = [
    "accumulate_grads",
    "block_backward",
    "flat_param_shapes",
    "flat_state_shapes",
    "init_flat_params",
    "init_flat_state",
    "split_params",
]


def flat_param_shapes(blocks: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{prefix}.{name}`` and shape of every block's parameters, in block order.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    """
    return {
        f"{prefix}.{name}": shape
        for prefix, block in blocks.items()
        for name, shape in block.param_shapes().items()
    }


def init_flat_params(
    blocks: dict[str, Any], rng: np.random.Generator, backend: str | None, dtype: Any
) -> dict[str, Any]:
    """Each block's own ``init_params``, drawn from ``rng`` in block order, flattened.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    rng : numpy.random.Generator
        The generator every block draws from, in block order.
    backend : str or None
        The array backend of the parameters (None: the current one).
    dtype : dtype
        Their dtype.
    """
    return {
        f"{prefix}.{name}": value
        for prefix, block in blocks.items()
        for name, value in block.init_params(rng, backend=backend, dtype=dtype).items()
    }


def flat_state_shapes(blocks: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{prefix}.{name}`` and shape of the state beside the parameters (BatchNorm's running
    statistics) of every block that has some (``state_shapes()``), in block order.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    """
    return {
        f"{prefix}.{name}": shape
        for prefix, block in blocks.items()
        if hasattr(block, "state_shapes")
        for name, shape in block.state_shapes().items()
    }


def init_flat_state(blocks: dict[str, Any], backend: str | None, dtype: Any) -> dict[str, Any]:
    """Each stateful block's own ``init_state``, flattened as :func:`flat_state_shapes`.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    backend : str or None
        The array backend of the state (None: the current one).
    dtype : dtype
        Its dtype.
    """
    return {
        f"{prefix}.{name}": value
        for prefix, block in blocks.items()
        if hasattr(block, "init_state")
        for name, value in block.init_state(backend=backend, dtype=dtype).items()
    }


def split_params(blocks: dict[str, Any], params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The parameters of ``blocks[prefix]`` under the block's own names.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    params : dict
        The flat parameters, ``{prefix}.{name}`` keys.
    prefix : str
        The block's prefix.
    """
    return {name: params[f"{prefix}.{name}"] for name in blocks[prefix].param_shapes()}


def accumulate_grads(d_params: dict[str, Any], prefix: str, grads: dict[str, Any]) -> None:
    """Add a block's ``grads`` into ``d_params`` under ``{prefix}.{name}`` (in place).

    A new key takes the gradient as is; a key already present becomes
    ``d_params[key] + grad`` (a new array, the earlier term first).

    Parameters
    ----------
    d_params : dict
        The flat gradients collected so far; updated in place.
    prefix : str
        The block's prefix.
    grads : dict
        The block's gradients under its own names.
    """
    for name, grad in grads.items():
        key = f"{prefix}.{name}"
        d_params[key] = d_params[key] + grad if key in d_params else grad


def block_backward(
    blocks: dict[str, Any],
    params: dict[str, Any],
    prefix: str,
    cache: Any,
    d_out: Any,
    d_params: dict[str, Any],
    **kwargs: Any,
) -> Any:
    """``blocks[prefix].backward`` on its own parameters: collects its gradients into
    ``d_params`` (:func:`accumulate_grads`) and returns its input gradient.

    ``kwargs`` go to the block's backward (e.g. ``input_grad=False``). A non-finite
    cotangent (an overflow further down the backward) is reported with the block's name,
    as the models' forward names the layer that overflowed.

    Parameters
    ----------
    blocks : dict
        The stack's parameterised blocks by prefix, in parameter order.
    params : dict
        The flat parameters.
    prefix : str
        The block's prefix.
    cache : object
        The block's forward cache.
    d_out : array
        The gradient of the block's output.
    d_params : dict
        The flat gradients collected so far; updated in place.
    **kwargs
        Passed to the block's backward.
    """
    try:
        d_input, grads = blocks[prefix].backward(
            split_params(blocks, params, prefix), cache, d_out, **kwargs
        )
    except NonFiniteError as err:
        raise NonFiniteError(f"in {prefix}: {err}") from err
    accumulate_grads(d_params, prefix, grads)
    return d_input
