"""Every theorem of the papers as an executable check: ``python -m proofs_check``.

A check evaluates one statement (a bound, an identity) on many random and
adversarial cases and returns a :class:`Record` with the keys ``id, paper,
statement, bound, measured, margin, passed, n_cases``; ``margin >= 0`` means
the worst case lies inside the bound (sign convention in
:mod:`proofs_check.registry`).

Adding checks
-------------
Write them in a module of this package with the ``@check`` decorator::

    from proofs_check.registry import Context, WorstCase, check

    @check(id="gat_balance.thm2_2", paper="GAT-balance", statement="... (Thm 2.2, Eq. 3)")
    def conservation(ctx: Context) -> WorstCase:
        worst = WorstCase("upper")  # or "lower"
        for _ in range(ctx.cases):  # ctx.rng: seeded Generator; ctx.xp: array module
            worst.add(measured, bound)  # scalars or arrays: one case, many values
        return worst

and add the module's name to ``CHECK_MODULES`` below (one line). Errata go in
:mod:`proofs_check.errata`.
"""

from __future__ import annotations

import importlib

from proofs_check.registry import (
    DEFAULT_CASES,
    REGISTRY,
    Check,
    Context,
    Record,
    WorstCase,
    check,
    select,
)

__all__ = [
    "CHECK_MODULES",
    "DEFAULT_CASES",
    "REGISTRY",
    "Check",
    "Context",
    "Record",
    "WorstCase",
    "check",
    "load_checks",
    "select",
]

# Modules whose checks run, in report order; importing one registers its checks.
CHECK_MODULES: tuple[str, ...] = (
    "softmax",
    "conservation",
    "conservation_layers",
    "lipschitz",
    "prf",
    "variational",
)


def load_checks() -> dict[str, Check]:
    """Import every module of ``CHECK_MODULES``; returns the registry (id -> check).

    The registry is put in ``CHECK_MODULES`` order (registration order within a
    module), whichever module a caller happened to import first.
    """
    for name in CHECK_MODULES:
        importlib.import_module(f"proofs_check.{name}")
    rank = {name: i for i, name in enumerate(CHECK_MODULES)}

    def module_rank(item: tuple[str, Check]) -> int:
        # proofs_check.<name> or, for a package, proofs_check.<name>.<submodule>
        name = item[1].body.__module__.split(".")[1]
        return rank.get(name, len(rank))

    ordered = sorted(REGISTRY.items(), key=module_rank)
    REGISTRY.clear()
    REGISTRY.update(ordered)
    return REGISTRY
