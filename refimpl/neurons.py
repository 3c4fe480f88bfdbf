"""The parameters that enter and leave each hidden neuron of a ``GAT``.

GAT-balance's conservation law (Thm 2.2 = Eq. 3, Thm 6.3, Thm 6.4) and its
balancing (Procedure 2.6) both work neuron by neuron: for hidden neuron ``i``
of layer ``layer_index`` (``l = 0 .. L-2`` here, ``1 .. L-1`` in the paper) they sum over
three sets of parameters. Rescaling the first set by ``lambda > 0`` and the
other two by ``1 / lambda`` leaves the network's output unchanged (the proof of
Thm 2.2), which is where the law comes from:

- **incoming**: the rows ``W[i, :]`` of layer ``layer_index``'s feature matrices (``W``;
  ``W_s``; ``W_t`` when not shared, Thm 6.3), its bias ``b[i]``, and its residual
  row ``res_W[i, :]``;
- **attention**: layer ``layer_index``'s attention entries of neuron ``i`` (v2 ``att[i]``;
  v1 both ``att_src[i]`` and ``att_dst[i]``);
- **outgoing**: the columns ``W[:, i]`` of layer ``layer_index + 1``'s feature matrices
  (``W_s`` *and* ``W_t``: the target transform also reads ``h^l``) and its
  residual column ``res_W[:, i]``.

Heads (Thm 6.4). With concatenated heads, neuron ``i`` is channel ``i % C`` of
head ``i // C`` and owns one row and one attention entry. With averaged heads
(``h = mean_k phi(...)`` is not the model's form, but ``h = phi(mean_k ...)``
rescales the same way) neuron ``i`` is channel ``i`` of every head, so its
incoming and attention sets hold one entry per head. The outgoing columns span
all heads of layer ``layer_index + 1`` either way.

Everything here reads only the parameter dict (keys ``layer{l}.{name}`` as
``GAT.param_shapes``), so ``balance(params)`` needs no model object: a hidden
layer averages its heads exactly when the next layer reads ``C`` rather than
``H * C`` features (with one head the two coincide); the last layer, as in
``GAT``, averages its heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from refimpl.backend import get_array_module

__all__ = [
    "ATTENTION_NAMES",
    "WEIGHT_NAMES",
    "LayerParams",
    "attention_sums",
    "incoming_sums",
    "layer_structure",
    "neuron_sums",
    "outgoing_sums",
    "scale_incoming",
    "scale_outgoing",
]

WEIGHT_NAMES = ("W", "W_s", "W_t")  # a GATConv's feature matrices (rows out, columns in)
ATTENTION_NAMES = ("att", "att_src", "att_dst")  # its attention vectors, (H, C)
_KNOWN = (*WEIGHT_NAMES, *ATTENTION_NAMES, "bias", "res_W")
_KEY = re.compile(r"layer(\d+)\.(\w+)$")


@dataclass(frozen=True)
class LayerParams:
    """Where one layer's parameters sit in the flat dict, and how its heads combine.

    Parameters
    ----------
    weights : tuple of str
        The keys of ``W`` / ``W_s`` / ``W_t``, each ``(H*C, n_in)``.
    attention : tuple of str
        The keys of ``att`` / ``att_src`` / ``att_dst``, each ``(H, C)``.
    bias : str or None
        The key of the bias, ``(n_out,)``; None without one.
    residual : str or None
        The key of ``res_W``, ``(n_out, n_in)``; None without one.
    heads : int
        ``H``.
    channels : int
        ``C``.
    concat : bool
        ``n_out = H*C`` (else ``C``: heads averaged).
    """

    weights: tuple[str, ...]
    attention: tuple[str, ...]
    bias: str | None
    residual: str | None
    heads: int
    channels: int
    concat: bool

    @property
    def width(self) -> int:
        """``n_l``: how many neurons the layer outputs."""
        return self.heads * self.channels if self.concat else self.channels


def layer_structure(params: dict[str, Any]) -> list[LayerParams]:
    """Parse a ``GAT`` parameter dict into per-layer structure, layer 0 first.

    Raises ``ValueError`` naming the key or layer when the dict is not a GAT's
    (unknown names, missing attention, widths that do not chain).

    Parameters
    ----------
    params : dict of str to array
        A ``GAT``'s parameters, keys ``layer{l}.{name}`` (``GAT.param_shapes``).

    Returns
    -------
    list of LayerParams
        One per layer, layer 0 first.
    """
    names: dict[int, list[str]] = {}
    for key in params:
        match = _KEY.match(key)
        if match is None or match.group(2) not in _KNOWN:
            raise ValueError(
                f"{key!r} is not a GAT parameter name (expected 'layer{{l}}.{{name}}' with name "
                f"in {', '.join(_KNOWN)}); pass the dict GAT.init_params returns"
            )
        names.setdefault(int(match.group(1)), []).append(match.group(2))
    if sorted(names) != list(range(len(names))) or not names:
        raise ValueError(f"GAT layers must be numbered 0, 1, ...; got {sorted(names)}")
    layers = []
    for index in range(len(names)):
        local = names[index]
        attention = [n for n in ATTENTION_NAMES if n in local]
        weights = [n for n in WEIGHT_NAMES if n in local]
        if not attention or not weights:
            raise ValueError(f"layer{index} has no feature weights or no attention: {local}")
        heads, channels = params[f"layer{index}.{attention[0]}"].shape
        next_in = None
        if index + 1 < len(names):
            next_weight = next(n for n in WEIGHT_NAMES if n in names[index + 1])
            next_in = params[f"layer{index + 1}.{next_weight}"].shape[1]
        if next_in is not None and next_in not in (heads * channels, channels):
            raise ValueError(
                f"layer{index} outputs {heads} heads x {channels} channels but layer{index + 1} "
                f"reads {next_in} features; widths do not chain"
            )
        layers.append(
            LayerParams(
                weights=tuple(f"layer{index}.{n}" for n in weights),
                attention=tuple(f"layer{index}.{n}" for n in attention),
                bias=f"layer{index}.bias" if "bias" in local else None,
                residual=f"layer{index}.res_W" if "res_W" in local else None,
                heads=heads,
                channels=channels,
                # The GAT's output layer always averages its heads.
                concat=next_in is not None and next_in == heads * channels,
            )
        )
    return layers


def incoming_sums(values: dict[str, Any], layers: list[LayerParams], layer_index: int) -> Any:
    """Per neuron of layer ``layer_index``: ``values`` summed over its incoming set.

    Parameters
    ----------
    values : dict of str to array
        Keyed like the parameters, e.g. ``p * grad`` or ``p * p``.
    layers : list of LayerParams
        The model's structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l``.

    Returns
    -------
    array
        ``(n_l,)``.
    """
    layer = layers[layer_index]
    incoming = sum(_rows_to_neurons(values[k].sum(axis=1), layer) for k in layer.weights)
    if layer.bias is not None:
        incoming = incoming + values[layer.bias]  # (n_l,)
    if layer.residual is not None:
        incoming = incoming + values[layer.residual].sum(axis=1)
    return incoming


def attention_sums(values: dict[str, Any], layers: list[LayerParams], layer_index: int) -> Any:
    """Per neuron of layer ``layer_index``: ``values`` summed over its attention.

    Parameters
    ----------
    values : dict of str to array
        Keyed like the parameters, e.g. ``p * grad`` or ``p * p``.
    layers : list of LayerParams
        The model's structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l``.

    Returns
    -------
    array
        ``(n_l,)``.
    """
    layer = layers[layer_index]
    return sum(_heads_to_neurons(values[k], layer) for k in layer.attention)


def outgoing_sums(values: dict[str, Any], layers: list[LayerParams], layer_index: int) -> Any:
    """Per neuron of layer ``layer_index``: ``values`` summed over its outgoing set.

    Parameters
    ----------
    values : dict of str to array
        Keyed like the parameters, e.g. ``p * grad`` or ``p * p``.
    layers : list of LayerParams
        The model's structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l``, below the last.

    Returns
    -------
    array
        ``(n_l,)``.
    """
    following = layers[layer_index + 1]
    outgoing = sum(values[k].sum(axis=0) for k in following.weights)  # columns (n_l,)
    if following.residual is not None:
        outgoing = outgoing + values[following.residual].sum(axis=0)
    return outgoing


def neuron_sums(
    values: dict[str, Any], layers: list[LayerParams], layer_index: int
) -> tuple[Any, Any, Any]:
    """Per hidden neuron of layer ``layer_index < L-1``: ``values`` summed over each set.

    ``values`` is keyed like the parameters, e.g. ``p * grad`` (Thm 2.2's inner
    products) or ``p * p`` (squared norms, Cor 2.3).

    Parameters
    ----------
    values : dict of str to array
        Keyed like the parameters, e.g. ``p * grad`` or ``p * p``.
    layers : list of LayerParams
        The model's structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l``, below the last.

    Returns
    -------
    tuple of array
        ``(incoming, attention, outgoing)``, each ``(n_l,)``.
    """
    return (
        incoming_sums(values, layers, layer_index),
        attention_sums(values, layers, layer_index),
        outgoing_sums(values, layers, layer_index),
    )


def scale_incoming(
    params: dict[str, Any],
    layers: list[LayerParams],
    layer_index: int,
    factor: Any,
    attention: bool = True,
) -> dict[str, Any]:
    """A copy of ``params`` with neuron ``i``'s incoming set (and attention) times ``factor[i]``.

    Parameters
    ----------
    params : dict of str to array
        A ``GAT``'s parameters; not modified.
    layers : list of LayerParams
        Their structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l``.
    factor : array
        ``(n_l,)``, one factor per neuron.
    attention : bool, default True
        Whether the attention entries are scaled too.

    Returns
    -------
    dict of str to array
        A new dict; the arrays not scaled are shared with ``params``.
    """
    layer, out = layers[layer_index], dict(params)
    xp = get_array_module(factor)
    per_row = factor if layer.concat else xp.tile(factor, layer.heads)  # (H*C,)
    for key in layer.weights:
        out[key] = params[key] * per_row[:, None]
    if layer.bias is not None:
        out[layer.bias] = params[layer.bias] * factor
    if layer.residual is not None:
        out[layer.residual] = params[layer.residual] * factor[:, None]
    if attention:
        per_head = per_row.reshape(layer.heads, layer.channels)  # (H, C)
        for key in layer.attention:
            out[key] = params[key] * per_head
    return out


def scale_outgoing(
    params: dict[str, Any], layers: list[LayerParams], layer_index: int, factor: Any
) -> dict[str, Any]:
    """A copy of ``params`` with neuron ``i``'s outgoing columns times ``factor[i]``.

    The columns are those of layer ``layer_index + 1`` (and its residual weights).

    Parameters
    ----------
    params : dict of str to array
        A ``GAT``'s parameters; not modified.
    layers : list of LayerParams
        Their structure (:func:`layer_structure`).
    layer_index : int
        The layer ``l`` whose neurons' outgoing columns are scaled, below the last.
    factor : array
        ``(n_l,)``, one factor per neuron.

    Returns
    -------
    dict of str to array
        A new dict; the arrays not scaled are shared with ``params``.
    """
    following, out = layers[layer_index + 1], dict(params)
    keys = list(following.weights) + ([following.residual] if following.residual else [])
    for key in keys:
        out[key] = params[key] * factor[None, :]
    return out


def _rows_to_neurons(per_row: Any, layer: LayerParams) -> Any:
    """``(H*C,)`` per-row values to ``(n_l,)`` per neuron (summing heads when averaged)."""
    if layer.concat:
        return per_row
    return per_row.reshape(layer.heads, layer.channels).sum(axis=0)


def _heads_to_neurons(per_entry: Any, layer: LayerParams) -> Any:
    """``(H, C)`` attention values to ``(n_l,)`` per neuron."""
    if layer.concat:
        return per_entry.reshape(-1)
    return per_entry.sum(axis=0)
