"""Massive activations per layer: summaries, base against trained, a table and a plot.

MA-supp Sec. 3 compares each layer's activations in the untrained (base) and
the trained model: the KS statistic ``D_n`` of the gamma fit to
``t = -log10(r + eps)`` (Sec. 3.2 steps 1-4) and the largest max/median ratio
``rho``, flagged as a massive activation above a threshold (default 1000).
The statistics themselves, their shapes and conventions (median, zero
medians, where ``eps`` sits, subsampling, how to read ``D_n`` and the p-value)
are in :mod:`refimpl.diagnostics.massive_activations`; this module gathers
them per array and per layer:

- :func:`summarize_activations`: one ``(R, C)`` array ->
  :class:`ActivationSummary` (:func:`ratio_distribution_test` plus the
  largest ``rho`` and whether it exceeds the threshold);
- :func:`compare_base_trained`: ``{layer: (R, C)}`` of base and trained ->
  one :class:`LayerComparison` per layer; same-shaped arrays are sampled at
  the same positions, so ``ks_increase`` compares like with like;
- :func:`format_comparison`: a fixed-width text table of those records;
- :func:`plot_ratio_distributions`: per layer, histograms of ``t`` with the
  fitted gamma densities (needs matplotlib); given ``records=`` (the
  comparison's result) it draws their fits instead of fitting again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refimpl.diagnostics.massive_activations import (
    DEFAULT_EPS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_THRESHOLD,
    _check_threshold,
    gamma_ks_test,
    log_ratios,
    max_median_ratio,
    ratio_distribution_test,
)
from refimpl.validation import check_keys

__all__ = [
    "ActivationSummary",
    "LayerComparison",
    "compare_base_trained",
    "format_comparison",
    "plot_ratio_distributions",
    "summarize_activations",
]


# -- per array, per layer ----------------------------------------------------------------------


class ActivationSummary(NamedTuple):
    r"""One array's MA statistics: :func:`ratio_distribution_test` and the largest $\rho$.

    Attributes
    ----------
    ks_statistic : float
        $D_n$, the KS statistic of the sample against the fitted gamma (MA-supp Eq. 15).
    p_value : float
        The KS test's p-value (conservative for a fitted gamma: compare $D_n$ instead).
    gamma_shape, gamma_loc, gamma_scale : float
        The gamma fitted by maximum likelihood: shape $k$, location, scale $\theta$.
    mean_loglik : float
        Mean log-density of the sample under the fitted gamma.
    num_samples : int
        Finite $t$ the gamma was fitted to.
    num_nonfinite : int
        Sampled elements dropped because their $t$ was infinite.
    max_ratio : float
        The largest max/median ratio $\rho_i$ over the rows (:func:`max_median_ratio`).
    flagged : bool
        ``max_ratio > threshold``: the array holds a massive activation.
    """

    ks_statistic: float
    p_value: float
    gamma_shape: float
    gamma_loc: float
    gamma_scale: float
    mean_loglik: float
    num_samples: int
    num_nonfinite: int
    max_ratio: float
    flagged: bool


def summarize_activations(
    x: Any,
    threshold: float = DEFAULT_THRESHOLD,
    median: str = "midpoint",
    eps: float = DEFAULT_EPS,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    seed: int | None = 0,
) -> ActivationSummary:
    """:func:`ratio_distribution_test` and the largest max/median ratio of one ``(R, C)`` array.

    Parameters
    ----------
    x : (R, C) finite float array, NumPy or CuPy
        One row per node, edge or (edge, head); ``C`` channels.
    threshold : float, default ``DEFAULT_THRESHOLD`` (1000)
        Positive; a max/median ratio above it is a massive activation (flagged).
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.
    eps : float, default ``DEFAULT_EPS`` (1e-12)
        Finite, ``>= 0``: inside the log, as in :func:`log_ratios`.
    max_samples : int or None, default ``DEFAULT_MAX_SAMPLES`` (100 000)
        Elements sampled per array for the fit, as in :func:`log_ratios` (``None``: all).
    seed : int or None, default 0
        Seed of the sampled positions, as in :func:`log_ratios`.

    Returns
    -------
    ActivationSummary
        The KS test of the sample, the largest ratio and its flag.
    """
    threshold = _check_threshold(threshold)
    largest = float(max_median_ratio(x, median).max())
    test = ratio_distribution_test(x, median, eps, max_samples, seed)
    return ActivationSummary(**test, max_ratio=largest, flagged=largest > threshold)


class LayerComparison(NamedTuple):
    """Base and trained statistics of one layer (MA-supp Sec. 3: base against trained).

    Attributes
    ----------
    layer : str
        The layer's name, a key of the activations compared.
    base : ActivationSummary
        The untrained model's statistics.
    trained : ActivationSummary
        The trained model's statistics.
    """

    layer: str
    base: ActivationSummary
    trained: ActivationSummary

    @property
    def flagged(self) -> bool:
        """The trained activations hold an MA (max/median ratio above the threshold)."""
        return self.trained.flagged

    @property
    def ks_increase(self) -> float:
        """``D_n(trained) - D_n(base)``: positive when training moved away from the gamma."""
        return self.trained.ks_statistic - self.base.ks_statistic


def _check_layers(base: Any, trained: Any) -> list[str]:
    for name, value in (("base", base), ("trained", trained)):
        if not isinstance(value, Mapping) or not value:
            raise TypeError(
                f"{name} must be a non-empty mapping of layer name -> (R, C) activations, "
                f"got {type(value).__name__}"
            )
    layers = list(base)
    check_keys(trained, layers, "trained layers differ from base layers", "pass the same layers")
    return layers


def compare_base_trained(
    base: Mapping[str, Any],
    trained: Mapping[str, Any],
    threshold: float = DEFAULT_THRESHOLD,
    median: str = "midpoint",
    *,
    eps: float = DEFAULT_EPS,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    seed: int | None = 0,
) -> list[LayerComparison]:
    """Per layer (``base``'s order), :func:`summarize_activations` of base and trained.

    Same-shaped arrays are sampled at the same positions, so the two $D_n$ compare like
    with like.

    Parameters
    ----------
    base : mapping of str to (R, C) float array
        Non-empty: layer name to that layer's activations in the untrained model.
    trained : mapping of str to (R, C) float array
        The same layers' activations for the same inputs through the trained model.
    threshold : float, default ``DEFAULT_THRESHOLD`` (1000)
        Positive; a max/median ratio above it is a massive activation (flagged).
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.
    eps : float, default ``DEFAULT_EPS`` (1e-12)
        Finite, ``>= 0``: inside the log, as in :func:`log_ratios`.
    max_samples : int or None, default ``DEFAULT_MAX_SAMPLES`` (100 000)
        Elements sampled per array for the fit, as in :func:`log_ratios` (``None``: all).
    seed : int or None, default 0
        Seed of the sampled positions, as in :func:`log_ratios`.

    Returns
    -------
    list of LayerComparison
        One per layer, in ``base``'s order.
    """
    layers = _check_layers(base, trained)
    options = {"threshold": threshold, "median": median, "eps": eps}
    options |= {"max_samples": max_samples, "seed": seed}
    return [
        LayerComparison(
            layer,
            summarize_activations(base[layer], **options),
            summarize_activations(trained[layer], **options),
        )
        for layer in layers
    ]


def format_comparison(records: list[LayerComparison]) -> str:
    """A fixed-width table of :func:`compare_base_trained`: two lines (base, trained) per layer.

    Parameters
    ----------
    records : list of LayerComparison
        What :func:`compare_base_trained` returned.

    Returns
    -------
    str
        A header, a rule, then per layer its base and trained $D_n$, p-value, gamma shape,
        location and scale, largest ratio and ``yes``/``no`` for a massive activation.
    """
    width = max([len("layer"), *(len(r.layer) for r in records)])
    header = (
        f"{'layer':<{width}}  {'model':<7}  {'KS D_n':>8}  {'p-value':>9}  {'shape':>9}  "
        f"{'loc':>10}  {'scale':>10}  {'max ratio':>10}   MA"
    )
    lines = [header, "-" * len(header)]
    for record in records:
        for label, s in (("base", record.base), ("trained", record.trained)):
            name = record.layer if label == "base" else ""
            lines.append(
                f"{name:<{width}}  {label:<7}  {s.ks_statistic:>8.4f}  {s.p_value:>9.2e}  "
                f"{s.gamma_shape:>9.4g}  {s.gamma_loc:>10.4g}  {s.gamma_scale:>10.4g}  "
                f"{s.max_ratio:>10.4g}  {'yes' if s.flagged else 'no':>3}"
            )
    return "\n".join(lines)


# -- plot --------------------------------------------------------------------------------------


def _fits_by_layer(records: Any, layers: list[str]) -> dict[str, LayerComparison]:
    """``records`` (one :class:`LayerComparison` per layer of ``layers``) keyed by layer."""
    if isinstance(records, (str, Mapping)) or not isinstance(records, Sequence):
        raise TypeError(
            "records must be the list of LayerComparison that compare_base_trained returns, "
            f"got {type(records).__name__}"
        )
    for record in records:
        if not isinstance(record, LayerComparison):
            raise TypeError(
                f"records must hold LayerComparison (from compare_base_trained), "
                f"got a {type(record).__name__}"
            )
    by_layer = {record.layer: record for record in records}
    if len(by_layer) != len(records):
        raise ValueError("records name a layer more than once; pass one record per layer")
    check_keys(
        by_layer,
        layers,
        "records' layers differ from base's",
        "pass compare_base_trained(base, trained, ...) of the same layers",
    )
    return by_layer


def plot_ratio_distributions(
    base: Mapping[str, Any],
    trained: Mapping[str, Any],
    path: str | Path,
    *,
    records: Sequence[LayerComparison] | None = None,
    median: str = "midpoint",
    eps: float = DEFAULT_EPS,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    seed: int | None = 0,
    threshold: float = DEFAULT_THRESHOLD,
    bins: int = 60,
    columns: int = 3,
    dpi: int = 120,
) -> Path:
    r"""Per layer, histograms of $t$ (base and trained) with each fitted gamma density on top.

    One axes per layer, with a dashed line at $t = -\log_{10}(\text{threshold})$ (MAs lie
    left of it); the samples and fits are those of :func:`compare_base_trained` with the
    same options. Drawn on an Agg canvas without pyplot, so the caller's matplotlib backend
    and open figures are untouched. Needs matplotlib (``pip install -e ".[plot]"``).

    Parameters
    ----------
    base : mapping of str to (R, C) float array
        Non-empty: layer name to that layer's activations in the untrained model.
    trained : mapping of str to (R, C) float array
        The same layers' activations through the trained model.
    path : str or pathlib.Path
        The image written; its suffix picks the format (``.png``, ``.svg``, ``.pdf``).
    records : sequence of LayerComparison or None, default None
        :func:`compare_base_trained`'s result for these arrays and options: its gamma
        parameters and $D_n$ are drawn instead of fitting again (only the samples $t$ are
        recomputed, for the histograms; a record whose sample size differs from them was
        made with other options: ValueError). ``None``: fit here.
    median : ``"midpoint"`` or ``"lower"``, default ``"midpoint"``
        NumPy's median or torch.median's, as in :func:`max_median_ratio`.
    eps : float, default ``DEFAULT_EPS`` (1e-12)
        Finite, ``>= 0``: inside the log, as in :func:`log_ratios`.
    max_samples : int or None, default ``DEFAULT_MAX_SAMPLES`` (100 000)
        Elements sampled per array for the fit, as in :func:`log_ratios` (``None``: all).
    seed : int or None, default 0
        Seed of the sampled positions, as in :func:`log_ratios`.
    threshold : float, default ``DEFAULT_THRESHOLD`` (1000)
        Positive; a max/median ratio above it is a massive activation (flagged).
    bins : int, default 60
        Histogram bins, shared by base and trained on one axes.
    columns : int, default 3
        Axes per row of the grid (fewer when there are fewer layers).
    dpi : int, default 120
        Resolution of a raster format.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            'plot_ratio_distributions needs matplotlib: pip install -e ".[plot]"'
        ) from err
    from scipy import stats

    layers = _check_layers(base, trained)
    threshold = _check_threshold(threshold)
    fits = None if records is None else _fits_by_layer(records, layers)
    columns = min(columns, len(layers))
    rows = math.ceil(len(layers) / columns)
    figure = Figure(figsize=(4.5 * columns, 3.4 * rows))
    FigureCanvasAgg(figure)
    grid = figure.subplots(rows, columns, squeeze=False)
    for axis in grid.ravel()[len(layers) :]:
        figure.delaxes(axis)
    for axis, layer in zip(grid.ravel(), layers, strict=False):
        samples = {}
        for label, arrays in (("base", base), ("trained", trained)):
            t = log_ratios(arrays[layer], median, eps, max_samples, seed).values
            if fits is None:
                fit = gamma_ks_test(t)
            else:
                fit = getattr(fits[layer], label)._asdict()
                if fit["num_samples"] != t.size:
                    raise ValueError(
                        f"records[{layer!r}].{label} was fitted to {fit['num_samples']} values "
                        f"but here {t.size} are drawn: pass records made by "
                        "compare_base_trained with the same median, eps, max_samples and seed"
                    )
            samples[label] = (t, fit)
        edges = np.histogram_bin_edges(np.concatenate([t for t, _ in samples.values()]), bins)
        grid_t = np.linspace(edges[0], edges[-1], 400)
        for (label, (t, fit)), colour in zip(samples.items(), ("C0", "C3"), strict=True):
            axis.hist(t, bins=edges, density=True, alpha=0.45, color=colour, label=label)
            density = stats.gamma.pdf(
                grid_t, fit["gamma_shape"], fit["gamma_loc"], fit["gamma_scale"]
            )
            fit_label = f"gamma fit, D={fit['ks_statistic']:.3f}"
            axis.plot(grid_t, density, color=colour, label=fit_label)
        axis.axvline(-math.log10(threshold), color="grey", linestyle="--", label="threshold")
        axis.set(title=layer, xlabel="t = -log10(|x| / median + eps)", ylabel="density")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    return Path(path)
