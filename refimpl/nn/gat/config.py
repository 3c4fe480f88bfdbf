"""``GATConv``'s configuration checks: one clear ``ValueError`` per field or combination
a layer cannot be built with (the PyG options it combines with included)."""

from __future__ import annotations

from typing import Any

from refimpl.nn.lipschitz.neighbourhood_norm import LIPSCHITZ_NORM_MODES
from refimpl.ops.loop_fill import check_fill_value

__all__ = ["check_config"]


def check_config(conv: Any) -> Any:
    """Raise on a configuration ``conv`` (a ``GATConv``) cannot have; returns its
    ``fill_value`` as stored (:func:`refimpl.ops.loop_fill.check_fill_value`)."""
    for name in ("out_channels", "heads"):
        value = getattr(conv, name)
        if not _positive_int(value):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    sizes = conv.in_channels
    if isinstance(sizes, list):  # a JSON config's pair
        sizes = tuple(sizes)
        object.__setattr__(conv, "in_channels", sizes)
    pair = isinstance(sizes, tuple) and len(sizes) == 2 and all(map(_positive_int, sizes))
    if not (_positive_int(sizes) or pair):
        raise ValueError(
            f"in_channels must be a positive int, or a pair (F_src, F_dst) of them for a "
            f"bipartite layer, got {sizes!r}"
        )
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
        raise ValueError(f"edge_dim must be None or a positive int, got {edge_dim!r}")
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
        raise ValueError(f"version must be 'v1' or 'v2', got {conv.version!r}")
    if not 0.0 <= conv.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {conv.dropout}")
    if conv.negative_slope < 0:
        raise ValueError(f"negative_slope must be >= 0, got {conv.negative_slope}")
    if conv.lipschitz_norm not in (None, *LIPSCHITZ_NORM_MODES):
        raise ValueError(
            f"lipschitz_norm must be None, 'paper' or 'reference-code', got {conv.lipschitz_norm!r}"
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


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1
