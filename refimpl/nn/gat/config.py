"""``GATConv``'s checks: one clear ``ValueError`` per field or combination a layer cannot be
built with (the PyG options it combines with included), and its inputs at the public
boundary (an overflow in its output or gradients: :mod:`refimpl.nn.overflow`)."""

from __future__ import annotations

from typing import Any

from refimpl.fields import check_bool, check_nonnegative_number, check_probability
from refimpl.graph import Graph
from refimpl.kernels.limits import check_count
from refimpl.nn.lipschitz.neighbourhood_norm import LIPSCHITZ_NORM_MODES
from refimpl.ops.loop_fill import check_fill_value
from refimpl.validation import (
    check_bipartite_inputs,
    check_block_inputs,
    check_graph_rows,
    check_optional_input,
)

__all__ = ["check_config", "check_inputs", "param_shapes"]

# GATConv's True/False fields
_FLAGS = ("concat", "share_weights", "add_self_loops", "bias", "residual", "projection_bias")


def check_config(conv: Any) -> Any:
    """Raise on a configuration ``conv`` (a ``GATConv``) cannot have; returns its
    ``fill_value`` as stored (:func:`refimpl.ops.loop_fill.check_fill_value`). Flags are
    stored as Python bools.

    Parameters
    ----------
    conv : GATConv
        The layer being constructed (its flags are normalised in place).
    """
    for name in _FLAGS:  # first: "False" would pass every check below as true
        object.__setattr__(conv, name, check_bool(getattr(conv, name), f"GATConv {name}"))
    for name in ("out_channels", "heads"):
        value = getattr(conv, name)
        if not _positive_int(value):
            raise ValueError(f"GATConv {name} must be a positive int, got {value!r}")
        check_count(value, f"GATConv {name}")  # at most 2**31 - 1
    sizes = conv.in_channels
    if isinstance(sizes, list):  # a JSON config's pair
        sizes = tuple(sizes)
        object.__setattr__(conv, "in_channels", sizes)
    pair = isinstance(sizes, tuple) and len(sizes) == 2 and all(map(_positive_int, sizes))
    if not (_positive_int(sizes) or pair):
        raise ValueError(
            f"GATConv in_channels must be a positive int, or a pair (F_src, F_dst) of them for a "
            f"bipartite layer, got {sizes!r}"
        )
    for size in sizes if pair else (sizes,):
        check_count(size, "GATConv in_channels")
    if pair and conv.version == "v2" and conv.share_weights and sizes[0] != sizes[1]:
        raise ValueError(
            f"share_weights needs one width on both sides, got in_channels={sizes}; use "
            "share_weights=False"
        )
    if pair and conv.lipschitz_norm is not None:
        raise ValueError("LipschitzNorm is defined on one node set: use one in_channels")
    edge_dim = conv.edge_dim
    if edge_dim is not None and (
        isinstance(edge_dim, bool) or not isinstance(edge_dim, int) or edge_dim < 1
    ):
        raise ValueError(f"GATConv edge_dim must be None or a positive int, got {edge_dim!r}")
    if edge_dim is not None:
        check_count(edge_dim, "GATConv edge_dim")
    fill_value = check_fill_value(conv.fill_value, edge_dim)
    if conv.projection_bias and conv.version != "v2":
        raise ValueError(
            "projection_bias is GATv2's (PyG's lin_l.bias, lin_r.bias); GATConv's lin has "
            "no bias: use version='v2' or projection_bias=False"
        )
    if edge_dim is not None and conv.lipschitz_norm is not None:
        raise ValueError(
            "LipschitzNorm is defined for scores without edge features (LipschitzNorm "
            "Sec. 5); use edge_dim=None or lipschitz_norm=None"
        )
    if conv.version not in ("v1", "v2"):
        raise ValueError(f"GATConv version must be 'v1' or 'v2', got {conv.version!r}")
    check_probability(conv.dropout, "GATConv dropout")  # NaN, a string or a bool fail too
    check_nonnegative_number(conv.negative_slope, "GATConv negative_slope")  # NaN, inf fail
    if conv.lipschitz_norm not in (None, *LIPSCHITZ_NORM_MODES):
        raise ValueError(
            f"GATConv lipschitz_norm must be None, 'paper' or 'reference-code', "
            f"got {conv.lipschitz_norm!r}"
        )
    if conv.lipschitz_norm == "reference-code" and conv.version != "v1":
        raise ValueError(
            "lipschitz_norm='reference-code' reproduces the authors' GATv1 code; "
            "use version='v1', or lipschitz_norm='paper' for GATv2"
        )
    if conv.lipschitz_norm is not None and conv.negative_slope > 1:
        # the normalised v2 score is bounded only if LeakyReLU is 1-Lipschitz
        raise ValueError(f"lipschitz_norm needs negative_slope <= 1, got {conv.negative_slope}")
    return fill_value


def param_shapes(conv: Any) -> dict[str, tuple[int, ...]]:
    """``GATConv.param_shapes``: the names and shapes of ``conv``'s parameters, in order."""
    hc, h, c = conv.heads * conv.out_channels, conv.heads, conv.out_channels
    f_src, f_dst = conv.in_sizes
    if conv.version == "v1":
        if isinstance(conv.in_channels, tuple):  # bipartite: lin_src, lin_dst
            shapes = {"W_s": (hc, f_src), "W_t": (hc, f_dst)}
        else:
            shapes = {"W": (hc, f_src)}
        shapes |= {"att_src": (h, c), "att_dst": (h, c)}
    else:
        shapes = {"W_s": (hc, f_src)}
        if conv.projection_bias:
            shapes["b_s"] = (hc,)
        if not conv.share_weights:
            shapes["W_t"] = (hc, f_dst)
            if conv.projection_bias:
                shapes["b_t"] = (hc,)
        shapes["att"] = (h, c)
    if conv.edge_dim is not None:
        shapes["W_e"] = (hc, conv.edge_dim)
        if conv.version == "v1":
            shapes["att_edge"] = (h, c)
    if conv.residual:
        shapes["W_res"] = (hc if conv.concat else c, f_dst)
    if conv.bias:
        shapes["bias"] = (hc,) if conv.concat else (c,)
    return shapes


def check_inputs(
    conv: Any, params: dict[str, Any], x: Any, graph: Graph, edge_attr: Any = None
) -> Graph:
    """``GATConv.forward``'s inputs (a sparse ``x`` or side whole, before any kernel reads it:
    :func:`~refimpl.validation.check_sparse_input`); returns the graph the layer attends over.

    Parameters
    ----------
    conv : GATConv
        The layer.
    params : dict
        Its parameters, checked against ``conv.param_shapes()``.
    x : array, sparse CSR matrix, or a pair of them
        The input features, ``(N, F)`` or ``(x_src, x_dst)``.
    graph : Graph
        The graph given to ``forward``.
    edge_attr : array, (E, D), optional
        The edge features, with ``edge_dim`` only.
    """
    f_src, f_dst = conv.in_sizes
    shapes = conv.param_shapes()
    if isinstance(x, tuple):  # bipartite: (x_src, x_dst), one row per node of each set
        check_bipartite_inputs(x, graph, "GATConv")
        if conv.lipschitz_norm is not None:
            raise ValueError("LipschitzNorm is defined on one node set: pass one x")
        check_block_inputs(params, shapes, "GATConv", x[0], f_src, "x_src", sparse=True)
        check_block_inputs(params, shapes, "GATConv", x[1], f_dst, "x_dst", sparse=True)
    else:
        if f_src != f_dst:
            raise ValueError(
                f"this GATConv has in_channels={conv.in_channels}: pass x as a pair "
                "(x_src, x_dst) with a bipartite Graph"
            )
        check_block_inputs(params, shapes, "GATConv", x, f_src, sparse=True)
        check_graph_rows(x, graph)
    x_src = x[0] if isinstance(x, tuple) else x
    check_optional_input(
        edge_attr, "edge_attr", "edge_dim", conv.edge_dim, graph.num_edges, x_src, "GATConv"
    )
    return conv.prepare_graph(graph)


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1
