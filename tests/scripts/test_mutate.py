"""``scripts/mutate.py``, its operators and its test map (``mutation_tests.py``) on tiny
snippets: what each operator writes, stable ids, the module-to-tests mapping, the kill rate.
No mutation run here (docs/mutation.md)."""

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


@pytest.fixture()
def test_map(monkeypatch):
    return _load("mutation_tests", monkeypatch)


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


MESSAGES = """\
class Config:
    slope: float = 0.2


def forward(x, limit):
    shown = " ".join(repr(x).split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    scale = limit * 2.0
    if x.max() > scale:
        raise ValueError(f"x must lie below {scale}, got {shown} (max {x.max() - 1.0})")
    return x / scale


def _message(x) -> str:
    bad = int((x > 0).sum()) + 1
    return f"{bad} entries"
"""


def test_error_messages_and_class_defaults_are_not_mutated(ops) -> None:
    # Guards the forward target from noise: a mutant of a message (built in the function or
    # by a function returning str) or of a dataclass default is no bug in the math. `scale`
    # is read by the raise and by the return: still mutated.
    mutants = ops.mutants_of("m.py", MESSAGES, ops.Scope(lambda name: True))
    assert {m.line for m in mutants} == {8, 9, 11}
    assert ops.message_names(ast.parse(MESSAGES).body[1]) == {"shown"}


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


def test_relevant_tests_mirror_first_then_importers(test_map, tmp_path) -> None:
    # Guards the documented mapping: mirrored files, then importers by dotted name, by a
    # name the package re-exports, or through the subpackage's __init__ (one import more);
    # an import of a package whose __init__ imports nothing does not count.
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
    assert test_map.relevant_tests(tmp_path, "pkg/sub/mod.py") == [
        "tests/sub/test_mod.py",
        "tests/sub/test_mod_extra.py",
        "tests/test_direct.py",
        "tests/test_reexport.py",
        "tests/test_subpackage.py",
    ]


def test_a_helper_a_test_only_patches_still_gets_its_users_tests(test_map, tmp_path) -> None:
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
    assert test_map.relevant_tests(tmp_path, "pkg/helper.py") == [
        "tests/test_patches.py",
        "tests/test_layer.py",
    ]


def test_regression_tests_that_reach_a_module_through_another_are_relevant(
    test_map, tmp_path
) -> None:
    # The map took only test files that import the module by name, so a mutant of
    # ops/loop_fill never ran the GAT layer's or model's tests, which reach it through
    # nn/gat/conv; the map's tests used repositories one import deep. Here a chain three
    # deep, a relative import, a lazy one and import_module("literal"), each link counted.
    files = {
        "pkg/__init__.py": "",
        "pkg/ops/__init__.py": "",
        "pkg/ops/loop_fill.py": "FILL = 1\n",
        "pkg/ops/other.py": "OTHER = 1\n",
        "pkg/nn/__init__.py": "",
        "pkg/nn/conv.py": "def f():\n    from ..ops import loop_fill\n",
        "pkg/nn/lazy.py": "import importlib\nimportlib.import_module('pkg.ops.loop_fill')\n",
        "pkg/models/__init__.py": "",
        "pkg/models/gat.py": "from pkg.nn.conv import f\n",
        "tests/ops/test_loop_fill.py": "",
        "tests/ops/test_other.py": "from pkg.ops.other import OTHER\n",
        "tests/nn/test_conv.py": "import pkg.nn.conv\n",
        "tests/nn/test_lazy.py": "from pkg.nn import lazy\n",
        "tests/models/test_gat.py": "from pkg.models.gat import f\n",
        "tests/test_direct.py": "from pkg.ops.loop_fill import FILL\n",
        "tests/test_helper.py": "from tests.helper import f\n",
        "tests/helper.py": "from pkg.models.gat import f\n",
    }
    write_tree(tmp_path, files)
    assert test_map.relevant_tests(tmp_path, "pkg/ops/loop_fill.py") == [
        "tests/ops/test_loop_fill.py",  # mirrored
        "tests/test_direct.py",  # one import
        "tests/nn/test_conv.py",  # two, then by name
        "tests/nn/test_lazy.py",
        "tests/models/test_gat.py",  # three
        "tests/test_helper.py",  # four: through a helper module of the tests
    ]
    assert test_map.import_distances(tmp_path, tmp_path / "tests/test_helper.py") == {
        "tests.helper": 1,
        "pkg.models.gat": 2,
        "pkg.nn.conv": 3,
        "pkg.ops.loop_fill": 4,
    }


def test_a_name_a_package_re_exports_leads_to_its_module_only(test_map, tmp_path) -> None:
    # Guards the precision of the map: `from pkg import Layer` uses the module that defines
    # Layer, not every module pkg/__init__ imports, or every test would run for every mutant.
    files = {
        "pkg/__init__.py": "from pkg.sub import Layer\nfrom pkg.other import Other\n",
        "pkg/sub/__init__.py": "from .layer import Layer as Layer\n",
        "pkg/sub/layer.py": "class Layer: ...\n",
        "pkg/other.py": "class Other: ...\n",
        "tests/test_uses_layer.py": "from pkg import Layer\n",
    }
    write_tree(tmp_path, files)
    assert test_map.imports(tmp_path, "tests.test_uses_layer") == {"pkg.sub.layer"}
    assert test_map.relevant_tests(tmp_path, "pkg/sub/layer.py") == ["tests/test_uses_layer.py"]
    assert test_map.relevant_tests(tmp_path, "pkg/other.py") == []


def test_among_equally_close_importers_the_mirror_folder_runs_first(test_map, tmp_path) -> None:
    # Guards the speed of the order: a helper's mutant reaches its layer's tests (beside it,
    # tests/nn/gat) before the interop tests that are as many imports away.
    files = {
        "pkg/__init__.py": "",
        "pkg/nn/gat/v1.py": "X = 1\n",
        "pkg/nn/gat/conv.py": "from pkg.nn.gat.v1 import X\n",
        "tests/interop/test_a.py": "from pkg.nn.gat.conv import X\n",
        "tests/nn/gat/test_conv.py": "from pkg.nn.gat.conv import X\n",
        "tests/nn/test_empty.py": "from pkg.nn.gat.conv import X\n",
    }
    write_tree(tmp_path, files)
    assert test_map.relevant_tests(tmp_path, "pkg/nn/gat/v1.py") == [
        "tests/nn/gat/test_conv.py",
        "tests/nn/test_empty.py",
        "tests/interop/test_a.py",
    ]


def test_the_sample_is_spread_round_robin(mutate) -> None:
    groups = {"b.py": [1, 2, 3], "a.py": [4, 5]}
    assert mutate._spread(groups, 4) == [4, 1, 5, 2]


FORWARD_AND_BACKWARD = """\
def forward(x, w):
    y = x * w + 1.0
    return y - x


def forward_backward_pair(x, w):
    return x + w


def helper_backward(d_out, w):
    return d_out * w - 2.0
"""


def test_regression_forward_code_is_mutated(mutate, tmp_path) -> None:
    # The driver mutated only functions named *backward*, so no forward mutant ever ran;
    # no test looked at which functions the targets reach.
    write_tree(tmp_path, {"refimpl/ops/act.py": FORWARD_AND_BACKWARD})
    selected = mutate.select(tmp_path)
    functions = {(target, m.function) for target, m in selected}
    assert functions == {
        ("forward code", "forward"),
        ("backward passes", "forward_backward_pair"),
        ("backward passes", "helper_backward"),
    }


def test_a_files_first_forward_picks_lie_on_different_lines(mutate, tmp_path, monkeypatch) -> None:
    # Guards "spread over files and lines": with two files and four picks, each file gives
    # two mutants on two different lines (a file's mutants come several to a line).
    source = "".join(f"def f{k}(x):\n    return x * {k}.5 + x - 1.0\n\n\n" for k in range(4))
    write_tree(tmp_path, {"refimpl/ops/a.py": source, "refimpl/ops/b.py": source})
    target = mutate.Target(
        "forward code", ("refimpl/ops/*.py",), mutate.Scope(mutate._forward), 4, "files, then lines"
    )
    monkeypatch.setattr(mutate, "TARGETS", (target,))
    selected = [m for _, m in mutate.select(tmp_path)]
    for path in ("refimpl/ops/a.py", "refimpl/ops/b.py"):
        assert len({m.line for m in selected if m.path == path}) == 2


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


def test_a_run_on_some_modules_takes_the_full_runs_mutants_there(
    mutate, tmp_path, monkeypatch
) -> None:
    # Guards --modules as a preview: the mutants it runs are the ones the full run samples in
    # those files, not a new sample drawn among them alone (which would take them all here).
    write_tree(tmp_path, {f"refimpl/ops/{name}.py": FORWARD_AND_BACKWARD for name in "abc"})
    target = mutate.Target("forward code", ("refimpl/ops/*.py",), mutate.Scope(mutate._forward), 3)
    monkeypatch.setattr(mutate, "TARGETS", (target,))
    full = mutate.select(tmp_path)
    assert len(full) == 3
    assert mutate.select(tmp_path, ["refimpl/ops/b.py"]) == [
        s for s in full if s[1].path == "refimpl/ops/b.py"
    ]


def test_tests_run_first_file_alone_and_a_crash_kills(mutate, tmp_path) -> None:
    # Guards run_tests: the first file runs alone (a failure there ends the run before the
    # rest is even collected), and a test process killed by a signal (a compiled kernel
    # reading out of bounds) counts as detecting the mutant, not as an error.
    collected = tmp_path / "collected"
    files = {
        "tests/test_fails.py": "def test_fails():\n    assert False\n",
        "tests/test_passes.py": "def test_passes():\n    pass\n",
        "tests/test_marks.py": f"open({str(collected)!r}, 'w').close()\n\n\n"  # when collected
        "def test_nothing():\n    pass\n",
        "tests/test_crashes.py": "import os, signal\n\n\ndef test_crash():\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n",
    }
    write_tree(tmp_path, files)
    status, _, _ = mutate.run_tests(tmp_path, ["tests/test_fails.py", "tests/test_marks.py"], 60)
    assert status == "killed" and not collected.exists()
    status, _, _ = mutate.run_tests(tmp_path, ["tests/test_passes.py", "tests/test_marks.py"], 60)
    assert status == "survived" and collected.exists()
    status, _, _ = mutate.run_tests(tmp_path, ["tests/test_passes.py", "tests/test_crashes.py"], 60)
    assert status == "killed"
