"""Synthetic molecule-like graphs for the graph-level tasks, as a :class:`GraphDataset`.

The graph-level tasks of the massive-activations supplement (Sec. 1: ZINC graph
regression, TOX21 multi-label classification) use thousands of small molecular
graphs with typed atoms (node features) and typed bonds (edge features). No
benchmark is bundled; :func:`synthetic_molecules` stands in for one. The flat
layout of its result, and the ``.npz`` file for converting your own molecules,
are documented in :mod:`refimpl.data.graph_dataset`.

Synthetic molecules
-------------------
:func:`synthetic_molecules` draws molecule-like graphs (typed atoms with
valences, a tree backbone, ring closures of size 5-6, single/double/triple
bonds within the valences) and a target computed from substructure counts; its
docstring states the construction and the target formula.
"""

from __future__ import annotations

import numpy as np

from refimpl.data.graph_dataset import TASKS, GraphDataset
from refimpl.data.pointers import _pointers

__all__ = [
    "ATOM_FREQUENCIES",
    "ATOM_TYPES",
    "ATOM_VALENCES",
    "BOND_TYPES",
    "MULTILABEL_NAMES",
    "SUBSTRUCTURE_NAMES",
    "TARGET_WEIGHTS",
    "synthetic_molecules",
]

ATOM_TYPES = ("C", "N", "O", "F", "S", "Cl")  # the columns of x (one-hot)
ATOM_VALENCES = (4, 3, 2, 1, 2, 1)  # bonds an atom may take, orders summed (hydrogens implicit)
ATOM_FREQUENCIES = (0.73, 0.12, 0.10, 0.015, 0.02, 0.015)  # roughly ZINC's heavy-atom shares
BOND_TYPES = ("single", "double", "triple")  # the columns of edge_attr; bond order = column + 1
SUBSTRUCTURE_NAMES = (
    "rings",  # cyclomatic number: bonds - atoms + 1 (the graph is connected)
    "ring_atoms",  # atoms on at least one cycle
    "double_bonds",
    "triple_bonds",
    "heteroatoms",  # N, O and S atoms
    "halogens",  # F and Cl atoms
    "carbonyls",  # C=O double bonds
)
TARGET_WEIGHTS = (1.0, 0.1, 0.5, 1.0, -0.5, 0.25, 1.0)  # per SUBSTRUCTURE_NAMES entry
MULTILABEL_NAMES = (
    "two_or_more_rings",
    "has_carbonyl",
    "has_halogen",
    "has_triple_bond",
    "has_nitrogen",
    "has_sulfur",
)

_VALENCE = np.array(ATOM_VALENCES, dtype=np.int64)
_CUMULATIVE = np.cumsum(ATOM_FREQUENCIES)[:-1] / np.sum(ATOM_FREQUENCIES)  # (5,) type boundaries
_C, _N, _O, _F, _S, _CL = range(len(ATOM_TYPES))
_SIX_RING_SHARE = 0.7  # ring closures aiming at a 6-ring (else a 5-ring), as in drug-like sets


def synthetic_molecules(
    num_graphs: int = 1000,
    seed: int = 0,
    min_atoms: int = 9,
    max_atoms: int = 23,
    *,
    mean_rings: float = 2.0,
    p_double: float = 0.25,
    p_triple: float = 0.1,
    noise: float = 0.0,
    standardize: bool = False,
    task: str = "regression",
    name: str = "synthetic_molecules",
) -> GraphDataset:
    """Seeded synthetic molecule-like graphs: typed atoms, typed bonds, a target from
    substructure counts (ZINC-like regression, or TOX21-like multi-label classification).

    Construction of one molecule with ``n ~ Uniform{min_atoms .. max_atoms}`` atoms:

    1. atom types drawn i.i.d. from ``ATOM_FREQUENCIES`` over ``ATOM_TYPES``
       (C N O F S Cl, valences 4 3 2 1 2 1); if the monovalent atoms (F, Cl)
       could not all be attached, some become C (only in tiny molecules: never in
       20,000 draws of 9-23 atoms);
    2. a random tree backbone: the atoms of valence >= 2 in random order, then
       F and Cl, each bonded (single) to a uniformly chosen earlier atom that
       has valence left, so the molecule is connected and never over-bonded;
    3. ``Poisson(mean_rings)`` ring closures: a single bond between two atoms
       with valence left at shortest-path distance 5 (a 6-ring, chosen with
       probability 0.7) or 4 (a 5-ring; either size is tried if the other has
       no candidate pair), uniformly among such pairs; closures stop when no pair
       is left. Fused rings arise, so larger cycles do too;
    4. bond orders: in random order, each bond becomes double with probability
       ``p_double`` if both atoms have valence left, and a new double bond
       becomes triple with probability ``p_triple`` if both still have;
    5. the atoms are relabelled by a random permutation (node order carries no
       information), each bond is stored in both directions with the same
       one-hot ``edge_attr`` (B = 3, ``BOND_TYPES``), edges sorted by (source,
       target) within each graph; ``x`` is the one-hot atom type (F = 6).

    Hydrogens are implicit (the valence left over). The graphs are
    molecule-like, not chemistry: no aromaticity, charges or ring-strain rules.

    Target (``task="regression"``, T = 1), with the counts ``SUBSTRUCTURE_NAMES``
    of each molecule and the weights ``TARGET_WEIGHTS``::

        y = 1.0 rings + 0.1 ring_atoms + 0.5 double_bonds + 1.0 triple_bonds
            - 0.5 heteroatoms + 0.25 halogens + 1.0 carbonyls  (+ noise * N(0, 1))

    ``rings`` is the cyclomatic number (bonds - atoms + 1), ``ring_atoms`` the
    atoms on some cycle, ``heteroatoms`` the N, O and S atoms, ``halogens`` F and
    Cl, ``carbonyls`` the C=O double bonds. With ``standardize=True`` the targets
    are then shifted and scaled to mean 0 and (population) standard deviation 1
    over the generated set (left unscaled when that deviation is 0), so they
    depend on the whole set. ``task="multilabel"`` instead gives T = 6 labels
    (``MULTILABEL_NAMES``): rings >= 2, a carbonyl, a halogen, a triple bond, a
    nitrogen, a sulfur (``noise`` and ``standardize`` must stay off).

    Determinism: the structures come from one stream of
    ``SeedSequence(seed)``, the noise from another, so the graphs of a seed do
    not depend on ``noise``. Molecules are drawn one at a time (small per-graph
    loops).

    Parameters
    ----------
    num_graphs : int, default 1000
        ``>= 1``: molecules generated.
    seed : int, default 0
        Seeds every draw: the same seed gives the same dataset.
    min_atoms, max_atoms : int, default 9 and 23
        Atoms per molecule, drawn uniformly in ``[min_atoms, max_atoms]`` (``min_atoms``
        at least 1, ``max_atoms`` at least ``min_atoms``).
    mean_rings : float, default 2.0
        ``>= 0``: ring closures attempted per molecule, ``Poisson(mean_rings)``.
    p_double : float, default 0.25
        In $[0, 1]$: the chance a bond with spare valence at both ends becomes double.
    p_triple : float, default 0.1
        In $[0, 1]$: the chance such a new double bond becomes triple.
    noise : float, default 0.0
        ``>= 0``: standard deviation of the Gaussian noise added to a regression target.
    standardize : bool, default False
        Rescale the regression targets to mean 0 and standard deviation 1 over the set.
    task : str, default "regression"
        ``"regression"`` (one target) or ``"multilabel"`` (the six labels
        ``MULTILABEL_NAMES``; ``noise`` and ``standardize`` off).
    name : str, default "synthetic_molecules"
        The dataset's name, printable text.

    Returns
    -------
    GraphDataset
        ``num_graphs`` molecules: ``x`` (N, 6) one-hot atom types, ``edge_attr`` (E, 3)
        one-hot bond types, ``y`` (G, 1) or (G, 6).
    """
    for key, value, low in (("num_graphs", num_graphs, 1), ("min_atoms", min_atoms, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{key} must be an int >= {low}, got {value!r}")
    if isinstance(max_atoms, bool) or not isinstance(max_atoms, (int, np.integer)):
        raise ValueError(f"max_atoms must be an int, got {max_atoms!r}")
    if max_atoms < min_atoms:
        raise ValueError(f"max_atoms ({max_atoms}) must be >= min_atoms ({min_atoms})")
    for key, value in (("mean_rings", mean_rings), ("noise", noise)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
    for key, value in (("p_double", p_double), ("p_triple", p_triple)):
        if not 0 <= value <= 1:
            raise ValueError(f"{key} must be a probability in [0, 1], got {value!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "multilabel" and (noise or standardize):
        raise ValueError("noise and standardize apply to regression targets; leave them off")

    structure_seed, noise_seed = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(structure_seed)
    sizes = rng.integers(min_atoms, max_atoms + 1, size=num_graphs)  # (G,)
    types, sources, targets, orders = [], [], [], []
    counts = np.zeros((num_graphs, len(SUBSTRUCTURE_NAMES)), dtype=np.int64)  # (G, 7)
    labels = np.zeros((num_graphs, len(MULTILABEL_NAMES)), dtype=np.float64)  # (G, 6)
    for g, n in enumerate(sizes.tolist()):
        atom, u, w, order, ring_atoms = _draw_molecule(rng, n, mean_rings, p_double, p_triple)
        types.append(atom)
        # both directions of every bond, sorted by (source, target)
        src, dst = np.concatenate([u, w]), np.concatenate([w, u])  # (2m,)
        by_edge = np.argsort(src * n + dst)
        sources.append(src[by_edge])
        targets.append(dst[by_edge])
        orders.append(np.concatenate([order, order])[by_edge])
        atom_counts = np.bincount(atom, minlength=len(ATOM_TYPES))  # (6,)
        carbon_oxygen = np.sort(np.stack([atom[u], atom[w]]), axis=0)  # (2, m) smaller type first
        counts[g] = (
            u.size - n + 1,
            ring_atoms,
            int((order == 2).sum()),
            int((order == 3).sum()),
            atom_counts[[_N, _O, _S]].sum(),
            atom_counts[[_F, _CL]].sum(),
            int(((order == 2) & (carbon_oxygen[0] == _C) & (carbon_oxygen[1] == _O)).sum()),
        )
        labels[g] = (
            counts[g, 0] >= 2,
            counts[g, 6] >= 1,
            counts[g, 5] >= 1,
            counts[g, 3] >= 1,
            atom_counts[_N] >= 1,
            atom_counts[_S] >= 1,
        )

    if task == "multilabel":
        y = labels  # (G, 6)
    else:
        y = counts @ np.array(TARGET_WEIGHTS)  # (G,)
        if noise:
            y = y + noise * np.random.default_rng(noise_seed).standard_normal(num_graphs)
        if standardize:
            spread = float(y.std())
            y = (y - y.mean()) / (spread if spread > 0 else 1.0)
        y = y.reshape(num_graphs, 1)
    edge_counts = np.array([s.size for s in sources], dtype=np.int64)  # (G,)
    return GraphDataset(
        name=name,
        x=np.eye(len(ATOM_TYPES))[np.concatenate(types)],  # (N, 6)
        edge_index=np.stack([np.concatenate(sources), np.concatenate(targets)]),  # (2, E) local
        edge_attr=np.eye(len(BOND_TYPES))[np.concatenate(orders) - 1],  # (E, 3)
        node_ptr=_pointers(sizes.astype(np.int64)),
        edge_ptr=_pointers(edge_counts),
        y=y,
        task=task,
    )


def _draw_molecule(
    rng: np.random.Generator, n: int, mean_rings: float, p_double: float, p_triple: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """One molecule (steps 1-5 of :func:`synthetic_molecules`): ``(types (n,), u (m,),
    w (m,), order (m,) in {1, 2, 3}, number of ring atoms)``, bonds ``u - w``."""
    # 1 atom types; valence >= 2 first, so that the tree always has an atom to grow from
    drawn = np.searchsorted(_CUMULATIVE, rng.random(n), side="right")  # (n,) inverse CDF
    atom = np.concatenate([drawn[_VALENCE[drawn] >= 2], drawn[_VALENCE[drawn] == 1]])
    heavy = int((_VALENCE[atom] >= 2).sum())
    while n > 1 and (heavy == 0 or n - heavy > _VALENCE[atom[:heavy]].sum() - 2 * (heavy - 1)):
        atom[heavy] = _C  # too many monovalent atoms to attach: one becomes carbon
        heavy += 1
    free = _VALENCE[atom].tolist()  # valence left per atom (Python ints: a scalar loop)

    # 2 tree backbone; open_atoms: the atoms placed so far with valence left, ascending
    choice = rng.random(n)  # (n,)
    open_atoms, u, w = [0], [], []
    for k in range(1, n):
        parent = open_atoms[int(choice[k] * len(open_atoms))]
        free[parent] -= 1
        free[k] -= 1
        if free[parent] == 0:
            open_atoms.remove(parent)
        if free[k] > 0:
            open_atoms.append(k)
        u.append(parent)
        w.append(k)
    tree = np.zeros((n, n), dtype=np.int64)  # tree distances, kept to find ring atoms later
    for parent, k in zip(u, w, strict=True):
        tree[k, :k] = tree[parent, :k] + 1  # (k,) one further than the parent
        tree[:k, k] = tree[k, :k]
    free = np.array(free, dtype=np.int64)  # (n,)

    # 3 ring closures at shortest-path distance 5 or 4 (rings of 6 or 5 atoms)
    shortest = tree.copy()
    in_ring = np.zeros(n, dtype=bool)
    for _ in range(int(rng.poisson(mean_rings))):
        first = 6 if rng.random() < _SIX_RING_SHARE else 5
        both_open = (free[:, None] > 0) & (free[None, :] > 0)  # (n, n)
        pair = None
        for ring_size in (first, 11 - first):
            pairs = np.argwhere(np.triu(both_open & (shortest == ring_size - 1), 1))  # (p, 2)
            if pairs.shape[0]:
                pair = pairs[rng.integers(pairs.shape[0])]
                break
        if pair is None:
            break
        a, b = int(pair[0]), int(pair[1])
        u.append(a)
        w.append(b)
        free[a] -= 1
        free[b] -= 1
        # Every tree edge on the tree path a..b now lies on a cycle; edges covered by no
        # closure's path are bridges, so the union of these paths is exactly the ring atoms.
        in_ring |= tree[a] + tree[b] == tree[a, b]
        via = np.minimum(
            shortest[:, [a]] + 1 + shortest[[b], :], shortest[:, [b]] + 1 + shortest[[a], :]
        )
        shortest = np.minimum(shortest, via)  # (n, n) distances with the new bond

    # 4 bond orders, bonds visited in random order (Python scalars: a short sequential loop)
    left = free.tolist()
    order = [1] * len(u)
    draws = rng.random((len(u), 2)).tolist()  # (m, 2)
    for bond in rng.permutation(len(u)).tolist():
        a, b = u[bond], w[bond]
        if left[a] > 0 and left[b] > 0 and draws[bond][0] < p_double:
            order[bond] = 2
            left[a] -= 1
            left[b] -= 1
            if left[a] > 0 and left[b] > 0 and draws[bond][1] < p_triple:
                order[bond] = 3
                left[a] -= 1
                left[b] -= 1

    # 5 relabel the atoms: old atom i becomes new atom relabel[i]
    relabel = rng.permutation(n)  # (n,)
    new_atom = np.empty_like(atom)
    new_atom[relabel] = atom
    u_arr, w_arr = np.array(u, dtype=np.int64), np.array(w, dtype=np.int64)  # (m,)
    bonds = (relabel[u_arr], relabel[w_arr], np.array(order, dtype=np.int64))
    return new_atom, *bonds, int(in_ring.sum())
