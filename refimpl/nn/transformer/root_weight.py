"""TransformerConv's root weight (UniMP's skip, Shi et al. 2021), with or without the beta gate.

On the aggregated messages ``m (N, F)`` and the input ``x (N, in)``::

    F10  x_r = W_skip x_v + b_skip                                   (N, F)
    F11  out = m + x_r, or with beta:
         b = sigmoid(w_beta . [m, x_r, m - x_r]),  out = b x_r + (1 - b) m    (N, 1), (N, F)

    B11  d_b = sum_f d_out (x_r - m);  d_z = d_b b (1 - b);  d w_beta = d_z^T [m, x_r, m - x_r]
         d_m = d_out (1 - b) + d_z w_m + d_z w_diff;  d_x_r = d_out b + d_z w_r - d_z w_diff
    B10  x_r's projection: in the layer's projection adjoint (it shares x with q, k, v)

Parameters as PyG's ``lin_skip`` (``W_skip (F, in)``, ``b_skip (F,)``) and ``lin_beta``
(``w_beta (1, 3F)``, no bias).
"""

from __future__ import annotations

from typing import Any

from refimpl.backend import get_array_module
from refimpl.nn.attention_common import project
from refimpl.ops.activations import sigmoid

__all__ = ["root_weight", "root_weight_backward"]


def root_weight(
    params: dict[str, Any], x: Any, messages: Any, bias: bool, beta: bool
) -> tuple[Any, Any, Any]:
    """F10-F11: the root weight, added to the messages or gated with them.

    Parameters
    ----------
    params : dict
        ``W_skip``, ``b_skip`` (with ``bias``), ``w_beta`` (with ``beta``).
    x : (N, in) array
        The targets' input features.
    messages : (N, F) array
        ``m``, the heads combined.
    bias : bool
        Whether ``b_skip`` exists.
    beta : bool
        Gate instead of add.

    Returns
    -------
    tuple
        ``(out (N, F), x_r (N, F), b (N, 1) or None)``.
    """
    xp = get_array_module(x)
    gate = None
    # F10 root weight x_r = W_skip x_v + b_skip (N, F)
    skip = project(params, ["skip"], x, bias)[0]
    if beta:
        # F11 gate b = sigmoid(w_beta . [m, x_r, m - x_r]) (N, 1), out = b x_r + (1-b) m
        stacked = xp.concatenate([messages, skip, messages - skip], axis=1)  # (N, 3F)
        gate = sigmoid(stacked @ params["w_beta"].T)  # (N, 1)
        out = gate * skip + (1 - gate) * messages
    else:
        # F11 out = m + x_r
        out = messages + skip
    return out, skip, gate


def root_weight_backward(
    params: dict[str, Any],
    messages: Any,
    skip: Any,
    gate: Any,
    d_out: Any,
    d_params: dict[str, Any],
) -> tuple[Any, Any]:
    """B11: the sum's or the gate's adjoint; ``x_r``'s projection is left to the caller (B10).

    Parameters
    ----------
    params : dict
        As :func:`root_weight` read them.
    messages, skip : (N, F) array
        ``m`` and ``x_r`` of the forward.
    gate : (N, 1) array or None
        ``b`` of the forward; None without ``beta``.
    d_out : (N, F) array
        The output's gradient.
    d_params : dict
        ``d_params["w_beta"]`` is set with the gate.

    Returns
    -------
    tuple
        ``(d_messages (N, F), d_x_r (N, F))``.
    """
    if gate is None:
        # B11 (of F11) the sum
        return d_out, d_out
    xp = get_array_module(d_out)
    # B11 (of F11) the gate: out = b x_r + (1 - b) m, b = sigmoid(z), z = w . stacked
    d_gate = xp.sum(d_out * (skip - messages), axis=1, keepdims=True)  # (N, 1)
    d_logit = d_gate * gate * (1 - gate)  # (N, 1)
    stacked = xp.concatenate([messages, skip, messages - skip], axis=1)  # (N, 3F)
    d_params["w_beta"] = d_logit.T @ stacked  # (1, 3F)
    d_stacked = d_logit @ params["w_beta"]  # (N, 3F)
    width = messages.shape[1]
    d_m, d_r, d_diff = (d_stacked[:, i * width : (i + 1) * width] for i in range(3))
    d_messages = d_out * (1 - gate) + d_m + d_diff
    d_skip = d_out * gate + d_r - d_diff
    return d_messages, d_skip
