"""PyTorch Geometric's state-dict layouts, release by release: which keys a ``GATConv``,
``GATv2Conv`` or ``TransformerConv`` has, their shapes, and the map of each to our
parameters. :mod:`refimpl.interop.pyg` converts with these tables; its docstring has the
naming history and the sources for each release boundary.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from refimpl.nn.gat.conv import GATConv
from refimpl.nn.transformer.transformer_conv import TransformerConv

__all__ = [
    "NEWEST",
    "Entry",
    "detect_gat_v1_layout",
    "layout_entries",
    "parse_version",
    "pyg_class",
]

NEWEST = (99, 0)  # pyg_version=None: the newest naming


class Entry(NamedTuple):
    """One key of PyG's state dict and what it is here."""

    key: str  # PyG's name, without prefix
    shape: tuple[int, ...]
    formula: str  # the shape in words, for messages
    kind: str  # "param" (our params), "alias" (equals ``source``), "zero", "ignored"
    ours: tuple[str, ...] = ()  # our names that this key holds ("param")
    source: str = ""  # "alias": the key it must equal
    required: bool = True  # from_pyg: must be present
    emit: bool = True  # to_pyg: written
    to_ours: Callable[..., tuple] | None = None  # PyG array -> our arrays (default: identity)
    to_theirs: Callable[..., Any] | None = None  # our arrays -> PyG array (default: identity)


def _att_to_ours(a: np.ndarray) -> tuple[np.ndarray]:
    return (a[0],)  # (1, H, C) -> (H, C)


def _att_to_pyg(a: np.ndarray) -> np.ndarray:
    return a[None]  # (H, C) -> (1, H, C)


# -- layouts -------------------------------------------------------------------------------------


def parse_version(pyg_version: str | None) -> tuple[int, int]:
    """``(major, minor)`` from a version string such as ``"2.4.0"`` or ``"2.6.1+pt24cu121"``."""
    if pyg_version is None:
        return NEWEST
    match = re.match(r"\s*(\d+)\.(\d+)", pyg_version) if isinstance(pyg_version, str) else None
    if match is None:
        raise ValueError(
            f"pyg_version must be a version string like '2.4.0' (torch_geometric.__version__) "
            f"or None for the newest layout, got {pyg_version!r}"
        )
    return int(match[1]), int(match[2])


def _gat_v1_layout(version: tuple[int, int]) -> str:
    """The GATConv naming in force at a PyG release (see the module docstring)."""
    if version < (1, 6):
        return "weight"
    if version < (2, 0):
        return "lin_l"
    if version < (2, 5):
        return "lin_src"
    return "lin"


def detect_gat_v1_layout(keys: set[str]) -> str:
    """The GATConv naming of a state dict, by its weight's name."""
    for marker, layout in (
        ("lin.weight", "lin"),
        ("lin_src.weight", "lin_src"),
        ("lin_l.weight", "lin_l"),
        ("weight", "weight"),
    ):
        if marker in keys:
            return layout
    return "lin"  # nothing recognisable: report against the newest names


def _bias_entry(layer: GATConv | TransformerConv, key: str = "bias", ours: str = "bias") -> Entry:
    width = layer.heads * layer.out_channels if layer.concat else layer.out_channels
    words = (
        "(heads * out_channels,) with concat" if layer.concat else "(out_channels,), concat=False"
    )
    return Entry(key, (width,), words, "param", (ours,))


def _gat_entries(layer: GATConv, layout: str) -> list[Entry]:
    """In PyG's state-dict order: the module's own tensors (attention vectors, bias), then its
    submodules' (the projections, ``lin_edge``, ``res``)."""
    h, c = layer.heads, layer.out_channels
    pair = isinstance(layer.in_channels, tuple)
    n_in, n_dst = layer.in_channels if pair else (layer.in_channels, layer.in_channels)
    weight, att = (h * c, n_in), (1, h, c)
    weight_words = "(heads * out_channels, in_channels)"
    if pair:  # bipartite: the sources' width first, the targets' second
        weight_words = "(heads * out_channels, in_channels[0])"
        target, target_words = (h * c, n_dst), "(heads * out_channels, in_channels[1])"
    else:
        target, target_words = weight, weight_words
    bias = [_bias_entry(layer)] if layer.bias else []
    edge = []  # lin_edge = Linear(edge_dim, heads * out_channels, bias=False), with edge_dim
    if layer.edge_dim is not None:
        words = "(heads * out_channels, edge_dim)"
        edge.append(Entry("lin_edge.weight", (h * c, layer.edge_dim), words, "param", ("W_e",)))
    residual = []  # PyG >= 2.6: res = Linear(in, width, bias=False), after bias
    if layer.residual:
        width = h * c if layer.concat else c
        words = "(heads * out_channels or out_channels, in_channels), residual=True"
        if pair:
            words = words.replace("in_channels)", "in_channels[1])")
        residual.append(Entry("res.weight", (width, n_dst), words, "param", ("W_res",)))
    if layer.version == "v2":
        return [
            _att_entry("att", "att", att),
            *bias,
            *_gatv2_projection_entries(layer, weight, weight_words, target, target_words),
            *edge,
            *residual,
        ]
    edge_att = [_att_entry("att_edge", "att_edge", att)] if layer.edge_dim is not None else []
    if pair:  # bipartite GATConv (every release since 2.0): lin_src and lin_dst, separate
        return [
            _att_entry("att_src", "att_src", att),
            _att_entry("att_dst", "att_dst", att),
            *edge_att,
            *bias,
            Entry("lin_src.weight", weight, weight_words, "param", ("W_s",)),
            Entry("lin_dst.weight", target, target_words, "param", ("W_t",)),
            *edge,
            *residual,
        ]
    if layout == "weight":  # PyG <= 1.5: x @ weight, att = [att_dst | att_src]
        return [
            Entry(
                "weight",
                (n_in, h * c),
                "(in_channels, heads * out_channels) (PyG <= 1.5: W transposed)",
                "param",
                ("W",),
                to_ours=lambda a: (a.T,),
                to_theirs=lambda w: w.T,
            ),
            Entry(
                "att",
                (1, h, 2 * c),
                "(1, heads, 2 * out_channels) (PyG <= 1.5: [att_dst | att_src])",
                "param",
                ("att_dst", "att_src"),
                to_ours=lambda a: (a[0, :, :c], a[0, :, c:]),
                to_theirs=lambda dst, src: np.concatenate([dst, src], axis=-1)[None],
            ),
            *bias,
            *residual,
        ]
    src, dst, lin = {
        "lin": ("att_src", "att_dst", "lin"),
        "lin_src": ("att_src", "att_dst", "lin_src"),
        "lin_l": ("att_l", "att_r", "lin_l"),
    }[layout]
    entries = [
        _att_entry(src, "att_src", att),
        _att_entry(dst, "att_dst", att),
        *edge_att,
        *bias,
        Entry(f"{lin}.weight", weight, weight_words, "param", ("W",)),
    ]
    if layout != "lin":  # the target side: the same module under a second name
        twin = "lin_dst" if layout == "lin_src" else "lin_r"
        entries.append(
            Entry(f"{twin}.weight", weight, weight_words, "alias", source=f"{lin}.weight")
        )
    return [*entries, *edge, *residual]


def _att_entry(key: str, ours: str, shape: tuple[int, int, int]) -> Entry:
    """An attention vector: PyG's ``(1, H, C)`` parameter, our ``(H, C)``."""
    return Entry(key, shape, "(1, heads, out_channels)", "param", (ours,),
                 to_ours=_att_to_ours, to_theirs=_att_to_pyg)  # fmt: skip


def _gatv2_projection_entries(
    layer: GATConv, weight: tuple, weight_words: str, target: tuple, target_words: str
) -> list[Entry]:
    """``lin_l`` and ``lin_r``: weights, and the biases PyG gives them under ``bias=True``
    (ours with ``projection_bias``; else they must be zero). ``lin_r`` is ``lin_l`` under a
    second name with ``share_weights``."""
    hc = weight[0]
    shared = layer.share_weights
    if layer.projection_bias:
        biases = [Entry("lin_l.bias", (hc,), "(heads * out_channels,)", "param", ("b_s",))]
        biases.append(
            Entry("lin_r.bias", (hc,), "(heads * out_channels,)", "alias", source="lin_l.bias")
            if shared
            else Entry("lin_r.bias", (hc,), "(heads * out_channels,)", "param", ("b_t",))
        )
    elif layer.bias:
        biases = [Entry(f"{lin}.bias", (hc,), "(heads * out_channels,)", "zero")
                  for lin in ("lin_l", "lin_r")]  # fmt: skip
    else:
        biases = []
    lin_r = (
        Entry("lin_r.weight", weight, weight_words, "alias", source="lin_l.weight")
        if shared
        else Entry("lin_r.weight", target, target_words, "param", ("W_t",))
    )
    return [
        Entry("lin_l.weight", weight, weight_words, "param", ("W_s",)),
        *biases[:1],
        lin_r,
        *biases[1:],
    ]


def _transformer_entries(layer: TransformerConv, version: tuple[int, int]) -> list[Entry]:
    hc = layer.heads * layer.out_channels
    f_src, f_dst = layer.in_sizes  # keys and values read the sources, the rest the targets
    pair = isinstance(layer.in_channels, tuple)
    width = hc if layer.concat else layer.out_channels
    hc_words = "(heads * out_channels,)"
    entries = []
    for lin, name, side in (("lin_key", "k", 0), ("lin_query", "q", 1), ("lin_value", "v", 0)):
        size = (f_src, f_dst)[side]
        words = f"in_channels[{side}]" if pair else "in_channels"
        entries.append(
            Entry(
                f"{lin}.weight",
                (hc, size),
                f"(heads * out_channels, {words})",
                "param",
                (f"W_{name}",),
            )
        )
        if layer.bias:
            entries.append(Entry(f"{lin}.bias", (hc,), hc_words, "param", (f"b_{name}",)))
        else:  # PyG < 2.7 kept these biases under bias=False
            entries.append(
                Entry(f"{lin}.bias", (hc,), hc_words, "zero", required=False, emit=version < (2, 7))
            )
    if layer.edge_dim is not None:
        shape = (hc, layer.edge_dim)
        entries.append(
            Entry("lin_edge.weight", shape, "(heads * out_channels, edge_dim)", "param", ("W_e",))
        )
    target = "in_channels[1]" if pair else "in_channels"
    skip_words = (
        f"(heads * out_channels, {target}) with concat"
        if layer.concat
        else f"(out_channels, {target}), concat=False"
    )
    skip_bias = _bias_entry(layer, "lin_skip.bias", "b_skip")
    if layer.root_weight:
        entries.append(Entry("lin_skip.weight", (width, f_dst), skip_words, "param", ("W_skip",)))
        if layer.bias:
            entries.append(skip_bias)
    else:  # PyG builds lin_skip regardless and never uses it without root_weight
        entries.append(
            Entry("lin_skip.weight", (width, f_dst), skip_words, "ignored", required=False)
        )
        if layer.bias:
            entries.append(skip_bias._replace(kind="ignored", ours=(), required=False))
    if layer.beta:
        words = "(1, 3 * heads * out_channels)" if layer.concat else "(1, 3 * out_channels)"
        entries.append(Entry("lin_beta.weight", (1, 3 * width), words, "param", ("w_beta",)))
    return entries


def layout_entries(layer: Any, layout: str | None, version: tuple[int, int]) -> list[Entry]:
    if isinstance(layer, GATConv):
        return _gat_entries(layer, layout or _gat_v1_layout(version))
    if isinstance(layer, TransformerConv):
        return _transformer_entries(layer, version)
    raise TypeError(
        f"layer must be a refimpl GATConv (version 'v1' or 'v2') or TransformerConv, got "
        f"{type(layer).__name__}; the PyG conversion covers these layers only"
    )


def pyg_class(layer: GATConv | TransformerConv) -> str:
    if isinstance(layer, TransformerConv):
        return "TransformerConv"
    return "GATConv" if layer.version == "v1" else "GATv2Conv"
