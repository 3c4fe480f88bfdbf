"""Gradient checking: a hand-written backward against central finite differences in float64.

Usable on any block that follows the layer protocol (``forward(params, *inputs,
**kwargs) -> (out, cache)`` and ``backward(params, cache, d_out) -> (d_inputs,
d_params)``), ours or a user's::

    report = check_gradients(conv, params, (x, graph), rng=np.random.default_rng(0))
    print(report.table())
    assert report.passed  # every tensor's max relative error <= rtol (1e-6)

The scalar checked is ``L = <c, out>`` for a random cotangent ``c`` (never
``sum(out)``: the sum of a softmax is constant, so its gradient is zero and
proves nothing). For every checked entry ``w`` of every float input and
parameter, ``(L(w + eps) - L(w - eps)) / (2 eps)`` is compared with the
analytical ``<c, d out / d w>`` from ``backward``.

Error measure, per tensor: ``max |analytic - numeric| / scale`` with
``scale = max(max |analytic|, max |numeric|, resolution / rtol)``. Central
differences resolve a derivative only down to ``resolution = 64 u sum|c * out| /
eps``: the rounding in ``L`` divided by the step, with ``u`` the float64 unit
roundoff and 64 allowing a few dozen roundings per output entry along the
forward pass (observed: up to ~1.3 u sum|c * out| / eps on one-edge graphs).
A gradient that is zero by cancellation (the shift invariance of a softmax,
say) cannot be judged relative to itself; flooring its scale at
``resolution / rtol`` means a correct backward always passes at ``rtol`` while
any error larger than the resolution still fails. :func:`judge_gradient` is this rule
on its own (the verdict's tests call it with chosen errors), and
:func:`finite_difference_resolution` the floor.

``stencil=4`` replaces the two-point difference by the four-point one,
``(8 (L(w + eps) - L(w - eps)) - (L(w + 2 eps) - L(w - 2 eps))) / (12 eps)``, whose
truncation error is ``O(eps^4)`` instead of ``O(eps^2)`` at twice the forward calls
(its rounding is 1.5x the two-point one's, so ``resolution`` is scaled by 1.5). It
is for blocks that curve strongly at the step the rounding forces: a NodeFormer
model (``tau = 0.25``, one random feature, LayerNorm) gave a two-point error of
``3.4e-6`` at ``eps = 1e-5`` that fell as ``eps^2`` (``3.1e-5``, ``3.4e-6``,
``3.1e-7``, ``3.5e-8`` at ``eps = 3e-5, 1e-5, 3e-6, 1e-6``): truncation, not the
backward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from refimpl.backend import get_array_module, is_array, to_numpy
from refimpl.testing.gradcheck_report import GradCheckReport, TensorError
from refimpl.testing.tolerances import GRADCHECK_RTOL

__all__ = [
    "GradCheckReport",
    "TensorError",
    "as_tuple",
    "check_gradients",
    "finite_difference_resolution",
    "judge_gradient",
    "max_relative_error",
    "relative_errors",
]

_ROUNDINGS = 64  # roundings per output entry allowed in the forward (see the module docstring)
# the measured noise floor (module docstring): points and difference order of Moré and
# Wild's estimate, and the margin over the noise for the largest of many central differences
_NOISE_POINTS = 11
_NOISE_ORDER = 6
_NOISE_MARGIN = 16

# central differences: {offset in steps: weight}, the derivative being sum(w L(x + o eps)) / eps
_STENCILS = {
    2: {1: 0.5, -1: -0.5},
    4: {1: 8 / 12, -1: -8 / 12, 2: -1 / 12, -2: 1 / 12},
}


def finite_difference_resolution(
    cotangent: Any, out: Any, eps: float = 1e-6, stencil: int = 2
) -> float:
    r"""The smallest derivative central differences resolve: $64 u \sum |c \odot out| / eps$.

    The rounding in $L = \langle c, out \rangle$ divided by the step, scaled by the stencil's
    weights (1 for two points, 1.5 for four); $u$ is float64's unit roundoff.

    Parameters
    ----------
    cotangent : array
        $c$, the cotangent the check contracts ``out`` with; ``out``'s shape.
    out : array
        The block's output at the unperturbed point.
    eps : float, default 1e-6
        Central-difference step.
    stencil : int, default 2
        Points of the central difference: 2 or 4.

    Returns
    -------
    float
        The resolution, $\ge 0$.
    """
    _check_stencil(stencil)
    xp = get_array_module(out)
    weights = sum(abs(w) for w in _STENCILS[stencil].values())
    rounding = _ROUNDINGS * np.finfo(np.float64).eps * float(xp.sum(xp.abs(cotangent * out)))
    return weights * rounding / eps


def _check_stencil(stencil: int) -> None:
    if stencil not in _STENCILS:
        raise ValueError(
            f"stencil must be 2 or 4 (points of the central difference), got {stencil!r}"
        )


def judge_gradient(
    name: str,
    analytic: np.ndarray,
    numeric: np.ndarray,
    resolution: float,
    rtol: float = GRADCHECK_RTOL,
    size: int | None = None,
) -> TensorError:
    """The decision rule of :func:`check_gradients` for one tensor, on its checked entries.

    ``max_rel_error = max |analytic - numeric| / scale`` with ``scale = max(max |analytic|,
    max |numeric|, resolution / rtol)``; the tensor passes when ``max_rel_error <= rtol``.
    The floor makes a gradient below the resolution (zero by cancellation) pass with any
    numeric noise under ``resolution`` and fail with more; above it, the error is relative
    to the tensor's largest entry (module docstring).

    Parameters
    ----------
    name : str
        The tensor's name in the report (``"param:W"``).
    analytic, numeric : array_like
        The backward's and the finite differences' derivatives at the checked entries,
        equal in size (any shape; flattened).
    resolution : float
        :func:`finite_difference_resolution` of the check.
    rtol : float, default ``GRADCHECK_RTOL`` (1e-6)
        The tolerance judged with.
    size : int or None, default None
        Entries in the whole tensor, when only some were checked (``None``: all were).

    Returns
    -------
    TensorError
        The tensor's errors; it passes when ``max_rel_error <= rtol``.
    """
    analytic = np.asarray(analytic, dtype=np.float64).reshape(-1)
    numeric = np.asarray(numeric, dtype=np.float64).reshape(-1)
    if analytic.shape != numeric.shape:
        raise ValueError(f"{name}: {analytic.size} analytic entries for {numeric.size} numeric")
    abs_error = float(np.max(np.abs(analytic - numeric), initial=0.0))
    scale = max(
        float(np.max(np.abs(analytic), initial=0.0)),
        float(np.max(np.abs(numeric), initial=0.0)),
        resolution / rtol,
        np.finfo(np.float64).tiny,
    )
    checked = analytic.size
    return TensorError(
        name, abs_error, abs_error / scale, scale, checked, checked if size is None else size
    )


def max_relative_error(actual: Any, expected: Any) -> float:
    """``max |actual - expected| / max(max |expected|, tiny)``: a normwise relative error.

    Parameters
    ----------
    actual, expected : array
        Equal shapes, any backend (compared on the host in float64).

    Returns
    -------
    float
        0.0 for empty arrays.
    """
    a = to_numpy(actual).astype(np.float64)
    b = to_numpy(expected).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(b))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - b))) / scale


def relative_errors(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, float]:
    """Per tensor ``max |actual - expected|``, over the largest entry of *any* expected tensor.

    For comparing two formulations of the same gradients: their differences are
    rounding in sums whose terms are on the scale of the whole set, so a
    tensor that is zero by cancellation (and computed as ~1e-17 either way) is
    not judged relative to itself.

    Parameters
    ----------
    actual, expected : mapping of str to array
        The same names, each pair of equal shape, any backend.

    Returns
    -------
    dict of str to float
        Per name, its largest absolute difference over the common scale.
    """
    if set(actual) != set(expected):
        raise ValueError(f"keys differ: {sorted(actual)} vs {sorted(expected)}")
    host = {
        k: (to_numpy(actual[k]).astype(np.float64), to_numpy(expected[k]).astype(np.float64))
        for k in expected
    }
    scale = max((float(np.max(np.abs(b), initial=0.0)) for _, b in host.values()), default=0.0)
    scale = max(scale, np.finfo(np.float64).tiny)
    errors = {}
    for name, (a, b) in host.items():
        if a.shape != b.shape:
            raise ValueError(f"{name}: shapes differ: {a.shape} vs {b.shape}")
        errors[name] = float(np.max(np.abs(a - b), initial=0.0)) / scale
    return errors


def as_tuple(value: Any, count: int) -> tuple:
    """The input gradients a ``backward`` returned, as a tuple of ``count`` entries.

    The layer protocol returns the gradient of a block's one differentiable input bare
    (``d_x``) and those of several as a tuple (``(d_x, d_edge_attr)``); this undoes the
    difference. ``count`` is the number of differentiable inputs (a 1-tuple stays as is).
    """
    if count == 1 and not isinstance(value, tuple):
        return (value,)
    return tuple(value)


def check_gradients(
    block: Any,
    params: dict[str, Any],
    inputs: Sequence[Any],
    *,
    forward_kwargs: dict[str, Any] | None = None,
    wrt_inputs: Sequence[int] | None = None,
    cotangent: Any = None,
    rng: np.random.Generator | None = None,
    eps: float = 1e-6,
    max_entries: int | None = 200,
    rtol: float = GRADCHECK_RTOL,
    stencil: int = 2,
) -> GradCheckReport:
    """Compare ``block.backward`` with central differences of ``block.forward``.

    Parameters
    ----------
    block
        Object with ``forward(params, *inputs, **forward_kwargs) -> (out, cache)``
        and ``backward(params, cache, d_out) -> (d_inputs, d_params)``;
        ``d_inputs`` is one array when one input is differentiable, else a tuple.
    params : dict of float64 arrays
        Parameters; every entry is checked (or ``max_entries`` of them).
    inputs : sequence
        Positional inputs. Float arrays are differentiable unless ``wrt_inputs``
        names the differentiable positions; everything else (a ``Graph``, labels)
        passes through unchanged.
    forward_kwargs : dict, optional
        Keyword arguments for ``forward`` (``training=True``, a fixed dropout
        mask, ...). Anything random must be fixed here: the forward is called
        many times and must be a deterministic function of the perturbed entry.
    wrt_inputs : sequence of int, optional
        Positions in ``inputs`` to check; default every float array.
    cotangent : array, optional
        ``c`` in ``L = <c, out>``; drawn standard normal from ``rng`` if omitted.
    rng : numpy.random.Generator, optional
        For the cotangent and the entry subset (default ``default_rng(0)``).
    eps : float
        Central-difference step.
    max_entries : int or None
        Entries checked per tensor, drawn without replacement; ``None`` for all.
    rtol : float
        The tolerance the caller will judge with; sets the scale floor
        ``resolution / rtol`` (see the module docstring).
    stencil : 2 or 4
        Points of the central difference: error ``O(eps^2)`` or ``O(eps^4)`` (module
        docstring).

    Returns
    -------
    GradCheckReport
        One :class:`TensorError` per differentiable input (``input[i]``) and
        parameter (``param:name``).
    """
    _check_stencil(stencil)
    rng = np.random.default_rng(0) if rng is None else rng
    forward_kwargs = {} if forward_kwargs is None else dict(forward_kwargs)
    inputs = tuple(inputs)
    if wrt_inputs is None:
        wrt_inputs = [
            i for i, value in enumerate(inputs) if is_array(value) and value.dtype.kind == "f"
        ]
    tensors = [(f"input[{i}]", inputs[i]) for i in wrt_inputs]
    tensors += [(f"param:{name}", value) for name, value in params.items()]
    for name, value in tensors:
        if value.dtype != np.float64:
            raise TypeError(
                f"gradient checks need float64 ({name} is {value.dtype}): float32 central "
                "differences are dominated by rounding"
            )

    out, cache = block.forward(params, *inputs, **forward_kwargs)
    xp = get_array_module(out)
    if cotangent is None:
        cotangent = xp.asarray(rng.standard_normal(out.shape))

    weights = _STENCILS[stencil]
    resolution = finite_difference_resolution(cotangent, out, eps, stencil)
    d_inputs, d_params = block.backward(params, cache, cotangent)
    d_inputs = as_tuple(d_inputs, len(wrt_inputs))
    analytic = [to_numpy(d) for d in d_inputs] + [to_numpy(d_params[name]) for name in params]

    def loss(replaced: dict[int, Any]) -> float:
        """``L`` with tensor ``k`` (numbered as ``tensors``) replaced by ``replaced[k]``."""
        new_inputs, new_params = list(inputs), dict(params)
        for k, value in replaced.items():
            if k < len(wrt_inputs):
                new_inputs[wrt_inputs[k]] = value
            else:
                new_params[tensors[k][0].removeprefix("param:")] = value
        value, _ = block.forward(new_params, *new_inputs, **forward_kwargs)
        return float(xp.sum(cotangent * value))

    numeric = []
    for k, (_, value) in enumerate(tensors):
        chosen = np.arange(value.size)
        if max_entries is not None and value.size > max_entries:
            chosen = rng.choice(value.size, size=max_entries, replace=False)
        estimates = np.empty(chosen.size)
        for j, flat_index in enumerate(chosen):
            index = np.unravel_index(int(flat_index), value.shape)
            index = tuple(int(i) for i in index)
            total = 0.0
            for offset, weight in weights.items():
                shifted = value.copy()
                shifted[index] = shifted[index] + offset * eps
                total += weight * loss({k: shifted})
            estimates[j] = total / eps
        numeric.append((chosen, estimates))

    for name, value, grad in zip(
        (name for name, _ in tensors), (value for _, value in tensors), analytic, strict=True
    ):
        if grad.shape != value.shape:
            raise ValueError(f"backward returned shape {grad.shape} for {name} of {value.shape}")
    report = _judge(tensors, analytic, numeric, eps, rtol, resolution)
    if not report.passed:
        # Only a failing verdict can change: the measured noise only raises the floor.
        noise = _loss_noise(loss, tensors, eps)
        measured = _NOISE_MARGIN * sum(abs(w) for w in weights.values()) * noise / eps
        if measured > resolution:
            report = _judge(tensors, analytic, numeric, eps, rtol, measured)
    return report


def _judge(
    tensors: list, analytic: list, numeric: list, eps: float, rtol: float, resolution: float
) -> GradCheckReport:
    report = GradCheckReport(eps=eps, rtol=rtol, resolution=resolution)
    for (name, value), grad, (chosen, estimates) in zip(tensors, analytic, numeric, strict=True):
        exact = grad.reshape(-1)[chosen]
        report.errors.append(judge_gradient(name, exact, estimates, resolution, rtol, value.size))
    return report


def _loss_noise(loss: Any, tensors: list, eps: float) -> float:
    """The rounding noise in ``L`` near the point, from its values along a line (Moré and Wild).

    ``L`` at ``_NOISE_POINTS`` points ``eps`` apart along a fixed sign pattern in every
    tensor at once; differences of order ``k = _NOISE_ORDER`` remove the smooth part
    (``eps^k L^(k)``, negligible) and leave the noise, whose variance they multiply by
    ``binom(2k, k)``.
    """
    signs = np.random.default_rng(0)  # a fixed direction: the check stays deterministic
    direction = {
        k: get_array_module(value).asarray(signs.choice([-1.0, 1.0], size=value.shape))
        for k, (_, value) in enumerate(tensors)
    }
    values = np.array(
        [
            loss({k: value + (j * eps) * direction[k] for k, (_, value) in enumerate(tensors)})
            for j in range(_NOISE_POINTS)
        ]
    )
    differences = np.diff(values, n=_NOISE_ORDER)
    return float(np.sqrt(np.mean(differences**2) / math.comb(2 * _NOISE_ORDER, _NOISE_ORDER)))
