"""Graph attention, GATv1 and GATv2 (GAT-balance Eq. 1-2): the layer and each version's score.

:mod:`~refimpl.nn.gat.conv` holds :class:`GATConv` (transform, softmax, dropout,
aggregation, heads, bias); :mod:`~refimpl.nn.gat.v1` and :mod:`~refimpl.nn.gat.v2` each
hold one version's attention score with its backward, so each fits one screen;
:mod:`~refimpl.nn.gat.fused_path` the device kernels' path (:func:`fused_kernels`). Their
literal twins are :mod:`refimpl.naive.gat_v1` and :mod:`refimpl.naive.gat_v2`.
"""

from refimpl.nn.gat.conv import GATCache, GATConv
from refimpl.nn.gat.fused_path import fused_kernels

__all__ = ["GATCache", "GATConv", "fused_kernels"]
