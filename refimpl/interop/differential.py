"""A differential property test: your graph layer against refimpl's on every small graph
Hypothesis draws, and the smallest graph where they disagree.

:func:`differential` draws cases (a configuration from PyG's option space, a graph with the
edge cases of :mod:`refimpl.testing.strategies`, a seed that fills parameters, features, edge
features and the cotangent ``c``), runs your layer through an adapter
(:mod:`refimpl.interop.differential_adapters`: a PyG module, your torch module, a JAX
function) and refimpl's layer in float64, and compares outputs and the vector-Jacobian
products of ``c`` tensor by tensor, as ``refimpl crosscheck`` does. On a disagreement (or an
exception in your layer) Hypothesis shrinks the case; the :class:`Disagreement` raised shows
the smallest one: the graph, the configuration, the seed, the per-tensor table, a runnable
reproducer and a crosscheck ``.npz`` to attach to a bug report.

Values per case, from ``numpy.random.default_rng(seed)`` in this order: every parameter
(standard normal, as trained weights are: no zero bias, no symmetric initialisation), ``x``
(``x_src`` then ``x_dst``) times ``scale``, ``edge_attr``, then ``c``, all standard normal.

Settings follow Hypothesis' conventions: two profiles are registered,
``"refimpl-differential"`` (derandomised, no example database: the same examples on every
run, for CI; 100 examples) and ``"refimpl-differential-explore"`` (fresh examples every run,
1000 of them). :func:`differential` uses the profile the environment variable
``REFIMPL_DIFFERENTIAL_PROFILE`` names (default the first), or ``settings=``; either way
with ``report_multiple_bugs=False`` (one bug, shrunk) and no deadline.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given
from hypothesis import settings as Settings
from hypothesis import strategies as st

from refimpl.graph import Graph
from refimpl.interop.compare import Comparison
from refimpl.interop.crosscheck import crosscheck_arrays, layer_from_config
from refimpl.interop.differential_adapters import (
    AdapterError,
    Inputs,
    JaxFunction,
    PyGModule,
    TorchModule,
)
from refimpl.testing import strategies as rst

__all__ = ["Case", "DifferentialReport", "Disagreement", "cases", "differential", "replay"]

PROFILE_ENV = "REFIMPL_DIFFERENTIAL_PROFILE"
_COMMON = {
    "deadline": None,
    "report_multiple_bugs": False,
    "suppress_health_check": [HealthCheck.too_slow],
}
# Hypothesis' own defaults as the parent, not whichever profile is loaded at import
_DEFAULT = Settings.get_profile("default")
Settings.register_profile(
    "refimpl-differential", _DEFAULT, max_examples=100, derandomize=True, database=None, **_COMMON
)
Settings.register_profile(
    "refimpl-differential-explore", _DEFAULT, max_examples=1000, derandomize=False, **_COMMON
)
_SCALES = (1.0, 0.1, 10.0)  # feature magnitudes; shrinks to the first


@dataclass(frozen=True)
class Case:
    """One drawn case: everything needed to rebuild it (printed as a reproducer)."""

    config: dict  # {"framework": "pyg", "layer": ..., "kwargs": {...}} (crosscheck config)
    edge_index: list  # [[sources...], [targets...]]
    num_nodes: int  # N, or N_src on a bipartite graph
    num_dst_nodes: int | None  # N_dst on a bipartite graph, else None
    seed: int  # fills the values (module docstring)
    scale: float = 1.0  # the node features' magnitude

    @property
    def graph(self) -> Graph:
        edges = np.array(self.edge_index, dtype=np.int64).reshape(2, -1)
        return Graph(edges, self.num_nodes, num_dst_nodes=self.num_dst_nodes)

    def describe(self) -> str:
        """``Case(...)`` as Python source."""
        return (
            f"Case(config={self.config!r}, edge_index={self.edge_index!r}, "
            f"num_nodes={self.num_nodes}, num_dst_nodes={self.num_dst_nodes}, "
            f"seed={self.seed}, scale={self.scale})"
        )


@st.composite
def cases(
    draw: st.DrawFn, configs: st.SearchStrategy[dict], graphs: st.SearchStrategy | None = None
) -> Case:
    """Cases for :func:`differential`: a configuration from ``configs``
    (:func:`refimpl.testing.strategies.layer_configs`), a graph from ``graphs`` (default
    :func:`~refimpl.testing.strategies.graphs` from 0 to 6 nodes, or
    :func:`~refimpl.testing.strategies.bipartite_graphs` for a pair ``in_channels``), a seed
    and a feature magnitude."""
    config = draw(configs)
    if graphs is None:
        bipartite = isinstance(config["kwargs"]["in_channels"], (list, tuple))
        graphs = rst.bipartite_graphs() if bipartite else rst.graphs(0, 6, 12)
    graph = draw(graphs)
    edges = np.asarray(graph.edge_index).tolist()
    num_dst = graph.num_dst_nodes if graph.is_bipartite else None
    seed, scale = draw(rst.seeds()), draw(st.sampled_from(_SCALES))
    return Case(config, edges, graph.num_nodes, num_dst, seed, scale)


def case_values(case: Case) -> tuple[Any, dict[str, np.ndarray], Inputs]:
    """``(layer, params, inputs)`` of a case: refimpl's layer, its parameters under refimpl's
    names and the inputs, drawn from the case's seed (module docstring)."""
    layer = layer_from_config(case.config)
    kwargs = case.config["kwargs"]
    rng = np.random.default_rng(case.seed)
    params = {name: rng.standard_normal(shape) for name, shape in layer.param_shapes().items()}
    num_dst = case.num_nodes if case.num_dst_nodes is None else case.num_dst_nodes
    widths = kwargs["in_channels"]
    if case.num_dst_nodes is None and isinstance(widths, (list, tuple)):
        raise ValueError(
            f"in_channels={widths} is a bipartite layer's, but the graph has one node set: "
            "draw graphs with refimpl.testing.strategies.bipartite_graphs()"
        )
    if case.num_dst_nodes is None:
        x: Any = case.scale * rng.standard_normal((case.num_nodes, widths))
    else:
        widths = widths if isinstance(widths, (list, tuple)) else (widths, widths)
        x = tuple(
            case.scale * rng.standard_normal((n, w))
            for n, w in zip((case.num_nodes, num_dst), widths, strict=True)
        )
    edge_index = np.array(case.edge_index, dtype=np.int64).reshape(2, -1)
    edge_attr = None
    if kwargs.get("edge_dim") is not None:
        edge_attr = rng.standard_normal((edge_index.shape[1], kwargs["edge_dim"]))
    width = kwargs["out_channels"] * (kwargs.get("heads", 1) if kwargs.get("concat", True) else 1)
    cotangent = rng.standard_normal((num_dst, width))
    return layer, params, Inputs(x, edge_index, edge_attr, cotangent)


def adapter_of(candidate: Any) -> PyGModule | TorchModule | JaxFunction:
    """An adapter as given, or :class:`PyGModule` of a PyG layer class (or a factory)."""
    if isinstance(candidate, (PyGModule, TorchModule, JaxFunction)):
        return candidate
    if callable(candidate):
        return PyGModule(candidate)
    raise TypeError(
        "differential: the candidate must be a PyG layer class (or a factory of PyG modules), "
        f"or a PyGModule, TorchModule or JaxFunction adapter; got {type(candidate).__name__}"
    )


def replay(
    candidate: Any, case: Case, rtol: float | None = None
) -> tuple[Comparison, list[str], dict[str, Any]]:
    """Run one case: ``(comparison, notes, arrays)``, ``arrays`` the crosscheck file's
    entries (``numpy.savez(path, **arrays)``). An exception in your layer propagates."""
    adapter = adapter_of(candidate)
    layer, params, inputs = case_values(case)
    arrays = adapter.arrays(case.config, layer, params, inputs)
    comparison, notes = crosscheck_arrays(arrays, rtol, source=repr(adapter))
    return comparison, notes, arrays


class Disagreement(AssertionError):
    """Your layer and refimpl's disagree (or yours raised) on the case shown, the smallest
    Hypothesis found; ``.case``, ``.comparison`` (None when yours raised), ``.path`` (the
    crosscheck file, None when yours raised), ``.examples`` (cases run before the first
    failure) and ``.calls`` (cases run in all, shrinking included)."""

    def __init__(self, message: str, case: Case, comparison: Comparison | None,
                 path: Path | None, examples: int, calls: int) -> None:  # fmt: skip
        super().__init__(message)
        self.case, self.comparison, self.path = case, comparison, path
        self.examples, self.calls = examples, calls


@dataclass
class DifferentialReport:
    """A passing run: how many cases agreed, and the worst relative error among them."""

    examples: int = 0
    max_rel_error: float = 0.0
    layers: set = field(default_factory=set)


class _Failed(Exception):
    def __init__(self, case: Case, comparison: Any, arrays: Any, error: Any) -> None:
        super().__init__("disagreement")
        self.case, self.comparison, self.arrays, self.error = case, comparison, arrays, error


def differential(
    candidate: Any,
    configs: st.SearchStrategy[dict] | None = None,
    *,
    graphs: st.SearchStrategy | None = None,
    settings: Settings | None = None,
    rtol: float | None = None,
    save_to: str | Path | None = None,
) -> DifferentialReport:
    """Check ``candidate`` against refimpl on the cases Hypothesis draws; raise
    :class:`Disagreement` with the smallest failing case.

    Parameters
    ----------
    candidate : PyG layer class, PyGModule, TorchModule or JaxFunction
        A class (``GATv2Conv``) or factory is run as :class:`PyGModule`.
    configs : strategy of crosscheck configs, optional
        :func:`refimpl.testing.strategies.layer_configs`; default every option of the PyG
        class ``candidate`` is (or subclasses).
    graphs : strategy of Graph, optional
        Default: 0 to 6 nodes (bipartite: 1 to 6 sources, 1 to 5 targets).
    settings : hypothesis.settings, optional
        Default: the profile ``$REFIMPL_DIFFERENTIAL_PROFILE`` names, else
        ``"refimpl-differential"`` (module docstring).
    rtol : float, optional
        As ``refimpl crosscheck``'s (default: 1e-12 outputs, 1e-10 gradients).
    save_to : str or Path, optional
        The directory for the failing case's crosscheck file (default a new temporary one);
        an existing file is never overwritten.

    Returns
    -------
    DifferentialReport
        When every case agreed.

    Raises
    ------
    Disagreement
        An ``AssertionError``: its message holds the graph, configuration, seed, per-tensor
        table, crosscheck file and reproducer.
    """
    adapter = adapter_of(candidate)
    if configs is None:
        configs = rst.layer_configs(_pyg_class_name(adapter))
    chosen = settings or Settings.get_profile(os.environ.get(PROFILE_ENV, "refimpl-differential"))
    report, calls, first = DifferentialReport(), [0], [0]

    @Settings(chosen, **_COMMON)
    @given(case=cases(configs, graphs))
    def agrees(case: Case) -> None:
        calls[0] += 1
        comparison = arrays = error = None
        layer, params, inputs = case_values(case)
        try:
            arrays = adapter.arrays(case.config, layer, params, inputs)
        except AdapterError:  # the adapter is set up wrong: say so, not "your layer raised"
            raise
        except Exception as err:  # your layer's failure is a finding, shrunk like the others
            error = err
        if error is None:
            comparison, _ = crosscheck_arrays(arrays, rtol, source=repr(adapter))
        if error is not None or not comparison.passed:
            first[0] = first[0] or calls[0]
            raise _Failed(case, comparison, arrays, error)
        report.examples += 1
        report.max_rel_error = max(report.max_rel_error, comparison.max_rel_error)
        report.layers.add(case.config["layer"])

    try:
        agrees()
    except _Failed as failed:
        raise _disagreement(adapter, failed, save_to, first[0], calls[0]) from None
    return report


def _pyg_class_name(adapter: Any) -> str:
    make = getattr(adapter, "make", None)
    for cls in getattr(make, "__mro__", ()):
        if cls.__name__ in rst.LAYERS and cls.__module__.startswith("torch_geometric"):
            return cls.__name__
    raise TypeError(
        f"differential: configs= is needed for {adapter!r} (no PyG layer class to draw the "
        "options of): pass refimpl.testing.strategies.layer_configs(NAME, ...)"
    )


def _disagreement(
    adapter: Any, failed: _Failed, save_to: Any, examples: int, calls: int
) -> Disagreement:
    case = failed.case
    graph = case.graph
    nodes = f"{graph.num_nodes} nodes"
    if case.num_dst_nodes is not None:
        nodes = f"{graph.num_nodes} source and {case.num_dst_nodes} target nodes"
    lines = [
        f"{adapter!r} disagrees with refimpl's {case.config['layer']} on a graph of {nodes} "
        f"and {graph.num_edges} edges, the smallest Hypothesis found (first failure at case "
        f"{examples}, {calls} cases run in all)",
        f"config: {json.dumps(case.config)}",
        f"edge_index: {case.edge_index}",
        f"seed: {case.seed}, scale: {case.scale} (parameters, x, edge_attr, cotangent drawn "
        "in that order from numpy.random.default_rng(seed))",
    ]
    path = None
    if failed.error is not None:
        words = " ".join(str(failed.error).split())
        lines.append(f"your layer raised {type(failed.error).__name__}: {words}")
    else:
        lines.append(failed.comparison.table())
        path = _save(failed.arrays, case, save_to)
        lines.append(f"crosscheck file: {path} (check it with: refimpl crosscheck {path})")
    lines += ["reproducer:", *(f"    {line}" for line in _reproducer(adapter, case))]
    return Disagreement("\n".join(lines), case, failed.comparison, path, examples, calls)


def _reproducer(adapter: Any, case: Case) -> list[str]:
    make = adapter.make
    module, name = getattr(make, "__module__", None), getattr(make, "__qualname__", "")
    importable = module and name and "<" not in name and module != "__main__"
    first = (
        [f"from {module} import {name.split('.')[0]}"]
        if importable
        else [f"# {name or make!r}: import or define it here"]
    )
    return [
        *first,
        "from refimpl.interop.differential import Case, replay",
        f"from refimpl.interop.differential_adapters import {type(adapter).__name__}",
        f"case = {case.describe()}",
        f"comparison, notes, arrays = replay({adapter!r}, case)",
        "print(comparison.table())",
    ]


def _save(arrays: dict[str, Any], case: Case, save_to: Any) -> Path:
    folder = Path(save_to) if save_to is not None else Path(tempfile.mkdtemp("", "refimpl-diff-"))
    folder.mkdir(parents=True, exist_ok=True)
    stem, count = f"differential_{case.config['layer']}_{case.seed}", 0
    path = folder / f"{stem}.npz"
    while path.exists():  # never overwrite a file already there
        count += 1
        path = folder / f"{stem}_{count}.npz"
    np.savez(path, **arrays)
    return path
