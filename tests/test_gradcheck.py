"""check_gradients: the two- and four-point stencils converge at their orders, and a wrong
backward fails with either."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from refimpl.testing import check_gradients

FREQUENCY = 3.0  # sin(3 x): third derivative 27, fifth 243, so truncation is visible


class SineBlock:
    """``out = w * sin(FREQUENCY x)``; ``slip`` scales ``d_x`` to make the backward wrong."""

    def __init__(self, slip: float = 0.0) -> None:
        self.slip = slip

    def forward(self, params: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return params["w"] * np.sin(FREQUENCY * x), x

    def backward(self, params: dict[str, Any], x: np.ndarray, d_out: np.ndarray) -> tuple:
        d_x = d_out * params["w"] * FREQUENCY * np.cos(FREQUENCY * x) * (1.0 + self.slip)
        return d_x, {"w": np.sum(d_out * np.sin(FREQUENCY * x), keepdims=True).reshape(1)}


def input_error(stencil: int, eps: float, slip: float = 0.0) -> float:
    params, x = {"w": np.array([1.3])}, np.array([0.4, -1.1, 2.0])
    report = check_gradients(
        SineBlock(slip), params, (x,), eps=eps, stencil=stencil, rng=np.random.default_rng(1)
    )
    return report.by_name()["input[0]"].max_abs_error


@pytest.mark.parametrize(("stencil", "order"), [(2, 2), (4, 4)])
def test_halving_the_step_divides_the_truncation_error_by_two_to_the_order(
    stencil: int, order: int
) -> None:
    # at these steps truncation dominates rounding (~1e-16 / eps) by orders of magnitude
    eps = 2e-2 if stencil == 2 else 1e-1
    ratio = input_error(stencil, eps) / input_error(stencil, eps / 2)
    assert 2**order * 0.8 <= ratio <= 2**order * 1.2


def test_the_four_point_stencil_is_far_more_accurate_at_the_same_step() -> None:
    assert input_error(4, 1e-3) < 1e-4 * input_error(2, 1e-3)


def test_a_backward_off_by_one_part_in_ten_thousand_fails_with_either_stencil() -> None:
    params, x = {"w": np.array([1.3])}, np.array([0.4, -1.1, 2.0])
    for stencil in (2, 4):
        report = check_gradients(SineBlock(slip=1e-4), params, (x,), eps=1e-5, stencil=stencil)
        assert report.by_name()["input[0]"].max_rel_error > 5e-5
        assert report.by_name()["param:w"].max_rel_error < 1e-8


def test_an_unknown_stencil_is_refused() -> None:
    with pytest.raises(ValueError, match="stencil must be 2 or 4"):
        check_gradients(SineBlock(), {"w": np.array([1.0])}, (np.zeros(2),), stencil=3)
