"""``TransformerConv``'s configuration and input checks: one clear error per field, combination
or input a layer cannot take (bipartite pairs included)."""

from __future__ import annotations

from typing import Any

from refimpl.fields import check_bool, check_positive_int, check_probability
from refimpl.graph import Graph
from refimpl.validation import (
    check_bipartite_inputs,
    check_block_inputs,
    check_graph_rows,
    check_optional_input,
)

__all__ = ["LIPSCHITZ_NORMS", "check_config", "check_inputs"]

LIPSCHITZ_NORMS = (None, "paper")


def check_config(conv: Any) -> None:
    """Raise on a configuration a ``TransformerConv`` cannot have, in one line.

    A JSON list ``in_channels`` becomes the pair, flags become Python bools.

    Parameters
    ----------
    conv : TransformerConv
        The layer being constructed (normalised in place).
    """
    for name in ("concat", "beta", "bias", "root_weight"):  # "False" would read as true
        object.__setattr__(conv, name, check_bool(getattr(conv, name), f"TransformerConv {name}"))
    if isinstance(conv.in_channels, list):  # a JSON config's pair
        object.__setattr__(conv, "in_channels", tuple(conv.in_channels))
    sizes = conv.in_channels if isinstance(conv.in_channels, tuple) else (conv.in_channels,)
    if len(sizes) > 2 or not sizes:
        raise ValueError(
            f"TransformerConv in_channels must be an int or a pair, got {conv.in_channels!r}"
        )
    for size in sizes:
        check_positive_int(size, "TransformerConv in_channels")
    if len(sizes) == 2 and conv.lipschitz_norm is not None:
        raise ValueError("LipschitzNorm is defined on one node set: use one in_channels")
    for name in ("out_channels", "heads"):
        check_positive_int(getattr(conv, name), f"TransformerConv {name}")
    if conv.edge_dim is not None:
        check_positive_int(conv.edge_dim, "TransformerConv edge_dim")
    check_probability(conv.dropout, "TransformerConv dropout")  # a string or None too
    if conv.lipschitz_norm not in LIPSCHITZ_NORMS:
        raise ValueError(
            f"TransformerConv lipschitz_norm must be None or 'paper' (LipschitzNorm Eq. 19), "
            f"got {conv.lipschitz_norm!r}"
        )
    if conv.beta and not conv.root_weight:
        raise ValueError(
            "TransformerConv beta=True gates the root weight's output, so it needs "
            "root_weight=True (PyG silently ignores beta without it); set beta=False or "
            "root_weight=True"
        )


def check_inputs(conv: Any, params: dict[str, Any], x: Any, graph: Graph, edge_attr: Any) -> None:
    """Check the parameters, ``x`` (or the pair ``(x_src, x_dst)``), the graph and ``edge_attr``.

    Parameters
    ----------
    conv : TransformerConv
        The layer.
    params : dict
        Its parameters, as :meth:`TransformerConv.param_shapes` lists them.
    x : array or tuple of two arrays
        ``(N, in_channels)``, or ``(x_src, x_dst)`` on a bipartite graph.
    graph : Graph
        The graph.
    edge_attr : (E, edge_dim) array or None
        Required exactly when ``edge_dim`` is set.
    """
    f_src, f_dst = conv.in_sizes
    shapes, owner = conv.param_shapes(), "TransformerConv"
    if isinstance(x, tuple):  # bipartite: (x_src, x_dst), one row per node of each set
        check_bipartite_inputs(x, graph, owner)
        if conv.lipschitz_norm is not None:
            raise ValueError("LipschitzNorm is defined on one node set: pass one x")
        check_block_inputs(params, shapes, owner, x[0], f_src, "x_src")
        check_block_inputs(params, shapes, owner, x[1], f_dst, "x_dst")
        x = x[0]
    else:
        if f_src != f_dst:
            raise ValueError(f"this {owner} has in_channels={conv.in_channels}: pass x as "
                             "a pair (x_src, x_dst) with a bipartite Graph")  # fmt: skip
        check_block_inputs(params, shapes, owner, x, f_src)
        check_graph_rows(x, graph)
    check_optional_input(
        edge_attr, "edge_attr", "edge_dim", conv.edge_dim, graph.num_edges, x, owner
    )
