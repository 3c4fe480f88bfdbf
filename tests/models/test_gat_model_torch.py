"""GAT model against torch autograd on a stack of direct torch GAT layers (skipped without torch).

The torch side stacks ``tests.nn.test_gat_torch.torch_gat`` (a few lines written from the
equations, independent of our ``GATConv``) with torch's dropout scaling, activations and
the residual matmul; autograd differentiates the whole network, so agreement checks the
hand-written model backward against an independent derivative.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from refimpl.nn.pairnorm import PairNorm
from tests.models.test_gat_model import model_setups

torch = pytest.importorskip("torch")
from tests.nn.test_gat_torch import (  # noqa: E402  (needs torch)
    assert_agrees_with_autograd,
    torch_gat,
)
from tests.nn.torch_norms import torch_pairnorm  # noqa: E402

TORCH_ACTIVATIONS = {
    "relu": torch.relu,
    "leaky_relu": lambda z: torch.nn.functional.leaky_relu(z, 0.01),  # get_activation default
    "elu": torch.nn.functional.elu,
    "identity": lambda z: z,
}


def torch_gat_model(model: object, params: dict, x: object, edge_index: np.ndarray, noise: dict):
    """The model's forward in torch: per layer dropout, GAT layer, skip, PairNorm, activation."""
    h = x
    for i, conv in enumerate(model.layers):
        layer_params = {name: params[f"layer{i}.{name}"] for name in conv.param_shapes()}
        if f"layer{i}.input_mask" in noise:
            h = h * torch.tensor(noise[f"layer{i}.input_mask"], dtype=h.dtype) / (1 - model.dropout)
        keep = noise.get(f"layer{i}.attn_mask")
        keep = None if keep is None else torch.tensor(keep, dtype=h.dtype)
        z = torch_gat(conv, layer_params, h, edge_index, keep)
        if model.residual:
            z = z + h @ params[f"layer{i}.res_W"].T
        if i < model.num_layers - 1 and model.pairnorm is not None:
            z = torch_pairnorm(PairNorm(model.pairnorm), z)
        h = TORCH_ACTIVATIONS[model.activation](z) if i < model.num_layers - 1 else z
    return h


@given(setup=model_setups())
def test_forward_and_gradients_match_torch_autograd(setup: tuple) -> None:
    model, params, x, graph, kwargs = setup
    out, cache = model.forward(params, x, graph, **kwargs)
    d_out = np.random.default_rng(0).standard_normal(out.shape)
    d_x, d_params = model.backward(params, cache, d_out)

    t_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    t_x = torch.tensor(x, requires_grad=True)
    t_out = torch_gat_model(model, t_params, t_x, graph.edge_index, kwargs.get("noise", {}))
    t_out.backward(torch.tensor(d_out))

    assert_agrees_with_autograd(out, d_x, d_params, t_out, t_x, t_params)
