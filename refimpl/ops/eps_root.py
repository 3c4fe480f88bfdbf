"""The ``eps``-guarded root both PairNorm and LayerNorm divide by, forward and backward.

Given a non-negative statistic ``q`` (a mean square), the denominator is

    D = sqrt(q + eps)        eps inside the root
    D = sqrt(q) + eps        eps outside the root

Libraries differ on the placement (see ``refimpl.nn.norms.pairnorm`` and
``refimpl.nn.norms.layernorm``), so both blocks take it as an option and share this step.
"""

from __future__ import annotations

from typing import Any

from refimpl.backend import get_array_module

__all__ = ["eps_root", "eps_root_backward"]


def eps_root(q: Any, eps: float, inside: bool) -> tuple[Any, Any]:
    """``(sqrt(q), D)`` for ``q >= 0`` of any shape; ``D`` as in the module docstring.

    Parameters
    ----------
    q : array
        The non-negative statistic (a mean square), any shape.
    eps : float
        The guard, ``> 0``.
    inside : bool
        True: ``D = sqrt(q + eps)``; False: ``D = sqrt(q) + eps``.

    Returns
    -------
    tuple of array
        ``(root, D)``, both of ``q``'s shape: ``root = sqrt(q)`` is what the backward reads.
    """
    xp = get_array_module(q)
    root = xp.sqrt(q)
    return root, (xp.sqrt(q + eps) if inside else root + eps)


def eps_root_backward(root: Any, denominator: Any, d_denominator: Any, inside: bool) -> Any:
    """``d_q`` from ``d_D``: ``dD/dq = 1 / (2 D)`` inside, ``1 / (2 sqrt(q))`` outside.

    Outside the root the derivative is infinite at ``q = 0``; it is taken as 0 there.
    Both blocks divide a quantity that vanishes with ``q`` (their centred input) by
    ``D``, so ``d_D = 0`` wherever ``q = 0`` and 0 is the composite's true limit.

    Parameters
    ----------
    root : array
        ``sqrt(q)``, as :func:`eps_root` returned it.
    denominator : array
        ``D``, as :func:`eps_root` returned it.
    d_denominator : array
        The cotangent of ``D``, of its shape.
    inside : bool
        The forward's placement of ``eps``.

    Returns
    -------
    array
        ``d_q``, of ``q``'s shape.
    """
    if inside:
        return d_denominator / (2 * denominator)
    xp = get_array_module(root)
    positive = root > 0
    return xp.where(positive, d_denominator / (2 * xp.where(positive, root, 1)), 0)
