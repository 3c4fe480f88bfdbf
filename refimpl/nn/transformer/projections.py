"""``TransformerConv``'s node projections, step F1, and their adjoint, B1 (with B10's root
weight, which reads the same features).

Queries read the targets' features, keys and values the sources' (PyG's ``lin_query`` on
``x_dst``, ``lin_key`` and ``lin_value`` on ``x_src``; ``lin_skip`` on ``x_dst``). On one node
set both are ``x``; on a bipartite graph the input is the pair ``(x_src (N_src, F_src), x_dst
(N_dst, F_dst))`` and ``in_channels = (F_src, F_dst)`` (or one int for both)::

    F1   q_v = W_q x_dst[v] + b_q,  k_u = W_k x_src[u] + b_k,  val_u = W_v x_src[u] + b_v
    B1   d W = d_y^T x_side,  d b = sum of d_y,  d x_side = sum over its maps of d_y W
         (the root weight's d x_r enters with the queries' side)
"""

from __future__ import annotations

from typing import Any

from refimpl.nn.attention_common import project, project_backward

__all__ = ["node_projections", "node_projections_backward"]


def node_projections(
    conv: Any, params: dict[str, Any], x_src: Any, x_dst: Any
) -> tuple[Any, Any, Any]:
    """F1: ``q (N_dst, H, C)``, ``k``, ``val (N_src, H, C)``.

    One product pass over ``x`` when both sides read it (``x_dst is x_src``).

    Parameters
    ----------
    conv : TransformerConv
        The layer (its ``heads``, ``out_channels``, ``bias``).
    params : dict
        Its parameters (``W_q``, ``W_k``, ``W_v`` and their biases).
    x_src : (N_src, F_src) array
        What keys and values read.
    x_dst : (N_dst, F_dst) array
        What queries read; ``x_src`` itself on one node set.

    Returns
    -------
    tuple
        ``(q, k, val)``.
    """
    heads, channels = conv.heads, conv.out_channels
    if x_dst is x_src:
        q, k, val = project(params, "qkv", x_src, conv.bias)
    else:
        (q,) = project(params, "q", x_dst, conv.bias)
        k, val = project(params, "kv", x_src, conv.bias)
    q = q.reshape(x_dst.shape[0], heads, channels)
    k, val = (y.reshape(x_src.shape[0], heads, channels) for y in (k, val))
    return q, k, val


def node_projections_backward(
    conv: Any,
    params: dict[str, Any],
    x_src: Any,
    x_dst: Any,
    d_q: Any,
    d_k: Any,
    d_val: Any,
    d_skip: Any,
    d_params: dict[str, Any],
    input_grad: bool,
) -> Any:
    """B1 and B10: the projections' adjoint; fills ``d_params``.

    Parameters
    ----------
    conv : TransformerConv
        The layer.
    params : dict
        Its parameters.
    x_src, x_dst : array
        As :func:`node_projections` read them.
    d_q : (N_dst, H, C) array
        The queries' gradient.
    d_k, d_val : (N_src, H, C) array
        The keys' and values' gradients.
    d_skip : (N_dst, F) array or None
        The root weight's output gradient; None without the root weight.
    d_params : dict
        Filled with the projections' (and the skip's) parameter gradients.
    input_grad : bool
        False: no input gradient (returns None).

    Returns
    -------
    array, tuple or None
        ``d_x (N, in)``, or ``(d_x_src, d_x_dst)`` for a pair, or None without ``input_grad``.
    """
    skip_maps, skip_grads = (["skip"], [d_skip]) if d_skip is not None else ([], [])
    if x_dst is x_src:  # one x: every map in one adjoint, in the order q, k, v, skip
        names, d_ys = ["q", "k", "v", *skip_maps], [d_q, d_k, d_val, *skip_grads]
        return project_backward(params, names, x_src, d_ys, d_params, conv.bias, input_grad)
    d_x_src = project_backward(
        params, ["k", "v"], x_src, [d_k, d_val], d_params, conv.bias, input_grad
    )
    d_x_dst = project_backward(
        params, ["q", *skip_maps], x_dst, [d_q, *skip_grads], d_params, conv.bias, input_grad
    )
    return (d_x_src, d_x_dst) if input_grad else None
