"""Cases for a surface that takes arrays: every argument of a call crossed with the table of
bad values for its kind (:mod:`reliability.corruptions`).

A :class:`Spec` is one configured call (a layer or model with its parameters and inputs):
``build()`` makes fresh valid inputs (seeded), ``call(inputs)`` runs the library (forward
and backward), ``reference(inputs)`` computes the same result independently: the literal
twin (``refimpl.naive``), the dense formula, or the library on the repaired input. Each
argument (``x``, ``params[W]``, ``graph``, ``d_out``, ...) gets every corruption of its
kind; the case passes if the library refuses it in one clear line, or accepts it and
agrees with the reference on the value the corruption stands for, without changing any
input in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from refimpl import Graph
from refimpl.testing.tolerances import TWIN_RTOL
from reliability_cases.corruptions import (
    FLOAT_ARRAY,
    INDEX_ARRAY,
    INVALID,
    SPARSE_CSR,
    Corruption,
    applies,
    scalar_corruptions,
    scalar_repair,
    scalar_valid,
)
from reliability_cases.outcomes import Case, difference, non_finite

Path = tuple[Any, ...]  # where an argument sits in the inputs: ("x",), ("params", "W"), ("x", 0)


@dataclass(frozen=True)
class Spec:
    label: str
    build: Callable[[], dict[str, Any]]
    call: Callable[[dict[str, Any]], Any]
    reference: Callable[[dict[str, Any]], Any]
    domains: dict[str, str] | None = None  # scalar arguments' domains (reliability.corruptions)
    extra: tuple[tuple[str, Corruption], ...] = ()  # (argument, corruption) beyond the tables


def get(inputs: dict[str, Any], path: Path) -> Any:
    value = inputs
    for key in path:
        value = value[key]
    return value


def put(inputs: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """``inputs`` with the entry at ``path`` replaced (containers copied, never changed)."""
    head, rest = path[0], path[1:]
    if not rest:
        if isinstance(inputs, tuple):
            return (*inputs[:head], value, *inputs[head + 1 :])
        return {**inputs, head: value}
    inner = put(inputs[head], rest, value)
    if isinstance(inputs, tuple):
        return (*inputs[:head], inner, *inputs[head + 1 :])
    return {**inputs, head: inner}


def paths(inputs: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every argument's path: the entries of dicts (params, noise) and tuples (pairs)."""
    if isinstance(inputs, dict):
        for key, value in inputs.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(inputs, tuple):
        for i, value in enumerate(inputs):
            yield from paths(value, (*prefix, i))
    else:
        yield prefix


def spelled(path: Path) -> str:
    return path[0] + "".join(f"[{key}]" for key in path[1:])


def snapshot(inputs: Any) -> dict[Path, Any]:
    """Copies of every array among the inputs, to tell afterwards whether one changed."""
    out = {}
    for path in paths(inputs):
        value = get(inputs, path)
        if isinstance(value, np.ndarray) and value.dtype != object:
            out[path] = value.copy()
        elif sp.issparse(value):
            out[path] = value.copy()
    return out


def changed(before: dict[Path, Any], inputs: Any) -> list[str]:
    """The arguments whose arrays differ from their ``before`` copies."""
    names = []
    for path, old in before.items():
        new = get(inputs, path)
        if sp.issparse(old):
            same = all(
                np.array_equal(getattr(old, a), getattr(new, a), equal_nan=True)
                for a in ("data", "indices", "indptr")
                if hasattr(old, a)
            )
        else:
            same = np.array_equal(old, new, equal_nan=old.dtype.kind in "fc")
        if not same:
            names.append(spelled(path))
    return names


def graph_corruptions(graph: Graph) -> tuple[Corruption, ...]:
    """What may stand where a layer expects its :class:`refimpl.Graph`."""
    edges, n = graph.edge_index, graph.num_nodes
    kept = edges[:, (edges < n - 1).all(axis=0)]
    return (
        Corruption("graph: None", lambda g: None),
        Corruption("graph: the edge_index array", lambda g: np.array(edges)),
        Corruption("graph: a nested list", lambda g: edges.tolist()),
        Corruption("graph: one node more", lambda g: Graph(edges, n + 1)),
        Corruption("graph: one node fewer", lambda g: Graph(kept, n - 1)),
        Corruption("graph: no edges", _edgeless, _edgeless),
        Corruption(
            "graph: bipartite, N_dst = N",
            lambda g: Graph(edges, n, num_dst_nodes=n),
            lambda g: Graph(edges, n),
        ),
    )


def _edgeless(graph: Graph) -> Graph:
    return Graph(np.zeros((2, 0), int), graph.num_nodes)


def table(value: Any) -> tuple[Corruption, ...]:
    """The corruptions for an argument holding ``value``."""
    if isinstance(value, Graph):
        return graph_corruptions(value)
    if sp.issparse(value):
        return SPARSE_CSR
    if isinstance(value, np.ndarray):
        return INDEX_ARRAY if value.dtype.kind in "iu" else FLOAT_ARRAY
    return ()


def scalar_table(value: Any, domain: str) -> tuple[Corruption, ...]:
    """Bad stand-ins for a scalar argument of ``domain`` (:func:`scalar_repair`)."""
    return tuple(
        Corruption(
            f"{name} ({bad!r})",
            lambda _, b=bad: b,
            (lambda _, b=bad: scalar_repair(b, domain)) if scalar_valid(bad, domain) else None,
        )
        for name, bad in scalar_corruptions(value)
    )


def spec_cases(spec: Spec, rtol: float = TWIN_RTOL) -> list[Case]:
    """Every (argument, corruption) case of ``spec``, the valid inputs first."""
    clean = spec.build()
    cases = [
        Case(
            f"{spec.label} | valid inputs",
            lambda: _called(spec, ()),
            _checker(spec, (), None, rtol),
        )
    ]
    pairs = []
    for path in paths(clean):
        value = get(clean, path)
        domain = (spec.domains or {}).get(spelled(path))
        pairs += [(path, c) for c in (scalar_table(value, domain) if domain else table(value))]
    pairs += [((argument,), c) for argument, c in spec.extra]
    for path, corruption in pairs:
        value = get(clean, path) if path[0] in clean else None
        if not applies(corruption, value):
            continue
        valid = corruption.repair is not None and corruption.repair(value) is not INVALID
        cases.append(
            Case(
                f"{spec.label} | {spelled(path)} | {corruption.name}",
                lambda p=path, c=corruption: _called(spec, p, c),
                _checker(spec, path, corruption, rtol) if valid else None,
                # a refusal of a valid input (an overflow, say) need not name an argument
                () if valid else _mentions(path),
            )
        )
    return cases


def _mentions(path: Path) -> tuple[str, ...]:
    """Words a refusal of the argument at ``path`` may use to name it."""
    head = path[0]
    names = {
        "x": ("x", "feature", "input", "h"),
        "h": ("h", "x", "input"),
        "graph": ("graph", "edge", "node", "Graph"),
        "d_out": ("d_out", "d_y", "d_logits", "cotangent", "output", "d_"),
        "edge_attr": ("edge_attr", "edge"),
        "pe": ("pe",),
        "batch": ("batch",),
        "num_graphs": ("num_graphs", "graph"),
    }.get(head, (head,))
    if len(path) > 1 and head in ("params", "noise"):
        return (str(path[1]), head)
    return (*names, "x_src", "x_dst") if head == "x" else names


def _called(spec: Spec, path: Path, corruption: Corruption | None = None) -> Any:
    inputs = spec.build()
    if corruption is not None:  # an argument the inputs lack (edge_attr) is added
        clean = get(inputs, path) if path[0] in inputs else None
        inputs = put(inputs, path, corruption.apply(clean))
    before = snapshot(inputs)
    value = spec.call(inputs)
    return value, changed(before, inputs)


def _checker(
    spec: Spec, path: Path, corruption: Corruption | None, rtol: float
) -> Callable[[Any], str | None]:
    def check(result: Any) -> str | None:
        value, mutated = result
        if mutated:
            return f"changed {mutated} in place"
        if corruption is not None and not corruption.compare:
            return non_finite(value)
        inputs = spec.build()
        if corruption is not None:
            inputs = put(inputs, path, corruption.repair(get(inputs, path)))
        return difference(value, spec.reference(inputs), rtol)

    return check
