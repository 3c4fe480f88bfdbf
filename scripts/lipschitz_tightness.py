"""How tight are LipschitzNorm's bounds? An adversarial search, and the unnormalised growth curve.

For each normalised attention form (Eq. 17 with Cor 1, Eq. 15 with Thm 3 for
several alpha, Eq. 19 with Cor 2) and size ``(d, m, n)``, maximise the exact
``||D Att_X||_F`` over the input ``X`` (and the queries ``Q``) by random
restarts and gradient ascent (:func:`proofs_check.lipschitz.tightness`), and
print a markdown table: the paper's bound, the best value found (exact at the
point found, so a lower bound on ``L_F``), their ratio, and the ratio to the
bound with Eq. 28's constant 1 in place of sqrt 2 (``e^a sqrt(m/n) + 2a``; see
the erratum ``lipschitznorm.lemma1.proof.convex_hull_factor``). A ratio above 1
would disprove a bound.

Then the growth curve (Kim et al. 2020): ``||D Att_{tX}||_F`` for ``t = 1 ..
1e4``, unnormalised, at inputs with tied scores (linear: grows like ``t``;
transformer: like ``t^2``) and at a generic input (the softmax saturates and
the norm falls back), beside Eq. 17 at the same tied input (constant: the
normalised scores are invariant under ``X -> tX``).

    python scripts/lipschitz_tightness.py [--restarts 8] [--steps 100] [--seed 0] [--quick]

About a minute with the defaults on one core; ``--quick`` takes seconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from proofs_check import lipschitz
from proofs_check.lipschitz import Case, Form

FORMS = (
    Form("linear", "linear"),
    Form("linear", "lipschitz", 0.5),
    Form("linear", "lipschitz", 1.0),
    Form("linear", "lipschitz", 2.0),
    Form("transformer", "lipschitz"),
)
LINEAR_SIZES = ((2, 1, 4), (2, 2, 2), (3, 3, 3), (2, 4, 2), (3, 2, 6))  # (d, m, n)
TRANSFORMER_SIZES = ((1, 2, 2), (2, 3, 3), (2, 4, 4))  # (d, n, n)
SCALES = (1.0, 10.0, 100.0, 1e3, 1e4)


def sharpened_bound(form: Form, m: int, n: int) -> float:
    """The bound with Eq. 28's constant 1: ``e^a sqrt(m/n) + 2a`` (``a = sqrt3`` for Eq. 19)."""
    alpha = np.sqrt(3.0) if form.kind == "transformer" else form.alpha
    return float(np.exp(alpha) * np.sqrt(m / n) + 2.0 * alpha)


def tightness_table(restarts: int, steps: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    rows = [
        "| form | (d, m, n) | bound | best found | ratio | ratio to e^a sqrt(m/n) + 2a |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for form in FORMS:
        sizes = TRANSFORMER_SIZES if form.kind == "transformer" else LINEAR_SIZES
        for dims in sizes:
            found = lipschitz.tightness(form, dims, rng, restarts=restarts, steps=steps)
            sharp = found.best / sharpened_bound(form, dims[1], dims[2])
            rows.append(
                f"| {form.label} | {dims} | {found.bound:.4f} | {found.best:.4f} | "
                f"{found.ratio:.3f} | {sharp:.3f} |"
            )
    return "\n".join(rows)


def growth_table(seed: int) -> str:
    rng = np.random.default_rng(seed)
    tied = lipschitz.tied_case(rng, "linear")
    curves = {
        "linear, no normalisation, tied scores": lipschitz.growth_curve(tied, SCALES),
        "transformer Eq. 7, tied scores": lipschitz.growth_curve(
            lipschitz.tied_case(rng, "transformer"), SCALES
        ),
        "linear, no normalisation, generic X": lipschitz.growth_curve(
            Case(Form("linear", None), rng.standard_normal((4, 5)), tied.q, "generic"), SCALES
        ),
        "linear Eq. 17, same tied X": lipschitz.growth_curve(
            tied._replace(form=Form("linear", "linear")), SCALES
        ),
    }
    header = "| input | " + " | ".join(f"t = {t:g}" for t in SCALES) + " |"
    rows = [header, "| --- |" + " ---: |" * len(SCALES)]
    for name, curve in curves.items():
        rows.append(f"| {name} | " + " | ".join(f"{norm:.4g}" for _, norm in curve) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=8, help="random starts per row")
    parser.add_argument("--steps", type=int, default=100, help="ascent steps per start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 restarts of 20 steps")
    args = parser.parse_args()
    restarts, steps = (2, 20) if args.quick else (args.restarts, args.steps)
    start = time.perf_counter()
    print(f"## Tightness ({restarts} restarts x {steps} ascent steps, seed {args.seed})\n")
    print(tightness_table(restarts, steps, args.seed))
    print("\n## ||D Att_{tX}||_F against the input scale t\n")
    print(growth_table(args.seed))
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
