"""Per-head contractions: against a loop, as each other's adjoint, on the strict backend; the
per-head scaling exactly as the broadcast it replaces; channel sums against a loop."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from refimpl.backend import to_numpy
from refimpl.ops.heads import dot_per_head, scale_per_head, sum_channels, sum_per_head
from refimpl.testing import max_relative_error
from refimpl.testing import strict as strict_xp
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
# (M, H, C): no rows, one row, one head, one channel, many heads
SHAPES = st.tuples(st.integers(0, 40), st.integers(1, 8), st.integers(1, 70))


def loop_dot(values: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    out = np.zeros(values.shape[:2])
    for m in range(values.shape[0]):
        for h in range(values.shape[1]):
            out[m, h] = math.fsum(values[m, h] * vectors[h])
    return out


def loop_sum(coefficients: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(values.shape[1:])
    for m in range(values.shape[0]):
        out += coefficients[m][:, None] * values[m]
    return out


@given(shape=SHAPES, seed=seeds())
def test_both_match_a_loop_and_are_adjoint(shape: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    vectors = rng.standard_normal(shape[1:])
    coefficients = rng.standard_normal(shape[:2])
    scores = dot_per_head(values, vectors)
    assert scores.shape == shape[:2]
    assert max_relative_error(scores, loop_dot(values, vectors)) <= RTOL64
    summed = sum_per_head(coefficients, values)
    assert summed.shape == shape[1:]
    assert max_relative_error(summed, loop_sum(coefficients, values)) <= RTOL64
    # <dot_per_head(values, vectors), coefficients> = <vectors, sum_per_head(coefficients, values)>
    left, right = np.vdot(scores, coefficients), np.vdot(vectors, summed)
    scale = np.abs(values).sum() * np.abs(vectors).max() * np.abs(coefficients).max(initial=0)
    assert abs(left - right) <= RTOL64 * scale  # both 0 when M = 0


@given(shape=SHAPES, seed=seeds())
def test_strict_backend_matches_numpy(shape: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, vectors = rng.standard_normal(shape), rng.standard_normal(shape[1:])
    coefficients = rng.standard_normal(shape[:2])
    v_s, a_s, c_s = (strict_xp.asarray(a) for a in (values, vectors, coefficients))
    assert max_relative_error(to_numpy(dot_per_head(v_s, a_s)), dot_per_head(values, vectors)) <= (
        RTOL64
    )
    assert (
        max_relative_error(to_numpy(sum_per_head(c_s, v_s)), sum_per_head(coefficients, values))
        <= RTOL64
    )


@given(
    shape=SHAPES,
    seed=seeds(),
    dtypes=st.sampled_from([(np.float32,) * 2, (np.float64,) * 2, (np.float32, np.float64)]),
)
def test_scale_per_head_is_the_broadcast_product_exactly(
    shape: tuple, seed: int, dtypes: tuple
) -> None:
    """The adjoint of dot_per_head in its values: the same products as the broadcast, bitwise,
    in the promoted dtype (float32 coefficients with float64 vectors give float64)."""
    rng = np.random.default_rng(seed)
    coefficients = rng.standard_normal(shape[:2]).astype(dtypes[0])
    vectors = rng.standard_normal(shape[1:]).astype(dtypes[1])
    scaled = scale_per_head(coefficients, vectors)
    expected = coefficients[..., None] * vectors
    assert scaled.dtype == expected.dtype
    np.testing.assert_array_equal(scaled, expected)
    # adjoint: <dot_per_head(values, vectors), c> = <values, scale_per_head(c, vectors)>
    values = rng.standard_normal(shape)
    left = np.vdot(dot_per_head(values, vectors.astype(float)), coefficients)
    right = np.vdot(values, scale_per_head(coefficients.astype(float), vectors.astype(float)))
    scale = np.abs(values).sum() * np.abs(vectors).max() * np.abs(coefficients).max(initial=0)
    assert abs(left - right) <= RTOL64 * scale


@given(shape=SHAPES, seed=seeds(), strict=st.booleans())
def test_sum_channels_matches_a_loop(shape: tuple, seed: int, strict: bool) -> None:
    values = np.random.default_rng(seed).standard_normal(shape)
    expected = np.array(
        [[math.fsum(values[m, h]) for h in range(shape[1])] for m in range(shape[0])]
    ).reshape(shape[:2])
    got = to_numpy(sum_channels(strict_xp.asarray(values) if strict else values))
    assert got.shape == shape[:2]
    scale = np.abs(values).sum(axis=2)  # the size of the terms that cancel
    assert np.all(np.abs(got - expected) <= RTOL64 * scale)
