"""estimate_rounding: the magnitude of the terms behind each entry of a torch computation, from
re-rounding every operation (skipped without torch)."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl.testing import estimate_rounding

torch = pytest.importorskip("torch")


def test_a_cancellation_carries_the_magnitude_of_its_terms() -> None:
    # (a + b) - a is b exactly here, but its rounding is that of a + b: magnitude ~1e8, not 1
    def compute() -> dict:
        a = torch.tensor([1e8], dtype=torch.float64)
        b = torch.tensor([1.0], dtype=torch.float64)
        return {"cancelled": (a + b) - a, "product": a * b}

    values, magnitudes = estimate_rounding(compute)
    assert values["cancelled"][0] == 1.0 and values["product"][0] == 1e8
    assert 1e7 < magnitudes["cancelled"][0] <= 2e8
    # one rounding of a result of 1e8: at most that result
    assert 1e7 < magnitudes["product"][0] <= 1e8


def test_a_maximum_keeps_its_gradient_under_rerounding() -> None:
    # Issue 24: re-rounding the result of a maximum made its backward, which finds the argument
    # by comparing the result with the inputs, drop the gradient in every perturbed run; every
    # gradient through LipschitzNorm's neighbourhood maximum then looked like rounding, and the
    # torch comparison passed a wrong backward. Selections are now left exact.
    def compute() -> dict:
        x = torch.tensor([0.3, 2.0, -1.0], dtype=torch.float64, requires_grad=True)
        (3.0 * x.amax()).backward()
        return {"grad": x.grad}

    values, magnitudes = estimate_rounding(compute)
    np.testing.assert_array_equal(values["grad"], [0.0, 3.0, 0.0])
    assert np.all(magnitudes["grad"] <= 2 * np.abs(values["grad"]))


def test_backward_operations_are_rerounded_too() -> None:
    # the gradient of sum(x - mean(x)) is 0 by cancellation in autograd's backward alone
    def compute() -> dict:
        x = torch.tensor([1e6, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
        (x - x.mean()).sum().backward()
        return {"grad": x.grad}

    _, magnitudes = estimate_rounding(compute)
    assert np.all(magnitudes["grad"] > 0.1)


def test_no_samples_gives_the_plain_values_and_zero_magnitudes() -> None:
    values, magnitudes = estimate_rounding(
        lambda: {"y": torch.tensor([0.1], dtype=torch.float64) * 3}, samples=0
    )
    assert values["y"][0] == 0.1 * 3 and magnitudes["y"][0] == 0.0


def test_an_estimate_repeats_exactly() -> None:
    def compute() -> dict:
        x = torch.linspace(0, 1, 5, dtype=torch.float64)
        return {"y": torch.exp(x).cumsum(0) - x.sum()}

    first, second = estimate_rounding(compute), estimate_rounding(compute)
    np.testing.assert_array_equal(first.magnitudes["y"], second.magnitudes["y"])


def test_results_that_are_not_floats_are_refused() -> None:
    with pytest.raises(TypeError, match="index: rounding is estimated for float results"):
        estimate_rounding(lambda: {"index": torch.arange(3)})
