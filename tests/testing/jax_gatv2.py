"""GATv2 as a JAX function under refimpl's parameter names, for refimpl's ``JaxFunction`` adapter:
correct (:func:`make_gatv2`) and with the softmax normalised over sources
(:func:`make_gatv2_softmax_over_sources`).

The equations are :mod:`tests.testing.buggy_gatv2`'s (PyG's ``GATv2Conv``), written with
``jax.ops.segment_*``; parameters ``W_s``, ``W_t`` ``(H*C, in)``, ``b_s``, ``b_t``
``(H*C,)`` (with ``bias``), ``att`` ``(H, C)``, ``bias``, as :meth:`refimpl.nn.GATConv.
param_shapes` names them. Needs jax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def make_gatv2(
    in_channels: int | list[int],
    out_channels: int,
    heads: int = 1,
    concat: bool = True,
    negative_slope: float = 0.2,
    add_self_loops: bool = True,
    bias: bool = True,
    over_sources: bool = False,
    **unused: Any,
) -> Callable[..., Any]:
    """``f(params, x, edge_index, edge_attr) -> out`` for PyG's ``GATv2Conv`` arguments (in
    evaluation mode: ``dropout`` is read and unused); ``over_sources`` seeds the bug."""
    if unused.get("share_weights") or unused.get("edge_dim") or unused.get("residual"):
        raise ValueError("this GATv2 has no share_weights, edge_dim or residual")

    def gatv2(params: dict, x: Any, edge_index: np.ndarray, edge_attr: Any) -> jax.Array:
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        src, dst = edge_index
        if add_self_loops:  # PyG's: loops replaced, i -> i for the nodes both sets have
            keep = src != dst
            loops = np.arange(min(n_src, n_dst))
            src, dst = np.concatenate([src[keep], loops]), np.concatenate([dst[keep], loops])
        x_l = x_src @ params["W_s"].T + params.get("b_s", 0.0)  # (N_src, H*C)
        x_r = x_dst @ params["W_t"].T + params.get("b_t", 0.0)  # (N_dst, H*C)
        x_l = x_l.reshape(n_src, heads, out_channels)
        x_r = x_r.reshape(n_dst, heads, out_channels)
        pre = x_l[src] + x_r[dst]  # (E, H, C)
        score = (jnp.where(pre > 0, pre, negative_slope * pre) * params["att"]).sum(-1)
        group, size = (src, n_src) if over_sources else (dst, n_dst)
        shift = jax.lax.stop_gradient(jax.ops.segment_max(score, group, num_segments=size))
        weight = jnp.exp(score - shift[group])  # (E, H)
        alpha = weight / jax.ops.segment_sum(weight, group, num_segments=size)[group]
        out = jax.ops.segment_sum(alpha[..., None] * x_l[src], dst, num_segments=n_dst)
        out = out.reshape(n_dst, heads * out_channels) if concat else out.mean(axis=1)
        return out + params["bias"] if bias else out

    return gatv2


def make_gatv2_softmax_over_sources(**kwargs: Any) -> Callable[..., Any]:
    """:func:`make_gatv2` normalising each source's outgoing scores (the seeded bug)."""
    return make_gatv2(**kwargs, over_sources=True)
