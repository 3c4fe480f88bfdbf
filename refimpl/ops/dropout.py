"""Inverted dropout with explicit randomness: the keep-mask is drawn from a generator or passed in.

docs/design.md, Randomness: nothing reads global random state, and the noise itself
can be passed in, so another implementation (PyTorch, a golden-vector file) can
be fed exactly the mask this one used (``cache.mask``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from refimpl.backend import get_array_module, is_array, is_sparse, sparse_module
from refimpl.fields import check_bool
from refimpl.kernels.dropout_fused import draw_keep_and_scale, keep_and_scale
from refimpl.kernels.pcg64_draws import draws_on_device, keep_mask
from refimpl.ops.fused_switch import runs_fused_kernels
from refimpl.validation import (
    check_array,
    check_cotangent,
    check_input,
    check_rng,
    check_sparse_input,
)

__all__ = ["Dropout", "DropoutCache", "recorded_dropout"]


class DropoutCache(NamedTuple):
    """What :meth:`Dropout.backward` reads: the keep-mask and scale, or None for the identity.

    Attributes
    ----------
    mask : array or None
        ``(*S,)`` bool, True = kept (``(nnz,)`` for a sparse ``x``); None when dropout was the
        identity.
    scale : float
        ``1 / (1 - p)``.
    shape : tuple of int
        ``x``'s shape, to validate the cotangent.
    dtype : dtype
        ``x``'s dtype.
    sparse_x : sparse matrix or None
        A sparse ``x`` (CSR), whose stored values the mask covers; None for a dense one.
    """

    mask: Any
    scale: float
    shape: tuple[int, ...]
    dtype: Any
    sparse_x: Any = None


@dataclass(frozen=True)
class Dropout:
    """Inverted dropout: ``y = x * mask / (1 - p)`` in training, ``y = x`` in evaluation.

    :meth:`forward` returns ``(y, cache)``, the cache a :class:`DropoutCache` whose ``mask``
    field is the boolean mask used. Backward: ``d_x = d_y * mask / (1 - p)``.

    A sparse ``x`` (CSR, sparse input features): the mask covers its stored values,
    ``(nnz,)``, drawn as ``rng.random(nnz) >= p``, and ``y`` is CSR with the same
    structure (dropped values stored as 0). That is dense dropout with a mask that keeps
    every entry not stored: those are 0 either way. ``d_x`` is dense, ``d_y / (1 - p)``
    but 0 at the stored entries dropped. The draws differ from the dense path's.

    PyTorch parity: ``torch.nn.functional.dropout`` (same scaling, identity in
    eval mode); the draws differ (PyTorch uses its own generator), so compare by
    passing ``cache.mask`` to the other side: ``x * mask / (1 - p)``.

    Parameters
    ----------
    p : float, default 0.5
        The drop probability, in ``[0, 1)`` (PyTorch's default; GAT uses 0.6).
    """

    p: float = 0.5  # drop probability; PyTorch default (GAT uses 0.6)

    def __post_init__(self) -> None:
        p = self.p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
            raise ValueError(
                f"dropout probability p must be a number in [0, 1), got {p!r} "
                "(p = 1 would drop everything and divide by zero)"
            )

    def forward(
        self,
        params: dict[str, Any],
        x: Any,
        training: bool = False,
        rng: Any = None,
        mask: Any = None,
    ) -> tuple[Any, DropoutCache]:
        """``(y, cache)``: ``x`` with the dropped entries zeroed and the rest scaled.

        Parameters
        ----------
        params : dict
            Ignored (pass ``{}``): dropout has no parameters.
        x : array or sparse matrix
            ``(*S,)`` floats, any shape, or a CSR matrix (sparse input features).
        training : bool, default False
            False (as ``torch.nn.functional.dropout`` called with ``training=False``) or
            ``p == 0``: the identity; ``rng`` and ``mask`` are then ignored, no number is
            drawn, and ``x``'s values are not inspected.
        rng : numpy.random.Generator or None, default None
            Draws the keep-mask as ``rng.random(x.shape) >= p`` (each entry kept with
            probability ``1 - p``). On a device backend with NumPy's default ``PCG64`` the
            draw is made on the device, bitwise the host's, and ``rng`` advanced as the host
            draw advances it (:mod:`refimpl.kernels.pcg64_draws`); another generator draws
            on the host and the mask is moved to ``x``'s backend; CuPy's generator draws on
            the device.
        mask : array or None, default None
            The keep-mask itself, ``(*S,)`` bool (True = keep), on ``x``'s backend. Takes
            precedence over ``rng``, which is then not advanced.

        Returns
        -------
        tuple
            ``(y, cache)``: ``y`` of ``x``'s shape, dtype and kind, and a
            :class:`DropoutCache`.
        """
        return self._forward(x, training, rng, mask, check_values=True)

    def forward_unchecked(
        self,
        params: dict[str, Any],
        x: Any,
        training: bool = False,
        rng: Any = None,
        mask: Any = None,
    ) -> tuple[Any, DropoutCache]:
        """:meth:`forward` without the pass over ``x``'s values (its type, the flags, ``rng``
        and ``mask`` are still checked), for a model whose dropout input is its own checked
        input or a checked layer output: the same array checked twice costs a reduction (and
        a sync on a device) for nothing."""
        return self._forward(x, training, rng, mask, check_values=False)

    def _forward(
        self, x: Any, training: bool, rng: Any, mask: Any, check_values: bool
    ) -> tuple[Any, DropoutCache]:
        """F1-F2 (class docstring); ``check_values``: refuse a non-finite ``x``."""
        check_bool(training, "Dropout training")  # read by its truth value otherwise
        check_rng(rng, "Dropout rng")
        scale = 1.0 / (1.0 - self.p)
        if is_sparse(x):
            return self._forward_sparse(x, training, rng, mask, scale)
        if not training or self.p == 0:
            # The identity computes nothing, so it checks the type alone and the block that
            # computes with x checks its values: a finiteness pass over the input
            # features here would cost as much as a GAT layer's scoring.
            check_array(x, "x")
            return x, DropoutCache(None, scale, tuple(x.shape), x.dtype)
        xp = check_input(x) if check_values else check_array(x, "x")
        # F1 the keep-mask: given, or rng.random(x.shape) >= p drawn on x's device (bitwise
        # the host's draw: refimpl.kernels.pcg64_draws), else on the host and moved there
        if mask is not None:
            _check_mask(mask, x)
        elif rng is None:
            raise self._no_randomness()
        elif not draws_on_device(xp, rng, self.p):
            mask = xp.asarray(rng.random(x.shape) >= self.p)  # (*S,) bool
        elif runs_fused_kernels(xp):  # F1 and F2 in one kernel
            y, mask = draw_keep_and_scale(xp, x, rng, self.p, scale)
            return y, DropoutCache(mask, scale, tuple(x.shape), x.dtype)
        else:
            mask = keep_mask(xp, rng, tuple(x.shape), self.p)  # (*S,) bool
        # F2 keep, and scale the kept entries by 1 / (1 - p) so that E[y] = x
        if runs_fused_kernels(xp):  # the two operations below in one kernel
            return keep_and_scale(xp, x, mask, scale), DropoutCache(
                mask, scale, tuple(x.shape), x.dtype
            )
        y = x * mask  # (*S,) in x's dtype
        y *= scale  # in place on the fresh product: one pass less
        return y, DropoutCache(mask, scale, tuple(x.shape), x.dtype)

    def _no_randomness(self) -> ValueError:
        return ValueError(
            f"Dropout(p={self.p}) in training mode needs randomness: pass rng="
            "numpy.random.default_rng(seed) or an explicit boolean mask=, or "
            "training=False for evaluation"
        )

    def _forward_sparse(
        self, x: Any, training: bool, rng: Any, mask: Any, scale: float
    ) -> tuple[Any, DropoutCache]:
        """F1-F2 over the stored values of a CSR ``x`` (class docstring)."""
        if not training or self.p == 0:  # the identity: as dense, the values go unread
            return x, DropoutCache(None, scale, tuple(x.shape), x.dtype)
        xp = check_sparse_input(x, "x", x.shape[1])
        values = x.data  # (nnz,)
        if mask is not None:
            _check_mask(mask, values)
        elif rng is not None:
            mask = xp.asarray(rng.random(values.shape) >= self.p)  # (nnz,) bool
        else:
            raise self._no_randomness()
        kept = values * mask
        kept *= scale
        y = sparse_module(xp).csr_matrix((kept, x.indices, x.indptr), shape=x.shape)
        return y, DropoutCache(mask, scale, tuple(x.shape), x.dtype, x)

    def backward(
        self, params: dict[str, Any], cache: DropoutCache, d_y: Any
    ) -> tuple[Any, dict[str, Any]]:
        like = () if cache.mask is None else (cache.mask,)
        check_cotangent(d_y, cache.shape, cache.dtype, *like)
        if cache.mask is None:
            return d_y, {}
        if cache.sparse_x is not None:  # dense d_x, 0 at the stored entries dropped
            x, xp = cache.sparse_x, get_array_module(d_y)
            # (nnz,) the row of each stored value (cupy.repeat before CuPy 14 takes no array)
            rows = xp.searchsorted(x.indptr, xp.arange(x.nnz), side="right") - 1
            d_x = d_y * cache.scale
            dropped = ~cache.mask
            d_x[rows[dropped], x.indices[dropped]] = 0
            return d_x, {}
        # B2 (of F2) and B1 (of F1): the mask is a constant, so only the scaling flows back
        xp = get_array_module(d_y)
        if runs_fused_kernels(xp):  # the two operations below in one kernel
            return keep_and_scale(xp, d_y, cache.mask, cache.scale), {}
        d_x = d_y * cache.mask
        d_x *= cache.scale
        return d_x, {}


def recorded_dropout(
    dropout: Dropout,
    key: str,
    x: Any,
    training: bool,
    rng: Any,
    noise: Mapping[str, Any],
    used: dict[str, Any],
) -> tuple[Any, DropoutCache]:
    """``dropout.forward`` for a model that names its masks: the keep-mask is ``noise[key]``
    when given (else drawn from ``rng``), and the mask used is recorded as ``used[key]``, so
    that ``forward(noise=used)`` replays the step exactly.

    Parameters
    ----------
    dropout : Dropout
        The configuration.
    key : str
        The mask's name in the model, e.g. ``"dropout1"``.
    x : array or sparse matrix
        The input, as :meth:`Dropout.forward` takes it.
    training : bool
        Whether to drop (else the identity, nothing recorded).
    rng : numpy.random.Generator or None
        Draws the mask when ``noise`` holds none for ``key``.
    noise : mapping of str to array
        Masks given by name (a replay); may be empty.
    used : dict of str to array
        Receives ``used[key]``, the mask used; modified in place.

    Returns
    -------
    tuple
        ``(y, cache)`` of :meth:`Dropout.forward`.
    """
    y, cache = dropout.forward({}, x, training, rng, noise.get(key))
    if cache.mask is not None:
        used[key] = cache.mask
    return y, cache


def _check_mask(mask: Any, x: Any) -> None:
    if not is_array(mask) or mask.dtype.kind != "b":
        kind = mask.dtype if is_array(mask) else type(mask).__name__
        raise TypeError(
            f"dropout mask must be a boolean array (True = keep), got {kind}; "
            "build one with mask = rng.random(x.shape) >= p"
        )
    get_array_module(x, mask)  # TypeError if the mask is on another backend
    if tuple(mask.shape) != tuple(x.shape):
        raise ValueError(
            f"dropout mask has shape {tuple(mask.shape)} but x has {tuple(x.shape)}; "
            "the mask must have exactly x's shape"
        )
