"""The package's floors (docs/design.md, "Layers"): imports go down or sideways, never up, and
never in a circle; the literal twins share nothing with the code they check; layers reach
each other only through public names.

Read from the source with ``ast`` (imports inside functions included, and
``importlib.import_module("refimpl....")`` with a literal name), so a lazy import that would
hide a circle from Python still counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("refimpl", "proofs_check")

# Bottom to top. A module's floor is that of the longest prefix listed; sideways imports
# (the same floor) are allowed as long as they make no circle.
FLOORS = {
    "refimpl.backend": 0,
    "refimpl.kernels": 1,
    "refimpl.graph": 2,
    "refimpl": 2,  # the root package re-exports Graph and the backend switch
    "refimpl.draws": 2,  # orthogonal and Glorot draws: the backend alone
    "refimpl.array_checks": 2,  # checks that read no values: the backend and Graph
    "refimpl.validation": 3,
    "refimpl.fields": 3,
    "refimpl.files": 3,
    "refimpl.testing": 3,
    "refimpl.neurons": 3,
    "refimpl.metrics": 3,
    "refimpl.optim": 3,
    "refimpl.schedules": 3,
    "refimpl.jacobian": 3,
    "refimpl.init": 3,
    "refimpl.naive": 3,
    "refimpl.ops": 4,
    "refimpl.nn": 5,
    "refimpl.models": 6,
    "refimpl.diagnostics": 6,
    "refimpl.data": 6,
    "refimpl.train": 7,
    "refimpl.interop": 8,
    "refimpl.cli": 9,
    "refimpl.__main__": 10,
    "proofs_check": 10,
}
# What a literal twin may read: the edge list's class, and other twins.
NAIVE_MAY_IMPORT = ("refimpl.graph", "refimpl.naive")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports: ``from pkg import sub`` counts as ``pkg.sub``."""
    return _imports_of_source(name, path.read_text(), path.name == "__init__.py")


def _imports_of_source(name: str, source: str, is_package: bool) -> set[str]:
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if _is_import_module_call(node):
            targets = [node.args[0].value]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def _is_import_module_call(node: ast.AST) -> bool:
    """``importlib.import_module("literal")`` or ``import_module("literal")``."""
    if not (isinstance(node, ast.Call) and node.args):
        return False
    function = node.func
    called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    first = node.args[0]
    return (
        called == "import_module"
        and isinstance(first, ast.Constant)
        and (isinstance(first.value, str))
    )


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def floor(name: str) -> int:
    prefixes = [p for p in FLOORS if name == p or name.startswith(p + ".")]
    return FLOORS[max(prefixes, key=len)]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_floor() -> None:
    assert all(floor(name) >= 0 for name in MODULES)


def test_no_module_imports_from_a_floor_above_it() -> None:
    upward = [
        f"{name} (floor {floor(name)}) imports {target} (floor {floor(target)})"
        for name, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if floor(target) > floor(name)
    ]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_circle() -> None:
    assert not _cycles(GRAPH), _cycles(GRAPH)


def test_a_lazy_import_by_name_counts_as_an_import() -> None:
    # backend.py once re-exported the segment kernels through importlib.import_module inside
    # a module __getattr__, an upward import that the ast Import nodes alone did not show.
    source = (
        'import importlib\n\ndef f():\n    importlib.import_module("refimpl.kernels.segment")\n'
    )
    assert _imports_of_source("refimpl.backend", source, False) == {"refimpl.kernels.segment"}


def test_the_checks_catch_an_upward_import_and_a_circle() -> None:
    # The two checks above have teeth: the graph they see, with one edge added.
    assert floor("refimpl.kernels.segment") < floor("refimpl.nn.gat.conv")
    looped = {**GRAPH, "refimpl.graph": GRAPH["refimpl.graph"] | {"refimpl.nn.gat.conv"}}
    assert _cycles(looped)


def test_literal_twins_share_no_code_with_what_they_check() -> None:
    borrowed = [
        f"{name} imports {target}"
        for name, targets in sorted(GRAPH.items())
        if name.startswith("refimpl.naive")
        for target in sorted(targets)
        if not target.startswith(NAIVE_MAY_IMPORT)
    ]
    assert not borrowed, "\n".join(borrowed)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_much_over_400_lines(name: str) -> None:
    # docs/style.md: a file that grows past ~400 lines is usually two concepts. 425 leaves
    # room for a docstring's last paragraph, not for a second concept.
    assert len(MODULES[name].read_text().splitlines()) <= 425


def test_layers_call_no_private_forward_or_backward_of_another_object() -> None:
    private_call = re.compile(r"\b(?!self\b|cls\b)\w+\._(forward|backward)\(")
    calls = [
        f"{name}: {line.strip()}"
        for name, path in sorted(MODULES.items())
        for line in path.read_text().splitlines()
        if private_call.search(line)
    ]
    assert not calls, "\n".join(calls)
