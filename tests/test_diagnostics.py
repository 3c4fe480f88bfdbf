"""refimpl.diagnostics: balancedness, parameter change, relative gradient norms, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.diagnostics import (
    balancedness,
    balancedness_summary,
    conservation_residuals,
    fraction_changed,
    parameter_changes,
)


def _two_layer() -> dict[str, np.ndarray]:
    # n_0 = 2 inputs, one hidden layer of 2 neurons (one head), 1 output.
    return {
        "layer0.W_s": np.array([[1.0, 2.0], [3.0, 0.0]]),
        "layer0.att": np.array([[0.5, -1.0]]),
        "layer1.W_s": np.array([[2.0, 1.0]]),
        "layer1.att": np.array([[0.3]]),
    }


def test_balancedness_by_hand() -> None:
    # c_0 = (1 + 4) - 0.25 - 4 = 0.75 ; c_1 = 9 - 1 - 1 = 7
    (c,) = balancedness(_two_layer())
    np.testing.assert_array_equal(c, [0.75, 7.0])
    summary = balancedness_summary(_two_layer())
    assert summary == {"layer0": {"sum": 7.75, "min": 0.75, "max": 7.0, "mean_abs": 3.875}}


def test_conservation_terms_by_hand() -> None:
    params = _two_layer()
    grads = {k: np.full_like(v, 0.5) for k, v in params.items()}
    (residual,) = conservation_residuals(params, grads)
    np.testing.assert_array_equal(residual.incoming, [1.5, 1.5])
    np.testing.assert_array_equal(residual.attention, [0.25, -0.5])
    np.testing.assert_array_equal(residual.outgoing, [1.0, 0.5])
    np.testing.assert_array_equal(residual.delta, [0.25, 1.5])
    np.testing.assert_array_equal(residual.relative, [0.25 / 1.5, 1.0])


def test_parameter_changes_relative_with_magnitude_floor_and_absolute_for_zero_attention():
    initial = {
        "layer0.W_s": np.array([[1.0, 2.0], [1e-5, 4.0]]),
        "layer0.att": np.zeros((1, 2)),
        "layer1.W_s": np.array([[1.0, 1.0]]),
        "layer1.att": np.array([[2.0]]),
    }
    final = {
        "layer0.W_s": np.array([[1.5, 2.0], [5e-5, 2.0]]),  # 5e-5 < 1e-4: not counted
        "layer0.att": np.array([[0.2, 0.0]]),
        "layer1.W_s": np.array([[2.0, 1.0]]),
        "layer1.att": np.array([[1.0]]),
    }
    changes = parameter_changes(initial, final)
    np.testing.assert_allclose(changes["layer0"]["feature"], [0.5 / 1.5, 0.0, 1.0])
    np.testing.assert_allclose(changes["layer0"]["attention"], [0.2, 0.0])  # absolute
    np.testing.assert_allclose(changes["layer1"]["attention"], [1.0])  # relative |1-2|/1
    fractions = fraction_changed(initial, final, threshold=0.05)
    assert fractions["layer0"] == {"feature": pytest.approx(2 / 3), "attention": 0.5}
    assert fractions["layer1"] == {"feature": 0.5, "attention": 1.0}
