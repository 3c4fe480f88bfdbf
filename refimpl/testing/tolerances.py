"""Every tolerance the tests use, in one place, per dtype.

Widen one locally only with a comment that says why.
"""

from __future__ import annotations

import numpy as np

# Hand-written backward vs central differences (float64, eps = 1e-6): the
# truncation error is ~eps^2 and the rounding noise ~1e-16 / eps, both far below.
GRADCHECK_RTOL = 1e-6

# Two exact formulations of the same forward (vectorised vs naive loops, sparse
# vs dense softmax) differ only by summation order: a few ulps times the depth
# of the computation.
FORWARD_RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}

# A hand-written backward against another implementation's (autograd, a golden file): the
# same derivatives, but a backward pass accumulates more roundings than its forward (longer
# chains of sums, reordered), so a wider tolerance than the forward's (100x in float64,
# 10x in float32). Judged relative to the largest gradient entry of all (a gradient can be
# zero by cancellation: see refimpl.interop.compare), or, where the reference can be re-run,
# entry by entry to the magnitude of the terms that cancelled (refimpl.testing.rounding).
GRADIENT_RTOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-4}

# A fused layer against its literal twin (refimpl.naive: the paper's equations as loops and
# per-edge einsums): the same maths in another summation order, forward and every gradient,
# judged relative to the largest entry of each tensor (float64 only: the twins are the
# reading copy, run on the host in float64).
TWIN_RTOL = 1e-12
