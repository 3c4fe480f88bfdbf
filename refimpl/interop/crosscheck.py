"""``refimpl crosscheck FILE.npz``: run our layer on another implementation's inputs and parameters
and compare its outputs and gradients, tensor by tensor.

The file (``numpy.savez``; plain arrays, read with ``allow_pickle=False``)
-------------------------------------------------------------------------
- ``config`` (0-d str, JSON): ``{"framework": "pyg" | "refimpl", "layer": NAME, "kwargs":
  {...}}``, and optionally ``"frozen": [names]``
- ``param/<name>`` (float arrays): parameters; PyG state-dict names for ``"pyg"`` (e.g.
  ``param/lin.weight``), ours for ``"refimpl"`` (``param/W``)
- ``input/x`` (``(N, in)`` float): node features
- ``input/edge_index`` (``(2, E)`` int): row 0 sources, row 1 targets (PyG's convention), as
  passed to the layer
- ``input/x_src``, ``input/x_dst`` (``(N_src, F_src)``, ``(N_dst, F_dst)`` float): a bipartite
  layer's inputs in place of ``input/x`` (PyG's ``x = (x_src, x_dst)``; ``kwargs``'
  ``in_channels`` a 2-list)
- ``input/edge_attr`` (``(E, edge_dim)`` float): edge features (a layer with ``edge_dim``;
  ``(E,)`` for ``edge_dim=1``, as PyG reads it)
- ``output/out`` (float): the other implementation's output
- ``cotangent`` (shaped like ``out``): ``c`` of the scalar loss ``L = sum(c * out)``
- ``grad/input/x`` (like ``input/x``): ``dL/dx`` (optional, as every ``grad/``)
- ``grad/input/edge_attr`` (like ``input/edge_attr``): ``dL/d edge_attr``
- ``grad/input/x_src``, ``grad/input/x_dst`` (like the inputs): ``dL/d x_src``, ``dL/d x_dst``
  (bipartite)
- ``grad/param/<name>`` (like ``param/<name>``): ``dL/d param``, under the parameters' names

Nothing else: an entry the reader does not know (``input/edge_weight``, a typo) is refused,
not ignored, and so is a file whose entries mean two things: ``input/x`` beside
``input/x_src`` / ``input/x_dst``, a ``grad/`` entry for an input or parameter the file does
not give (``grad/input/x`` in a bipartite file), a gradient given for a frozen parameter.
``input/edge_index`` must be an integer array (not float, not boolean) whose sources lie in
``[0, N_src)`` and targets in ``[0, N_dst)``: a float one is refused, never truncated.

Frozen parameters (``requires_grad=False`` in torch) have no gradient: list their names
under the config's ``"frozen"`` (PyG's names for ``"pyg"``). Their values are used in the
forward; their gradients are not compared, need no ``grad/param/`` entry, and a note names
each. ``named_parameters()`` lists them, so an export writes
``{k: p.grad for k, p in named_parameters() if p.requires_grad}``.

Layers: ``"pyg"`` takes PyG's class names and constructor arguments: ``GATConv``
(our GATConv v1), ``GATv2Conv`` (v2) and ``TransformerConv``; ``"refimpl"`` takes our
``GATConv`` and ``TransformerConv`` with our arguments. ``kwargs`` are the constructor's
arguments as the user wrote them (PyG's defaults for those left out); PyG's
``GATv2Conv(bias=True)`` is our ``GATConv(version="v2", bias=True,
projection_bias=True)``, and ``fill_value`` a number, a list of ``edge_dim`` numbers (a
tensor's ``tolist()``), a reduction's name or None. Parameters convert with
:func:`refimpl.interop.pyg.from_pyg` (gradients too: the maps are reshapes).

The comparison is made in evaluation mode (no dropout): export with
``module.eval()``. Tolerances follow the data's dtype: outputs ``1e-12`` (float64)
or ``1e-5`` (float32) relative to the output's largest entry, gradients ``1e-10`` or
``1e-4`` relative to the largest gradient entry of all (a gradient can be zero by
cancellation: see :mod:`refimpl.interop.compare`); ``rtol=`` overrides both. The values
are :data:`refimpl.testing.tolerances.FORWARD_RTOL` and ``GRADIENT_RTOL``.

Gradients under PyG's names follow the layer's state-dict layout
(:mod:`refimpl.interop.pyg_layouts`): a key that is the same module under a second name
(GATv2's ``lin_r`` with ``share_weights``, GATConv's ``lin_dst`` before PyG 2.5) appears
once in ``named_parameters()``, so its gradient is taken from its twin; keys refimpl has
no counterpart for (the zero GATv2 projection biases of a ``"refimpl"`` layer without
``projection_bias``, the query/key/value biases PyG < 2.7 kept under ``bias=False``, an
unused ``lin_skip``) need no gradient and are not compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from refimpl.fields import check_nonnegative_number
from refimpl.files import read_npz
from refimpl.graph import Graph
from refimpl.interop.compare import Comparison, compare_tensors
from refimpl.interop.crosscheck_file import (
    CONFIG_KEYS,
    CrosscheckError,
    check_entries,
    frozen_parameters,
)
from refimpl.interop.pyg import from_pyg
from refimpl.interop.pyg_layouts import NEWEST, Entry, detect_gat_v1_layout, layout_entries
from refimpl.nn import GATConv, TransformerConv
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL

__all__ = ["CrosscheckError", "crosscheck", "crosscheck_arrays", "graph_of", "layer_from_config"]

# outputs, gradients: a few ulps of the data's precision along the layer's chain of sums
TOLERANCES = {dtype: (FORWARD_RTOL[dtype], GRADIENT_RTOL[dtype]) for dtype in GRADIENT_RTOL}
# PyG's constructor arguments refimpl reads, per class, in the order of PyG's signatures (the
# rest must keep their defaults): what a file's kwargs may hold, and what
# refimpl.interop.pyg_module reads back from a module's attributes (all but bias, which PyG
# keeps no flag for).
PYG_ARGUMENTS = {
    "GATConv": (
        "in_channels out_channels heads concat negative_slope dropout add_self_loops edge_dim "
        "fill_value bias residual"
    ).split(),
    "GATv2Conv": (
        "in_channels out_channels heads concat negative_slope dropout add_self_loops edge_dim "
        "fill_value bias share_weights residual"
    ).split(),
    "TransformerConv": (
        "in_channels out_channels heads concat beta dropout edge_dim bias root_weight"
    ).split(),
}
_OURS = {"GATConv": GATConv, "TransformerConv": TransformerConv}


def layer_from_config(config: dict[str, Any]) -> GATConv | TransformerConv:
    """Our configured layer for a crosscheck file's ``config`` entry (see the module docstring).

    Parameters
    ----------
    config : dict
        ``{"framework": "pyg" | "refimpl", "layer": NAME, "kwargs": {...}}`` (``framework``
        defaults to ``"pyg"``; a ``"frozen"`` list is read by the crosscheck, not here):
        PyG's ``GATConv``, ``GATv2Conv`` or ``TransformerConv`` with PyG's arguments, or our
        ``GATConv`` or ``TransformerConv`` with ours.

    Returns
    -------
    GATConv or TransformerConv
        Our layer; PyG's ``GATv2Conv`` is our ``GATConv(version="v2")``, with
        ``projection_bias`` following ``bias``.
    """
    if not isinstance(config, dict):
        raise CrosscheckError(
            'config must be a JSON object {"framework": ..., "layer": ..., "kwargs": {...}}, '
            f"got {config!r}"
        )
    unknown = [key for key in config if key not in CONFIG_KEYS]
    if unknown:
        raise CrosscheckError(
            f"config has {unknown[0]!r}, which the crosscheck does not read; its keys are "
            f"{list(CONFIG_KEYS)}"
        )
    framework, name = config.get("framework", "pyg"), config.get("layer")
    kwargs = config.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise CrosscheckError(
            f"config's kwargs must be a JSON object of constructor arguments, got {kwargs!r}"
        )
    kwargs = dict(kwargs)
    if framework == "refimpl":
        if name not in _OURS:
            raise CrosscheckError(f"layer {name!r} is not one of ours {sorted(_OURS)}")
        try:
            return _OURS[name](**kwargs)
        except TypeError as err:  # an argument our layer does not take
            raise CrosscheckError(f"cannot build our {name} from {kwargs}: {err}") from err
    if framework != "pyg":
        raise CrosscheckError(f"framework must be 'pyg' or 'refimpl', got {framework!r}")
    if name not in PYG_ARGUMENTS:
        raise CrosscheckError(
            f"PyG layer {name!r} is not supported; supported: {sorted(PYG_ARGUMENTS)}"
        )
    allowed = PYG_ARGUMENTS[name]
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        key = unknown[0]
        raise CrosscheckError(
            f"{name} argument {key}={kwargs[key]!r} has no refimpl counterpart; "
            f"supported arguments: {allowed}"
        )
    try:
        if name == "TransformerConv":
            return TransformerConv(**kwargs)
        if name == "GATv2Conv":  # PyG's bias reaches lin_l and lin_r too
            kwargs["projection_bias"] = kwargs.get("bias", True)
        return GATConv(version="v1" if name == "GATConv" else "v2", **kwargs)
    except (TypeError, ValueError) as err:
        raise CrosscheckError(f"{name}({_spelled(kwargs)}): {err}") from err


def _spelled(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def graph_of(
    edge_index: Any, num_nodes: int, num_dst_nodes: int | None = None, name: str = "edge_index"
) -> Graph:
    """The :class:`~refimpl.graph.Graph` of an edge list, checked as :class:`Graph` checks it
    (an integer ``(2, E)`` array, sources in ``[0, num_nodes)``, targets in
    ``[0, num_dst_nodes)``), or a :class:`CrosscheckError` naming ``name``: a float edge list
    is refused, never truncated to another graph."""
    if getattr(edge_index, "dtype", None) == np.bool_:  # Graph's advice, astype(int), is wrong
        raise CrosscheckError(
            f"{name} is boolean; an edge list holds node indices: an integer (2, E) array, "
            "row 0 the sources, row 1 the targets"
        )
    try:
        return Graph(edge_index, num_nodes, num_dst_nodes=num_dst_nodes)
    except (TypeError, ValueError) as err:
        raise CrosscheckError(f"{name}: {err}") from err


def crosscheck(path: str | Path, rtol: float | None = None) -> tuple[Comparison, list[str]]:
    """Run our layer on the file's inputs and parameters; compare outputs and gradients.

    Parameters
    ----------
    path : str or pathlib.Path
        A crosscheck file (``numpy.savez``; its entries in the module docstring).
    rtol : float or None, default None
        One tolerance for every tensor, a finite number ``>= 0`` (a NaN would pass every
        tensor); ``None``: by the inputs' dtype, outputs and gradients apart.

    Returns
    -------
    comparison : Comparison
        ``.passed``, and ``.table(title)``: the table ``refimpl crosscheck`` prints.
    notes : list of str
        Tensors not compared, and why.
    """
    arrays = read_npz(path, CrosscheckError, "write it with numpy.savez", what="crosscheck file")
    return crosscheck_arrays(arrays, rtol, source=str(path))


def crosscheck_arrays(
    arrays: dict[str, Any], rtol: float | None = None, source: str = "the arrays"
) -> tuple[Comparison, list[str]]:
    """:func:`crosscheck` on the file's entries already in memory.

    Parameters
    ----------
    arrays : dict of str to array
        The entries, ``key -> array`` (NumPy), as in the file; ``config`` a JSON string.
    rtol : float or None, default None
        As in :func:`crosscheck`.
    source : str, default "the arrays"
        What the entries came from, named in error messages.

    Returns
    -------
    comparison : Comparison
        Output and gradients, tensor by tensor.
    notes : list of str
        Tensors not compared, and why.
    """
    if rtol is not None:
        check_nonnegative_number(rtol, "rtol")
    check_entries(arrays, source)
    bipartite = "input/x_src" in arrays or "input/x_dst" in arrays
    features = ("input/x_src", "input/x_dst") if bipartite else ("input/x",)
    for key in ("config", *features, "input/edge_index", "output/out"):
        if key not in arrays:
            raise CrosscheckError(f"{source} has no {key!r} entry (see refimpl.interop.crosscheck)")
    try:
        config = json.loads(str(arrays["config"]))
    except json.JSONDecodeError as err:
        raise CrosscheckError(f"config is not JSON: {err}") from err
    layer = layer_from_config(config)
    pyg = config.get("framework", "pyg") == "pyg"
    for key in features:
        if np.ndim(arrays[key]) != 2:
            raise CrosscheckError(f"{key} must be (nodes, features), got shape {arrays[key].shape}")
    x = arrays[features[0]]
    if rtol is not None:
        out_rtol = grad_rtol = rtol
    elif x.dtype in TOLERANCES:
        out_rtol, grad_rtol = TOLERANCES[x.dtype]
    else:
        raise CrosscheckError(f"{features[0]} has dtype {x.dtype}; use float32 or float64")
    notes: list[str] = []
    given = {k.removeprefix("param/"): v for k, v in arrays.items() if k.startswith("param/")}
    frozen = frozen_parameters(config, given, arrays)
    params = from_pyg(layer, given) if pyg else given
    num_dst = arrays["input/x_dst"].shape[0] if bipartite else None
    graph = graph_of(arrays["input/edge_index"], x.shape[0], num_dst, "input/edge_index")
    inputs: list[Any] = [(x, arrays["input/x_dst"]) if bipartite else x, graph]
    if "input/edge_attr" in arrays:
        inputs.append(arrays["input/edge_attr"])
    try:
        out, cache = layer.forward(params, *inputs)
    except TypeError as err:  # dtypes or array types the layer refuses: the file's problem
        raise CrosscheckError(
            f"our {type(layer).__name__} refused the file's arrays: {err}"
        ) from err
    ours = {"out": out}
    reference = {"out": arrays["output/out"]}
    result = compare_tensors(ours, reference, out_rtol)

    grads = {k.removeprefix("grad/"): v for k, v in arrays.items() if k.startswith("grad/")}
    if not grads:
        if "cotangent" in arrays:
            notes.append("cotangent: given without any grad/ entry, so only out is compared")
        return result, notes
    if "cotangent" not in arrays:
        raise CrosscheckError("gradients are given but no 'cotangent' (c of L = sum(c * out))")
    cotangent = arrays["cotangent"]
    if cotangent.dtype != out.dtype:
        raise CrosscheckError(
            f"cotangent has dtype {cotangent.dtype} but the output is {out.dtype}; "
            "save the cotangent in the dtype of the run"
        )
    d_inputs, d_params = layer.backward(params, cache, cotangent)
    # x (a pair for a bipartite layer) and edge_attr: the graph has none
    d_inputs = (d_inputs,) if len(inputs) == 2 else tuple(d_inputs)
    if bipartite:
        ours_grads = {"input/x_src": d_inputs[0][0], "input/x_dst": d_inputs[0][1]}
    else:
        ours_grads = {"input/x": d_inputs[0]}
    if len(d_inputs) > 1:  # shaped as the input: (E,) for a 1-D edge_attr (edge_dim=1)
        ours_grads["input/edge_attr"] = d_inputs[1].reshape(np.shape(inputs[2]))
    their_params = {k.removeprefix("param/"): v for k, v in grads.items() if k.startswith("param/")}
    frozen_ours = {} if pyg else {name: name for name in frozen}
    if pyg and their_params:
        their_params, skipped, frozen_ours = _pyg_gradients(layer, their_params, given, frozen)
        notes += [f"grad/param/{k}: not compared ({why})" for k, why in skipped.items()]
    for name, key in frozen_ours.items():
        their_params.pop(name, None)
        pyg_name = f"PyG's {key}, " if pyg else ""
        notes.append(
            f"grad/param/{name}: not compared (frozen: {pyg_name}requires_grad=False, no "
            "gradient; its value is used in the forward)"
        )
    ours_grads.update({f"param/{k}": v for k, v in d_params.items() if k not in frozen_ours})
    reference_grads = {k: v for k, v in grads.items() if k.startswith("input/")}
    reference_grads.update({f"param/{k}": v for k, v in their_params.items()})
    for name in [n for n in ours_grads if n not in reference_grads]:
        del ours_grads[name]
        notes.append(f"grad/{name}: not in the file, not compared")
    names = list(reference_grads)
    grad_result = compare_tensors(
        {f"grad/{k}": v for k, v in ours_grads.items()},
        {f"grad/{k}": v for k, v in reference_grads.items()},
        grad_rtol,
        groups={"gradients": [f"grad/{k}" for k in names]},
    )
    return result + grad_result, notes


def _pyg_gradients(
    layer: GATConv | TransformerConv,
    grads: dict[str, np.ndarray],
    params: dict[str, np.ndarray],
    frozen: list[str],
) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """PyG-named gradients under our names, driven by the layer's state-dict layout (the
    one :func:`~refimpl.interop.pyg.from_pyg` read ``params`` with).

    An ``"alias"`` key (the same module under a second name) takes its twin's gradient when
    only one of the two is given: ``named_parameters()`` lists a shared module once. Keys
    refimpl has no counterpart for (``"zero"``: their values must be zero, their gradients
    need not be; ``"ignored"``: PyG never uses them) are set aside: they need no gradient,
    are not compared, and are returned with the reason. ``frozen`` keys (and their twins)
    have no gradient: zeros stand in for the conversion, and the third result maps each
    of our names they hold to the PyG key, to be left out of the comparison.
    """
    layout = None
    if isinstance(layer, GATConv) and layer.version == "v1":
        layout = detect_gat_v1_layout(set(params))
    entries = layout_entries(layer, layout, NEWEST)
    by_key = {entry.key: entry for entry in entries}
    held = {e.key: by_key[e.source].ours if e.kind == "alias" else e.ours for e in entries}
    frozen_ours = {name: key for key in frozen for name in held.get(key, ())}
    grads = dict(grads)
    for key in params:
        if set(held.get(key, ())) & set(frozen_ours):
            if key in grads:  # its twin is frozen: one module under two names
                twin = frozen_ours[held[key][0]]
                raise CrosscheckError(
                    f"grad/param/{key} is given, but {twin}, the same parameter under "
                    "PyG's other name, is frozen (no gradient): drop one or the other"
                )
            grads[key] = np.zeros_like(params[key])
    for entry in entries:
        if entry.kind == "alias":
            if entry.key not in grads and entry.source in grads:
                grads[entry.key] = grads[entry.source]
            elif entry.source not in grads and entry.key in grads:
                grads[entry.source] = grads[entry.key]
    skipped = {}
    for entry in entries:
        if entry.kind in ("zero", "ignored") and (entry.key in grads or entry.key in params):
            like = grads.get(entry.key, params.get(entry.key))
            grads[entry.key] = np.zeros_like(like)  # from_pyg accepts "zero" keys at zero
            skipped[entry.key] = _no_counterpart(layer, entry)
    missing = sorted(set(params) - set(grads))
    if missing:
        raise CrosscheckError(
            f"gradients are given for some parameters but not for {missing}; give "
            "grad/param/<name> for every parameter (module.named_parameters()) or for none, "
            "and list frozen ones (requires_grad=False) in the config's frozen list"
        )
    return from_pyg(layer, grads), skipped, frozen_ours


def _no_counterpart(layer: GATConv | TransformerConv, entry: Entry) -> str:
    """Why a PyG key's gradient is not compared (``entry.kind`` "zero" or "ignored")."""
    if isinstance(layer, GATConv):  # only GATv2 has such keys: lin_l.bias, lin_r.bias
        return "this GATv2 has projection_bias=False, so they must be zero"
    if entry.kind == "ignored":
        return "PyG's TransformerConv does not use lin_skip with root_weight=False"
    return "refimpl's TransformerConv with bias=False has no bias here (PyG < 2.7 kept it)"
