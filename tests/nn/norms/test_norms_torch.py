"""PairNorm and LayerNorm against PyTorch / PyG and torch autograd (skipped without torch).

Three kinds of reference, all in float64:

* PyG's own modules (``torch_geometric.nn.norm.PairNorm`` / ``LayerNorm``) and
  ``torch.nn.functional.layer_norm``, called without a batch vector and, where
  PyG's eps placement changes with one, with a batch vector of zeros (one graph);
* for the variants PyG lacks (PN-SCS, the other eps placement), a few lines of
  torch written from the equations, following the PairNorm authors' code;
* torch autograd through each, against our hand-written backward.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.norms.pairnorm import PairNorm
from refimpl.testing import max_relative_error
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.nn.norms.test_norms import assert_gradients_agree, features, layernorm_setups, pairnorms

torch = pytest.importorskip("torch")
pyg_norm = pytest.importorskip("torch_geometric.nn.norm")
from tests.nn.norms.torch_norms import torch_layernorm, torch_pairnorm  # noqa: E402  (needs torch)

RTOL = FORWARD_RTOL[np.dtype(np.float64)]


def pyg_references(block: object, params: dict) -> list[tuple]:
    """PyG (or torch) calls computing exactly ``block`` (maybe none), each as a function of
    x and the torch parameters it holds (``None`` when there are none to compare)."""
    references: list[tuple] = []
    if isinstance(block, PairNorm) and block.mode != "PN-SCS":
        # PyG's eps: inside for PN, outside for PN-SI, with and without a batch vector
        if block.inside == (block.mode == "PN"):
            module = pyg_norm.PairNorm(block.scale, block.mode == "PN-SI", block.eps)
            references.append((lambda x: module(x), None))
            references.append((lambda x: module(x, one_graph(x), 1), None))
    elif isinstance(block, LayerNorm):
        module = pyg_norm.LayerNorm(block.channels, block.eps, block.affine, block.mode).double()
        if block.affine:
            with torch.no_grad():
                module.weight.copy_(torch.tensor(params["weight"]))
                module.bias.copy_(torch.tensor(params["bias"]))
        held = dict(module.named_parameters()) if block.affine else None
        if block.mode == "node" and block.inside:
            references.append((lambda x: module(x), held))
            t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
            weight, bias = t_params.get("weight"), t_params.get("bias")
            references.append(
                (
                    lambda x: torch.nn.functional.layer_norm(
                        x, (block.channels,), weight, bias, block.eps
                    ),
                    t_params or None,
                )
            )
        elif block.mode == "graph":
            # PyG's graph mode: x / (std + eps) without a batch vector, / sqrt(var + eps) with one
            if block.inside:
                references.append((lambda x: module(x, one_graph(x), 1), held))
            else:
                references.append((lambda x: module(x), held))
    return references


def one_graph(x: object) -> object:
    """PyG's batch vector for a single graph: every node in graph 0."""
    return torch.zeros(len(x), dtype=torch.long)


def check_against(
    block: object, params: dict, x: np.ndarray, reference: object, t_params: dict | None = None
) -> None:
    """Forward and every gradient of ``block`` equal torch's (autograd) to rounding."""
    out, cache = block.forward(params, x)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = block.backward(params, cache, d_out)
    t_x = torch.tensor(x, requires_grad=True)
    t_out = reference(t_x)
    t_out.backward(torch.tensor(d_out))
    assert max_relative_error(out, t_out.detach().numpy()) <= RTOL
    expected = {"x": t_x.grad.numpy()}
    actual = {"x": d_x}
    if t_params is not None:
        expected.update({k: v.grad.numpy() for k, v in t_params.items()})
        actual.update(d_params)
    assert_gradients_agree(actual, expected, block, params, cache, d_out)


@given(norm=pairnorms(), x=features())
def test_pairnorm_matches_torch_and_pyg(norm: PairNorm, x: np.ndarray) -> None:
    check_against(norm, {}, x, lambda t: torch_pairnorm(norm, t))
    for reference, _ in pyg_references(norm, {}):
        check_against(norm, {}, x, reference)


@given(setup=layernorm_setups())
def test_layernorm_matches_torch_and_pyg(setup: tuple) -> None:
    norm, params, x = setup
    t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    check_against(norm, params, x, lambda t: torch_layernorm(norm, t_params, t), t_params)
    for reference, held in pyg_references(norm, params):
        check_against(norm, params, x, reference, held)


@pytest.mark.parametrize("mode", ["PN", "PN-SI", "PN-SCS"])
def test_authors_pairnorm_code_is_eps_inside_with_eps_1e_6(mode: str) -> None:
    # github.com/LingxiaoShawn/PairNorm: sqrt(1e-6 + ...) in every mode.
    norm = PairNorm(mode, scale=10.0, eps=1e-6, eps_inside_sqrt=True)
    x = np.random.default_rng(1).standard_normal((6, 4))

    def authors(t: object) -> object:
        col_mean = t.mean(dim=0)
        if mode == "PN":
            t = t - col_mean
            return 10.0 * t / (1e-6 + t.pow(2).sum(dim=1).mean()).sqrt()
        if mode == "PN-SI":
            t = t - col_mean
            return 10.0 * t / (1e-6 + t.pow(2).sum(dim=1, keepdim=True)).sqrt()
        return 10.0 * t / (1e-6 + t.pow(2).sum(dim=1, keepdim=True)).sqrt() - col_mean

    check_against(norm, {}, x, authors)


@pytest.mark.parametrize("value", [0.0, 3.0, -1.25])
def test_zero_spread_matches_autograd(value: float) -> None:
    # PyTorch takes the gradient of sqrt / norm / std at 0 as its limit too: compare there.
    rows = np.tile([value, 1.5, -0.5], (4, 1))  # all rows equal
    constant = np.full((4, 3), value)
    params = {"weight": np.array([0.5, -2.0, 1.5]), "bias": np.array([0.25, 1.0, -3.0])}
    for block, p, x in [
        (PairNorm("PN", 2.0), {}, rows),
        (PairNorm("PN-SI", 2.0), {}, rows),
        (LayerNorm(3, "node"), params, constant),
        (LayerNorm(3, "graph"), params, constant),
        (LayerNorm(3, "graph", eps_inside_sqrt=True), params, constant),
    ]:
        references = pyg_references(block, p)
        assert references
        for reference, held in references:
            check_against(block, p, x, reference, held)


def pyg_layernorm(mode: str, params: dict) -> object:
    """PyG's LayerNorm in float64 holding ``params`` (eps 1e-3, as the blocks below)."""
    module = pyg_norm.LayerNorm(3, 1e-3, bool(params), mode).double()
    if params:
        with torch.no_grad():
            module.weight.copy_(torch.tensor(params["weight"]))
            module.bias.copy_(torch.tensor(params["bias"]))
    return module


# Written out, not derived from the block's settings: our defaults must equal these calls.
PYG_COUNTERPARTS = [
    (PairNorm("PN", 2.0, 1e-3), lambda p: lambda x: pyg_norm.PairNorm(2.0, False, 1e-3)(x)),
    (
        PairNorm("PN", 2.0, 1e-3),
        lambda p: lambda x: pyg_norm.PairNorm(2.0, False, 1e-3)(x, one_graph(x), 1),
    ),
    (PairNorm("PN-SI", 0.5, 1e-3), lambda p: lambda x: pyg_norm.PairNorm(0.5, True, 1e-3)(x)),
    (
        PairNorm("PN-SI", 0.5, 1e-3),
        lambda p: lambda x: pyg_norm.PairNorm(0.5, True, 1e-3)(x, one_graph(x), 1),
    ),
    (LayerNorm(3, "node", eps=1e-3), lambda p: pyg_layernorm("node", p)),
    (
        LayerNorm(3, "node", eps=1e-3),
        lambda p: (
            lambda x: torch.nn.functional.layer_norm(
                x, (3,), torch.tensor(p["weight"]), torch.tensor(p["bias"]), 1e-3
            )
        ),
    ),
    (LayerNorm(3, "node", affine=False, eps=1e-3), lambda p: pyg_layernorm("node", p)),
    (LayerNorm(3, "graph", eps=1e-3), lambda p: pyg_layernorm("graph", p)),
    (
        LayerNorm(3, "graph", eps=1e-3, eps_inside_sqrt=True),
        lambda p: lambda x: pyg_layernorm("graph", p)(x, one_graph(x), 1),
    ),
]


@pytest.mark.parametrize(("block", "make_reference"), PYG_COUNTERPARTS)
def test_every_pyg_counterpart_agrees(block: object, make_reference: object) -> None:
    rng = np.random.default_rng(7)
    params = {k: rng.standard_normal(v) for k, v in block.param_shapes().items()}
    x = rng.standard_normal((5, 3)) * 0.1 + rng.standard_normal(3)
    check_against(block, params, x, make_reference(params))
