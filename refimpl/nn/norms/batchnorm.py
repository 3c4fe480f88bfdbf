"""``BatchNorm`` over the rows of an ``(M, C)`` array, as ``torch.nn.BatchNorm1d``, with its
hand-written backward.

Batch normalisation (Ioffe & Szegedy 2015, Alg. 1) standardises each channel by the
statistics of the batch, then applies a per-channel affine map. The graph transformer of
Dwivedi & Bresson (2021, Eq. 7-8 and 13-14: ``BN`` after each residual), the one the
massive-activations study ran on ZINC, normalises the node stream and the edge stream with
it (``nn.BatchNorm1d(out_dim)`` in their released code): a row is a node (or an edge) of
any graph of the batch, and the statistics are over all rows of all graphs together.

Training mode (``training=True``), per channel ``c`` over the ``M`` rows::

    mu_c   = (1/M) sum_i x_ic                              batch mean
    var_c  = (1/M) sum_i (x_ic - mu_c)^2                   BIASED batch variance
    y_ic   = (x_ic - mu_c) / sqrt(var_c + eps) * weight_c + bias_c
    running_mean <- (1 - momentum) running_mean + momentum mu_c
    running_var  <- (1 - momentum) running_var  + momentum var_c M / (M - 1)   (UNBIASED)

Evaluation mode (``training=False``) is an affine map of ``x``:
``y_ic = (x_ic - running_mean_c) / sqrt(running_var_c + eps) * weight_c + bias_c``,
the running statistics unchanged. PyTorch names and defaults throughout: ``weight``,
``bias``, ``running_mean`` (zeros), ``running_var`` (ones), ``momentum = 0.1``,
``eps = 1e-5``; torch's ``momentum=None`` (a cumulative average) and
``track_running_stats=False`` are not offered.

The running statistics are state, not parameters: ``forward`` takes them as a dict
``{"running_mean": (C,), "running_var": (C,)}`` (:meth:`BatchNorm.init_state`) and returns
the updated ones in the cache (a new dict; the one passed in is never modified), so a
training loop carries them from step to step and a checkpoint saves them beside the
parameters. No gradient flows into or out of them (torch's buffers are not differentiated).

Edge semantics. A constant channel has ``var_c = 0``: ``y = bias_c`` up to rounding in
``mu_c``, finite because ``eps > 0``, and its gradient is the centring of ``d_y``
(``weight_c / sqrt(eps)`` times it). Training with ``M < 2`` rows is refused: one row's
biased variance is 0, so the output is ``bias`` whatever ``x`` is, and its unbiased
variance divides by ``M - 1 = 0`` (PyTorch raises "Expected more than 1 value per channel
when training" for the same reason). Evaluation accepts ``M = 0`` and returns ``(0, C)``.

Forward and backward side by side (training; sums and means over the rows, per channel)::

    F1  mu = mean x                              (C,)
    F2  xc = x - mu                              (M, C)
    F3  var = mean xc^2;  inv_std = 1 / sqrt(var + eps)
    F4  xhat = xc * inv_std
    F5  y = xhat * weight + bias
    F6  running statistics (above; no gradient)

    B5  d_weight = sum d_y * xhat;  d_bias = sum d_y;  d_xhat = d_y * weight
    B4  d_xc = d_xhat * inv_std;  d_inv_std = sum d_xhat * xc
    B3  d_var = -d_inv_std * inv_std^3 / 2;  d_xc += d_var * 2 xc / M
    B2  d_mu = -sum d_xc  (the path through var adds d_var * mean(-2 xc) = 0: xc sums to 0)
    B1  d_x = d_xc + d_mu / M

Evaluation: ``xhat = (x - running_mean) * inv_std`` with ``inv_std`` from ``running_var``,
and ``d_x = d_y * weight * inv_std``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import asarray, get_array_module
from refimpl.fields import check_bool, check_nonnegative_number, check_positive_int, shown
from refimpl.nn.norms.affine import affine_init, affine_shapes
from refimpl.nn.overflow import backward_checked, check_overflow
from refimpl.validation import check_block_inputs, check_cotangent, check_input, check_like

__all__ = ["BATCHNORM_STATE", "BatchNorm", "BatchNormCache"]

BATCHNORM_STATE = ("running_mean", "running_var")  # torch.nn.BatchNorm1d's buffer names


class BatchNormCache(NamedTuple):
    """What :meth:`BatchNorm.backward` reads, and the running statistics after the step.

    Attributes
    ----------
    xhat : array, (M, C)
        The standardised input, before the affine map.
    inv_std : array, (C,)
        ``1 / sqrt(var + eps)``: of the batch variance (training) or of ``running_var``.
    training : bool
        Batch statistics (training) or running statistics (evaluation).
    state : dict
        The running statistics after this step (a new dict).
    """

    xhat: Any
    inv_std: Any
    training: bool
    state: dict[str, Any]


@dataclass(frozen=True)
class BatchNorm:
    r"""Batch normalisation over rows, ``torch.nn.BatchNorm1d(C)`` on an ``(M, C)`` input.

    Ioffe & Szegedy 2015, Alg. 1, with PyTorch's running statistics (the module docstring
    gives their update and the backward's steps). Per channel, in training with the batch's
    mean $\mu$ and biased variance $\sigma^2$ over the $M$ rows, in evaluation with
    ``running_mean`` and ``running_var`` in their place:

    $$
    y_{ic} = \frac{x_{ic} - \mu_c}{\sqrt{\sigma_c^2 + \epsilon}}\, w_c + b_c
    $$

    (``running_var`` is updated with the unbiased variance, as torch's).

    Parameters
    ----------
    channels : int
        ``C``, the number of features per row (``num_features`` in torch); >= 1.
    momentum : float, default 0.1
        Weight of the batch statistic in the running average, in ``[0, 1]`` (torch's
        default). 0 freezes the running statistics, 1 keeps only the last batch's.
    eps : float, default 1e-5
        $\epsilon > 0$, added to the variance under the square root (torch's default).
    affine : bool, default True
        Learnable per-channel ``weight`` $w$ (ones) and ``bias`` $b$ (zeros).

    Shapes
    ------
    - ``x``: ``(M, C)``, one row per node (or per edge, for an edge stream); ``M >= 2``
      in training, ``M >= 0`` in evaluation.
    - ``y``: ``(M, C)``, ``x``'s dtype.
    - ``params``: ``weight`` ``(C,)``, ``bias`` ``(C,)`` (``{}`` without ``affine``).
    - ``state``: ``running_mean`` ``(C,)``, ``running_var`` ``(C,)`` (>= 0), ``x``'s dtype.
    """

    channels: int  # C; torch's num_features
    momentum: float = 0.1  # torch default
    eps: float = 1e-5  # torch default
    affine: bool = True  # torch default

    def __post_init__(self) -> None:
        check_positive_int(self.channels, "BatchNorm channels")
        momentum = self.momentum
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real):
            momentum = float("nan")  # refused below, in the same words
        if not 0 <= momentum <= 1:  # NaN fails too
            raise ValueError(
                f"BatchNorm momentum must be a number in [0, 1] (the batch statistic's weight in "
                f"the running average; torch's default 0.1), got {shown(self.momentum)}"
            )
        check_nonnegative_number(self.eps, "BatchNorm eps", allow_zero=False)
        object.__setattr__(self, "affine", check_bool(self.affine, "BatchNorm affine"))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the parameters, in order (torch's)."""
        return affine_shapes(self.channels, self.affine)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """``weight`` ones and ``bias`` zeros, as torch (``rng`` is not used)."""
        return affine_init(self.channels, self.affine, backend, dtype)

    def init_state(self, backend: str | None = None, dtype: Any = np.float64) -> dict[str, Any]:
        """``{"running_mean": zeros (C,), "running_var": ones (C,)}``, as torch's buffers."""
        return {
            "running_mean": asarray(np.zeros(self.channels), backend=backend, dtype=dtype),
            "running_var": asarray(np.ones(self.channels), backend=backend, dtype=dtype),
        }

    def forward(
        self, params: dict[str, Any], x: Any, training: bool, state: Mapping[str, Any]
    ) -> tuple[Any, BatchNormCache]:
        """Normalise ``x`` (M, C); returns ``(y (M, C), cache)``, ``cache.state`` the running
        statistics after this step (updated in training, the same values in evaluation).

        Parameters
        ----------
        params : dict
            ``weight`` and ``bias`` (C,), or ``{}`` without ``affine``.
        x : array (M, C)
            Rows to normalise, finite.
        training : bool
            Batch statistics and a running-statistics update (True), or the running
            statistics (False). No default: the two modes compute different functions.
        state : dict
            ``running_mean`` and ``running_var`` (C,), finite, ``running_var >= 0``, on
            ``x``'s backend in its dtype (:meth:`init_state`). Not modified.
        """
        xp = check_block_inputs(params, self.param_shapes(), "BatchNorm", x, self.channels)
        training = check_bool(training, "BatchNorm training")
        running_mean, running_var = self._check_state(state, x)
        rows = x.shape[0]
        if training and rows < 2:
            raise ValueError(
                f"BatchNorm in training needs at least 2 rows per channel, got {rows}: one row's "
                "batch variance is 0 (the output would be the bias whatever x is) and the "
                "unbiased variance for running_var divides by M - 1 = 0 (PyTorch refuses this "
                "too); batch more nodes or graphs, or use training=False"
            )
        if not training:
            inv_std = 1 / xp.sqrt(running_var + self.eps)  # (C,)
            xhat = (x - running_mean) * inv_std  # (M, C)
            new_state = {"running_mean": running_mean.copy(), "running_var": running_var.copy()}
        else:
            # F1 batch mean; F2 centre
            mean = x.mean(axis=0)  # (C,)
            centred = x - mean  # (M, C)
            # F3 biased batch variance; an infinite one from finite x would zero xhat silently
            var = (centred * centred).mean(axis=0)  # (C,)
            check_overflow(var, "BatchNorm.forward: the batch variance of x", x.dtype)
            inv_std = 1 / xp.sqrt(var + self.eps)  # (C,)
            # F4 standardise
            xhat = centred * inv_std  # (M, C)
            # F6 running statistics with the unbiased variance (torch's update, no gradient)
            keep = 1 - self.momentum
            new_state = {
                "running_mean": keep * running_mean + self.momentum * mean,
                "running_var": keep * running_var + self.momentum * (var * (rows / (rows - 1))),
            }
            check_overflow(new_state, "BatchNorm.forward: the running statistics", x.dtype)
        # F5 per-channel affine map, broadcast over rows
        y = xhat * params["weight"] + params["bias"] if self.affine else xhat
        check_overflow(y, "BatchNorm.forward: its output", x.dtype)
        return y, BatchNormCache(xhat, inv_std, training, new_state)

    def _check_state(self, state: Any, x: Any) -> tuple[Any, Any]:
        """The running statistics: the two keys, finite (C,) arrays like ``x``, var >= 0."""
        if not isinstance(state, Mapping) or sorted(state) != sorted(BATCHNORM_STATE):
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(
                "BatchNorm state must be a dict with keys 'running_mean' and 'running_var' "
                f"(C,), got {got}; create it with BatchNorm.init_state"
            )
        for name in BATCHNORM_STATE:
            check_input(state[name], f"state[{name!r}]", shape=(self.channels,))
        check_like(dict(state), x, "x", "BatchNorm", "state comes from init_state; ")
        running_var = state["running_var"]
        if bool((running_var < 0).any()):
            raise ValueError(
                f"BatchNorm state['running_var'] must be >= 0 (a variance), got minimum "
                f"{float(running_var.min())}; restore it from init_state or a checkpoint"
            )
        return state["running_mean"], running_var

    def backward(
        self, params: dict[str, Any], cache: BatchNormCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of a scalar loss: ``(d_x (M, C), {"weight": (C,), "bias": (C,)})``; none
        for the running statistics."""
        xhat = cache.xhat
        check_cotangent(d_y, xhat.shape, xhat.dtype, xhat, name="d_y")
        get_array_module(xhat, *params.values())  # TypeError if params moved backend
        return backward_checked(lambda: self._backward(params, cache, d_y), "BatchNorm", xhat.dtype)

    def _backward(
        self, params: dict[str, Any], cache: BatchNormCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        """B5-B1 of :meth:`backward` on a checked cotangent."""
        xhat, inv_std, training, _ = cache
        d_params: dict[str, Any] = {}
        # B5 (of F5) broadcasting over rows is adjoint to summing over them
        if self.affine:
            d_params["weight"] = (d_y * xhat).sum(axis=0)  # (C,)
            d_params["bias"] = d_y.sum(axis=0)  # (C,)
            d_xhat = d_y * params["weight"]  # (M, C)
        else:
            d_xhat = d_y
        if not training:  # an affine map of x: running statistics are constants
            return d_xhat * inv_std, d_params
        rows = xhat.shape[0]
        centred = xhat / inv_std  # (M, C) xc, recovered: inv_std > 0
        # B4 (of F4) xhat = xc * inv_std: both receive gradient
        d_centred = d_xhat * inv_std  # (M, C)
        d_inv_std = (d_xhat * centred).sum(axis=0)  # (C,)
        # B3 (of F3) inv_std = (var + eps)^(-1/2), var = mean xc^2
        d_var = -0.5 * d_inv_std * inv_std**3  # (C,)
        d_centred = d_centred + d_var * (2 / rows) * centred
        # B2 (of F2) xc = x - mu; the path mu -> var is zero since xc sums to 0 over rows
        d_mean = -d_centred.sum(axis=0)  # (C,)
        # B1 (of F1) mu = mean x
        return d_centred + d_mean / rows, d_params
