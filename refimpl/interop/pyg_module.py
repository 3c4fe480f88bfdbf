"""Check a PyTorch Geometric module against refimpl in one call: no export, no file.

:func:`check_pyg_module` takes a PyG ``GATConv``, ``GATv2Conv`` or ``TransformerConv`` and
its inputs, reads the module's configuration from its attributes, runs a float64 copy of it in
evaluation mode with torch autograd (``L = sum(c * out)`` for a cotangent ``c``), and hands its
inputs, parameters (``state_dict()``), output and gradients (``named_parameters()``) to
:func:`refimpl.interop.crosscheck.crosscheck_arrays`: the same checks, tolerances, notes and
per-tensor table as ``refimpl crosscheck FILE.npz``, whose format those arrays follow.

The module given is not changed: the run uses a deep copy (``.double().eval()``), so the
caller's dtype, training mode and gradients stay as they were. A configuration refimpl has no
counterpart for raises :class:`~refimpl.interop.crosscheck.CrosscheckError` saying which.
Needs torch and torch_geometric (the ``crosscheck`` extra); they are imported when the
function is called.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np

from refimpl.interop.compare import Comparison, host_array
from refimpl.interop.crosscheck import CrosscheckError, crosscheck_arrays

__all__ = ["check_pyg_module", "pyg_config"]

# PyG's constructor arguments refimpl reads, per class (the rest must keep their defaults).
_ARGUMENTS = {
    "GATConv": ("in_channels", "out_channels", "heads", "concat", "negative_slope", "dropout",
                "add_self_loops", "edge_dim", "fill_value", "residual"),
    "GATv2Conv": ("in_channels", "out_channels", "heads", "concat", "negative_slope", "dropout",
                  "add_self_loops", "share_weights", "edge_dim", "fill_value", "residual"),
    "TransformerConv": ("in_channels", "out_channels", "heads", "concat", "beta", "dropout",
                        "edge_dim", "root_weight"),
}  # fmt: skip


def pyg_config(module: Any) -> dict[str, Any]:
    """The crosscheck ``config`` of a PyG module: ``{"framework": "pyg", "layer": NAME,
    "kwargs": {...}}``, its constructor arguments read from its attributes (``bias`` from
    whether it has a bias: PyG keeps no ``bias`` flag)."""
    from torch_geometric import nn as pyg_nn

    name = next(
        (n for n in _ARGUMENTS if isinstance(module, getattr(pyg_nn, n))),
        None,
    )
    if name is None:
        raise CrosscheckError(
            f"{type(module).__name__} is not a PyG layer refimpl checks; supported: "
            f"{sorted(_ARGUMENTS)}"
        )
    for option, defaults in (("aggr", ("add", "sum")), ("flow", ("source_to_target",))):
        value = getattr(module, option, defaults[0])  # MessagePassing's, not the layer's
        if value not in defaults:
            raise CrosscheckError(
                f"{name} has {option}={value!r}: refimpl's layers use PyG's default "
                f"{option}={defaults[0]!r}"
            )
    kwargs = {key: getattr(module, key) for key in _ARGUMENTS[name]}
    if not isinstance(kwargs["in_channels"], int):  # bipartite: (F_src, F_dst), as a list
        kwargs["in_channels"] = list(kwargs["in_channels"])
    with_bias = module.lin_key.bias if name == "TransformerConv" else module.bias
    kwargs["bias"] = with_bias is not None
    if hasattr(kwargs.get("fill_value"), "tolist"):  # a tensor of edge features
        kwargs["fill_value"] = kwargs["fill_value"].tolist()
    return {"framework": "pyg", "layer": name, "kwargs": kwargs}


def check_pyg_module(
    module: Any,
    x: Any,
    edge_index: Any,
    edge_attr: Any = None,
    *,
    cotangent: Any = None,
    rtol: float | None = None,
    seed: int = 0,
) -> tuple[Comparison, list[str]]:
    """Run ``module`` (PyG, in float64, evaluation mode) and refimpl's matching layer on the
    same inputs and parameters; compare output and every gradient, tensor by tensor.

    Parameters
    ----------
    module : torch_geometric.nn.GATConv, GATv2Conv or TransformerConv
        Left unchanged (a deep copy runs).
    x : (N, in_channels) array or tensor, or a pair ``(x_src, x_dst)``
        The pair for a bipartite graph (``N_src`` sources, ``N_dst`` targets), as PyG takes
        it; checked as the crosscheck file's ``input/x_src`` and ``input/x_dst``.
    edge_index : (2, E) integer array or tensor, row 0 the sources
    edge_attr : (E, edge_dim) array or tensor, optional
        For a layer with ``edge_dim``.
    cotangent : array shaped like the output, optional
        ``c`` of ``L = sum(c * out)``; default a standard normal draw of ``seed``.
    rtol : float, optional
        One tolerance for every tensor; default by dtype, as ``refimpl crosscheck``.

    Returns
    -------
    comparison : refimpl.interop.compare.Comparison
        ``.passed``, and ``.table(title)``: the table ``refimpl crosscheck`` prints.
    notes : list of str
        Tensors not compared, and why.
    """
    import torch

    config = pyg_config(module)
    reference = copy.deepcopy(module).double().eval()
    names = ("x_src", "x_dst") if isinstance(x, (tuple, list)) else ("x",)
    sides = x if isinstance(x, (tuple, list)) else (x,)
    x_t = [
        torch.as_tensor(np.asarray(host_array(side), dtype=np.float64)).requires_grad_(True)
        for side in sides
    ]
    edge_index_t = torch.as_tensor(np.array(host_array(edge_index), dtype=np.int64))  # a copy
    inputs = [tuple(x_t) if len(x_t) == 2 else x_t[0], edge_index_t]
    if edge_attr is not None:
        edge_attr_t = torch.as_tensor(np.asarray(host_array(edge_attr), dtype=np.float64))
        inputs.append(edge_attr_t.requires_grad_(True))
    out = reference(*inputs)
    if cotangent is None:
        cotangent = np.random.default_rng(seed).standard_normal(tuple(out.shape))
    cotangent = np.asarray(host_array(cotangent), dtype=np.float64)
    (out * torch.as_tensor(cotangent)).sum().backward()
    arrays: dict[str, Any] = {
        "config": json.dumps(config),
        "input/edge_index": edge_index_t.numpy(),
        "output/out": out.detach().numpy(),
        "cotangent": cotangent,
    }
    for name, side in zip(names, x_t, strict=True):
        arrays[f"input/{name}"] = side.detach().numpy()
        arrays[f"grad/input/{name}"] = _gradient(side)
    if edge_attr is not None:
        arrays["input/edge_attr"] = inputs[2].detach().numpy()
        arrays["grad/input/edge_attr"] = _gradient(inputs[2])
    arrays.update({f"param/{k}": v.numpy() for k, v in reference.state_dict().items()})
    arrays.update({f"grad/param/{k}": _gradient(p) for k, p in reference.named_parameters()})
    return crosscheck_arrays(arrays, rtol, source=f"PyG {config['layer']}")


def _gradient(leaf: Any) -> np.ndarray:
    """A leaf's gradient; zeros where autograd reached it by no path (PyG's GATv1 reads no
    edge features on a graph without edges, for one)."""
    return np.zeros(tuple(leaf.shape)) if leaf.grad is None else leaf.grad.numpy()
