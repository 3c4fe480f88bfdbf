"""LipschitzNorm's Lipschitz bounds (Sec. 3-5, proofs in Sec. 9) on the true Jacobian.

Every check measures ``||D Att_X||_F``, the Frobenius -> Frobenius operator norm
of the derivative of a block of :mod:`refimpl.nn.lipschitz.multi_head_attention` at an input ``X``:
the largest singular value of the block's Jacobian, assembled from its ``jvp``
or ``backward`` and decomposed by an exact SVD (:mod:`refimpl.jacobian`; sizes
are small). The bound is the paper's. Lemma 2 and Eq. 10 are checked in
:mod:`proofs_check.softmax`; here are

- ``lipschitz.lemma3``: ``||softmax(g)||_F <= e^a sqrt(m/n)`` for ``|g_ij| <= a`` (Eq. 12)
- ``lipschitz.eq28``: ``||A Dsoftmax_M(B)^T||_F <= ||A^T||_(inf,2) ||B||_(2,inf)``: the step of
  Lemma 1's proof, with constant 1 (printed: sqrt 2)
- ``lipschitz.lemma1``: ``||D Att_X|| <= ||S||_F + sqrt2 ||h(X)^T||_(inf,2) |||D
  g_X|||_(F,(2,inf))`` (Eq. 9; ``h(X) = X``, or ``V``, Remark 1)
- ``lipschitz.thm2``: ``||D Att_X|| <= e^a* sqrt(m/n) + a* sqrt8`` with ``a*`` the smallest
  ``a`` meeting assumptions (1)-(3) at ``X`` (Eq. 14)
- ``lipschitz.thm3.*``: Eq. 15 scores: ``L_F <= e^a sqrt(m/n) + a sqrt8`` (Eq. 16)
- ``lipschitz.cor1``: Eq. 17 scores: ``L_F <= e sqrt(m/n) + sqrt8`` (Eq. 18)
- ``lipschitz.cor2``: Eq. 19 scores: ``L_F <= e^sqrt3 sqrt(m/n) + 2 sqrt6`` (Eq. 20)
- ``lipschitz.thm1``: multi-head: ``||D MultAtt_X|| <= ||W_O||_* (sum_k ||D Att_{W_k X}||^2
  ||W_k||_*^2)^(1/2)``, the pointwise form of the proof of Eq. 6
- ``lipschitz.eq21``: normalised heads, ``m = n``: ``L_F(MultAtt) <= 11 ||W_O||_* (sum_k
  ||W_k||_*^2)^(1/2)`` (Eq. 21)
- ``lipschitz.gat_neighbourhood``: GAT with per-neighbourhood LipschitzNorm (Sec. 5): per
  target, ``||D out_v|| <= 3||W_s|| + 2||W_t||`` (v2), derived there
- ``lipschitz.eq22.composition``: two Eq. 17 layers in sequence: ``L_F <= L_1 L_2``, the Cor 1
  bounds multiplied (Eq. 22, Sec. 6)
- ``lipschitz.unnormalised_growth``: Kim et al. (2020), a lower bound: without normalisation
  ``||D Att_{tX}||`` grows without bound in ``t``

Norms and shapes (Sec. 3.1 and the proof of Lemma 1): ``X`` is ``(d, n)``, one
input vector per *column*; scores ``(m, n)``; ``||M||_(inf,2) = max_i
||M_i,:||_2`` (so ``||X^T||_(inf,2)`` is the longest input vector);
``||M||_(2,inf) = sqrt(sum_i max_j M_ij^2)``; ``|||L|||_(F,(2,inf)) = max_H
||L(H)||_(2,inf) / ||H||_F``.

The score side of Lemma 1 and Thm 2 is the paper's score function, computed
on the host independently of the blocks (:func:`score_split`; the derivative
and tie conventions are in :mod:`proofs_check.lipschitz.forms`).

Cases: fixed adversarial ones first (``n = 1``, ``m = 1``, ``m > n``, ``m < n``,
``X`` scaled by ``1e2`` and ``1e3``, column norms tied to the last bit or to
``1e-9``, columns aligned with the queries so scores reach their bound, tied
scores at scale 1 and ``1e3`` (where an unnormalised block's norm is ~1e3:
Kim et al.'s direction; at generic inputs the softmax saturates instead), a
zero column, every branch of the ``max`` in Eq. 15 and 19 and ties between
them, and the end of a short gradient ascent of ``||D Att_X||``), then
``ctx.cases`` random ones.

Rounding allowance: an upper bound ``B`` is reported as ``B (1 + (size(J) +
64) eps)``. The computed ``||D Att_X||`` carries the SVD's error (a few ``eps
||J|| max(shape)``, Golub & Van Loan Sec. 8.6) plus that of ``J``'s entries (a
few ulps of sums of ``n`` terms each); ``size(J) eps`` exceeds both. Equality is
attained by ``alpha = 0`` (uniform attention: ``||D Att_X|| = sqrt(m/n)``, the
bound), by Eq. 28's constant, by Lemma 1 where ``D g_X = 0`` (``d = n = 1``)
and by Thm 1's pointwise form (one head, rank-one maps).

Findings: every bound holds; Lemma 1 (so Thm 2, 3, Cor 1, 2) holds with
``sqrt2`` replaced by 1 (erratum ``lipschitznorm.lemma1.proof.convex_hull_factor``);
the adversarial search (:func:`tightness`, ``scripts/lipschitz_tightness.py``)
reaches 0.2-0.5 of Eq. 16/18 and 0.11-0.16 of Eq. 20.

Modules
-------
forms
    :class:`Form`, :class:`Case`, the score split ``g = g~ / c``
bounds
    the measured norm, the exact (F, (2,inf)) norm, the bounds
cases
    the inputs: adversarial and random, single- and multi-head
search
    the adversarial search (:func:`tightness`)
lemma3_eq28
    checks ``lipschitz.lemma3``, ``lipschitz.eq28``
lemma1_thm2
    checks ``lipschitz.lemma1``, ``lipschitz.thm2``
thm3_corollaries
    checks ``lipschitz.thm3.*``, ``lipschitz.cor1``, ``lipschitz.cor2``
thm1_eq21
    checks ``lipschitz.thm1``, ``lipschitz.eq21``
growth
    check ``lipschitz.unnormalised_growth``; :func:`growth_curve`

The package imports the check modules in this order, which is the report's.
Everything in ``__all__`` is importable from the package. Blocks, bounds and
constants are looked up when a check runs, in the submodule that uses them; a
test swaps in a broken one there, e.g.
``monkeypatch.setattr(lipschitz.forms, "Attention", ...)``.
"""

from __future__ import annotations

from proofs_check.lipschitz.bounds import (
    EQ21_CONSTANT,
    cor1_bound,
    cor2_bound,
    eq21_bound,
    form_bound,
    jacobian_norm,
    rounding_allowance,
    thm1_bound,
    thm3_bound,
    two_inf_operator_norm,
)
from proofs_check.lipschitz.cases import MultiHeadCase, attention_cases, multihead_cases, tied_case
from proofs_check.lipschitz.forms import ALPHAS, Case, Form, ScoreSplit, score_split
from proofs_check.lipschitz.search import Tightness, tightness
from refimpl.nn.lipschitz.score_norms import inf2_norm, two_inf_norm

# The checks. Importing a module registers its checks, so the order of these imports is
# the order of the report (hence not sorted).
# isort: off
from proofs_check.lipschitz.lemma3_eq28 import EQ28_CONSTANT, eq28_ratio
from proofs_check.lipschitz.lemma1_thm2 import lemma1_bound, thm2_alpha
from proofs_check.lipschitz import thm3_corollaries as thm3_corollaries
from proofs_check.lipschitz import thm1_eq21 as thm1_eq21
from proofs_check.lipschitz import composition as composition
from proofs_check.lipschitz import gat_neighbourhood as gat_neighbourhood
from proofs_check.lipschitz.growth import GROWTH_AT_LEAST, GROWTH_SCALE, growth_curve
# isort: on

__all__ = [
    "ALPHAS",
    "EQ21_CONSTANT",
    "EQ28_CONSTANT",
    "GROWTH_AT_LEAST",
    "GROWTH_SCALE",
    "Case",
    "Form",
    "MultiHeadCase",
    "ScoreSplit",
    "Tightness",
    "attention_cases",
    "cor1_bound",
    "cor2_bound",
    "eq21_bound",
    "eq28_ratio",
    "form_bound",
    "growth_curve",
    "inf2_norm",
    "jacobian_norm",
    "lemma1_bound",
    "multihead_cases",
    "rounding_allowance",
    "score_split",
    "thm1_bound",
    "thm2_alpha",
    "thm3_bound",
    "tied_case",
    "tightness",
    "two_inf_norm",
    "two_inf_operator_norm",
]
