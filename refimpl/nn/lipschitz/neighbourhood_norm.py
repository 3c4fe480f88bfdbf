"""LipschitzNorm for graph attention, neighbour-wise and per head (LipschitzNorm Sec. 5).

Two forms: the GAT form below (a denominator per edge, :func:`neighbour_lipschitz_norm`)
and the transformer form of the last section (Eq. 19 per target,
:func:`transformer_lipschitz_scores`).

The paper normalises a score ``g~`` by ``||Q||_F * max_i ||x_i||`` (Eq. 17): the
Frobenius norm of the attention parameters times the largest norm of a score
input, taken *neighbour-wise* for graphs ("for each node, we compute the maximum
of the 2-norms of its neighbours") and per head. For a target ``v``, an edge
``u -> v`` and head ``h`` (``E`` edges of the attended graph, self-loops
included when the layer adds them):

``mode="paper"`` (``eps = 0``)
    ``e_uv / (||a_h|| * max_{k in N(v)} ||x_kv||)`` with ``x_uv`` the input of
    the score, so that ``|e_uv| <= ||a_h|| ||x_uv||`` bounds every normalised
    score by 1 (Eq. 15 with ``alpha = 1``):

    * GATv1: ``x_uv = [W h_u ; W h_v]``, ``a_h = [att_src_h ; att_dst_h]``, so
      ``max_k ||x_kv||^2 = max_k ||W h_k||^2 + ||W h_v||^2``. The score is
      ``LeakyReLU(a_h . x_uv)``; LeakyReLU is positively homogeneous, so dividing
      before it (as done here, like the released code) equals dividing after.
    * GATv2: ``x_uv = W_s h_u + W_t h_v`` and ``e_uv = a_h . LeakyReLU(x_uv)``,
      which is ``||a_h||``-Lipschitz in ``x_uv`` (LeakyReLU is 1-Lipschitz for
      slopes <= 1), so ``max_k ||x_kv||`` is the norm of the pre-activation.

``mode="reference-code"`` (GATv1 only)
    The formula of the authors' released code (``normalizations/lipschitznorm.py``
    of github.com/gdasoulas/LipschitzNorm), applied before the LeakyReLU:
    ``(a_h . x_uv) / (4 ||a_h|| * sqrt(max_{k in N(v)} ||W h_k||^2 + ||W h_u||^2) + 1e-12)``.
    It differs from the paper in the factor 4 and in adding the *source*'s norm
    ``||W h_u||^2`` where the paper's ``x_uv`` has the target's. With several
    heads the released code flattens its ``(N, H)`` maxima to ``(N * H, 1)`` and
    indexes them by node, mixing heads and nodes, and its default
    (``scale_individually=False``) takes one norm over the attention vectors of
    all heads; here both are per head, which agrees with the released code for
    one head.

Zero denominators: with ``eps = 0`` the denominator vanishes only where the
attention vector of a head is zero or every score input of a neighbourhood is
zero, and then the raw score is zero too. The normalised score is defined as 0
there and its derivative is taken as that of ``e / 1`` (no gradient through the
denominator): the quotient has no derivative at that point (its limit depends
on the direction), and this choice lets training leave a zero attention vector
(``Xav_Z``, ``Bal_X``, ``Bal_O`` start there). Ties in the neighbourhood
maximum send its gradient to one edge, the lowest index (``segment_max``); a
zero-norm ``x`` gets the zero subgradient of the norm.

GAT form, forward and backward side by side (``r`` the per-edge radius, ``D`` the denominator):

    F1  ||a_h||                                      (H,)
    F2  r_uv = max_k ||x_kv|| (paper) or the
        reference code's square root                 (E, H)
    F3  D = factor * ||a_h|| * r + eps               (E, H)
    F4  e / D                                        (E, H)

    B4  d_e = d_out / D,  d_D = -d_out * out / D
    B3  d||a_h|| = factor sum_e d_D r,  d_r = factor d_D ||a_h||
    B2  through the max (to one edge) and the norms, into W h (v1) or x_uv (v2)
    B1  d a_h = d||a_h|| a_h / ||a_h||

Transformer form: per target and head
-------------------------------------
:class:`refimpl.nn.transformer.transformer_conv.TransformerConv` with ``lipschitz_norm="paper"``
(:func:`transformer_lipschitz_scores`): LipschitzNorm Eq. 19 per head and
per target neighbourhood (Sec. 5: norms and maxima "per head" and
"neighbour-wise"). For target ``v`` and head ``h``, ``Q`` is the single query
``q_v`` and ``K``, ``V`` the keys ``k_uv`` and values ``val_uv`` of the edges
into ``v``::

    u = ||q_v||,  a = max_{u in N(v)} ||k_uv||,  w = max_{u in N(v)} ||val_uv||
    D_v = max{u a, u w, a w},   s_uv = q_v . k_uv / D_v   (replacing 1 / sqrt(C))

so per target this is the Eq. 19 layer with one query (Cor. 2's setting with
``m = 1``, ``n = |N(v)|``). ``|s_uv| <= ||q_v|| ||k_uv|| <= u a <= D_v`` bounds
every score by 1; rounding can overshoot by an ulp, so the quotient is clipped
to ``[-1, 1]`` as in :mod:`refimpl.nn.lipschitz.score_norms` (the clip only moves it toward
the exact value; derivatives treat it as the identity).

Conventions of the transformer form:

* **Ties.** ``max{ua, uw, aw}`` is differentiated through one product, the first
  maximiser in ``[ua, uw, aw]`` order (shared with the dense Eq. 19:
  :func:`refimpl.nn.lipschitz.score_norms.largest_pair_product`); the neighbourhood
  maxima ``a``, ``w`` through one edge, the lowest index
  (:func:`refimpl.kernels.segment.segment_max`). A norm at a zero vector has the zero
  subgradient.
* **D = 0** needs two of ``u, a, w`` zero; then ``q_v = 0`` or every key is 0,
  so every raw score ``q_v . k_uv`` of the neighbourhood is exactly 0. The score
  is 0 (uniform attention) and passes no gradient through ``D``; its raw part
  is divided by 1 instead (the zero-denominator convention of the GAT form above).
  That gradient vanishes too: either ``q_v`` and all keys are 0 (``d raw`` is
  multiplied by one of them), or all values are 0 (``w = 0``) and ``alpha``
  receives none. So it agrees with :mod:`refimpl.nn.lipschitz.score_norms`' "zero
  derivative with respect to everything".
* There is no eps.
* **The released code differs** (its transformer LipschitzNorm, run on the same
  weights): it takes one Frobenius norm of the queries over all edges per head,
  keeps the ``1 / sqrt(C)`` scale and adds ``1e-12`` to the denominator, where
  Eq. 19 (and this form) has per-target norms, no ``sqrt(C)`` and no eps. Its
  scores equal these only in special cases (one target, and no ``sqrt(C)``), so
  compare a port of the released code with its own formula, not with this one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from refimpl.backend import get_array_module
from refimpl.kernels.segment import Segments, gather, segment_max, segment_max_backward, segment_sum
from refimpl.nn.lipschitz.score_norms import largest_pair_product, largest_pair_product_backward
from refimpl.nn.overflow import check_overflow

__all__ = [
    "LIPSCHITZ_NORM_MODES",
    "NeighbourNormCache",
    "TransformerLipschitzCache",
    "neighbour_lipschitz_norm",
    "neighbour_lipschitz_norm_backward",
    "transformer_lipschitz_scores",
    "transformer_lipschitz_scores_backward",
]


LIPSCHITZ_NORM_MODES = ("paper", "reference-code")
_REFERENCE_FACTOR = 4.0  # released code: LipschitzNorm(att_norm=4)
_REFERENCE_EPS = 1e-12  # released code: LipschitzNorm(eps=1e-12)


class NeighbourNormCache(NamedTuple):
    """What :func:`neighbour_lipschitz_norm_backward` reads.

    Attributes
    ----------
    mode : {"paper", "reference-code"}
        The form of the denominator.
    version : {"v1", "v2"}
        The GAT version whose score is normalised.
    normalised : array, (E, H)
        The normalised scores.
    denominator : array, (E, H)
        ``D``, with 1 where ``D = 0`` (see the module docstring).
    nonzero : array, (E, H)
        ``D > 0``.
    att_norm : array, (H,)
        ``||a_h||``.
    radius : array, (E, H)
        ``r``, the per-edge radius.
    norms : array
        v1: ``(N, H)`` ``||W h_k||^2``; v2: ``(E, H)`` ``||x_uv||``.
    argmax : array, (N, H)
        The edge attaining each neighbourhood's maximum (-1 if none).
    """

    mode: str
    version: str
    normalised: Any
    denominator: Any
    nonzero: Any
    att_norm: Any
    radius: Any
    norms: Any
    argmax: Any


def _att_vectors(params: dict[str, Any], version: str) -> list[Any]:
    return [params["att_src"], params["att_dst"]] if version == "v1" else [params["att"]]


def neighbour_lipschitz_norm(
    raw: Any,
    mode: str,
    version: str,
    params: dict[str, Any],
    h_src: Any,
    pre: Any,
    src: Segments,
    dst: Segments,
) -> tuple[Any, NeighbourNormCache]:
    """Divide each edge's score by its neighbour-wise Lipschitz denominator.

    Parameters
    ----------
    raw : array, (E, H)
        The scores to normalise: v1 ``a_h . x_uv`` (before the LeakyReLU), v2
        ``a_h . LeakyReLU(x_uv)``.
    mode : {"paper", "reference-code"}
        The denominator's form (the module docstring).
    version : {"v1", "v2"}
        The GAT version whose score this is.
    params : dict
        The layer's parameters (the attention vectors are read from here).
    h_src : array, (N, H, C)
        ``W h`` (v1; unused for v2).
    pre : array, (E, H, C)
        ``x_uv = W_s h_u + W_t h_v`` (v2; unused for v1).
    src, dst : Segments
        The attended edges by source and by target.

    Returns
    -------
    normalised : array, (E, H)
        The normalised scores.
    cache : NeighbourNormCache
        What :func:`neighbour_lipschitz_norm_backward` reads.
    """
    xp = get_array_module(raw)
    factor, eps = (_REFERENCE_FACTOR, _REFERENCE_EPS) if mode == "reference-code" else (1.0, 0.0)
    # F1 ||a_h|| (H,)
    att_norm = xp.sqrt(sum((a * a).sum(axis=1) for a in _att_vectors(params, version)))
    # F2 per-edge radius (E, H)
    if version == "v1":
        norms = (h_src * h_src).sum(axis=2)  # (N, H) ||W h_k||^2
        neighbour_max, argmax = segment_max(gather(norms, src), dst)  # (N, H)
        own = gather(norms, src if mode == "reference-code" else dst)  # (E, H)
        radius = xp.sqrt(gather(neighbour_max, dst) + own)
    else:
        norms = xp.sqrt((pre * pre).sum(axis=2))  # (E, H) ||x_uv||
        neighbour_max, argmax = segment_max(norms, dst)  # (N, H)
        radius = gather(neighbour_max, dst)
    # F3 denominator (E, H); 1 where it vanishes (the raw score is 0 there)
    denominator = factor * att_norm * radius + eps
    # the norms square their inputs: an infinite D from finite ones would zero the scores
    check_overflow(denominator, "LipschitzNorm: the score denominator", raw.dtype)
    nonzero = denominator > 0
    denominator = xp.where(nonzero, denominator, 1.0).astype(raw.dtype, copy=False)
    # F4
    normalised = raw / denominator
    cache = NeighbourNormCache(
        mode, version, normalised, denominator, nonzero, att_norm, radius, norms, argmax
    )
    return normalised, cache


def neighbour_lipschitz_norm_backward(
    cache: NeighbourNormCache,
    d_normalised: Any,
    params: dict[str, Any],
    h_src: Any,
    pre: Any,
    src: Segments,
    dst: Segments,
) -> tuple[Any, Any, dict[str, Any]]:
    """Adjoint of :func:`neighbour_lipschitz_norm`.

    Returns ``(d_raw (E, H), d_input, d_att)``: ``d_input`` is the gradient
    through the denominator into ``h_src`` (v1, (N, H, C)) or ``pre`` (v2,
    (E, H, C)); ``d_att`` maps the attention parameter names to their gradient
    through ``||a_h||``. Both add to the layer's other contributions.

    Parameters
    ----------
    cache : NeighbourNormCache
        From :func:`neighbour_lipschitz_norm`.
    d_normalised : array, (E, H)
        The gradient of the normalised scores.
    params, h_src, pre, src, dst
        As given to :func:`neighbour_lipschitz_norm`.
    """
    xp = get_array_module(d_normalised)
    factor = _REFERENCE_FACTOR if cache.mode == "reference-code" else 1.0
    # B4 (of F4) the quotient; no gradient through a vanished denominator
    d_raw = d_normalised / cache.denominator
    d_denominator = xp.where(cache.nonzero, -d_normalised * cache.normalised / cache.denominator, 0)
    # B3 (of F3) (H,) and (E, H)
    d_att_norm = factor * (d_denominator * cache.radius).sum(axis=0)
    d_radius = factor * d_denominator * cache.att_norm
    # B2 (of F2)
    if cache.version == "v1":
        # radius = sqrt(q), q = max_k ||W h_k||^2 + own; sqrt'(0) taken as 0
        positive = cache.radius > 0
        d_q = xp.where(positive, d_radius / (2 * xp.where(positive, cache.radius, 1)), 0)
        d_neighbour_max = segment_sum(d_q, dst)  # (N, H)
        d_norms = segment_sum(segment_max_backward(d_neighbour_max, cache.argmax, dst), src)
        d_norms += segment_sum(d_q, src if cache.mode == "reference-code" else dst)  # (N, H)
        d_input = 2 * d_norms[..., None] * h_src  # (N, H, C)
    else:
        d_neighbour_max = segment_sum(d_radius, dst)  # (N, H)
        d_norms = segment_max_backward(d_neighbour_max, cache.argmax, dst)  # (E, H)
        d_input = _norm_backward(d_norms, cache.norms, pre)  # (E, H, C)
    # B1 (of F1) d||a|| / da = a / ||a|| (zero subgradient at a = 0), per name (H, C)
    names = ("att_src", "att_dst") if cache.version == "v1" else ("att",)
    d_att = {name: _norm_backward(d_att_norm, cache.att_norm, params[name]) for name in names}
    return d_raw, d_input, d_att


# -- LipschitzNorm Eq. 19 per target and head ---------------------------------------------------


class TransformerLipschitzCache(NamedTuple):
    """What :func:`transformer_lipschitz_scores_backward` reads (per target ``v``, head ``h``).

    Attributes
    ----------
    scores : array, (E, H)
        ``q_v . k_uv / D_v``, clipped to ``[-1, 1]``.
    denominator : array, (N, H)
        ``D_v``, with 1 where ``D_v = 0`` (the raw scores are 0 there).
    nonzero : array, (N, H)
        ``D_v > 0``.
    norms : tuple
        ``(u, a, w)``, each ``(N, H)``: ``||q_v||``, ``max ||k_uv||``, ``max ||val_uv||``.
    branch : array, (N, H)
        The product taken: 0 ``ua``, 1 ``uw``, 2 ``aw``.
    key_norms : array, (E, H)
        ``||k_uv||``.
    value_norms : array, (E, H)
        ``||val_uv||``.
    key_argmax : array, (N, H)
        The edge attaining ``a`` (-1 for no incoming edge).
    value_argmax : array, (N, H)
        The edge attaining ``w``.
    """

    scores: Any
    denominator: Any
    nonzero: Any
    norms: tuple
    branch: Any
    key_norms: Any
    value_norms: Any
    key_argmax: Any
    value_argmax: Any


def transformer_lipschitz_scores(
    raw: Any, q: Any, k_edges: Any, val_edges: Any, dst: Segments
) -> tuple[Any, TransformerLipschitzCache]:
    """``q_v . k_uv / max{ua, uw, aw}`` per target ``v`` and head: (E, H) and the cache.

    Its own steps F1-F3 (TransformerConv's F5'), walked back by
    :func:`transformer_lipschitz_scores_backward`; conventions in the module
    docstring ("Transformer form").

    Parameters
    ----------
    raw : array, (E, H)
        The raw scores ``q_v . k_uv``.
    q : array, (N, H, C)
        The node queries.
    k_edges, val_edges : array, (E, H, C)
        The keys ``k_uv`` and values ``val_uv`` per edge.
    dst : Segments
        The edges by target.
    """
    xp = get_array_module(raw)
    # F1 u = ||q_v|| (N, H); a, w: the longest key and value into v (N, H), first edge at a tie
    u = xp.sqrt(xp.sum(q * q, axis=2))
    key_norms = xp.sqrt(xp.sum(k_edges * k_edges, axis=2))  # (E, H)
    value_norms = xp.sqrt(xp.sum(val_edges * val_edges, axis=2))  # (E, H)
    a, key_argmax = segment_max(key_norms, dst)
    w, value_argmax = segment_max(value_norms, dst)
    # F2 D = max{ua, uw, aw} (N, H), the first maximiser; 1 where it vanishes
    denominator, branch = largest_pair_product(u, a, w)
    check_overflow(denominator, "LipschitzNorm: the score denominator", raw.dtype)  # as above
    nonzero = denominator > 0
    denominator = xp.where(nonzero, denominator, 1).astype(raw.dtype, copy=False)
    # F3 the quotient, clipped against rounding (module docstring) (E, H)
    scores = xp.clip(raw / gather(denominator, dst), -1.0, 1.0)
    cache = TransformerLipschitzCache(
        scores,
        denominator,
        nonzero,
        (u, a, w),
        branch,
        key_norms,
        value_norms,
        key_argmax,
        value_argmax,
    )
    return scores, cache


def transformer_lipschitz_scores_backward(
    cache: TransformerLipschitzCache,
    d_scores: Any,
    q: Any,
    k_edges: Any,
    val_edges: Any,
    dst: Segments,
) -> tuple[Any, Any, Any, Any]:
    """Adjoint of :func:`transformer_lipschitz_scores` (same ``q``, ``k_edges``, ``val_edges``,
    ``dst``): ``(d_raw (E, H), d_q (N, H, C), d_k_edges, d_val_edges (E, H, C))``, the
    last three through D only; they add to the layer's other contributions.

    Parameters
    ----------
    cache : TransformerLipschitzCache
        From :func:`transformer_lipschitz_scores`.
    d_scores : array, (E, H)
        The gradient of the normalised scores.
    q, k_edges, val_edges, dst
        As given to :func:`transformer_lipschitz_scores`.
    """
    xp = get_array_module(d_scores)
    denominator_edges = gather(cache.denominator, dst)  # (E, H)
    # B3 (of F3) the quotient (clip as identity); no gradient through a vanished D
    d_raw = d_scores / denominator_edges
    d_denominator_edges = -d_scores * cache.scores / denominator_edges
    d_denominator = xp.where(cache.nonzero, segment_sum(d_denominator_edges, dst), 0)  # (N, H)
    # B2 (of F2) only the chosen product
    d_u, d_a, d_w = largest_pair_product_backward(cache.norms, cache.branch, d_denominator)
    # B1 (of F1) the norms (zero subgradient at a zero vector); maxima to one edge
    d_q = _norm_backward(d_u, cache.norms[0], q)
    d_key_norms = segment_max_backward(d_a, cache.key_argmax, dst)  # (E, H)
    d_value_norms = segment_max_backward(d_w, cache.value_argmax, dst)  # (E, H)
    d_k_edges = _norm_backward(d_key_norms, cache.key_norms, k_edges)
    d_val_edges = _norm_backward(d_value_norms, cache.value_norms, val_edges)
    return d_raw, d_q, d_k_edges, d_val_edges


def _norm_backward(d_norm: Any, norm: Any, vectors: Any) -> Any:
    """Adjoint of ``||vectors||`` over the last axis: ``d_norm * vectors / norm`` (0 at 0)."""
    xp = get_array_module(vectors)
    positive = norm > 0
    scale = xp.where(positive, d_norm / xp.where(positive, norm, 1), 0)
    return scale[..., None] * vectors
