"""Graph transformers: PyG's :class:`~refimpl.nn.transformer.transformer_conv.TransformerConv`
(Shi et al. 2021) and the massive-activation supplement's layer (Eq. 1-14),
:class:`~refimpl.nn.transformer.graph_transformer_layer.GraphTransformerLayer`."""
