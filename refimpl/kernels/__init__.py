"""The ground floor: aggregation kernels below :class:`refimpl.Graph` and every layer.

:mod:`~refimpl.kernels.segment` (segmentations of edges by node, gather, segment
sum / max / softmax with their backward passes), :mod:`~refimpl.kernels.csr` (sparse
times dense products in row blocks), :mod:`~refimpl.kernels.parallel` (the thread
pool and its BLAS limit) and :mod:`~refimpl.kernels.limits` (the largest count they index,
``2**31 - 1``). They import only :mod:`refimpl.backend`.
"""
