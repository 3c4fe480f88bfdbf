"""The ground floor: aggregation kernels below :class:`refimpl.Graph` and every layer.

:mod:`~refimpl.kernels.segment` (segmentations of edges by node, gather, segment sum / max /
softmax with their backward passes; its fixed-order sums in :mod:`~refimpl.kernels.sums`, its
maxima and float order keys in :mod:`~refimpl.kernels.maxima`), :mod:`~refimpl.kernels.csr`
(sparse times dense products in row blocks), :mod:`~refimpl.kernels.parallel` (the thread pool
and its BLAS limit), :mod:`~refimpl.kernels.limits` (the largest count they index, ``2**31 -
1``), and the CUDA kernels with their host twins: :mod:`~refimpl.kernels.device_sums` (segment
sums in a fixed order) and :mod:`~refimpl.kernels.gat_fused` (GATv1's attention and aggregation
fused over CSR rows, twin :mod:`~refimpl.kernels.gat_fused_twin`), and
:mod:`~refimpl.kernels.gat_fused_scores` and :mod:`~refimpl.kernels.elu_fused` (the score
halves' gradient and ELU), and :mod:`~refimpl.kernels.adam` (Adam's update as one kernel). They
import only :mod:`refimpl.backend`.
"""
