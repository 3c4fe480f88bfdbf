"""Diagnostics of trained models: one module per concern, every public name re-exported here.

- :mod:`refimpl.diagnostics.conservation`: GAT-balance's conservation residual
  (Thm 2.2, Eq. 3/7), balancedness (Cor 2.3-2.4), relative gradient norms and
  parameter change (Fig. 3-5, 8, 11-12). ``ConservationResidual``,
  ``conservation_residuals``, ``balancedness``, ``balancedness_summary``,
  ``grad_norms``, ``relative_grad_norms``, ``parameter_changes``,
  ``fraction_changed``.
- :mod:`refimpl.diagnostics.massive_activations`: massive activations, the
  max/median activation ratio and the gamma-fit Kolmogorov-Smirnov test of the
  massive-activations supplement (Sec. 3). ``max_median_ratio``,
  ``activation_ratios``, ``log_ratios``, ``gamma_ks_test``,
  ``ratio_distribution_test``.
- :mod:`refimpl.diagnostics.massive_activations_per_graph`: the largest ratio of each graph
  of a batch. ``max_ratio_per_graph``.
- :mod:`refimpl.diagnostics.massive_activations_report`: those statistics per
  layer, base against trained. ``summarize_activations``,
  ``compare_base_trained``, ``format_comparison``, ``plot_ratio_distributions``.

``from refimpl.diagnostics import balancedness`` (and every other name above)
works as before the split.
"""

from refimpl.diagnostics.conservation import (
    ConservationResidual,
    balancedness,
    balancedness_summary,
    conservation_residuals,
    fraction_changed,
    grad_norms,
    parameter_changes,
    relative_grad_norms,
)
from refimpl.diagnostics.massive_activations import (
    DEFAULT_EPS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_THRESHOLD,
    MEDIANS,
    LogRatios,
    activation_ratios,
    gamma_ks_test,
    log_ratios,
    max_median_ratio,
    ratio_distribution_test,
)
from refimpl.diagnostics.massive_activations_per_graph import GraphRatios, max_ratio_per_graph
from refimpl.diagnostics.massive_activations_report import (
    ActivationSummary,
    LayerComparison,
    compare_base_trained,
    format_comparison,
    plot_ratio_distributions,
    summarize_activations,
)

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_THRESHOLD",
    "MEDIANS",
    "ActivationSummary",
    "ConservationResidual",
    "GraphRatios",
    "LayerComparison",
    "LogRatios",
    "activation_ratios",
    "balancedness",
    "balancedness_summary",
    "compare_base_trained",
    "conservation_residuals",
    "format_comparison",
    "fraction_changed",
    "gamma_ks_test",
    "grad_norms",
    "log_ratios",
    "max_median_ratio",
    "max_ratio_per_graph",
    "parameter_changes",
    "plot_ratio_distributions",
    "ratio_distribution_test",
    "relative_grad_norms",
    "summarize_activations",
]
