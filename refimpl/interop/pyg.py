"""Parameters between refimpl's layers and PyTorch Geometric's state dicts, both directions.

``from_pyg(layer, state_dict) -> params`` reads a PyG module's ``state_dict()`` (a
mapping from PyG's names to arrays: NumPy arrays, torch tensors, anything with
``.detach().cpu().numpy()`` or that ``np.asarray`` takes) into the parameter dict of
``layer``, a configured :class:`~refimpl.nn.GATConv` or
:class:`~refimpl.nn.TransformerConv`. ``to_pyg(layer, params) -> state_dict`` is
the inverse: NumPy arrays under PyG's names, ready for
``module.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})``. Torch
is never imported: tensors are converted through their own methods.

Conventions (shared with the layers): weights are ``(out, in)`` like torch's
``Linear.weight``, so no transpose, except in PyG <= 1.5's ``GATConv.weight``,
which was ``(in, out)``; attention vectors are ``(H, C)`` here and ``(1, H, C)``
in PyG. Values keep their dtype (float32 stays float32) unless ``dtype=`` asks
for another, and every returned array is a new array, never a view of the input.

Names (``H`` heads, ``C`` = ``out_channels``, ``F = H*C`` with ``concat`` else ``C``)
======================================================================================

``GATConv(version="v1")``, by PyG release (``from_pyg`` recognises each naming from
its keys; ``to_pyg`` writes the newest unless ``pyg_version`` is given):

| PyG release | ``W``                                      | ``att_src`` | ``att_dst`` | ``bias`` |
| ----------- | ------------------------------------------ | ----------- | ----------- | -------- |
| >= 2.5      | ``lin.weight``                             | ``att_src`` | ``att_dst`` | ``bias`` |
| 2.0 - 2.4   | ``lin_src.weight``, ``lin_dst.weight`` (*) | ``att_src`` | ``att_dst`` | ``bias`` |
| 1.6 - 1.7   | ``lin_l.weight``, ``lin_r.weight`` (*)     | ``att_l``   | ``att_r``   | ``bias`` |

Attention vectors are ``(1, H, C)`` in every PyG release. (*) One module under two
names (``lin_dst = lin_src`` for an int ``in_channels``): both keys are in the state
dict with equal tensors, and must be equal here. PyG >= 2.5 writes ``lin_src`` and
``lin_dst`` only for a bipartite layer (``in_channels`` a pair): ``W_s`` and ``W_t`` of
``GATConv(in_channels=(F_src, F_dst))``; a layer with one ``in_channels`` reads equal ones
as its ``W`` and refuses different ones, saying so. PyG <= 1.5 had
``weight (in, H*C)`` (``W`` transposed: it computed ``x @ weight``) and
``att (1, H, 2C)``, whose first ``C`` entries multiply the target's features
(``att_dst``) and the last ``C`` the source's (``att_src``), and always replaced
self-loops. A GATConv trained with PyG 1.6.1 (or an earlier 1.6 release) scored both
sides with ``att_l`` (fixed in 1.6.2, pyg-team/pytorch_geometric#1894): replace
``att_r`` by ``att_l`` before converting to reproduce its outputs.

Where the boundaries come from: 2.5.0's CHANGELOG ("Breaking Change: Properly
initialize modules in GATConv depending on whether the input is bipartite or
non-bipartite", #8397); pyg-team/pytorch_geometric#3139 (2021-09-15, "after last
release ... (2 days ago)", which we take to be 2.0.0: an older model's state dict lacks
``att_src``, ``att_dst``, ``lin_src.weight``, ``lin_dst.weight``); #1755 (the
maintainer's conversion of 1.3.2 weights: ``lin_l.weight = weight.t()``,
``att_l = att[..., C:]``, ``att_r = att[..., :C]``). 1.6.0 as the first release with
``lin_l``/``att_l`` (the TorchScript rewrite of the convolutions) is inferred from
those threads, not read from a 1.6.0 tag; so is 2.0.0 for ``lin_src``.

``GATConv(version="v2")`` = PyG ``GATv2Conv`` (the same names in every release):
``W_s`` = ``lin_l.weight`` (source), ``W_t`` = ``lin_r.weight`` (target; with
``share_weights`` ``lin_r`` is ``lin_l``, both keys present and equal), ``att`` =
``att (1,H,C)``, ``bias``. PyG's ``bias=True`` also gives ``lin_l`` and ``lin_r``
biases: ``b_s``, ``b_t`` of ``GATConv(version="v2", projection_bias=True)``. A layer
without them (the paper's form, GAT-balance Eq. 2) accepts them from ``from_pyg`` only
when exactly zero, and ``to_pyg`` writes zeros.

``TransformerConv``: ``W_q, b_q`` = ``lin_query.weight, .bias``; ``W_k, b_k`` =
``lin_key.*``; ``W_v, b_v`` = ``lin_value.*``; ``W_e`` = ``lin_edge.weight``;
``W_skip, b_skip`` = ``lin_skip.*``; ``w_beta`` = ``lin_beta.weight``. PyG builds
``lin_skip`` even with ``root_weight=False`` (and never uses it): ``from_pyg``
ignores it then (it may be absent) and ``to_pyg`` writes zeros so that
``load_state_dict`` finds every key. Before PyG 2.7 the query/key/value linears
kept their biases under ``bias=False`` (pyg-team/pytorch_geometric#10163, fixed
by #10177): ``from_pyg`` accepts them when zero, and ``to_pyg(...,
pyg_version="2.6")`` writes zeros for them.

PyG >= 2.6's ``residual=True`` (``res.weight``) maps to ``GATConv(residual=True)``'s
``W_res``; edge features (``edge_dim``) to ``W_e`` = ``lin_edge.weight`` and (GATv1)
``att_edge`` = ``att_edge (1,H,C)``.

What the state dict cannot tell
-------------------------------
Only shapes are checked. ``negative_slope``, ``add_self_loops``, ``dropout``,
``lipschitz_norm`` (no parameters), and ``concat`` when ``bias=False`` leave no
trace in the state dict: construct the refimpl layer with the PyG module's values.

Prefixes
--------
A layer inside a model has its names under a prefix (``"conv1.lin.weight"``):
pass ``prefix="conv1"`` (a trailing dot is added). Keys outside the prefix are
ignored, so a whole model's state dict can be read layer by layer; inside the
prefix every key must be one this layer expects. If every key of the state dict
starts with ``"module."`` (a model wrapped in ``torch.nn.DataParallel``), that
wrapper prefix is stripped first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from refimpl.backend import asarray, to_numpy
from refimpl.interop.compare import host_array
from refimpl.interop.pyg_layouts import (
    NEWEST,
    detect_gat_v1_layout,
    layout_entries,
    parse_version,
)
from refimpl.interop.pyg_mismatch import check_values, mismatch_message, spelled_out
from refimpl.nn.gat.conv import GATConv
from refimpl.nn.transformer.transformer_conv import TransformerConv
from refimpl.validation import check_params

__all__ = ["from_pyg", "pyg_shapes", "to_pyg"]

# -- public functions ----------------------------------------------------------------------------


def pyg_shapes(
    layer: GATConv | TransformerConv, pyg_version: str | None = None
) -> dict[str, tuple[int, ...]]:
    """The keys and shapes of the state dict PyG's counterpart of ``layer`` has.

    Parameters
    ----------
    layer : GATConv or TransformerConv
        A configured refimpl layer.
    pyg_version : str, optional
        A PyG release (``torch_geometric.__version__``, e.g. ``"2.4.0"``); None: the newest.
        Only ``GATConv`` v1 and ``TransformerConv`` with ``bias=False`` depend on it.

    Returns
    -------
    dict of str to tuple of int
        Every key :func:`to_pyg` writes, in PyG's order, with its shape.
    """
    version = parse_version(pyg_version)
    return {e.key: e.shape for e in layout_entries(layer, None, version) if e.emit}


def to_pyg(
    layer: GATConv | TransformerConv,
    params: Mapping[str, Any],
    *,
    prefix: str = "",
    pyg_version: str | None = None,
) -> dict[str, np.ndarray]:
    """``layer``'s parameters as PyG's state dict: new NumPy arrays under PyG's names.

    Parameters
    ----------
    layer : GATConv or TransformerConv
        The configured refimpl layer ``params`` belong to.
    params : dict
        As from ``layer.init_params`` (any backend; copied to the host).
    prefix : str
        Put before every key (``"conv1"`` gives ``"conv1.lin.weight"``).
    pyg_version : str, optional
        Write the names of this PyG release (``torch_geometric.__version__``); None:
        the newest. Only ``GATConv`` v1 (renamed in 1.6, 2.0, 2.5) and ``TransformerConv``
        with ``bias=False`` (before 2.7) depend on it.

    Returns
    -------
    dict
        Every key PyG's module holds, in its order. Parameters refimpl lacks are
        written as zeros (GATv2's ``lin_l``/``lin_r`` biases, an unused ``lin_skip``).
    """
    entries = layout_entries(layer, None, parse_version(pyg_version))
    check_params(params, layer.param_shapes(), type(layer).__name__)
    host = {name: np.array(to_numpy(value), copy=True) for name, value in params.items()}
    dtype = next(iter(host.values())).dtype
    head = _normalise_prefix(prefix)
    out: dict[str, np.ndarray] = {}
    for entry in entries:
        if not entry.emit:
            continue
        if entry.kind == "param":
            value = (entry.to_theirs or (lambda a: a))(*(host[n] for n in entry.ours))
        elif entry.kind == "alias":
            value = out[head + entry.source]
        else:  # "zero", "ignored": a parameter PyG has and refimpl lacks
            value = np.zeros(entry.shape, dtype=dtype)
        out[head + entry.key] = np.array(value, copy=True, order="C")
    return out


def from_pyg(
    layer: GATConv | TransformerConv,
    state_dict: Mapping[str, Any],
    *,
    prefix: str = "",
    dtype: Any = None,
    backend: str | None = None,
) -> dict[str, Any]:
    """Parameters for ``layer`` from a PyG module's state dict (any naming the module
    docstring lists).

    Parameters
    ----------
    layer : GATConv or TransformerConv
        The configured refimpl layer; its configuration decides the expected keys.
    state_dict : Mapping[str, array]
        PyG's names to NumPy arrays or torch tensors (``module.state_dict()`` as is).
    prefix : str
        The layer's name inside a model (``"conv1"``); keys outside it are ignored.
    dtype : optional
        Cast to this dtype (e.g. ``np.float64`` for float32 PyG weights); None keeps
        the state dict's dtype.
    backend : str, optional
        Array backend of the result (``"numpy"``, ``"cupy"``); None: the current one.

    Returns
    -------
    dict
        Keyed and ordered like ``layer.param_shapes()``; every array a new copy.

    Raises
    ------
    ValueError
        Naming every missing key, every unexpected key and every shape mismatch
        (expected and found, with the configuration that implies the expected shape),
        and values the configured layer cannot represent (non-zero GATv2 ``lin_l``/``lin_r``
        biases without ``projection_bias``, different twin weights).
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping of PyG names to arrays (module.state_dict()), "
            f"got {type(state_dict).__name__}"
        )
    head = _normalise_prefix(prefix)
    if (
        state_dict
        and not head.startswith("module.")
        and all(isinstance(k, str) and k.startswith("module.") for k in state_dict)
    ):
        head = "module." + head  # torch.nn.DataParallel's wrapper prefix
    keys = {k[len(head) :] for k in state_dict if isinstance(k, str) and k.startswith(head)}
    if head and not keys:
        tops = sorted({str(k).split(".")[0] for k in state_dict})
        raise ValueError(
            f"no key of the state dict starts with {head!r}; its top-level names are "
            f"{tops[:20]}: pass one of those as prefix"
        )
    layout = None
    if isinstance(layer, GATConv) and layer.version == "v1":
        layout = detect_gat_v1_layout(keys)
    entries = layout_entries(layer, layout, NEWEST)
    expected = {e.key: e for e in entries}
    given = {k: _host_copy(state_dict[head + k], head + k) for k in keys & set(expected)}

    missing = [e.key for e in entries if e.required and e.key not in given]
    unexpected = sorted(keys - set(expected))
    mismatched = [
        f"{head}{e.key}: expected {e.shape} = {spelled_out(e.formula, layer)}, "
        f"got {given[e.key].shape}"
        for e in entries
        if e.key in given and given[e.key].shape != e.shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            mismatch_message(layer, layout, head, missing, unexpected, mismatched, given)
        )
    check_values(layer, entries, given, head)

    params: dict[str, Any] = {}
    for entry in entries:
        if entry.kind == "param":
            values = (entry.to_ours or (lambda a: (a,)))(given[entry.key])
            params.update(zip(entry.ours, values, strict=True))
    return {
        name: asarray(np.ascontiguousarray(params[name]), backend, dtype)
        for name in layer.param_shapes()
    }


# -- helpers -------------------------------------------------------------------------------------


def _normalise_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str such as 'conv1', got {type(prefix).__name__}")
    return prefix if not prefix or prefix.endswith(".") else prefix + "."


def _host_copy(value: Any, key: str) -> np.ndarray:
    """A new NumPy array from anything :func:`~refimpl.interop.compare.host_array` takes."""
    array = np.array(host_array(value), copy=True)
    if array.dtype.kind != "f":
        raise TypeError(
            f"state_dict[{key!r}] has dtype {array.dtype}; parameters must be floating-point "
            "arrays (is this key a buffer or a counter of another module?)"
        )
    return array
