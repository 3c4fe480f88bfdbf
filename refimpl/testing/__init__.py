"""Tools for checking implementations: gradient checks, tolerances, rounding estimates, the strict
backend, and Hypothesis strategies for graph layers (:mod:`refimpl.testing.strategies`, imported
on its own: it needs Hypothesis, the ``test`` extra)."""

from refimpl.testing.gradcheck import (
    GradCheckReport,
    TensorError,
    check_gradients,
    finite_difference_resolution,
    judge_gradient,
    max_relative_error,
    relative_errors,
)
from refimpl.testing.rounding import RoundingEstimate, estimate_rounding
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

__all__ = [
    "FORWARD_RTOL",
    "GRADCHECK_RTOL",
    "GradCheckReport",
    "RoundingEstimate",
    "TensorError",
    "check_gradients",
    "estimate_rounding",
    "finite_difference_resolution",
    "judge_gradient",
    "max_relative_error",
    "relative_errors",
]
