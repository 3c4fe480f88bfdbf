"""LipschitzNorm (Dasoulas et al. 2021): the normalised score forms and the attention
layers the paper's theorems are stated for.

:mod:`~refimpl.nn.lipschitz.score_norms` (the dense Eq. 17 and Eq. 19 normalisations),
:mod:`~refimpl.nn.lipschitz.neighbourhood_norm` (the per-neighbourhood forms that
:class:`refimpl.nn.GATConv` and :class:`refimpl.nn.TransformerConv` use, Sec. 5),
:mod:`~refimpl.nn.lipschitz.linear_score_attention` (Eq. 15-17),
:mod:`~refimpl.nn.lipschitz.transformer_score_attention` (Eq. 19) and
:mod:`~refimpl.nn.lipschitz.multi_head_attention` (heads of either).
"""
