"""Why a PyTorch Geometric state dict does not fit a refimpl layer: the checks and error
messages of :func:`refimpl.interop.pyg.from_pyg`.

A state dict can lack keys, carry unexpected ones or hold other shapes
(:func:`mismatch_message` names each, spells out the configuration that implies the expected
shape, and says what the PyG flag behind such keys usually was), and it can hold values
refimpl cannot represent (:func:`check_values`): twin weights that differ (a bipartite
GATConv's ``lin_src``/``lin_dst``, GATv2's ``lin_l``/``lin_r`` under ``share_weights``),
non-zero GATv2 ``lin_l``/``lin_r`` biases (refimpl keeps the paper's form, GAT-balance Eq. 2),
and the query/key/value biases PyG before 2.7 kept under ``bias=False``
(pyg-team/pytorch_geometric#10163, fixed by #10177). The naming history and its sources are in
the docstring of :mod:`refimpl.interop.pyg`; the layouts in :mod:`refimpl.interop.pyg_layouts`.
"""

from __future__ import annotations

import numpy as np

from refimpl.interop.pyg_layouts import Entry, pyg_class
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.transformer.transformer_conv import TransformerConv

__all__ = ["check_values", "mismatch_message", "spelled_out"]


def spelled_out(formula: str, layer: GATConv | TransformerConv) -> str:
    """``formula`` with the configuration values it names: ``"(heads * out_channels,)
    (heads=2, out_channels=3)"``."""
    names = [n for n in ("heads", "out_channels", "in_channels", "edge_dim") if n in formula]
    return formula + " (" + ", ".join(f"{n}={getattr(layer, n)}" for n in names) + ")"


def check_values(
    layer: GATConv | TransformerConv,
    entries: list[Entry],
    given: dict[str, np.ndarray],
    head: str,
) -> None:
    """Twins equal, parameters refimpl lacks exactly zero."""
    problems = []
    for entry in entries:
        if entry.key not in given:
            continue
        value = given[entry.key]
        if entry.kind == "alias" and not np.array_equal(value, given[entry.source]):
            problems.append(_alias_problem(layer, head, entry))
        elif entry.kind == "zero" and np.any(value != 0):
            problems.append(_zero_problem(layer, head, entry, float(np.max(np.abs(value)))))
    if problems:
        raise ValueError("\n".join(problems))


def _alias_problem(layer: GATConv | TransformerConv, head: str, entry: Entry) -> str:
    key, source = head + entry.key, head + entry.source
    if isinstance(layer, GATConv) and layer.version == "v2":
        return (
            f"{key} differs from {source}, but this GATConv has share_weights=True (one "
            "matrix for source and target); construct it with share_weights=False to load "
            "them as W_s and W_t"
        )
    return (
        f"{key} differs from {source}: PyG holds two different weights only for a bipartite "
        "GATConv (in_channels given as a pair, separate source and target transforms); "
        "construct refimpl's with in_channels=(F_src, F_dst) to load them as W_s and W_t"
    )


def _zero_problem(layer: GATConv | TransformerConv, head: str, entry: Entry, size: float) -> str:
    key = head + entry.key
    if isinstance(layer, GATConv):
        return (
            f"{key} is not zero (max |value| = {size:.3g}) but this GATConv(version='v2') has "
            "projection_bias=False: no biases in W_s x and W_t x (the paper's form, "
            "GAT-balance Eq. 2), which PyG's GATv2Conv(bias=True) adds to lin_l and lin_r; "
            "construct it with projection_bias=True to load them as b_s and b_t"
        )
    fix = (
        "construct the refimpl layer with bias=True and add a zero 'lin_skip.bias' of shape "
        f"{(layer.heads * layer.out_channels if layer.concat else layer.out_channels,)} to "
        "the state dict (the output is then the same)"
        if layer.root_weight
        else "construct the refimpl layer with bias=True (the output is then the same)"
    )
    return (
        f"{key} is not zero (max |value| = {size:.3g}) but this TransformerConv has "
        "bias=False. PyG before 2.7 kept the query/key/value biases under bias=False (the "
        "flag reached only lin_skip; pyg-team/pytorch_geometric#10163, fixed by #10177), "
        f"and refimpl's bias flag covers all four linears: {fix}"
    )


def mismatch_message(
    layer: GATConv | TransformerConv,
    layout: str | None,
    head: str,
    missing: list[str],
    unexpected: list[str],
    mismatched: list[str],
    given: dict[str, np.ndarray],
) -> str:
    naming = {
        "lin": " (names of PyG >= 2.5)",
        "lin_src": " (names of PyG 2.0-2.4, or of a bipartite layer)",
        "lin_l": " (names of PyG 1.6-1.7)",
        "weight": " (names of PyG <= 1.5)",
    }.get(layout or "", "")
    lines = [
        f"the state dict does not fit {layer!r}, read as PyG's {pyg_class(layer)}{naming}"
        + (f" under prefix {head!r}" if head else "")
    ]
    if missing:
        lines.append("missing keys: " + ", ".join(head + k for k in missing))
    if unexpected:
        lines.append("unexpected keys: " + ", ".join(head + k for k in unexpected))
    lines += [f"shape mismatch: {m}" for m in mismatched]
    lines += _hints(layer, set(missing), set(unexpected))
    return "\n".join(lines)


def _hints(layer: GATConv | TransformerConv, missing: set[str], unexpected: set[str]) -> list[str]:
    """What a mismatch usually means, for the keys PyG's configurations add or remove."""
    hints = []
    bias_keys = {"bias", "lin_skip.bias", "lin_key.bias"}
    if missing & bias_keys and getattr(layer, "bias", False):
        hints.append("the PyG module had bias=False? construct the refimpl layer with bias=False")
    if unexpected & bias_keys and not layer.bias:
        hints.append("the PyG module had bias=True? construct the refimpl layer with bias=True")
    if isinstance(layer, GATConv):
        if unexpected & {"lin_edge.weight", "att_edge"}:
            hints.append("lin_edge: the PyG layer uses edge features; construct with edge_dim=")
        if missing & {"lin_edge.weight", "att_edge"}:
            hints.append("no lin_edge: the PyG layer has edge_dim=None; construct with it")
        if missing & {"lin_l.bias", "lin_r.bias"} and layer.projection_bias:
            hints.append("no lin_l.bias: the PyG layer has bias=False; construct with "
                         "bias=False, projection_bias=False")  # fmt: skip
        if "res.weight" in unexpected:
            hints.append(
                "res.weight: the PyG layer has residual=True (a linear skip, PyG >= 2.6); "
                "construct the refimpl layer with residual=True"
            )
        if "res.weight" in missing:
            hints.append("no res.weight: the PyG layer has residual=False; construct with it")
        if layer.version == "v1" and unexpected & {"att", "lin_l.bias"}:
            hints.append("this looks like a GATv2Conv state dict: use GATConv(version='v2')")
        if layer.version == "v2" and unexpected & {"att_src", "lin.weight", "lin_src.weight"}:
            hints.append("this looks like a GATConv (v1) state dict: use GATConv(version='v1')")
    else:
        if "lin_edge.weight" in unexpected:
            hints.append("lin_edge: the PyG layer uses edge features; construct with edge_dim=")
        if "lin_edge.weight" in missing:
            hints.append("no lin_edge: the PyG layer has edge_dim=None; construct with it")
        if "lin_beta.weight" in unexpected:
            hints.append("lin_beta: the PyG layer has beta=True; construct with beta=True")
        if "lin_beta.weight" in missing:
            hints.append("no lin_beta: the PyG layer has beta=False; construct with beta=False")
    return hints
