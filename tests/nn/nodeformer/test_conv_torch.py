"""NodeFormerConv and its edge loss against torch autograd: the layer (Eq. 4, 7, 8, Alg. 1) and
Eq. 10 / 12 written densely in torch from the equations, with the same fixed noise."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl import Graph
from refimpl.nn.nodeformer.conv import NodeFormerConv
from refimpl.nn.nodeformer.edge_loss import NodeFormerEdgeLoss
from refimpl.testing import relative_errors
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.nn.nodeformer.test_conv import ONE_NODE, dense_operators, setups

torch = pytest.importorskip("torch")

# widened as in test_kernel_attention: autograd multiplies unshifted features, ours adds
# shifted exponents first
RTOL = 1e2 * FORWARD_RTOL[np.dtype(np.float64)]


def torch_heads(conv: NodeFormerConv, p: dict, x: Any, scale: float) -> tuple:
    """``scale (W x + b)`` for q and k, and ``W_v x + b_v``, each (N, H, C)."""
    shape = (x.shape[0], conv.heads, conv.out_channels)

    def project(name: str) -> Any:
        y = x @ p[f"W_{name}"].T
        return (y + p[f"b_{name}"] if conv.bias else y).reshape(shape)

    return scale * project("q"), scale * project("k"), project("v")


def phi(y: Any, omega: Any) -> Any:
    """Eq. 4 as printed: (N, d) -> (N, m)."""
    return torch.exp(y @ omega.T - (y * y).sum(1, keepdim=True) / 2) / math.sqrt(len(omega))


def torch_layer(
    conv: NodeFormerConv, p: dict, x: Any, graph: Graph, noise: dict, training: bool
) -> Any:
    """Alg. 1 per head (Eq. 7 / 17 with the K-sample average), Eq. 8 with dense A_j, concat, W_o."""
    tau, omega = conv.tau, torch.tensor(noise["projection"])
    q, k, v = torch_heads(conv, p, x, conv.qk_factor)
    use_gumbel = training and conv.use_gumbel
    gumbel = (
        torch.tensor(noise["gumbel"])
        if use_gumbel
        else torch.zeros(x.shape[0], conv.heads, 1, dtype=x.dtype)
    )
    heads = []
    for h in range(conv.heads):
        kernel = phi(q[:, h] / math.sqrt(tau), omega) @ phi(k[:, h] / math.sqrt(tau), omega).T
        samples = []
        for s in range(gumbel.shape[2]):
            weights = kernel * torch.exp(gumbel[:, h, s] / tau)[None, :]  # key v: e^{g_v / tau}
            samples.append(weights / weights.sum(1, keepdim=True) @ v[:, h])
        heads.append(torch.stack(samples).mean(0))
    z = torch.stack(heads, dim=1)  # (N, H, C)
    if conv.relational_bias is not None:
        b = p["b_rel"]
        gate = torch.sigmoid(b) if conv.relational_bias == "sigmoid" else b
        for j, a in enumerate(dense_operators(conv, graph)):
            z = z + gate[j][None, :, None] * torch.einsum("vu,uhc->vhc", torch.tensor(a), v)
    out = z.reshape(x.shape[0], -1) @ p["W_o"].T
    return out + p["b_o"] if conv.bias else out


def torch_edge_loss(
    conv: NodeFormerConv, p: dict, x: Any, graph: Graph, noise: dict, convention: str
) -> Any:
    """Eq. 10 with pi of Eq. 12 (dense, no noise): -1/(Z H) sum_h sum_e log pi_e,h / d_in(v)."""
    t = 1.0 if convention == "paper" else 1 / math.sqrt(conv.tau)
    q, k, _ = torch_heads(conv, p, x, conv.qk_factor * t)
    omega = torch.tensor(noise["projection"])
    used = conv.prepare_graph(graph)
    src, dst = (torch.tensor(i) for i in used.edge_index)
    in_degree = torch.bincount(dst, minlength=x.shape[0]).to(x.dtype)
    scale = x.shape[0] if convention == "paper" else max(used.num_edges, 1)
    total = x.new_zeros(())
    for h in range(conv.heads):
        kernel = phi(q[:, h], omega) @ phi(k[:, h], omega).T  # [v, u]
        pi = kernel / kernel.sum(1, keepdim=True)
        total = total - (torch.log(pi[dst, src]) / in_degree[dst]).sum()
    return total / (scale * conv.heads)


def torch_gradients(forward: Any, params: dict, x: np.ndarray, cotangent: Any) -> dict:
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    t_x = torch.tensor(x, requires_grad=True)
    out = forward(tensors, t_x)
    inputs = [t_x, *tensors.values()]
    grads = torch.autograd.grad(out, inputs, torch.tensor(cotangent), allow_unused=True)
    # the edge loss does not reach W_v, W_o, ...: autograd says None, ours zeros
    grads = [torch.zeros_like(i) if g is None else g for i, g in zip(inputs, grads, strict=True)]
    found = {"out": out.detach().numpy(), "x": grads[0].numpy()}
    found.update({name: g.numpy() for name, g in zip(tensors, grads[1:], strict=True)})
    return found


@given(setup=setups(), seed=seeds())
@example(setup=ONE_NODE, seed=0)
def test_layer_gradients_match_torch_autograd(setup: tuple, seed: int) -> None:
    conv, params, x, graph, kwargs = setup
    out, cache = conv.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(seed).standard_normal(out.shape)
    d_x, d_params = conv.backward(params, cache, d_out)
    ours = {"out": out, "x": d_x, **d_params}
    theirs = torch_gradients(
        lambda p, t_x: torch_layer(conv, p, t_x, graph, kwargs["noise"], kwargs["training"]),
        params,
        x,
        d_out,
    )
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= RTOL, errors


@given(setup=setups(min_nodes=2), convention=st.sampled_from(["paper", "authors"]), seed=seeds())
def test_edge_loss_gradients_match_torch_autograd(setup: tuple, convention: str, seed: int) -> None:
    # N >= 2: one node gives L_e = 0 identically, gradients of rounding size only (tested in
    # test_nodeformer.py), which a relative comparison cannot judge
    conv, params, x, graph, kwargs = setup
    _, cache = conv.forward(params, x, graph, **kwargs)
    block = NodeFormerEdgeLoss(conv, convention)
    loss, loss_cache = block.forward(params, cache)
    d_loss = float(np.random.default_rng(seed).standard_normal())
    d_x, d_params = block.backward(params, loss_cache, d_loss)
    ours = {"out": np.asarray(loss), "x": d_x, **d_params}
    theirs = torch_gradients(
        lambda p, t_x: torch_edge_loss(conv, p, t_x, graph, kwargs["noise"], convention),
        params,
        x,
        np.asarray(d_loss),
    )
    errors = relative_errors(ours, theirs)
    assert max(errors.values()) <= RTOL, errors
