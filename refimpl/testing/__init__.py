"""Tools for checking implementations: gradient checks, tolerances, the strict backend."""

from refimpl.testing.gradcheck import (
    GradCheckReport,
    TensorError,
    check_gradients,
    max_relative_error,
    relative_errors,
)
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL

__all__ = [
    "FORWARD_RTOL",
    "GRADCHECK_RTOL",
    "GradCheckReport",
    "TensorError",
    "check_gradients",
    "max_relative_error",
    "relative_errors",
]
