r"""Massive activations per graph of a batch: the largest max/median ratio of each graph.

The ratio $\rho_i$ and its conventions (median, zero medians) are those of
:mod:`refimpl.diagnostics.massive_activations`; this module reduces them over the rows of
each graph, as PyG's ``batch`` vector assigns them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import to_numpy
from refimpl.diagnostics.massive_activations import (
    DEFAULT_THRESHOLD,
    _check_threshold,
    max_median_ratio,
)
from refimpl.validation import check_array

__all__ = ["GraphRatios", "max_ratio_per_graph"]


class GraphRatios(NamedTuple):
    r"""The largest row ratio of each graph of a batch.

    Attributes
    ----------
    max_ratio : numpy.ndarray
        ``(num_graphs,)`` float64, $\max_{i : batch_i = g} \rho_i$ per graph $g$; NaN for a
        graph with no rows.
    flagged : numpy.ndarray
        ``(num_graphs,)`` bool, ``max_ratio > threshold`` (False for NaN).
    """

    max_ratio: np.ndarray
    flagged: np.ndarray


def max_ratio_per_graph(
    x: Any,
    batch: Any,
    num_graphs: int,
    median: str = "midpoint",
    threshold: float = DEFAULT_THRESHOLD,
) -> GraphRatios:
    r"""Per graph $g$, $\max_{i : batch_i = g} \rho_i$ and whether it exceeds ``threshold``.

    Strictly greater: a ratio equal to the threshold is not flagged.

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        A batch's node or edge activations, one row each; ``C`` channels.
    batch : (R,) integer array, NumPy or CuPy
        The graph id of each row, in ``[0, num_graphs)``, as PyG's ``batch`` vector.
    num_graphs : int
        Positive: the number of graphs in the batch (a graph with no rows gets NaN).
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.
    threshold : float, default ``DEFAULT_THRESHOLD`` (1000)
        Positive; a graph whose largest ratio is above it holds a massive activation.

    Returns
    -------
    GraphRatios
        Each graph's largest ratio and its flag, host arrays of shape ``(num_graphs,)``.
    """
    ratios = max_median_ratio(x, median)  # (R,) host
    threshold = _check_threshold(threshold)
    if isinstance(num_graphs, bool) or not isinstance(num_graphs, int) or num_graphs < 1:
        raise ValueError(f"num_graphs must be a positive int, got {num_graphs!r}")
    check_array(batch, "batch", shape=(ratios.size,), floating=False)
    graph_of = to_numpy(batch)
    if graph_of.dtype.kind not in "iu":
        raise TypeError(f"batch must hold integer graph ids, got dtype {graph_of.dtype}")
    if graph_of.min() < 0 or graph_of.max() >= num_graphs:
        raise ValueError(
            f"batch ids must lie in [0, {num_graphs}), got [{graph_of.min()}, {graph_of.max()}]; "
            "pass num_graphs = the number of graphs in the batch"
        )
    maxima = np.full(num_graphs, -np.inf)
    np.maximum.at(maxima, graph_of, ratios)
    maxima[maxima == -np.inf] = np.nan  # ratios are >= 1, so -inf marks a graph with no rows
    return GraphRatios(maxima, maxima > threshold)  # NaN > t is False
