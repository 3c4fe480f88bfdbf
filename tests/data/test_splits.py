"""random_split (seeded, per-class or fractions) and drop_features (LipschitzNorm Sec. 7.1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.data import NodeDataset, contextual_sbm, drop_features, random_split
from refimpl.testing.strategies import seeds


def labels(counts: list[int], seed: int = 0) -> np.ndarray:
    """Shuffled class ids with ``counts[c]`` nodes in class ``c``."""
    y = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(seed).permutation(y)


def test_per_class_split_counts_and_reproducibility() -> None:
    y = labels([300, 400, 500, 350, 450])
    train, val, test = random_split(y, np.random.default_rng(7))
    np.testing.assert_array_equal(np.bincount(y[train]), [20] * 5)  # default: 20 per class
    assert (int(val.sum()), int(test.sum())) == (500, 1000)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    again = random_split(y, np.random.default_rng(7), train_per_class=20)
    for a, b in zip((train, val, test), again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = random_split(y, np.random.default_rng(8))
    assert not np.array_equal(train, other[0])


@given(
    counts=st.lists(st.integers(3, 30), min_size=1, max_size=5),
    per_class=st.integers(0, 3),
    num_val=st.integers(0, 10),
    seed=seeds(),
)
def test_per_class_split_properties(
    counts: list[int], per_class: int, num_val: int, seed: int
) -> None:
    y = labels(counts, seed)
    rest = y.size - per_class * len(counts)
    num_test = max(0, min(rest - num_val, 7))
    if rest < num_val + num_test:
        with pytest.raises(ValueError, match=r"only \d+ nodes remain"):
            random_split(
                y,
                np.random.default_rng(seed),
                train_per_class=per_class,
                num_val=num_val,
                num_test=num_test,
            )
        return
    train, val, test = random_split(
        y,
        np.random.default_rng(seed),
        train_per_class=per_class,
        num_val=num_val,
        num_test=num_test,
    )
    np.testing.assert_array_equal(
        np.bincount(y[train], minlength=len(counts)), [per_class] * len(counts)
    )
    assert (int(val.sum()), int(test.sum())) == (num_val, num_test)
    assert int((train.astype(int) + val + test).max()) <= 1


def test_class_too_small_is_named() -> None:
    y = labels([30, 30, 3])
    with pytest.raises(ValueError, match="train_per_class=20: class 2 has 3"):
        random_split(y, np.random.default_rng(0))


def test_too_few_remaining_nodes() -> None:
    with pytest.raises(ValueError, match=r"only 20 nodes remain .* num_val \+ num_test = 500"):
        random_split(labels([30, 30]), np.random.default_rng(0))


def test_fractions_split() -> None:
    y = labels([101, 102])  # N = 203: sizes rounded down
    train, val, test = random_split(y, np.random.default_rng(1), fractions=(0.5, 0.25, 0.25))
    assert [int(m.sum()) for m in (train, val, test)] == [101, 50, 50]
    assert int((train.astype(int) + val + test).max()) == 1
    again = random_split(y, np.random.default_rng(1), fractions=(0.5, 0.25, 0.25))
    np.testing.assert_array_equal(train, again[0])
    # Multi-label targets: only the number of rows matters.
    multi = np.zeros((40, 3))
    assert (
        int(random_split(multi, np.random.default_rng(0), fractions=(0.6, 0.2, 0.2))[0].sum()) == 24
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fractions": (0.6, 0.3, 0.2)}, "summing to at most 1"),
        ({"fractions": (0.5, -0.1, 0.2)}, "non-negative"),
        ({"fractions": (0.5, 0.5)}, "three"),
        ({"fractions": (0.5, 0.2, 0.2), "train_per_class": 5}, "not both"),
        ({"train_per_class": -1}, ">= 0"),
    ],
)
def test_split_argument_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        random_split(labels([50, 50]), np.random.default_rng(0), **kwargs)


def test_per_class_needs_class_ids() -> None:
    with pytest.raises(ValueError, match="use fractions= for multi-label"):
        random_split(np.zeros((10, 2)), np.random.default_rng(0), train_per_class=1)
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        random_split(labels([5]), 0, train_per_class=1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def csbm() -> NodeDataset:
    return contextual_sbm(400, 4, np.random.default_rng(0))


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_drop_features_fraction_and_training_rows(csbm: NodeDataset, p: float) -> None:
    assert csbm.x.any(axis=1).all()  # no zero rows before: every zero row below was dropped
    out = drop_features(csbm, p, np.random.default_rng(3))
    unlabelled = ~csbm.train_mask  # V_u: everything outside the training set
    zeroed = ~out.x.any(axis=1)
    assert int(zeroed.sum()) == round(p * int(unlabelled.sum()))  # |M| = p |V_u|
    assert not (zeroed & csbm.train_mask).any()
    np.testing.assert_array_equal(out.x[csbm.train_mask], csbm.x[csbm.train_mask])
    np.testing.assert_array_equal(out.x[~zeroed], csbm.x[~zeroed])  # the rest untouched
    assert out.graph is csbm.graph and out.y is csbm.y
    assert csbm.x.any(axis=1).all()  # input not mutated


def test_drop_features_seeded_and_validated(csbm: NodeDataset) -> None:
    a = drop_features(csbm, 0.4, np.random.default_rng(5))
    b = drop_features(csbm, 0.4, np.random.default_rng(5))
    c = drop_features(csbm, 0.4, np.random.default_rng(6))
    np.testing.assert_array_equal(a.x, b.x)
    assert not np.array_equal(a.x, c.x)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]"):
        drop_features(csbm, 1.5, np.random.default_rng(0))
