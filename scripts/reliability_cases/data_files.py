"""Data files: ``refimpl.data.load_planetoid`` on a small Planetoid set laid out like the real
one (every file damaged in turn, its contents replaced by other objects, tampered sparse
matrices, bad test ids and graph dicts) and ``load_graph_dataset`` on ``.npz`` graph datasets
(the file damaged, every member corrupted).

References: the small Planetoid set's features, labels and split written out from the parts
here (what ``tkipf/gcn``'s ``load_data`` makes of them), and the graph dataset's own arrays.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from refimpl.data import load_graph_dataset, load_planetoid, save_graph_dataset, synthetic_molecules
from reliability_cases.corruptions import SPARSE_CSR
from reliability_cases.files import file_cases, in_scratch, member_cases
from reliability_cases.outcomes import Case, difference

# The small set: allx 505 nodes (x its first 2, val the next 500), tx 3 test nodes with ids
# 507, 505, 506 in file order, 4 features, 3 classes, 508 nodes, two neighbours each.
NODES, ALLX, TEST_IDS = 508, 505, (507, 505, 506)


class _Forbidden:
    """Unpickles to a call of ``os.getpid``: a class no allow-list admits."""

    def __reduce__(self) -> tuple:
        return (os.getpid, ())


@functools.cache
def _parts() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    allx = sp.csr_matrix((rng.random((ALLX, 4)) < 0.5).astype(np.float32))
    ally = np.eye(3, dtype=np.int32)[np.arange(ALLX) % 3]
    graph = defaultdict(list, {k: [(k + 1) % NODES, (k + 3) % NODES] for k in range(NODES)})
    return {
        "x": allx[:2].tocsr(),
        "y": ally[:2],
        "allx": allx,
        "ally": ally,
        "tx": sp.csr_matrix(np.eye(3, 4, dtype=np.float32)),
        "ty": np.eye(3, dtype=np.int32),
        "graph": graph,
        "test.index": "".join(f"{i}\n" for i in TEST_IDS),
    }


def _write_planetoid(folder: Path, changes: dict[str, Any] | None = None) -> Path:
    for part, value in {**_parts(), **(changes or {})}.items():
        path = folder / f"ind.cora.{part}"
        if isinstance(value, bytes):
            path.write_bytes(value)
        elif isinstance(value, str):
            path.write_text(value)
        else:
            path.write_bytes(pickle.dumps(value, protocol=4))
    return folder


def _summary(dataset: Any) -> dict[str, Any]:
    x = dataset.x.toarray() if sp.issparse(dataset.x) else np.asarray(dataset.x)
    return {
        "x": x,
        "y": np.asarray(dataset.y),
        "edges": dataset.graph.num_edges,
        "masks": np.stack([dataset.train_mask, dataset.val_mask, dataset.test_mask]),
    }


def _planetoid_reference() -> dict[str, Any]:
    """The public split's preprocessing on the parts, written out: X = [allx; tx] with the
    test rows put at their ids; 2 training, 500 validation, 3 test nodes; each node's two
    out-neighbours, symmetrised and deduplicated."""
    parts = _parts()
    x = np.vstack([parts["allx"].toarray(), parts["tx"].toarray()]).astype(np.float64)
    labels = np.concatenate([parts["ally"].argmax(1), parts["ty"].argmax(1)])
    ordered = np.array(TEST_IDS)
    x[ordered] = x[np.sort(ordered)].copy()
    labels[ordered] = labels[np.sort(ordered)].copy()
    masks = np.zeros((3, NODES), dtype=bool)
    masks[0, :2], masks[1, 2:502], masks[2, sorted(TEST_IDS)] = True, True, True
    edges = {(min(k, j), max(k, j)) for k, js in parts["graph"].items() for j in js if j != k}
    return {"x": x, "y": labels, "edges": 2 * len(edges), "masks": masks}


def _load(folder: Path) -> dict[str, Any]:
    dataset = load_planetoid(folder, "cora")
    out = _summary(dataset)
    out["x"] = out["x"].astype(np.float64)
    return out


def _planetoid_run(changes: dict[str, Any]) -> Any:
    return in_scratch(lambda folder: _load(_write_planetoid(folder, changes)))


def _tampered(name: str, matrix: sp.csr_matrix) -> list[tuple[str, Any, Any]]:
    """(label, content, repaired content) for a pickled CSR matrix: SciPy's raw arrays
    replaced behind its back, as an edited pickle restores them unchecked."""
    out = []
    for c in SPARSE_CSR:
        if c.name.startswith("csr: CSC") or c.name.startswith("csr: COO"):
            continue
        repaired = None if c.repair is None else sp.csr_matrix(c.repair(matrix))
        out.append((f"{name} | {c.name}", c.apply(matrix), repaired))
    return out


def _planetoid_contents() -> list[tuple[str, str, Any, Any]]:
    """(part, label, content, repaired content or None) replacing one part's object."""
    parts, out = _parts(), []
    others = {
        "a list": [1, 2, 3],
        "a dict": {"a": 1},
        "a str": "x",
        "None": None,
        "an unlisted class (os.getpid)": _Forbidden(),
        "an int": 7,
    }
    for part in ("x", "y", "tx", "ty", "allx", "ally", "graph"):
        out += [
            (part, f"{part} | pickle of {label}", value, None) for label, value in others.items()
        ]
    for part in ("tx", "allx"):
        out += [
            (part, label, content, fixed) for label, content, fixed in _tampered(part, parts[part])
        ]
    for part in ("y", "ty", "ally"):
        labels = parts[part]
        out += [
            (part, f"{part} | NaN label", np.where(labels == 1, np.nan, 0.0), None),
            (part, f"{part} | two classes in a row", np.ones_like(labels), None),
            (part, f"{part} | labels 2 for 1", labels * 2, None),
            (part, f"{part} | one row fewer", labels[:-1], None),
            (part, f"{part} | int64 labels", labels.astype(np.int64), labels.astype(np.int64)),
        ]
    index = parts["test.index"]
    out += [
        ("test.index", f"test.index | {label}", text, fixed)
        for label, text, fixed in (
            ("CRLF line ends", index.replace("\n", "\r\n"), index),
            ("no final newline", index.rstrip("\n"), index),
            ("id -1", "-1\n505\n506\n", None),
            ("id beyond the nodes", "5000\n505\n506\n", None),
            ("id inside allx", "3\n505\n506\n", None),
            ("id 1.5", "1.5\n505\n506\n", None),
            ("id abc", "abc\n505\n506\n", None),
            ("id 10**30", f"{10**30}\n505\n506\n", None),
            ("duplicate id", "505\n505\n506\n", None),
            ("empty", "", None),
        )
    ]
    graph = parts["graph"]
    out += [
        ("graph", f"graph | {label}", value, None)
        for label, value in (
            ("neighbour -1", {**graph, 0: [-1]}),
            ("neighbour beyond the nodes", {**graph, 0: [NODES + 10]}),
            ("float neighbour", {**graph, 0: [1.5]}),
            ("key beyond the nodes", {**graph, NODES + 5: [0]}),
            ("str key", {**graph, "a": [0]}),
            ("neighbours not a list", {**graph, 0: 3}),
        )
    ]
    return out


def _as_loaded(changes: dict[str, Any], value: Any) -> str | None:
    """Whether ``value`` is what the set with the valid ``changes`` loads as."""
    return difference(value, _planetoid_run(changes), 0.0)


def planetoid_cases() -> list[Case]:
    reference = _planetoid_reference
    cases = []
    for part in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"):
        cases += file_cases(
            f"load_planetoid | ind.cora.{part}",
            lambda folder, part=part: _write_planetoid(folder) / f"ind.cora.{part}",
            lambda path: _load(path.parent),
            reference,
            mentions=(f"ind.cora.{part}", part),
        )[1:]  # the valid set once, below
    # test.index is text: its last byte cut is the "no final newline" case below
    cases = [
        case
        for case in cases
        if case.name != "load_planetoid | ind.cora.test.index | file: last byte cut"
    ]
    cases.insert(
        0,
        Case(
            "load_planetoid | valid files",
            lambda: _planetoid_run({}),
            lambda value: difference(value, reference(), 0.0),
        ),
    )
    for part, label, content, fixed in _planetoid_contents():
        check = None
        if fixed is not None:
            check = functools.partial(_as_loaded, {part: fixed})
        cases.append(
            Case(
                f"load_planetoid | {label}",
                lambda p=part, c=content: _planetoid_run({p: c}),
                check,
                (f"ind.cora.{part}", part),
            )
        )
    return cases


# -- .npz graph datasets ------------------------------------------------------------------------
@functools.cache
def _molecules() -> Any:
    return synthetic_molecules(4, seed=1)


def _graph_arrays() -> dict[str, np.ndarray]:
    data = _molecules()
    return {
        "x": data.x,
        "edge_index": data.edge_index,
        "edge_attr": data.edge_attr,
        "node_ptr": data.node_ptr,
        "edge_ptr": data.edge_ptr,
        "y": data.y,
        "name": np.array(data.name),
        "task": np.array(data.task),
        "format_version": np.array(1),
    }


def _graph_summary(data: Any) -> dict[str, Any]:
    return {
        key: np.asarray(getattr(data, key))
        for key in ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "y")
    }


# another dataset, not a damaged one: other widths, another float precision
_OTHER_DATA = (
    "dtype: float32 among float64",
    "dtype: float16",
    "shape: one column fewer",
    "shape: one column more",
)


def _graph_read(path: Path) -> dict[str, Any]:
    return _graph_summary(load_graph_dataset(path))


def graph_dataset_cases() -> list[Case]:
    def write(folder: Path) -> Path:
        save_graph_dataset(folder / "molecules.npz", _molecules())
        return folder / "molecules.npz"

    def reference(arrays: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        arrays = arrays or _graph_arrays()
        return {key: arrays[key] for key in _graph_summary(_molecules())}

    return file_cases(
        "load_graph_dataset", write, _graph_read, reference, npz=True, mentions=("molecules.npz",)
    ) + member_cases(
        "load_graph_dataset member",
        _graph_arrays,
        _graph_read,
        reference,
        skip=("name", "task", "format_version"),
        as_stored=lambda key, c: (
            key in ("x", "edge_attr", "y") and c is not None and c.name in _OTHER_DATA
        ),
    )


def cases() -> list[Case]:
    return planetoid_cases() + graph_dataset_cases()
