"""Massive-activation reports: base vs trained per layer, the table, the plot, bad layers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from refimpl.diagnostics import (
    DEFAULT_THRESHOLD,
    compare_base_trained,
    format_comparison,
    plot_ratio_distributions,
)
from tests.diagnostics.test_massive_activations import RTOL64, plant

# -- base vs trained ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_and_trained() -> tuple[dict, dict]:
    rng = np.random.default_rng(9)
    clean, other = rng.standard_normal((200, 16)), rng.standard_normal((150, 16))
    rows = np.zeros(150, dtype=bool)
    rows[[5, 70]] = True
    base = {"layer0": clean, "layer1_attention_out": other}
    trained = {  # layer0 rescaled (identical ratios), layer1 with two planted MAs
        "layer0": 2.0 * clean,
        "layer1_attention_out": plant(other, rows, np.full(2, 3 * DEFAULT_THRESHOLD), "midpoint"),
    }
    return base, trained


def test_compare_base_trained_flags_only_the_planted_layer(base_and_trained) -> None:
    records = compare_base_trained(*base_and_trained, max_samples=None)
    assert [r.layer for r in records] == ["layer0", "layer1_attention_out"]
    unchanged, planted = records
    assert unchanged.base == unchanged.trained
    assert not unchanged.flagged and unchanged.ks_increase == 0.0
    assert planted.flagged and not planted.base.flagged
    assert planted.trained.max_ratio == pytest.approx(3 * DEFAULT_THRESHOLD, rel=RTOL64)
    assert planted.ks_increase > 0.0

    table = format_comparison(records).splitlines()
    assert len(table) == 2 + 2 * len(records)
    assert len({len(line) for line in table}) == 1  # fixed width
    assert table[2].startswith("layer0") and table[4].startswith("layer1_attention_out")
    assert [line.split()[-1] for line in table[2:]] == ["no", "no", "no", "yes"]


def test_plot_writes_a_png(base_and_trained, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_ratio_distributions(*base_and_trained, tmp_path / "ratios.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_has_one_axes_per_layer(base_and_trained, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    base, trained = base_and_trained
    base = {**base, "layer2": base["layer0"][:50], "layer3": base["layer0"][50:120]}
    trained = {**trained, "layer2": trained["layer0"][:50], "layer3": trained["layer0"][50:120]}
    path = plot_ratio_distributions(base, trained, tmp_path / "ratios.svg", columns=3)
    # One <g id="axes_k"> group per axes: the 2 x 3 grid's two spare axes are removed.
    assert len(re.findall(r'<g id="axes_\d+"', path.read_text())) == len(base) == 4


# -- bad input ---------------------------------------------------------------------------------


def test_mismatched_layers() -> None:
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        compare_base_trained({"a": x, "b": x}, {"a": x, "c": x})
    with pytest.raises(TypeError, match="non-empty mapping"):
        compare_base_trained({}, {})
