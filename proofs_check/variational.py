"""NodeFormer Sec. 5, Prop. 1: the variational reading of the learning objective (Eq. 13).

For a latent structure ``A~`` with prior ``p0``, likelihood ``p(Y | A~)`` and any ``q``,

    log p(Y) = E_q[log p(Y | A~)] - D(q || p0) + D(q || p(A~ | Y)),

so the objective of Eq. 13 (its negative, the ELBO) is at most ``log p(Y)`` and equals it
exactly when ``q`` is the posterior: Prop. 1's two claims (``D(q || posterior) = 0`` at the
optimum over ``q``, where the bound on ``log p(Y)`` is attained). The check enumerates a
latent space small enough to sum exactly (3 possible edges, 8 graphs) with a random prior of
full support, random likelihoods and random ``q``, and measures the identity's residual, the
ELBO's excess over ``log p(Y)`` and the gap at the posterior, each relative to ``|log p(Y)|``
and the terms' size. (Eq. 10, the loss NodeFormer trains with, is not this ``D(q || p0)``:
erratum ``nodeformer.eq13.kl_direction``.)
"""

from __future__ import annotations

import numpy as np

from proofs_check.registry import Context, WorstCase, check

__all__ = ["elbo_terms"]

_LATENT = 8  # 2^3 graphs on 3 possible edges
# Sums of 8 terms of size O(1-10) in float64: exact to ~1e-14 relative; 1e-12 leaves room.
_TOL = 1e-12


def elbo_terms(
    q: np.ndarray, prior: np.ndarray, likelihood: np.ndarray
) -> tuple[float, float, float]:
    """``(log p(Y), ELBO(q), D(q || posterior))`` for distributions over the latent states
    (``q``, ``prior`` ``(S,)``, full support) and ``likelihood = p(Y | A~)`` ``(S,)``."""
    evidence = float(np.sum(prior * likelihood))
    posterior = prior * likelihood / evidence
    support = q > 0
    expected = float(np.sum(q[support] * np.log(likelihood[support])))
    kl_prior = float(np.sum(q[support] * np.log(q[support] / prior[support])))
    kl_posterior = float(np.sum(q[support] * np.log(q[support] / posterior[support])))
    return float(np.log(evidence)), expected - kl_prior, kl_posterior


@check(
    id="nodeformer.prop1.elbo",
    paper="NodeFormer",
    statement="log p(Y) = ELBO(q) + D(q || posterior) for every q, so ELBO <= log p(Y) with "
    "equality at q = posterior (Prop. 1, Eq. 13); relative",
)
def prop1_elbo(ctx: Context) -> WorstCase:
    worst = WorstCase("upper")
    rng = ctx.rng
    for _ in range(max(ctx.cases, 1)):
        prior = rng.dirichlet(np.ones(_LATENT))
        likelihood = rng.uniform(1e-3, 1.0, _LATENT)  # p(Y | A~) of one observed Y
        q = rng.dirichlet(np.full(_LATENT, 0.5))
        log_evidence, elbo, kl_posterior = elbo_terms(q, prior, likelihood)
        scale = max(abs(log_evidence), abs(elbo), kl_posterior, 1.0)
        identity = abs(log_evidence - elbo - kl_posterior) / scale
        excess = max(elbo - log_evidence, 0.0) / scale  # the bound: ELBO <= log p(Y)
        posterior = prior * likelihood / np.sum(prior * likelihood)
        at_optimum = elbo_terms(posterior, prior, likelihood)
        gap = (abs(at_optimum[0] - at_optimum[1]) + abs(at_optimum[2])) / scale
        worst.add(max(identity, excess, gap), _TOL)
    return worst
