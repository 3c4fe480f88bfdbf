"""TransformerConv against PyTorch Geometric's TransformerConv and torch autograd.

Our parameters are loaded into ``torch_geometric.nn.TransformerConv`` (float64);
outputs, attention coefficients and the gradients autograd computes for ``x``,
``edge_attr`` and every parameter must equal ours. For ``lipschitz_norm="paper"``
the torch side is PyG's layer with its ``message`` rewritten in a few lines of
torch from LipschitzNorm Eq. 19 (per target and head), so autograd checks our
hand-written LipschitzNorm backward. Attention dropout: PyG draws its own mask, so
its module-level ``F.dropout`` is swapped, for the duration of one call, for one
that applies ours (docs/design.md: feed the other implementation the same noise).
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from hypothesis import assume, given

from refimpl.testing import max_relative_error, relative_errors
from tests.nn.transformer.test_transformer_conv import MAX_GAP, Setup, max_gap, setups

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")
import torch_geometric.nn.conv.transformer_conv as pyg_module  # noqa: E402
from torch_geometric.nn import TransformerConv as PygTransformerConv  # noqa: E402
from torch_geometric.utils import scatter, softmax  # noqa: E402

FORWARD_RTOL = 1e-12  # outputs and coefficients: rounding in another summation order
# Gradients: autograd's chain reorders longer sums. Judged over the largest entry of all
# gradients (relative_errors), not per tensor: some vanish by cancellation and are rounding
# on both sides (b_k without LipschitzNorm, W_q when every target has one incoming edge).
GRADIENT_RTOL = 1e-10

# ours -> (PyG submodule, attribute)
PYG_NAMES = {
    "W_q": ("lin_query", "weight"),
    "b_q": ("lin_query", "bias"),
    "W_k": ("lin_key", "weight"),
    "b_k": ("lin_key", "bias"),
    "W_v": ("lin_value", "weight"),
    "b_v": ("lin_value", "bias"),
    "W_e": ("lin_edge", "weight"),
    "W_skip": ("lin_skip", "weight"),
    "b_skip": ("lin_skip", "bias"),
    "w_beta": ("lin_beta", "weight"),
}


class LipschitzTransformerConv(PygTransformerConv):
    """PyG's TransformerConv with the score of LipschitzNorm Eq. 19, written from the paper."""

    def message(
        self,
        query_i: object,
        key_j: object,
        value_j: object,
        edge_attr: object,
        index: object,
        ptr: object,
        size_i: int | None,
    ) -> object:
        if self.lin_edge is not None:
            edge_attr = self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)
            key_j, value_j = key_j + edge_attr, value_j + edge_attr
        # per target v (index) and head: u = ||q_v||, a = max ||k_uv||, w = max ||val_uv||
        u = query_i.norm(dim=-1)  # (E, H), the same for every edge into v
        a = scatter(key_j.norm(dim=-1), index, 0, size_i, reduce="max")[index]
        w = scatter(value_j.norm(dim=-1), index, 0, size_i, reduce="max")[index]
        denominator = torch.stack([u * a, u * w, a * w]).amax(dim=0)
        denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        alpha = softmax((query_i * key_j).sum(dim=-1) / denominator, index, ptr, size_i)
        self._alpha = alpha
        alpha = pyg_module.F.dropout(alpha, p=self.dropout, training=self.training)
        return value_j * alpha.view(-1, self.heads, 1)


def pyg_layer(setup: Setup) -> object:
    """The PyG layer (float64) holding our parameters."""
    conv = setup.conv
    cls = PygTransformerConv if conv.lipschitz_norm is None else LipschitzTransformerConv
    layer = cls(
        conv.in_channels,
        conv.out_channels,
        heads=conv.heads,
        concat=conv.concat,
        beta=conv.beta,
        dropout=conv.dropout,
        edge_dim=conv.edge_dim,
        bias=conv.bias,
        root_weight=conv.root_weight,
    ).double()
    ours = {f"{module}.{attr}" for module, attr in (PYG_NAMES[k] for k in setup.params)}
    unused = set() if conv.root_weight else {"lin_skip.weight", "lin_skip.bias"}
    assert {name for name, _ in layer.named_parameters()} - unused == ours  # PyG always
    # builds lin_skip, and uses it only with root_weight
    with torch.no_grad():
        for name, value in setup.params.items():
            module, attribute = PYG_NAMES[name]
            getattr(getattr(layer, module), attribute).copy_(torch.from_numpy(value))
    return layer


def run_pyg(layer: object, setup: Setup, d_out: np.ndarray) -> tuple:
    """PyG forward (with our dropout mask), autograd backward: ``(out, alpha, grads)``."""
    keep = setup.kwargs.get("attn_dropout_mask")
    layer.train(keep is not None)
    t_x = torch.tensor(setup.x, requires_grad=True)
    t_edge_attr = None
    if setup.edge_attr is not None:
        t_edge_attr = torch.tensor(setup.edge_attr, requires_grad=True)
    edge_index = torch.tensor(setup.graph.edge_index)

    def our_mask(alpha: object, p: float = 0.5, training: bool = True) -> object:
        return alpha * torch.from_numpy(keep) / (1 - p) if training else alpha

    with pytest.MonkeyPatch.context() as patch:
        if keep is not None:
            patch.setattr(pyg_module, "F", types.SimpleNamespace(dropout=our_mask))
        t_out, (_, t_alpha) = layer(t_x, edge_index, t_edge_attr, return_attention_weights=True)
    t_out.backward(torch.from_numpy(d_out))
    grads = {"x": t_x.grad.numpy()}
    if t_edge_attr is not None:
        grads["edge_attr"] = t_edge_attr.grad.numpy()
    for name in setup.params:
        module, attribute = PYG_NAMES[name]
        grads[name] = getattr(getattr(layer, module), attribute).grad.numpy()
    return t_out.detach().numpy(), t_alpha.detach().numpy(), grads


def compare(setup: Setup) -> dict[str, float]:
    """Errors of ours against PyG: forward, alpha, and per-gradient (normwise over all)."""
    conv, params, x, graph, edge_attr, kwargs = setup
    out, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_inputs, d_params = conv.backward(params, cache, d_out)
    ours = {**d_params, "x": d_inputs if edge_attr is None else d_inputs[0]}
    if edge_attr is not None:
        ours["edge_attr"] = d_inputs[1]
    t_out, t_alpha, t_grads = run_pyg(pyg_layer(setup), setup, d_out)
    _, alpha = conv.attention_weights(cache)
    return {
        "forward": max_relative_error(out, t_out),
        "alpha": max_relative_error(alpha, t_alpha),
        **{f"d_{k}": v for k, v in relative_errors(ours, t_grads).items()},
    }


def assert_close(errors: dict[str, float]) -> None:
    assert errors["forward"] <= FORWARD_RTOL, errors
    assert errors["alpha"] <= FORWARD_RTOL, errors
    gradients = {k: v for k, v in errors.items() if k.startswith("d_")}
    assert max(gradients.values()) <= GRADIENT_RTOL, errors


@given(setup=setups(lipschitz=False))
def test_matches_pyg_transformer_conv(setup: Setup) -> None:
    assert_close(compare(setup))


@given(setup=setups(lipschitz=True))
def test_lipschitz_norm_matches_torch_autograd(setup: Setup) -> None:
    conv, params, x, graph, edge_attr, kwargs = setup
    _, cache = conv.forward(params, x, graph, edge_attr, **kwargs)
    # torch's max splits its gradient among tied arguments; ours picks one. Exact ties
    # (duplicate edges without edge features) reach the same parameters either way.
    assume(max_gap(cache) > MAX_GAP)
    assert_close(compare(setup))


def test_pyg_initialisation_has_our_bounds() -> None:
    # Same distribution (not draws): every PyG parameter lies within 1/sqrt(fan_in).
    torch.manual_seed(0)
    layer = PygTransformerConv(16, 8, heads=4, beta=True, edge_dim=9)
    fan_in = {"lin_edge": 9, "lin_beta": 96}
    for name, value in layer.named_parameters():
        bound = 1 / math.sqrt(fan_in.get(name.split(".")[0], 16))
        assert value.abs().max().item() <= bound, name
