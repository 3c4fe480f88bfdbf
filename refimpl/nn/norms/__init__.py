"""Normalisation layers: :mod:`~refimpl.nn.norms.layernorm` (the graph transformer's),
:mod:`~refimpl.nn.norms.batchnorm` (``torch.nn.BatchNorm1d``, Dwivedi & Bresson's GT) and
:mod:`~refimpl.nn.norms.pairnorm` (PairNorm, for deep GATs)."""
