"""The inputs the checks evaluate: fixed adversarial cases first, then seeded random ones.

Single-head inputs (:func:`attention_cases`) are the adversarial cases listed in
the package docstring (:mod:`proofs_check.lipschitz`), then random ones.
Multi-head inputs (:func:`multihead_cases`, Eq. 5), for every head form: three
small fixed shapes (``h = 2``; ``h = 1`` with ``d_O = n = 1``; ``h = 3`` with
``d = 1``), one dominant head with a rank-deficient output map, for normalised
heads an input scaled by ``1e3`` and one at which every head's scores tie; then
random ones. Tied scores
(:func:`tied_case` and the multi-head ones) come from input directions in the
null space of every score map, so they stay tied at every scale ``X -> tX``.

Every generator draws from the ``rng`` it is given in a fixed order, so a
check's cases depend only on its seed and its number of random cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from proofs_check.lipschitz.forms import Case, Form
from proofs_check.registry import Context
from refimpl.nn.lipschitz.multi_head_attention import MultiHeadAttention
from refimpl.nn.lipschitz.score_norms import inf2_norm

__all__ = ["MultiHeadCase", "attention_cases", "multihead_cases", "tied_case"]


# -- single-head cases ----------------------------------------------------------------------------
def _orthogonal_complement_noise(rng: np.random.Generator, q: np.ndarray, n: int) -> np.ndarray:
    """``n`` random columns orthogonal to every column of ``q`` ``(d, k)``, ``k < d``."""
    basis, _ = np.linalg.qr(q, mode="complete")  # (d, d): first rank(q) columns span q
    rank = np.linalg.matrix_rank(q)
    return basis[:, rank:] @ rng.standard_normal((q.shape[0] - rank, n))  # (d, n)


def _linear_fixed(rng: np.random.Generator, form: Form, scaled: bool) -> Iterator[Case]:
    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape)

    for d, m, n, label in ((3, 2, 1, "n = 1"), (3, 1, 6, "m = 1"), (2, 4, 2, "m > n")):
        yield Case(form, normal(d, n), normal(d, m), label)
    yield Case(form, normal(3, 5), normal(3, 2), "m < n")
    if scaled:
        for scale in (1e2, 1e3):
            yield Case(form, scale * normal(3, 4), normal(3, 3), f"X * {scale:g}")
    x = normal(3, 5)
    x[:, 1] = x[::-1, 0]  # the same squares summed in another order: tied to the last bit
    x[:, 2] = x[:, 0] * (1 + 1e-9)  # tied to 1e-9
    yield Case(form, x, normal(3, 2), "tied column norms")
    q, _ = np.linalg.qr(normal(3, 3))  # orthonormal queries
    yield Case(form, 2.0 * q, q, "columns = queries (|g| at its bound; Eq. 15's first branch)")
    q1 = normal(3, 1)
    x = np.concatenate([3 * q1, normal(3, 3)], axis=1)
    yield Case(form, x, q1, "m = 1, longest column along q (Eq. 15's branches tie)")
    q = normal(4, 2)
    x = normal(4, 1) + _orthogonal_complement_noise(rng, q, 5)  # every row's scores tied
    yield Case(form, x, q, "tied scores")
    if scaled:  # Kim et al.: without normalisation, ||D Att_X|| grows like the scale here
        yield Case(form, 1e3 * x, q, "tied scores, X * 1e3")
    x = normal(3, 4)
    x[:, 2] = 0.0
    yield Case(form, x, normal(3, 3), "a zero column")


def _linear_random(rng: np.random.Generator, form: Form) -> Case:
    d, m, n = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 7))
    column_scales = 10.0 ** rng.uniform(-1, 1, size=n)  # (n,): unequal input norms
    x = rng.standard_normal((d, n)) * column_scales
    return Case(form, x, rng.standard_normal((d, m)) * 10.0 ** rng.uniform(-1, 1), "random")


def _transformer_fixed(rng: np.random.Generator, form: Form, scaled: bool) -> Iterator[Case]:
    def stacked(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.concatenate([q, k, v], axis=0)  # (3d, n)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape)

    yield Case(form, normal(6, 1), None, "n = 1")
    yield Case(form, normal(3, 4), None, "d = 1")
    if scaled:
        for scale in (1e2, 1e3):
            yield Case(form, scale * normal(6, 3), None, f"X * {scale:g}")
    for small, label in ((2, "uv"), (1, "uw"), (0, "vw")):  # shrink one factor: the other two win
        parts = [normal(2, 4) for _ in range(3)]
        parts[small] *= 1e-2
        yield Case(form, stacked(*parts), None, f"c = {label}")
    q, k, v = normal(2, 4), normal(2, 4), normal(2, 4)
    q /= np.sqrt((q * q).sum())
    k /= inf2_norm(k.T)
    v /= inf2_norm(v.T)
    yield Case(form, stacked(q, k, v), None, "u = v = w (all three products tie)")
    k = normal(2, 4)
    k[:, 1] = k[::-1, 0]
    yield Case(form, stacked(normal(2, 4), k, normal(2, 4)), None, "tied key norms")
    q = np.outer(normal(3), normal(4))  # rank one: keys can differ orthogonally to all queries
    k = normal(3, 1) + _orthogonal_complement_noise(rng, q, 4)
    yield Case(form, stacked(q, k, normal(3, 4)), None, "tied scores")
    if scaled:  # Eq. 7: ||D Att_X|| grows like the square of the scale here
        yield Case(form, 1e3 * stacked(q, k, normal(3, 4)), None, "tied scores, X * 1e3")
    yield Case(form, stacked(np.zeros((2, 3)), normal(2, 3), normal(2, 3)), None, "Q = 0")


def _transformer_random(rng: np.random.Generator, form: Form) -> Case:
    d, n = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    parts = [rng.standard_normal((d, n)) * 10.0 ** rng.uniform(-1, 1) for _ in range(3)]
    return Case(form, np.concatenate(parts, axis=0), None, "random")


def attention_cases(
    rng: np.random.Generator, form: Form, random: int, scaled: bool = True
) -> Iterator[Case]:
    """The adversarial cases for ``form`` (package docstring), then ``random`` random ones
    (``d <= 4``, ``m <= 4``, ``n <= 6``; transformer ``d <= 3``, ``n <= 5``; input vectors
    and queries of norms spread over two decades).

    ``scaled=False`` leaves out ``X * 1e2`` and ``X * 1e3`` (for unnormalised
    scores, where Thm 2's ``e^a`` would overflow).
    """
    transformer = form.kind == "transformer"
    fixed = _transformer_fixed if transformer else _linear_fixed
    draw = _transformer_random if transformer else _linear_random
    yield from fixed(rng, form, scaled)
    for _ in range(random):
        yield draw(rng, form)


def _mixed_cases(ctx: Context, forms: tuple[Form, ...], scaled_none: bool) -> Iterator[Case]:
    """Every form's adversarial cases, and ``ctx.cases`` random ones shared among the forms."""
    for k, form in enumerate(forms):
        share = ctx.cases // len(forms) + (k < ctx.cases % len(forms))
        scaled = scaled_none or form.normalization is not None
        yield from attention_cases(ctx.rng, form, share, scaled)


def tied_case(rng: np.random.Generator, kind: str = "linear") -> Case:
    """An unnormalised input whose scores tie along every row, at every scale ``t``.

    Linear: columns ``x_j = x_0 + r_j`` with ``r_j`` orthogonal to every query,
    so ``Q^T X`` has equal columns. Transformer: rank-one queries ``Q = q a^T``
    and keys ``k_j = k_0 + r_j`` with ``r_j`` orthogonal to ``q``. The softmax
    stays uniform under ``X -> tX`` and never saturates, so the second term of
    Eq. 8 grows like ``t`` (like ``t^2`` for the transformer) while the first
    stays ``sqrt(m/n)``. (At generic inputs the softmax saturates as ``t`` grows
    and its derivative decays: unboundedness lives near ties, as in Kim et al.
    2020.)
    """
    if kind == "transformer":
        q = np.outer(rng.standard_normal(3), rng.standard_normal(4))  # (3, 4)
        k = rng.standard_normal((3, 1)) + _orthogonal_complement_noise(rng, q, 4)
        x = np.concatenate([q, k, rng.standard_normal((3, 4))], axis=0)  # (9, 4)
        return Case(Form("transformer", None), x, None, "tied scores")
    q = rng.standard_normal((4, 2))
    x = rng.standard_normal((4, 1)) + _orthogonal_complement_noise(rng, q, 5)  # (4, 5)
    return Case(Form("linear", None), x, q, "tied scores")


# -- multi-head cases (Eq. 5) ---------------------------------------------------------------------
class MultiHeadCase(NamedTuple):
    """A multi-head block, host parameters and input ``x`` ``(d_I, n)``."""

    block: Any  # MultiHeadAttention
    params: dict[str, np.ndarray]
    x: np.ndarray
    label: str


_HEAD_FORMS = (
    ("transformer", None, 1.0),
    ("transformer", "lipschitz", 1.0),
    ("linear", None, 1.0),
    ("linear", "linear", 1.0),
    ("linear", "lipschitz", 1.0),
)


def multihead_cases(
    rng: np.random.Generator, random: int, normalised_square: bool = False
) -> Iterator[MultiHeadCase]:
    """Multi-head cases (Eq. 5): adversarial ones, then ``random`` random ones.

    ``normalised_square=True`` keeps the heads Eq. 21 is about: normalised
    (Eq. 17, Eq. 15 with ``alpha = 1``, Eq. 19) with ``m = n``.
    """
    forms = [f for f in _HEAD_FORMS if f[1] is not None] if normalised_square else _HEAD_FORMS

    def make(form: tuple, d_in: int, d: int, d_out: int, h: int, n: int) -> tuple[Any, dict]:
        kind, normalization, alpha = form
        m = None if kind == "transformer" else (n if normalised_square else int(rng.integers(1, 4)))
        block = MultiHeadAttention(d_in, d, d_out, h, kind, normalization, m, alpha)
        params = {k: 10.0 ** rng.uniform(-0.5, 0.5) * v for k, v in block.init_params(rng).items()}
        return block, params

    for k, form in enumerate(forms):
        fixed = [(3, 2, 2, 2, 3, "h = 2"), (2, 2, 1, 1, 1, "h = 1, d_O = 1, n = 1")]
        fixed.append((4, 1, 3, 3, 4, "h = 3, d = 1"))
        for d_in, d, d_out, h, n, label in fixed:
            block, params = make(form, d_in, d, d_out, h, n)
            yield MultiHeadCase(block, params, rng.standard_normal((d_in, n)), label)
        block, params = make(form, 3, 2, 3, 2, 3)
        params["W_in"][0] *= 30.0  # one head's projection dominates sum ||W_k||_*^2
        params["W_out"][:, 0] = 0.0  # a rank-deficient output map
        yield MultiHeadCase(block, params, rng.standard_normal((3, 3)), "unequal heads")
        if form[1] is not None:
            block, params = make(form, 3, 2, 2, 2, 3)
            yield MultiHeadCase(block, params, 1e3 * rng.standard_normal((3, 3)), "X * 1e3")
            block, params = make(form, 5, 2, 2, 2, 2)
            yield MultiHeadCase(block, params, 1e3 * _tied_heads(rng, block, params), "tied, * 1e3")
        for _ in range(random // len(forms) + (k < random % len(forms))):
            d_in, d, d_out, h = (int(v) for v in rng.integers(1, 4, size=4))
            n = int(rng.integers(1, 5))
            block, params = make(form, d_in, d, d_out, h, n)
            yield MultiHeadCase(block, params, rng.standard_normal((d_in, n)), "random")


def _tied_heads(rng: np.random.Generator, block: Any, params: dict[str, np.ndarray]) -> np.ndarray:
    """An input ``(d_I, n)`` at which every head's scores tie along every row.

    Columns ``x_0 + r_j`` with ``r_j`` in the null space of every head's score
    map: ``Q_k^T W_k`` (linear heads), the key projection of ``W_k`` (transformer
    heads: the keys are then equal). Needs ``d_I`` above the total rank.
    """
    d = block.head_dim
    if block.kind == "linear":
        maps = [q.T @ w for q, w in zip(params["Q"], params["W_in"], strict=True)]  # (m, d_I)
    else:
        maps = [w[d : 2 * d] for w in params["W_in"]]  # the key rows, (d, d_I)
    stacked = np.concatenate(maps, axis=0)  # (rows, d_I)
    _, singular, right = np.linalg.svd(stacked)
    null = right[int((singular > 1e-12 * singular[0]).sum()) :]  # (k, d_I), orthonormal rows
    n = 2
    return rng.standard_normal((block.in_dim, 1)) + null.T @ rng.standard_normal((len(null), n))
