"""The caches of :class:`refimpl.models.gat.GAT`: one per layer, and the model's."""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.nn.gat.conv import GATCache
from refimpl.nn.norms.pairnorm import PairNormCache
from refimpl.ops.dropout import DropoutCache
from refimpl.ops.linear import LinearCache

__all__ = ["GATLayerCache", "GATModelCache"]


class GATLayerCache(NamedTuple):
    """One layer's caches, one per forward step.

    Attributes
    ----------
    input_dropout : DropoutCache
        F1, the input dropout's (its mask, or None outside training).
    conv : GATCache
        F2, the layer's :class:`~refimpl.nn.GATConv`.
    residual : LinearCache or None
        F3, the skip's; None without ``residual``.
    norm : PairNormCache or None
        F4, PairNorm's; None without ``pairnorm`` and on the last layer.
    activation : object
        F5, the activation's; None on the last layer.
    """

    input_dropout: DropoutCache
    conv: GATCache
    residual: LinearCache | None
    norm: PairNormCache | None
    activation: Any


class GATModelCache(NamedTuple):
    """What :meth:`GAT.backward` reads: the per-layer caches, layer 0 first.

    Attributes
    ----------
    layers : tuple of GATLayerCache
        One per layer, layer 0 first.
    """

    layers: tuple[GATLayerCache, ...]

    @property
    def noise(self) -> dict[str, Any]:
        """The dropout keep-masks used, as ``GAT.forward(noise=...)`` takes them.

        Only masks actually drawn appear (none in evaluation or for ``p = 0``).
        """
        noise = {}
        for i, layer in enumerate(self.layers):
            for key, mask in (
                ("input_mask", layer.input_dropout.mask),
                ("attn_mask", layer.conv.dropout_cache.mask),
            ):
                if mask is not None:
                    noise[f"layer{i}.{key}"] = mask
        return noise
