"""Normalisation layers: :mod:`~refimpl.nn.norms.layernorm` (the graph transformer's) and
:mod:`~refimpl.nn.norms.pairnorm` (PairNorm, for deep GATs)."""
