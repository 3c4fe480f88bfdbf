"""``scripts/mutate.py`` and its operators on tiny snippets: what each operator writes, stable
ids, the module-to-tests mapping, the kill rate. No mutation run here (docs/mutation.md)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

SNIPPET = """\
RESIDUAL_TOL = 1e-10
BROKEN_AT_LEAST = 1e-3
SIZE = 64


def backward(x, d_out, edge_index):
    d_x = -d_out * 2.0 + x
    d_x += d_out[edge_index[0]]
    return d_x if x < 1 else att_src


def cor1_bound(m, n):
    return np.e * np.sqrt(m / n) + np.sqrt(8.0)


def untouched(x):
    return x + 1.0
"""


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # mutate.py imports mutation_operators
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def ops(monkeypatch):
    return _load("mutation_operators", monkeypatch)


@pytest.fixture()
def mutate(monkeypatch):
    return _load("mutate", monkeypatch)


def _mutants(ops, source: str = SNIPPET):
    scope = ops.Scope(lambda name: name in ("backward", "cor1_bound"), lambda name: name.isupper())
    return ops.mutants_of("pkg/mod.py", source, scope)


def _triples(mutants) -> set[tuple[str, str, str]]:
    return {(m.operator, m.original, m.mutated) for m in mutants}


def test_each_operator_writes_the_expected_mutant(ops) -> None:
    # Guards the operator set of the module docstring, one bug of each kind.
    triples = _triples(_mutants(ops))
    expected = {
        ("sign", "-d_out * 2.0 + x", "-d_out * 2.0 - x"),
        ("sign", "-d_out", "d_out"),
        ("drop_term", "-d_out * 2.0 + x", "-d_out * 2.0"),
        ("drop_term", "-d_out * 2.0 + x", "x"),
        ("drop_term", "d_x += d_out[edge_index[0]]", "d_x = d_out[edge_index[0]]"),
        ("swap_src_dst", "edge_index[0]", "edge_index[1]"),
        ("swap_src_dst", "att_src", "att_dst"),
        ("scale_const", "2.0", "20.0"),
        ("scale_const", "2.0", "0.2"),
        ("scale_const", "8.0", "80.0"),
        ("slip", "-d_out * 2.0 + x", "(-d_out * 2.0 + x) * (1 + 0.0001)"),
        ("loosen", "x < 1", "x <= 1"),
        ("loosen", "1e-10", "1e-09"),  # an upper tolerance: x10
        ("loosen", "0.001", "0.0001"),  # a lower bound (AT_LEAST): /10
        ("scale_const", "64", "640"),  # not a tolerance: both ways
        ("scale_const", "64", "6.4"),
    }
    assert expected <= triples, expected - triples
    # Tolerances are only loosened, and nothing outside the scope is touched.
    assert ("scale_const", "1e-10", "1e-11") not in triples
    assert all(m.function in ("backward", "cor1_bound", "<module>") for m in _mutants(ops))


def test_a_mutant_changes_its_span_and_nothing_else(ops) -> None:
    # Guards apply: the splice parses, differs from the original, and reads like it.
    (sqrt80,) = [m for m in _mutants(ops) if m.mutated == "80.0"]
    mutated = ops.apply(SNIPPET, sqrt80)
    assert mutated == SNIPPET.replace("np.sqrt(8.0)", "np.sqrt((80.0))")
    (overwrite,) = [m for m in _mutants(ops) if m.original.startswith("d_x +=")]
    assert "    d_x = d_out[edge_index[0]]\n" in ops.apply(SNIPPET, overwrite)
    for mutant in _mutants(ops):
        assert ast.dump(ast.parse(ops.apply(SNIPPET, mutant))) != ast.dump(ast.parse(SNIPPET))


def test_ids_are_stable_across_line_shifts_and_unique(ops) -> None:
    # Guards the ids of docs/mutation.md and mutation_equivalents.json: not line numbers.
    before = {m.id: (m.operator, m.original, m.mutated) for m in _mutants(ops)}
    shifted = "import numpy as np\n\n\n" + SNIPPET.replace("x + 1.0", "x + 2.0")
    after = {m.id: (m.operator, m.original, m.mutated) for m in _mutants(ops, shifted)}
    assert before == after
    assert len(before) == len(_mutants(ops))  # two scale_const of one constant: two ids


def test_the_same_text_twice_in_a_function_gives_two_ids(ops) -> None:
    source = "def backward(a, b):\n    c = a + b\n    return a + b\n"
    mutants = ops.mutants_of("m.py", source, ops.Scope(lambda name: True))
    flips = [m for m in mutants if m.mutated == "a - b"]
    assert len(flips) == 2 and flips[0].id != flips[1].id


def write_tree(root: Path, files: dict[str, str]) -> None:
    """A small repository: each file's path under ``root`` and its text."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_relevant_tests_mirror_first_then_importers(mutate, tmp_path) -> None:
    # Guards the documented mapping: mirrored files, then importers by dotted name, by a
    # name the package re-exports, or by the subpackage; a top-level import does not count.
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from pkg.sub.mod import Thing\n",
        "pkg/sub/mod.py": "Thing = 1\n",
        "pkg/sub/other.py": "Other = 1\n",
        "tests/sub/test_mod.py": "",
        "tests/sub/test_mod_extra.py": "",
        "tests/sub/test_model.py": "from pkg.sub.other import Other\n",
        "tests/test_direct.py": "from pkg.sub.mod import Thing\n",
        "tests/test_reexport.py": "from pkg.sub import Thing\n",
        "tests/test_subpackage.py": "from pkg import sub\n",
        "tests/test_top.py": "import pkg\n",
    }
    write_tree(tmp_path, files)
    assert mutate.relevant_tests(tmp_path, "pkg/sub/mod.py") == [
        "tests/sub/test_mod.py",
        "tests/sub/test_mod_extra.py",
        "tests/test_direct.py",
        "tests/test_reexport.py",
        "tests/test_subpackage.py",
    ]


def test_a_helper_a_test_only_patches_still_gets_its_users_tests(mutate, tmp_path) -> None:
    # nn/gat/v1 has no test file of its own; once a test imported it (to patch it), that
    # test became its only one and the GAT layer's tests stopped running on its mutants.
    files = {
        "pkg/__init__.py": "",
        "pkg/helper.py": "X = 1\n",
        "pkg/layer.py": "from pkg.helper import X\n",
        "tests/test_layer.py": "from pkg.layer import X\n",
        "tests/test_patches.py": "import pkg.helper\n",
    }
    write_tree(tmp_path, files)
    assert mutate.relevant_tests(tmp_path, "pkg/helper.py") == [
        "tests/test_patches.py",
        "tests/test_layer.py",
    ]


def test_the_sample_is_spread_round_robin(mutate) -> None:
    groups = {"b.py": [1, 2, 3], "a.py": [4, 5]}
    assert mutate._spread(groups, 4) == [4, 1, 5, 2]


def test_kill_rate_is_over_non_equivalent_mutants(mutate, ops) -> None:
    # Guards the report's headline: equivalents leave the denominator, time-outs count as
    # detected and are reported apart.
    mutants = _mutants(ops)[:4]
    statuses = ["killed", "timeout", "survived", "equivalent"]
    outcomes = [mutate.Outcome("t", m, s, 1.0) for m, s in zip(mutants, statuses, strict=True)]
    assert mutate._rate(outcomes) == (2, 3, "66.7 %")
    text = mutate.report(outcomes, {"pkg/mod.py": ["tests/test_mod.py"]}, 60.0, "cmd")
    assert "**Kill rate: 2 of 3 non-equivalent mutants (66.7 %)**" in text
    assert f"`{mutants[2].id}`" in text.split("## Survivors")[1].split("##")[0]
