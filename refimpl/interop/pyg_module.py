"""Check a PyTorch Geometric module against refimpl in one call: no export, no file.

:func:`check_pyg_module` takes a PyG ``GATConv``, ``GATv2Conv`` or ``TransformerConv`` and
its inputs, reads the module's configuration from its attributes, runs a float64 copy of it in
evaluation mode with torch autograd (``L = sum(c * out)`` for a cotangent ``c``), and hands its
inputs, parameters (``state_dict()``), output and gradients (``named_parameters()``) to
:func:`refimpl.interop.crosscheck.crosscheck_arrays`: the same checks, tolerances, notes and
per-tensor table as ``refimpl crosscheck FILE.npz``, whose format those arrays follow.

The module given is not changed: the run uses a deep copy moved to the CPU in float64
(``.to("cpu", torch.float64).eval()``), so a module on any device (a GPU's included) is
checked, and the caller's device, dtype, training mode and gradients stay as they were; its
inputs may be on any device too (they are copied to the host). Its frozen parameters
(``requires_grad=False``) go to the crosscheck's ``"frozen"`` list. Inputs are those PyG's
``forward`` takes, a sparse adjacency read as PyG reads it (transposed). A
configuration refimpl has no counterpart for, and an input the check cannot read (a float
``edge_index``, ``x = (x_src, None)``, ...), raise
:class:`~refimpl.interop.CrosscheckError` in one line saying which.
Needs torch and torch_geometric (the ``crosscheck`` extra); they are imported when the
function is called.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np

from refimpl.interop.compare import Comparison, host_array
from refimpl.interop.crosscheck import (
    PYG_ARGUMENTS,
    CrosscheckError,
    crosscheck_arrays,
    graph_of,
)

__all__ = ["check_pyg_module", "pyg_config", "pyg_module_arrays"]


def pyg_config(module: Any) -> dict[str, Any]:
    """The crosscheck ``config`` of a PyG module, its constructor arguments read back.

    Parameters
    ----------
    module : torch_geometric.nn.GATConv, GATv2Conv or TransformerConv
        With PyG's default ``aggr`` and ``flow`` (others have no refimpl counterpart:
        :class:`CrosscheckError`).

    Returns
    -------
    dict
        ``{"framework": "pyg", "layer": NAME, "kwargs": {...}}``, the arguments read from the
        module's attributes (``bias`` from whether it has a bias: PyG keeps no ``bias``
        flag; a tensor ``fill_value`` as a list), as a crosscheck file's ``config``.
    """
    from torch_geometric import nn as pyg_nn

    name = next(
        (n for n in PYG_ARGUMENTS if isinstance(module, getattr(pyg_nn, n))),
        None,
    )
    if name is None:
        raise CrosscheckError(
            f"{type(module).__name__} is not a PyG layer refimpl checks; supported: "
            f"{sorted(PYG_ARGUMENTS)}"
        )
    for option, defaults in (("aggr", ("add", "sum")), ("flow", ("source_to_target",))):
        value = getattr(module, option, defaults[0])  # MessagePassing's, not the layer's
        if value not in defaults:
            raise CrosscheckError(
                f"{name} has {option}={value!r}: refimpl's layers use PyG's default "
                f"{option}={defaults[0]!r}"
            )
    # the crosscheck's arguments, read back; bias (no attribute in PyG) below
    kwargs = {key: getattr(module, key) for key in PYG_ARGUMENTS[name] if key != "bias"}
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
        On any device; left unchanged (a deep copy moved to the CPU runs). Its frozen
        parameters (``requires_grad=False``) take part in the forward; their gradients are not
        compared, and a note names each.
    x : (N, in_channels) array or tensor, or a pair ``(x_src, x_dst)``
        The pair for a bipartite graph (``N_src`` sources, ``N_dst`` targets), as PyG takes
        it; checked as the crosscheck file's ``input/x_src`` and ``input/x_dst``. Both
        sides must be given (PyG's ``(x_src, None)`` is refused).
    edge_index : (2, E) integer array or tensor, row 0 the sources, or a sparse adjacency
        A ``torch.sparse`` tensor (COO, CSR or CSC) or a ``torch_sparse.SparseTensor`` is
        read as PyG reads it, transposed (``adj_t``, of shape ``(N_dst, N_src)``: row the
        target, column the source), its stored entries the edges in their stored order.
    edge_attr : (E, edge_dim) array or tensor, optional
        For a layer with ``edge_dim``; ``(E,)`` for ``edge_dim=1`` (PyG's ``view(-1, 1)``),
        whose gradient is compared in that shape. Rows follow the edges (a sparse
        adjacency's stored entries); a ``SparseTensor``'s values are its edge features when
        ``edge_attr`` is None, as in PyG.
    cotangent : array shaped like the output, optional
        ``c`` of ``L = sum(c * out)``; default a standard normal draw of ``seed``.
    rtol : float, optional
        One tolerance for every tensor; default by dtype, as ``refimpl crosscheck``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng`` for the default cotangent; unused when
        ``cotangent`` is given.

    Returns
    -------
    comparison : refimpl.interop.compare.Comparison
        ``.passed``, and ``.table(title)``: the table ``refimpl crosscheck`` prints.
    notes : list of str
        Tensors not compared, and why.

    Raises
    ------
    CrosscheckError
        In one line: a configuration without a refimpl counterpart, ``x = (x_src, None)``,
        an ``edge_index`` that is not integer (float, boolean) or indexes a node that does
        not exist, a sparse adjacency of the wrong shape or with duplicate entries, or
        inputs PyG's module itself fails on.
    """
    arrays = pyg_module_arrays(module, x, edge_index, edge_attr, cotangent=cotangent, seed=seed)
    name = json.loads(arrays["config"])["layer"]
    return crosscheck_arrays(arrays, rtol, source=f"PyG {name}")


def pyg_module_arrays(
    module: Any,
    x: Any,
    edge_index: Any,
    edge_attr: Any = None,
    *,
    cotangent: Any = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The crosscheck file's entries (:mod:`refimpl.interop.crosscheck`) of ``module`` run on
    these inputs, as :func:`check_pyg_module` compares them: ``numpy.savez(path, **arrays)``
    writes the file ``refimpl crosscheck`` reads. Arguments and errors as
    :func:`check_pyg_module`'s."""
    import torch

    config = pyg_config(module)
    name = config["layer"]
    x_t = [torch.as_tensor(side).requires_grad_(True) for side in _features(x)]
    sizes = (x_t[0].shape[0], x_t[-1].shape[0])
    adjacency, edges, edge_attr = _edge_list(module, name, edge_index, edge_attr, sizes)
    graph = graph_of(edges, sizes[0], sizes[1] if len(x_t) == 2 else None)
    edge_index_t = torch.as_tensor(np.array(graph.edge_index))  # int64, a copy
    inputs = [tuple(x_t) if len(x_t) == 2 else x_t[0], edge_index_t]
    if adjacency is not None:
        inputs[1] = adjacency.clone().cpu()  # PyG marks a COO tensor coalesced: a copy
    if edge_attr is not None:
        edge_attr_t = torch.as_tensor(np.array(host_array(edge_attr), dtype=np.float64))
        inputs.append(edge_attr_t.requires_grad_(True))
    reference = copy.deepcopy(module).to("cpu", torch.float64).eval()
    try:
        out = reference(*inputs)
    except (AssertionError, NotImplementedError, RuntimeError, ValueError, IndexError) as err:
        words = " ".join(str(err).split()) or "an assertion in its forward"
        raise CrosscheckError(
            f"PyG's {name} itself fails on these inputs ({type(err).__name__}: {words}); "
            "nothing to compare"
        ) from err
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
    for key, side in zip(("x_src", "x_dst") if len(x_t) == 2 else ("x",), x_t, strict=True):
        arrays[f"input/{key}"] = side.detach().numpy()
        arrays[f"grad/input/{key}"] = _gradient(side)
    if edge_attr is not None:
        arrays["input/edge_attr"] = inputs[2].detach().numpy()
        arrays["grad/input/edge_attr"] = _gradient(inputs[2])
    arrays.update({f"param/{k}": v.numpy() for k, v in reference.state_dict().items()})
    parameters = dict(reference.named_parameters())
    frozen = [k for k, p in parameters.items() if not p.requires_grad]
    if frozen:  # no gradient: the crosscheck leaves them out and says so
        config["frozen"] = frozen
        arrays["config"] = json.dumps(config)
    arrays.update(
        {f"grad/param/{k}": _gradient(p) for k, p in parameters.items() if p.requires_grad}
    )
    return arrays


def _features(x: Any) -> list[np.ndarray]:
    """``x``, or the two sides of a pair, as float64 ``(nodes, features)`` host arrays."""
    pair = isinstance(x, (tuple, list))
    if pair and (len(x) != 2 or any(side is None for side in x)):
        raise CrosscheckError(
            "x must be an (N, in_channels) array or a pair (x_src, x_dst) of two; PyG's "
            "(x_src, None) has no refimpl counterpart (GATConv then scores each edge by its "
            "source alone, GATv2Conv and TransformerConv need x_dst): pass both sides (for "
            "GATConv, x_dst = zeros of N_src rows gives the output of (x_src, None))"
        )
    sides = [np.array(host_array(side), dtype=np.float64) for side in (x if pair else (x,))]
    for label, side in zip(("x_src", "x_dst") if pair else ("x",), sides, strict=True):
        if side.ndim != 2:
            raise CrosscheckError(f"{label} must be (nodes, features), got shape {side.shape}")
    return sides


def _edge_list(
    module: Any, name: str, edge_index: Any, edge_attr: Any, sizes: tuple[int, int]
) -> tuple[Any, Any, Any]:
    """``(adjacency, edges, edge_attr)``: a sparse adjacency (None for an edge list), the
    ``(2, E)`` edges to check (sources in row 0), and the edge features.

    PyG reads a sparse ``edge_index`` transposed (PyG 2.8.1, read in its source): the
    ``collect`` it generates for each conv (``torch_geometric/nn/conv/collect.jinja``) and
    ``MessagePassing._collect`` take the target of each stored entry from its row
    (``edge_index_i``, the softmax's index) and the source from its column
    (``edge_index_j``): ``indices()`` of a COO tensor, ``crow_indices()`` and
    ``col_indices()`` of a CSR one (a CSC one is refused there), ``coo()`` of a
    ``SparseTensor``, whose values become ``edge_attr`` when none is given (a
    ``torch.sparse`` tensor's only when they are not one number per entry). ``propagate``'s
    docstring: "(row, col) should relate to row = edge_index[1] and col = edge_index[0]".
    The entries are read here with ``torch_geometric.utils.to_edge_index``, in that order.
    """
    import torch
    from torch_geometric.typing import SparseTensor
    from torch_geometric.utils import to_edge_index

    if isinstance(edge_index, SparseTensor):
        row, col, values = edge_index.coo()
        shape = tuple(edge_index.sizes())
    elif isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided:
        (row, col), values = to_edge_index(edge_index.clone())
        shape = tuple(edge_index.shape)
        if values.dim() > 1:
            raise CrosscheckError(
                f"edge_index is a sparse adjacency with values of shape {tuple(values.shape)}, "
                "which PyG reads as edge features; pass them as edge_attr= (rows in the "
                "adjacency's stored order) and the adjacency with one value per entry"
            )
        values = None
    else:  # an edge list: a nested list as it is (Graph reads [] as no edges)
        edges = edge_index if isinstance(edge_index, (list, tuple)) else host_array(edge_index)
        return None, edges, edge_attr
    expected = (sizes[1], sizes[0])  # adj_t: targets by sources
    if shape[:2] != expected:
        raise CrosscheckError(
            f"edge_index is a sparse adjacency of shape {shape[:2]}; PyG reads it transposed "
            f"(adj_t: row the target, column the source), so for these x it must be "
            f"{expected} (N_dst, N_src)"
        )
    edges = torch.stack([col, row]).cpu().numpy()
    if np.unique(edges[1] * sizes[0] + edges[0]).size < edges.shape[1]:
        raise CrosscheckError(
            "edge_index is a sparse adjacency with duplicate entries, which PyG merges when "
            "it adds self-loops and keeps otherwise; coalesce it, or pass the (2, E) edge list"
        )
    if values is not None and edge_attr is None and module.edge_dim is not None:
        edge_attr = values  # PyG's edge_attr when none is given
    elif values is not None and edge_attr is None and name == "TransformerConv":
        raise CrosscheckError(
            "edge_index is a SparseTensor with values, which PyG's TransformerConv without "
            "edge_dim adds to its messages as edge features; refimpl's refuses edge features "
            "without edge_dim: pass the adjacency without values"
        )
    return edge_index, edges, edge_attr


def _gradient(leaf: Any) -> np.ndarray:
    """A leaf's gradient; zeros where autograd reached it by no path (PyG's GATv1 reads no
    edge features on a graph without edges, for one)."""
    return np.zeros(tuple(leaf.shape)) if leaf.grad is None else leaf.grad.numpy()
