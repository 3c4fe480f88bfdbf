"""The reliability harness's modules (``scripts/reliability.py`` runs them): bad inputs for
every public surface of refimpl, each outcome classified and counted.

:data:`SURFACES` names the groups in the order the table prints them; each module's
``cases()`` returns its cases in a fixed order, made from fixed seeds, so that every run
(and every worker process of one run) feeds the same inputs. ``--quick`` keeps every
``QUICK_STRIDE[name]``-th case of a group (the valid inputs first among them).
"""

from __future__ import annotations

import importlib

from reliability_cases.outcomes import Case

# name -> (module, what the group covers)
SURFACES = {
    "layers": (
        "layers",
        "GATConv (v1/v2, edge features, fill values, bipartite, CSR), Linear, "
        "TransformerConv, NodeFormerConv, GraphTransformerLayer: forward and backward",
    ),
    "models": ("models", "GAT, NodeFormer, GraphTransformer: forward and backward"),
    "graph": ("graph_config", "Graph: edge_index shapes, dtypes, ranges; node counts"),
    "config": (
        "configs",
        "configuration objects: layers, models, TrainConfig, GraphTrainConfig, optimisers",
    ),
    "data": (
        "data_files",
        "refimpl.data loaders on damaged Planetoid and Geom-GCN files, .npz graph datasets",
    ),
    "checkpoints": ("checkpoints", "load_checkpoint on damaged files and state; resume"),
    "crosscheck": (
        "crosscheck_files",
        "crosscheck files: keys, dtypes, shapes, configs, "
        "altered results; check_pyg_module when torch_geometric is installed",
    ),
    "cli": (
        "commands",
        "refimpl train/sweep/plot/crosscheck/golden options, plot logs (subprocesses)",
    ),
    "runs": (
        "run_folders",
        "run folders: a second command on a live run, resume with changed "
        "options, SIGKILL during writes then resume, users' files (subprocesses)",
    ),
}
# --quick keeps every k-th case: about a minute on two cores in all
QUICK_STRIDE = {
    "layers": 40,
    "models": 25,
    "graph": 8,
    "config": 25,
    "data": 6,
    "checkpoints": 6,
    "crosscheck": 10,
    "cli": 25,
    "runs": 8,
}


def surface_cases(name: str, quick: bool = False, only: str | None = None) -> list[Case]:
    """The cases of surface ``name``: all of them, the quick sample, or those whose name
    contains ``only``. A name ``module:function`` is a surface of one's own, outside the
    table (the harness's tests use one): ``function()`` returns its cases."""
    if ":" in name:
        module_name, function = name.split(":")
        cases = getattr(importlib.import_module(module_name), function)()
    else:
        cases = importlib.import_module(f"reliability_cases.{SURFACES[name][0]}").cases()
    if quick:
        cases = cases[:: QUICK_STRIDE.get(name, 1)]
    if only is not None:
        cases = [case for case in cases if only in case.name]
    return cases
