"""NodeFormer model against torch autograd: App. C's stack (input MLP, convs, residual, LayerNorm,
ELU, dropout, output MLP) and the objective <c, logits> + lambda L_e, built in torch from the dense
layer and edge loss of tests/nn/nodeformer/test_conv_torch.py with the same fixed noise."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given

from refimpl.models import NodeFormer
from refimpl.testing import estimate_rounding
from tests.autograd import compare_with_autograd
from tests.models.test_nodeformer_model import model_setups
from tests.nn.nodeformer.test_conv_torch import torch_edge_loss, torch_layer

torch = pytest.importorskip("torch")
functional = pytest.importorskip("torch.nn.functional")


def torch_model(model: NodeFormer, p: dict, x: Any, graph: Any, noise: dict) -> tuple:
    """Logits and L_e (mean over layers, None without edge loss) of the training forward."""

    def sub(prefix: str) -> dict:
        return {k[len(prefix) + 1 :]: v for k, v in p.items() if k.startswith(prefix + ".")}

    def drop(key: str, h: Any) -> Any:
        if key not in noise:
            return h
        return h * torch.tensor(noise[key]) / (1 - model.dropout)

    d = model.hidden_channels
    h = x @ p["input.W"].T + p["input.b"]
    h = functional.layer_norm(h, (d,), p["input_norm.weight"], p["input_norm.bias"], 1e-5)
    h = drop("input.dropout", functional.elu(h))
    edge_losses = []
    for i, conv in enumerate(model.convs):
        layer = {k: v for k, v in sub(f"layer{i}").items() if not k.startswith("norm.")}
        layer_noise = {
            key: noise[f"layer{i}.{key}"]
            for key in ("projection", "gumbel")
            if f"layer{i}.{key}" in noise
        }
        z = torch_layer(conv, layer, h, graph, layer_noise, training=True)
        if model.edge_loss_weight > 0:
            edge_losses.append(
                torch_edge_loss(conv, layer, h, graph, layer_noise, model.edge_loss_convention)
            )
        if model.residual:
            z = z + h
        if model.layer_norm:
            z = functional.layer_norm(
                z, (d,), p[f"layer{i}.norm.weight"], p[f"layer{i}.norm.bias"], 1e-5
            )
        if model.activation:
            z = functional.elu(z)
        h = drop(f"layer{i}.dropout", z)
    logits = h @ p["output.W"].T + p["output.b"]
    return logits, (sum(edge_losses) / len(edge_losses) if edge_losses else None)


@given(setup=model_setups())
def test_training_objective_matches_torch_autograd(setup: tuple) -> None:
    model, params, x, graph, rng = setup
    logits, cache = model.forward(params, x, graph, training=True, rng=rng)
    cotangent = rng.standard_normal(logits.shape)
    d_x, d_params = model.backward(params, cache, cotangent)
    ours = {"logits": logits, "x": d_x, **d_params}
    if model.edge_loss_weight > 0:
        ours["edge_loss"] = np.asarray(cache.edge_loss)
    else:
        assert cache.edge_loss is None
    assert all(np.isfinite(value).all() for value in ours.values())

    def reference() -> dict:
        tensors = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
        t_x = torch.tensor(x, requires_grad=True)
        t_logits, t_edge = torch_model(model, tensors, t_x, graph, cache.noise)
        objective = (torch.tensor(cotangent) * t_logits).sum()
        if t_edge is not None:
            objective = objective + model.edge_loss_weight * t_edge
        inputs = [t_x, *tensors.values()]
        grads = torch.autograd.grad(objective, inputs, allow_unused=True)
        grads = [
            torch.zeros_like(i) if g is None else g for i, g in zip(inputs, grads, strict=True)
        ]
        theirs = {"logits": t_logits, "x": grads[0]}
        theirs.update(zip(tensors, grads[1:], strict=True))
        return theirs if t_edge is None else {**theirs, "edge_loss": t_edge}

    # the dense torch reference multiplies unshifted Eq. 4 features: at large |q| with few
    # features they underflow and its pi is 0/0 (ours works in the log domain)
    plain = estimate_rounding(reference, samples=0)
    assume(all(np.isfinite(value).all() for value in plain.values.values()))
    # LayerNorm of a near-constant row and the kernel's exponentials amplify rounding: each
    # entry is judged against the rounding autograd shows there (tests.autograd)
    comparison = compare_with_autograd(ours, reference, outputs=["logits", "edge_loss"])
    assert comparison.passed, comparison.table()
