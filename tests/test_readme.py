"""The README's Python examples run as written and check what they show.

Each example asserts the facts it illustrates (shapes, attention summing to one, the
gradient check passing, a bound holding, training above chance), so a number that goes
wrong fails here, not only an example that crashes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
IDS = [f"block{i}" for i in range(len(BLOCKS))]


def test_readme_has_python_examples() -> None:
    assert BLOCKS, "the README lost its runnable examples"


@pytest.mark.parametrize("source", BLOCKS, ids=IDS)
def test_every_example_asserts_what_it_shows(source: str) -> None:
    # Issue 24: the examples were only run, so a wrong number they printed passed. Each now
    # asserts its facts; one without an assert (on a name it computed) would check nothing.
    tree = ast.parse(source)
    assigned = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    checked = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} & assigned
    ]
    assert checked, "this README example asserts nothing it computed"


@pytest.mark.parametrize("source", BLOCKS, ids=IDS)
def test_readme_example_runs_and_its_checks_hold(source: str) -> None:
    exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})


def test_a_failing_check_in_an_example_fails_the_test() -> None:
    # The examples' checks are live: a false one fails the run (under python -O, compile
    # would strip them, and this test would say so).
    source = BLOCKS[0] + "\nassert report.max_rel_error > 1.0  # false: the check passed\n"
    with pytest.raises(AssertionError):
        test_readme_example_runs_and_its_checks_hold(source)
