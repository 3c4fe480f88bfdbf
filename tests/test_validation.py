"""check_finite: a finite sum clears an array; a non-finite one falls through to the entrywise
check, so finite entries whose sum overflows pass and any NaN or infinity is reported."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.validation import NonFiniteError, check_finite
from tests.strategies import seeds


@given(
    seed=seeds(),
    size=st.integers(0, 40),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    bad=st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), max_size=3),
    huge=st.booleans(),
)
def test_reports_exactly_the_arrays_with_nan_or_infinity(
    seed: int, size: int, dtype: type, bad: list, huge: bool
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size).astype(dtype)
    if huge:  # finite entries near the largest float: their sum overflows
        values[:] = np.finfo(dtype).max * 0.75
    places = rng.integers(0, size, len(bad)) if size else []
    for place, value in zip(places, bad, strict=False):
        values[place] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflowing sum is not the caller's business
        if np.isfinite(values).all():
            check_finite(values, "x")
        else:
            with pytest.raises(NonFiniteError, match=r"x contains NaN or infinity \(\d+ of"):
                check_finite(values, "x")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_entries_whose_sum_overflows_pass(dtype: type) -> None:
    values = np.full(4, np.finfo(dtype).max, dtype=dtype)
    with np.errstate(over="ignore"):
        assert not np.isfinite(values.sum())  # the fast check alone would reject them
    check_finite(values, "x")


def test_opposite_infinities_are_reported() -> None:
    # +inf and -inf sum to NaN, and a count of both is given
    with pytest.raises(NonFiniteError, match=r"\(2 of 3 entries\)"):
        check_finite(np.array([np.inf, 1.0, -np.inf]), "x")
