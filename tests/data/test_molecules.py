"""The synthetic molecules, checked against an independent recomputation with networkx."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.data.graph_dataset import GraphDataset
from refimpl.data.molecules import ATOM_TYPES, ATOM_VALENCES, synthetic_molecules
from refimpl.testing.strategies import seeds
from tests.data.test_graph_dataset import assert_same

# -- synthetic molecules against networkx --------------------------------------------------------


def bonds_of(ds: GraphDataset, i: int) -> nx.Graph:
    """Graph ``i`` as an undirected networkx graph: atom symbols and bond orders as attributes."""
    graph, x, edge_attr, _ = ds.graph(i)
    g = nx.Graph()
    for v, row in enumerate(x):
        g.add_node(v, atom=ATOM_TYPES[int(np.flatnonzero(row)[0])])
    for (u, v), row in zip(graph.edge_index.T.tolist(), edge_attr, strict=True):
        g.add_edge(u, v, order=int(np.flatnonzero(row)[0]) + 1)
    return g


def networkx_counts(g: nx.Graph) -> dict[str, int]:
    """The substructure counts of the target, each by networkx's own means."""
    atoms = [a for _, a in g.nodes(data="atom")]
    orders = [o for _, _, o in g.edges(data="order")]
    cycles = nx.cycle_basis(g)
    return {
        "rings": len(cycles),  # the cycle space's dimension
        "ring_atoms": len(set().union(*cycles)) if cycles else 0,
        "double_bonds": orders.count(2),
        "triple_bonds": orders.count(3),
        "heteroatoms": sum(a in ("N", "O", "S") for a in atoms),
        "halogens": sum(a in ("F", "Cl") for a in atoms),
        "carbonyls": sum(
            o == 2 and {g.nodes[u]["atom"], g.nodes[v]["atom"]} == {"C", "O"}
            for u, v, o in g.edges(data="order")
        ),
        "nitrogens": atoms.count("N"),
        "sulfurs": atoms.count("S"),
    }


SMALL = {"min_atoms": 2, "max_atoms": 30}


@settings(max_examples=10)
@given(seed=seeds(), mean_rings=st.sampled_from([0.0, 2.0, 6.0]))
def test_target_equals_the_documented_formula_on_networkx_counts(seed: int, mean_rings: float):
    ds = synthetic_molecules(num_graphs=8, seed=seed, mean_rings=mean_rings, **SMALL)
    for i in range(len(ds)):
        c = networkx_counts(bonds_of(ds, i))
        expected = (
            1.0 * c["rings"]
            + 0.1 * c["ring_atoms"]
            + 0.5 * c["double_bonds"]
            + 1.0 * c["triple_bonds"]
            - 0.5 * c["heteroatoms"]
            + 0.25 * c["halogens"]
            + 1.0 * c["carbonyls"]
        )
        assert ds.y[i, 0] == pytest.approx(expected, rel=1e-12, abs=1e-12), (i, c)


@settings(max_examples=10)
@given(seed=seeds())
def test_multilabel_labels_match_networkx(seed: int):
    ds = synthetic_molecules(num_graphs=8, seed=seed, task="multilabel", **SMALL)
    for i in range(len(ds)):
        c = networkx_counts(bonds_of(ds, i))
        expected = [
            c["rings"] >= 2,
            c["carbonyls"] >= 1,
            c["halogens"] >= 1,
            c["triple_bonds"] >= 1,
            c["nitrogens"] >= 1,
            c["sulfurs"] >= 1,
        ]
        np.testing.assert_array_equal(ds.y[i], np.array(expected, dtype=float))


@settings(max_examples=15)
@given(
    seed=seeds(),
    sizes=st.sampled_from([(1, 1), (1, 3), (2, 2), (9, 23), (30, 40)]),
    mean_rings=st.sampled_from([0.0, 2.0, 8.0]),
    p_double=st.sampled_from([0.0, 0.5, 1.0]),
    p_triple=st.sampled_from([0.0, 1.0]),
)
def test_molecules_are_valid(seed, sizes, mean_rings, p_double, p_triple):
    ds = synthetic_molecules(
        num_graphs=6,
        seed=seed,
        min_atoms=sizes[0],
        max_atoms=sizes[1],
        mean_rings=mean_rings,
        p_double=p_double,
        p_triple=p_triple,
    )
    n = np.diff(ds.node_ptr)
    assert n.min() >= sizes[0] and n.max() <= sizes[1]
    np.testing.assert_array_equal(ds.x.sum(axis=1), 1.0)  # one-hot atoms
    np.testing.assert_array_equal(ds.edge_attr.sum(axis=1), 1.0)  # one-hot bonds
    for i in range(len(ds)):
        graph, _, edge_attr, _ = ds.graph(i)
        src, dst = graph.edge_index
        pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
        # simple, and every bond stored both ways with the same attributes
        assert all(u != v for u, v in pairs) and len(set(pairs)) == len(pairs)
        attr = {pair: tuple(row) for pair, row in zip(pairs, edge_attr.tolist(), strict=True)}
        assert all(attr[(v, u)] == attr[(u, v)] for u, v in pairs)
        assert pairs == sorted(pairs)  # sorted by (source, target)
        g = bonds_of(ds, i)
        assert nx.is_connected(g)
        # valence: the bond orders at an atom never exceed its valence
        valence = dict(zip(ATOM_TYPES, ATOM_VALENCES, strict=True))
        for v in g.nodes:
            used = sum(o for _, _, o in g.edges(v, data="order"))
            assert used <= valence[g.nodes[v]["atom"]], (i, v)
        # rings: every cycle has >= 5 atoms and a minimum cycle basis holds only 5- and
        # 6-rings (each closure joined atoms at distance 4 or 5 of the graph so far)
        assert {len(c) for c in nx.minimum_cycle_basis(g)} <= {5, 6}
        assert nx.girth(g) >= 5 or nx.girth(g) == float("inf")


def test_generator_is_deterministic_and_noise_leaves_structure_alone():
    a = synthetic_molecules(num_graphs=50, seed=11)
    assert_same(a, synthetic_molecules(num_graphs=50, seed=11))
    other = synthetic_molecules(num_graphs=50, seed=12)
    assert not np.array_equal(other.node_ptr, a.node_ptr)
    noisy = synthetic_molecules(num_graphs=50, seed=11, noise=0.3)
    for key in ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr"):
        np.testing.assert_array_equal(getattr(noisy, key), getattr(a, key))
    assert 0.15 < float(np.std(noisy.y - a.y)) < 0.45  # sample sd of 50 N(0, 0.3^2) draws
    standard = synthetic_molecules(num_graphs=50, seed=11, standardize=True)
    np.testing.assert_allclose(standard.y, (a.y - a.y.mean()) / a.y.std(), rtol=1e-12)
    assert abs(float(standard.y.mean())) < 1e-12 and float(standard.y.std()) == pytest.approx(1)


def test_generator_looks_like_zinc_on_average():
    ds = synthetic_molecules()  # the defaults: 1000 graphs of 9..23 atoms
    n = np.diff(ds.node_ptr)
    assert len(ds) == 1000 and n.min() == 9 and n.max() == 23
    carbon = ds.x[:, ATOM_TYPES.index("C")].mean()
    assert 0.65 < carbon < 0.8  # mostly carbon, like ZINC
    rings = (np.diff(ds.edge_ptr) // 2) - n + 1
    assert 1.0 < rings.mean() < 3.0 and rings.max() >= 3
    assert ds.y.std() > 1.0  # the target varies across molecules


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_graphs": 0}, "num_graphs must be an int >= 1"),
        ({"min_atoms": 0}, "min_atoms must be an int >= 1"),
        ({"min_atoms": 5, "max_atoms": 4}, r"max_atoms \(4\) must be >= min_atoms \(5\)"),
        ({"p_double": 1.5}, r"p_double must be a probability in \[0, 1\]"),
        ({"mean_rings": -1.0}, "mean_rings must be a finite number >= 0"),
        ({"noise": float("nan")}, "noise must be a finite number >= 0"),
        ({"task": "binary"}, "task must be one of"),
        ({"task": "multilabel", "noise": 0.1}, "noise and standardize apply to regression"),
    ],
)
def test_generator_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic_molecules(**kwargs)
