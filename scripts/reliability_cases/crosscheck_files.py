"""``refimpl.interop.crosscheck`` files: damaged files, every member corrupted or removed,
ambiguous keys, bad configs and tolerances, results altered after export; and
``check_pyg_module`` on bad inputs when torch_geometric is installed.

The reference is the file itself: written from GATConv and TransformerConv, a file agrees
with them. A corruption that keeps the numbers (a Fortran-ordered member, int32 edges) must
still agree; one that changes a number anywhere (an input, a parameter, the other side's
output or a gradient) must be refused or reported as a mismatch, never passed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from refimpl import Graph
from refimpl.interop import check_pyg_module, crosscheck
from refimpl.nn import GATConv, TransformerConv
from reliability_cases.files import file_cases, in_scratch, member_cases
from reliability_cases.layers import EDGES, F, N
from reliability_cases.outcomes import Case

LAYERS = {
    "GATConv v1, edge_dim=2": GATConv(F, 3, heads=2, edge_dim=2),
    "TransformerConv": TransformerConv(F, 3, heads=2),
}


@functools.cache
def _file(label: str) -> tuple[tuple[str, np.ndarray], ...]:
    """A file written from our layer: its config, inputs, parameters, output, cotangent and
    gradients (refimpl's own parameter names)."""
    layer = LAYERS[label]
    rng = np.random.default_rng(5)
    params = layer.init_params(rng)
    x, graph = rng.standard_normal((N, F)), Graph(EDGES, N)
    inputs = [x, graph]
    if layer.edge_dim:
        inputs.append(rng.standard_normal((EDGES.shape[1], layer.edge_dim)))
    out, cache = layer.forward(params, *inputs)
    cotangent = rng.standard_normal(out.shape)
    d_inputs, d_params = layer.backward(params, cache, cotangent)
    d_inputs = d_inputs if isinstance(d_inputs, tuple) else (d_inputs,)
    kwargs = {k: getattr(layer, k) for k in ("in_channels", "out_channels", "heads", "edge_dim")}
    config = {"framework": "refimpl", "layer": type(layer).__name__, "kwargs": kwargs}
    arrays = {
        "config": np.array(json.dumps(config)),
        "input/x": x,
        "input/edge_index": graph.edge_index,
        "output/out": out,
        "cotangent": cotangent,
        "grad/input/x": d_inputs[0],
    }
    if layer.edge_dim:
        arrays |= {"input/edge_attr": inputs[2], "grad/input/edge_attr": d_inputs[1]}
    arrays |= {f"param/{k}": v for k, v in params.items()}
    arrays |= {f"grad/param/{k}": v for k, v in d_params.items()}
    return tuple(arrays.items())


# members whose numbers the comparison cannot see: the key bias b_k adds q_v . b_k to every
# score of target v, which the softmax removes, so its gradient is zero and any b_k agrees
_INVARIANT = ("config", "param/b_k", "grad/param/b_k")


def _arrays(label: str) -> dict[str, np.ndarray]:
    return dict(_file(label))


def _verdict(path: Path, rtol: Any = None) -> dict[str, Any]:
    result, _ = crosscheck(path, rtol=rtol)
    return {"passed": np.array(result.passed)}


def _expect(passed: bool) -> dict[str, Any]:
    return {"passed": np.array(passed)}


def _same_numbers(stored: dict[str, np.ndarray], label: str) -> bool:
    """Whether every member of ``stored`` holds the file's own numbers (members may be
    missing: a gradient left out is not compared, which is no disagreement)."""
    clean = _arrays(label)
    return all(k in clean and _equal(stored[k], clean[k]) for k in stored if k != "config")


def _equal(stored: Any, clean: np.ndarray) -> bool:
    """The same numbers, in whatever dtype they were stored (text included)."""
    try:
        value = np.asarray(stored).astype(clean.dtype)
    except (ValueError, TypeError):
        return False
    return value.shape == clean.shape and np.array_equal(value, clean)


def _written(label: str, change: dict[str, Any]) -> Any:
    def inside(folder: Path) -> Any:
        arrays = {k: v for k, v in {**_arrays(label), **change}.items() if v is not None}
        np.savez(folder / "file.npz", **arrays)
        return _verdict(folder / "file.npz")

    return in_scratch(inside)


def _agreement(label: str) -> Any:
    """The reference for a stored file: passed exactly when it holds the same numbers, so
    an accepted change of any number must come out as a mismatch."""
    return lambda stored: _expect(_same_numbers(stored, label))


def _config_cases(label: str) -> list[Case]:
    config = json.loads(str(_arrays(label)["config"]))
    kwargs = config["kwargs"]
    texts = {
        "not JSON": "{",
        "a list": "[]",
        "layer missing": json.dumps({**config, "layer": None}),
        "unknown layer": json.dumps({**config, "layer": "GCNConv"}),
        "unknown framework": json.dumps({**config, "framework": "dgl"}),
        "kwargs a list": json.dumps({**config, "kwargs": [1]}),
        "unknown argument": json.dumps({**config, "kwargs": {**kwargs, "colour": 1}}),
        "in_channels 5": json.dumps({**config, "kwargs": {**kwargs, "in_channels": 5}}),
        "heads 3": json.dumps({**config, "kwargs": {**kwargs, "heads": 3}}),
        "heads NaN": json.dumps({**config, "kwargs": {**kwargs, "heads": float("nan")}}),
    }
    return [
        Case(
            f"crosscheck {label} | config | {name}",
            lambda t=text: _written(label, {"config": np.array(t)}),
            None,
            (
                "config",
                "kwargs",
                "layer",
                "framework",
                "in_channels",
                "heads",
                "argument",
                "params",
            ),
        )
        for name, text in texts.items()
    ]


def _altered_cases(label: str) -> list[Case]:
    """Results changed after export, and keys that make the file ambiguous."""
    arrays = _arrays(label)
    altered = {
        "output 1e-9 off": {"output/out": arrays["output/out"] * (1 + 1e-9)},
        "one output entry negated": {"output/out": _negate_first(arrays["output/out"])},
        "gradient 1e-7 off": {"grad/input/x": arrays["grad/input/x"] * (1 + 1e-7)},
        "parameter gradient zeroed": {"grad/param/W": np.zeros_like(arrays["grad/param/W"])}
        if "grad/param/W" in arrays
        else {"grad/param/W_q": np.zeros_like(arrays["grad/param/W_q"])},
        "a gradient without a cotangent": {"cotangent": None},
        "x_src beside x": {"input/x_src": arrays["input/x"]},
        "x_dst beside x": {"input/x_dst": arrays["input/x"]},
        "edges as float": {"input/edge_index": arrays["input/edge_index"].astype(float)},
    }
    rtols = {"rtol NaN": np.nan, "rtol -1": -1.0, "rtol inf": np.inf, "rtol '1e-3'": "1e-3"}

    def with_rtol(rtol: Any) -> Any:
        def inside(folder: Path) -> Any:
            np.savez(folder / "file.npz", **arrays)
            return _verdict(folder / "file.npz", rtol)

        return in_scratch(inside)

    cases = [
        Case(
            f"crosscheck {label} | {name}",
            lambda c=change: _written(label, c),
            lambda value: None if not value["passed"] else "passed a changed file",
            ("cotangent", "x_src", "x_dst", "edge_index", "ambiguous"),
        )
        for name, change in altered.items()
    ]
    cases += [
        Case(f"crosscheck {label} | {name}", lambda r=rtol: with_rtol(r), None, ("rtol",))
        for name, rtol in rtols.items()
    ]
    return cases


def _negate_first(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flat[0] = -array.flat[0]
    return array


def _pyg_cases() -> list[Case]:
    """check_pyg_module on bad inputs; none where torch_geometric is not installed."""
    if importlib.util.find_spec("torch_geometric") is None:
        return []
    import torch
    from torch_geometric.nn import GATConv as PygGAT

    module = PygGAT(F, 3, heads=2).double()
    x, edges = torch.randn(N, F, dtype=torch.float64), torch.as_tensor(EDGES)
    valid = {"x float32": (x.float(), edges), "x numpy": (x.numpy(), edges)}  # run in float64
    bad = {
        "x NaN": (x * np.nan, edges),
        "edges float": (x, edges.double()),
        "edges out of range": (x, edges + N),
        "edges (E, 2)": (x, edges.T.contiguous()),
        "x one column fewer": (x[:, :-1], edges),
    }
    cases = [
        Case(
            "check_pyg_module | valid inputs",
            lambda: {"passed": np.array(check_pyg_module(module, x, edges)[0].passed)},
            lambda value: None if value["passed"] else "a PyG layer disagrees with ours",
        )
    ]
    cases += [
        Case(
            f"check_pyg_module | {name}",
            lambda a=args: {"passed": np.array(check_pyg_module(module, *a)[0].passed)},
            None,
            ("x", "edge_index"),
        )
        for name, args in bad.items()
    ]
    cases += [
        Case(
            f"check_pyg_module | {name}",
            lambda a=args: {"passed": np.array(check_pyg_module(module, *a)[0].passed)},
            lambda value: None if value["passed"] else "a PyG layer disagrees with ours",
        )
        for name, args in valid.items()
    ]
    return cases


def cases() -> list[Case]:
    out = []
    for label in LAYERS:

        def write(folder: Path, label: str = label) -> Path:
            np.savez(folder / "file.npz", **_arrays(label))
            return folder / "file.npz"

        out += file_cases(
            f"crosscheck {label}",
            write,
            _verdict,
            lambda: _expect(True),
            npz=True,
            mentions=("file.npz", "crosscheck"),
        )
        out += member_cases(
            f"crosscheck {label} member",
            lambda label=label: _arrays(label),
            _verdict,
            _agreement(label),
            skip=_INVARIANT,
            as_stored=lambda key, c: True,
        )
        out += _config_cases(label) + _altered_cases(label)
    return out + _pyg_cases()
