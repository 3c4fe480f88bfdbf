"""``plot_ratio_distributions(..., records=...)``: the comparison's fits are drawn, not refitted.

The plot with ``records`` must be byte for byte the plot without them (the same samples, the
same maximum-likelihood fits), while the gamma fit is not run again; records of other layers
or made with other sampling options are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import refimpl.diagnostics.massive_activations_report as report
from refimpl.diagnostics import DEFAULT_THRESHOLD, compare_base_trained, plot_ratio_distributions
from tests.diagnostics.test_massive_activations import plant


@pytest.fixture(scope="module")
def layers() -> tuple[dict, dict]:
    rng = np.random.default_rng(21)
    first, second = rng.standard_normal((120, 16)), rng.standard_normal((90, 24))
    rows = np.zeros(90, dtype=bool)
    rows[[3, 40]] = True
    base = {"layer0": first, "layer1": second}
    trained = {
        "layer0": rng.standard_normal((120, 16)),
        "layer1": plant(second, rows, np.full(2, 5 * DEFAULT_THRESHOLD), "midpoint"),
    }
    return base, trained


def test_records_draw_the_same_plot_without_fitting_again(layers, tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    options = {"max_samples": 1000, "seed": 3}  # subsampled: the records must match the draws
    records = compare_base_trained(*layers, **options)
    refitted = plot_ratio_distributions(*layers, tmp_path / "refitted.png", **options)

    fits, fit = [], report.gamma_ks_test

    def counted_fit(t: np.ndarray) -> dict:
        fits.append(t)
        return fit(t)

    monkeypatch.setattr(report, "gamma_ks_test", counted_fit)
    reused = plot_ratio_distributions(*layers, tmp_path / "reused.png", records=records, **options)
    assert fits == []  # no gamma fit with records
    assert reused.read_bytes() == refitted.read_bytes()

    plot_ratio_distributions(*layers, tmp_path / "counted.png", **options)
    assert len(fits) == 2 * len(records)  # without records: base and trained per layer


def test_records_of_other_layers_or_options_are_refused(layers, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    base, trained = layers
    records = compare_base_trained(base, trained, max_samples=1000)
    with pytest.raises(ValueError, match=r"records' layers differ.*missing \['layer1'\]"):
        plot_ratio_distributions(base, trained, tmp_path / "a.png", records=records[:1])
    with pytest.raises(ValueError, match="more than once"):
        plot_ratio_distributions(base, trained, tmp_path / "a.png", records=records * 2)
    with pytest.raises(ValueError, match=r"fitted to 1000 values but here 1920 are drawn"):
        plot_ratio_distributions(base, trained, tmp_path / "a.png", records=records)
    with pytest.raises(TypeError, match="LayerComparison"):
        plot_ratio_distributions(base, trained, tmp_path / "a.png", records=[records[0].base])
    with pytest.raises(TypeError, match="list of LayerComparison"):
        plot_ratio_distributions(
            base, trained, tmp_path / "a.png", records={r.layer: r for r in records}
        )
