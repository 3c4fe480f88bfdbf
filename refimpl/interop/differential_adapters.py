"""How :func:`refimpl.interop.differential.differential` runs another implementation of a layer:
a PyTorch Geometric module, a torch module of your own, or a JAX function.

Each adapter takes one drawn case (a PyG configuration, refimpl's parameters drawn for it,
the inputs and a cotangent ``c``), runs the other implementation in float64 on exactly those
values, pulls ``c`` back through it (``L = sum(c * out)``: autograd in torch, ``jax.vjp`` in
JAX), and returns the entries of a crosscheck file (:mod:`refimpl.interop.crosscheck`), which
:func:`~refimpl.interop.crosscheck.crosscheck_arrays` compares with refimpl's layer and
``numpy.savez`` writes for ``refimpl crosscheck``. Parameters travel under PyG's names
(:func:`~refimpl.interop.pyg.to_pyg`), so every adapter writes the same file a PyG export
would. torch and JAX are imported when an adapter runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from refimpl.interop.pyg import to_pyg
from refimpl.interop.pyg_module import pyg_module_arrays
from refimpl.nn import GATConv, TransformerConv

__all__ = ["AdapterError", "Inputs", "JaxFunction", "PyGModule", "TorchModule"]


class AdapterError(ValueError):
    """An adapter set up wrong (a parameter map that misses or misnames a parameter): what is
    wrong, and how to fix it. Raised as it is, never taken for your layer's disagreement."""


class Inputs(NamedTuple):
    """One case's inputs, float64 host arrays, as PyG's ``forward`` takes them."""

    x: Any  # (N, F) array, or a pair (x_src (N_src, F_src), x_dst (N_dst, F_dst))
    edge_index: np.ndarray  # (2, E) int64, row 0 the sources
    edge_attr: np.ndarray | None  # (E, edge_dim), with edge_dim only
    cotangent: np.ndarray  # c of L = sum(c * out), shaped like the output


def _source(function: Any) -> str:
    """The qualified name of a function or class: the reproducer imports it from its module."""
    return getattr(function, "__qualname__", repr(function))


class PyGModule:
    """A PyTorch Geometric layer (``GATConv``, ``GATv2Conv``, ``TransformerConv`` or a subclass)
    built for each case: ``make(**config["kwargs"])``, a class or any factory taking PyG's
    constructor arguments. Its parameters are set to the case's, its inputs are PyG's, and
    :func:`~refimpl.interop.pyg_module.check_pyg_module`'s machinery runs it."""

    def __init__(self, make: Callable[..., Any]) -> None:
        self.make = make

    def __repr__(self) -> str:
        return f"PyGModule({_source(self.make)})"

    def arrays(self, config: dict, layer: Any, params: dict, inputs: Inputs) -> dict[str, Any]:
        import torch

        module = self.make(**config["kwargs"]).double()  # float64 before the values load
        state = {k: torch.as_tensor(v) for k, v in to_pyg(layer, params).items()}
        module.load_state_dict(state)
        return pyg_module_arrays(
            module, inputs.x, inputs.edge_index, inputs.edge_attr, cotangent=inputs.cotangent
        )


class TorchModule:
    """A torch module of your own, built for each case by ``make(**config["kwargs"])`` (PyG's
    constructor arguments) and called as ``call(module, x, edge_index, edge_attr)``.

    Parameters
    ----------
    make : callable
        PyG's constructor arguments -> your ``torch.nn.Module``.
    params : mapping of str to str
        Which refimpl parameter each of yours is: ``{"lin_l.weight": "W_s", "att": "att",
        ...}``, your ``named_parameters()`` names to refimpl's (the table in
        :mod:`refimpl.nn.gat.conv`; ``"W_s.T"`` for a weight stored transposed, ``(in, out)``).
        Values are reshaped to your shapes (PyG's ``att`` ``(1, H, C)`` is refimpl's
        ``(H, C)``); two of yours may be one of refimpl's (their gradients add up). Every
        parameter of yours must be named, and every one of the refimpl layer's must be named
        once at least.
    call : callable, optional
        Default: ``module(x, edge_index)``, and ``edge_attr`` as a third argument when the
        configuration has ``edge_dim``; ``x`` a tuple ``(x_src, x_dst)`` on bipartite graphs.
    """

    def __init__(
        self,
        make: Callable[..., Any],
        params: Mapping[str, str],
        call: Callable[..., Any] | None = None,
    ) -> None:
        self.make, self.params, self.call = make, dict(params), call

    def __repr__(self) -> str:
        return f"TorchModule({_source(self.make)}, params={self.params!r})"

    def arrays(self, config: dict, layer: Any, params: dict, inputs: Inputs) -> dict[str, Any]:
        import torch

        module = self.make(**config["kwargs"]).double().eval()
        theirs = dict(module.named_parameters())
        mapping = _mapping(self.params, theirs, layer)
        with torch.no_grad():
            for name, (ours, transposed) in mapping.items():
                value = params[ours].T if transposed else params[ours]
                theirs[name].copy_(torch.as_tensor(value).reshape(theirs[name].shape))
        x = [torch.tensor(side, requires_grad=True) for side in _sides(inputs.x)]
        edge_attr = None
        if inputs.edge_attr is not None:
            edge_attr = torch.tensor(inputs.edge_attr, requires_grad=True)
        args = (tuple(x) if len(x) == 2 else x[0], torch.as_tensor(inputs.edge_index), edge_attr)
        out = self.call(module, *args) if self.call else _call(module, *args)
        _check_shape(tuple(out.shape), inputs.cotangent.shape, "module")
        (out * torch.as_tensor(inputs.cotangent)).sum().backward()
        d_params = {name: np.zeros(shape) for name, shape in layer.param_shapes().items()}
        for name, (ours, transposed) in mapping.items():
            grad = _grad(theirs[name])
            grad = grad.reshape(params[ours].T.shape if transposed else params[ours].shape)
            d_params[ours] += grad.T if transposed else grad
        d_x = [_grad(side) for side in x]
        d_edge_attr = None if edge_attr is None else _grad(edge_attr)
        return _arrays(
            config, layer, params, inputs, out.detach().numpy(), d_x, d_edge_attr, d_params
        )


class JaxFunction:
    """A JAX function, built for each case by ``make(**config["kwargs"])`` (PyG's constructor
    arguments): ``f(params, x, edge_index, edge_attr) -> out``, with ``params`` a dict under
    refimpl's names and shapes (:meth:`refimpl.nn.GATConv.param_shapes`), ``x`` an array or
    a pair ``(x_src, x_dst)``, ``edge_index`` a ``(2, E)`` NumPy int64 array (structure, held
    fixed) and ``edge_attr`` an array or None. Its gradients are ``jax.vjp``'s, as
    ``examples/jax_replay.py`` pulls a cotangent back. Turns on ``jax_enable_x64`` (the
    comparison is float64)."""

    def __init__(self, make: Callable[..., Callable[..., Any]]) -> None:
        self.make = make

    def __repr__(self) -> str:
        return f"JaxFunction({_source(self.make)})"

    def arrays(self, config: dict, layer: Any, params: dict, inputs: Inputs) -> dict[str, Any]:
        import jax

        if not jax.config.jax_enable_x64:  # updating it again would empty JAX's caches
            jax.config.update("jax_enable_x64", True)
        function = self.make(**config["kwargs"])
        x = tuple(_sides(inputs.x)) if isinstance(inputs.x, tuple) else inputs.x

        def run(params: dict, x: Any, edge_attr: Any) -> Any:
            return function(params, x, inputs.edge_index, edge_attr)

        out, pullback = jax.vjp(run, params, x, inputs.edge_attr)
        _check_shape(tuple(out.shape), inputs.cotangent.shape, "function")
        d_params, d_x, d_edge_attr = pullback(jax.numpy.asarray(inputs.cotangent))
        d_x = [np.asarray(side) for side in (d_x if isinstance(d_x, tuple) else (d_x,))]
        d_edge_attr = None if d_edge_attr is None else np.asarray(d_edge_attr)
        d_params = {name: np.asarray(value) for name, value in d_params.items()}
        return _arrays(config, layer, params, inputs, np.asarray(out), d_x, d_edge_attr, d_params)


def _sides(x: Any) -> list[np.ndarray]:
    return list(x) if isinstance(x, tuple) else [x]


def _call(module: Any, x: Any, edge_index: Any, edge_attr: Any) -> Any:
    return module(x, edge_index) if edge_attr is None else module(x, edge_index, edge_attr)


def _grad(leaf: Any) -> np.ndarray:
    """A leaf's gradient; zeros where autograd reached it by no path (no edges, say)."""
    return np.zeros(tuple(leaf.shape)) if leaf.grad is None else leaf.grad.numpy()


def _check_shape(shape: tuple[int, ...], expected: tuple[int, ...], what: str) -> None:
    if shape != expected:
        raise ValueError(
            f"your {what} returned an output of shape {shape}; refimpl's is {expected}"
        )


def _mapping(
    names: dict[str, str], theirs: dict[str, Any], layer: GATConv | TransformerConv
) -> dict[str, tuple[str, bool]]:
    """Your parameter names -> (refimpl's name, transposed), checked both ways."""
    ours = layer.param_shapes()
    unnamed = [name for name in theirs if name not in names]
    if unnamed:
        raise AdapterError(
            f"TorchModule: your parameter {unnamed[0]!r} is not in params=; name the refimpl "
            f"parameter it is (refimpl's here: {list(ours)})"
        )
    mapping = {
        name: (target.removesuffix(".T"), target.endswith(".T"))
        for name, target in names.items()
        if name in theirs  # a name for an option this configuration does not have
    }
    for name, (target, _) in mapping.items():
        if target not in ours:
            raise AdapterError(
                f"TorchModule: params= maps {name!r} to {target!r}, which this refimpl layer "
                f"does not have; its parameters: {list(ours)}"
            )
    missing = [name for name in ours if name not in {t for t, _ in mapping.values()}]
    if missing:
        raise AdapterError(
            f"TorchModule: refimpl's {missing[0]!r} is none of your parameters in params= "
            f"(yours here: {list(theirs)})"
        )
    return mapping


def _arrays(
    config: dict,
    layer: GATConv | TransformerConv,
    params: dict,
    inputs: Inputs,
    out: np.ndarray,
    d_x: list[np.ndarray],
    d_edge_attr: np.ndarray | None,
    d_params: dict[str, np.ndarray],
) -> dict[str, Any]:
    """A crosscheck file's entries of one run whose gradients are under refimpl's names:
    parameters and their gradients converted to PyG's (the maps are reshapes)."""
    arrays: dict[str, Any] = {
        "config": json.dumps(config),
        "input/edge_index": inputs.edge_index,
        "output/out": out,
        "cotangent": inputs.cotangent,
    }
    keys = ("x_src", "x_dst") if len(d_x) == 2 else ("x",)
    for key, side, grad in zip(keys, _sides(inputs.x), d_x, strict=True):
        arrays[f"input/{key}"], arrays[f"grad/input/{key}"] = side, grad
    if inputs.edge_attr is not None:
        arrays["input/edge_attr"] = inputs.edge_attr
        arrays["grad/input/edge_attr"] = d_edge_attr
    arrays |= {f"param/{k}": v for k, v in to_pyg(layer, params).items()}
    arrays |= {f"grad/param/{k}": v for k, v in to_pyg(layer, d_params).items()}
    return arrays
