"""Literal twin of ``BatchNorm`` (``torch.nn.BatchNorm1d``): forward and backward, per channel.

Never optimised: it exists so :class:`refimpl.nn.norms.batchnorm.BatchNorm` has an
independent formulation to agree with. NumPy on the host, float64, a loop over channels
and sums written out over the rows, the backward recomputed from the inputs (no cache)
as Ioffe & Szegedy (2015, Sec. 3) print the chain rule. Shares no code with the layer.

Per channel ``c``, over the ``M`` rows ``i``::

    F1  mu = (1/M) sum_i x_i
    F2  var = (1/M) sum_i (x_i - mu)^2                       (biased)
    F4  xhat_i = (x_i - mu) / sqrt(var + eps)
    F5  y_i = weight xhat_i + bias
    F6  running_mean' = (1 - momentum) running_mean + momentum mu
        running_var'  = (1 - momentum) running_var + momentum (1/(M-1)) sum_i (x_i - mu)^2
    evaluation: xhat_i = (x_i - running_mean) / sqrt(running_var + eps), F5, no F6

    B5  d_weight = sum_i d_y_i xhat_i;  d_bias = sum_i d_y_i;  d_xhat_i = d_y_i weight
    B4  d_var = sum_i d_xhat_i (x_i - mu) (-1/2) (var + eps)^(-3/2)
    B2  d_mu = sum_i d_xhat_i (-1 / sqrt(var + eps)) + d_var (1/M) sum_i -2 (x_i - mu)
    B1  d_x_i = d_xhat_i / sqrt(var + eps) + d_var 2 (x_i - mu) / M + d_mu / M
    evaluation: d_x_i = d_xhat_i / sqrt(running_var + eps)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["batchnorm_backward", "batchnorm_forward"]


def batchnorm_forward(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y (M, C), running_mean' (C,), running_var' (C,))``; pass ones and zeros for
    ``weight`` and ``bias`` without ``affine``."""
    rows, channels = x.shape
    y = np.empty_like(x)
    new_mean, new_var = running_mean.copy(), running_var.copy()
    for c in range(channels):
        column = [float(v) for v in x[:, c]]
        if training:
            mu = math.fsum(column) / rows  # F1
            squares = math.fsum((v - mu) ** 2 for v in column)
            var = squares / rows  # F2
            new_mean[c] = (1 - momentum) * running_mean[c] + momentum * mu  # F6
            new_var[c] = (1 - momentum) * running_var[c] + momentum * squares / (rows - 1)
        else:
            mu, var = float(running_mean[c]), float(running_var[c])
        for i in range(rows):
            xhat = (column[i] - mu) / math.sqrt(var + eps)  # F4
            y[i, c] = weight[c] * xhat + bias[c]  # F5
    return y, new_mean, new_var


def batchnorm_backward(
    x: np.ndarray,
    weight: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    training: bool,
    eps: float,
    d_y: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d_x (M, C), d_weight (C,), d_bias (C,))`` of ``<d_y, y>``, recomputed from ``x``."""
    rows, channels = x.shape
    d_x = np.empty_like(x)
    d_weight, d_bias = np.empty(channels), np.empty(channels)
    for c in range(channels):
        column = [float(v) for v in x[:, c]]
        if training:
            mu = math.fsum(column) / rows
            var = math.fsum((v - mu) ** 2 for v in column) / rows
        else:
            mu, var = float(running_mean[c]), float(running_var[c])
        root = math.sqrt(var + eps)
        xhat = [(v - mu) / root for v in column]
        # B5
        d_weight[c] = math.fsum(d_y[i, c] * xhat[i] for i in range(rows))
        d_bias[c] = math.fsum(d_y[i, c] for i in range(rows))
        d_xhat = [d_y[i, c] * weight[c] for i in range(rows)]
        if not training:
            for i in range(rows):
                d_x[i, c] = d_xhat[i] / root
            continue
        # B4
        d_var = math.fsum(d_xhat[i] * (column[i] - mu) for i in range(rows)) * -0.5 * root**-3
        # B2: both paths into mu, the second zero in exact arithmetic, written as printed
        d_mu = (
            math.fsum(-d_xhat[i] / root for i in range(rows))
            + d_var * math.fsum(-2 * (v - mu) for v in column) / rows
        )
        # B1
        for i in range(rows):
            d_x[i, c] = d_xhat[i] / root + d_var * 2 * (column[i] - mu) / rows + d_mu / rows
    return d_x, d_weight, d_bias
