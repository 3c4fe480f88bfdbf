"""Our forward and backward against torch autograd, judged with the reference's own rounding.

Used by the torch-parity tests of layers and models (which skip themselves without torch;
this module imports torch only through ``estimate_rounding``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from refimpl.interop.compare import Comparison, compare_tensors
from refimpl.testing import RoundingEstimate, estimate_rounding
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL

FORWARD64 = FORWARD_RTOL[np.dtype(np.float64)]
GRADIENT64 = GRADIENT_RTOL[np.dtype(np.float64)]


def compare_with_autograd(
    ours: Mapping[str, Any],
    reference: Callable[[], Mapping[str, Any]],
    outputs: Sequence[str],
    forward_rtol: float = FORWARD64,
    gradient_rtol: float = GRADIENT64,
) -> Comparison:
    """Compare ``ours`` with what ``reference()`` computes, name by name.

    ``reference`` builds the torch computation from scratch (leaves, forward, backward)
    and returns the same names as ``ours``. Names in ``outputs`` are judged at
    ``forward_rtol`` on their own scale, the rest (gradients) at ``gradient_rtol`` on the
    scale of all gradients together (a tensor can be zero by cancellation); every entry
    is also judged against the magnitude of the terms whose rounding made it, measured
    by re-rounding the reference (``refimpl.testing.rounding``), so rounding that a
    collapsed normalisation amplifies fails no correct backward.

    The measurement runs only when the plain comparison fails: magnitudes only raise
    the denominators, so a comparison that passes without them passes with them, and
    the verdict is the same either way.
    """
    rtols = (forward_rtol, gradient_rtol)
    comparison = _compare(ours, estimate_rounding(reference, samples=0), outputs, *rtols)
    if comparison.passed:
        return comparison
    return _compare(ours, estimate_rounding(reference), outputs, *rtols)


def _compare(
    ours: Mapping[str, Any],
    reference: RoundingEstimate,
    outputs: Sequence[str],
    forward_rtol: float,
    gradient_rtol: float,
) -> Comparison:
    values, magnitudes = reference
    gradients = [name for name in values if name not in outputs]
    forward = compare_tensors(
        {n: ours[n] for n in outputs if n in ours},
        {n: values[n] for n in outputs if n in values},
        forward_rtol,
        magnitudes=magnitudes,
    )
    backward = compare_tensors(
        {n: v for n, v in ours.items() if n not in outputs},
        {n: values[n] for n in gradients},
        gradient_rtol,
        groups={"gradients": gradients},
        magnitudes=magnitudes,
    )
    return forward + backward
