"""NodeFormer (Wu et al. 2022): its blocks and its layer.

:mod:`~refimpl.nn.nodeformer.random_features` (positive random features, Eq. 4),
:mod:`~refimpl.nn.nodeformer.kernel_attention` (kernelised softmax and Gumbel-Softmax,
Eq. 5-7, Alg. 1, with the all-pair ground truth), :mod:`~refimpl.nn.nodeformer.relational_bias`
(Eq. 8), :mod:`~refimpl.nn.nodeformer.conv` (the layer, Alg. 1) and
:mod:`~refimpl.nn.nodeformer.edge_loss` (Eq. 10-12).
"""
