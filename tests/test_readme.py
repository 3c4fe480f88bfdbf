"""The README's and the docs' Python examples run as written and check what they show.

Each example asserts the facts it illustrates (shapes, attention summing to one, the
gradient check passing, a bound holding, training above chance), so a number that goes
wrong fails here, not only an example that crashes. The same holds for every page under
``docs/`` (examples moved there from the README stay tested). The README stays short (under
500 lines), every relative link in it and in the docs points to a file that exists, and every
``::: name`` the API pages render names an importable object.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
MAX_README_LINES = 500

# The quick start's commands, which CI (.ci/run) must run as the README writes them.
QUICK_START = ('    pip install -e ".[test]"', "    refimpl demo", "    pytest")
CI_SCRIPT = ROOT / ".ci" / "run"


FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.DOTALL | re.MULTILINE)


def _blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# Every distinct ```python block, with the first page that shows it (a block shown in both
# the README and a docs page runs once).
_SOURCES: dict[str, str] = {}
for _page in PAGES:
    for _i, _source in enumerate(_blocks(_page, "python")):
        _SOURCES.setdefault(_source, f"{_name(_page)}:block{_i}")
BLOCKS = list(_SOURCES)
IDS = list(_SOURCES.values())
README_BLOCKS = _blocks(README, "python")


def test_readme_has_python_examples() -> None:
    assert README_BLOCKS, "the README lost its runnable examples"


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
    assert checked, "this example asserts nothing it computed"


# The optional extras an example may import; without them its test skips, naming the extra.
OPTIONAL_MODULES = {
    "torch": "crosscheck",
    "torch_geometric": "crosscheck",
    "jax": "jax",
    "matplotlib": "plot",
    "rdkit": "chem",
    "distributed": "cluster",
    "cupy": "gpu",
}


def _imported_modules(source: str) -> set[str]:
    """The top-level packages an example imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize("source", BLOCKS, ids=IDS)
def test_readme_example_runs_and_its_checks_hold(source: str) -> None:
    # The quick start installs the test extra alone: an example of another extra (the
    # crosscheck guide's PyG one) failed there instead of skipping.
    for module in sorted(_imported_modules(source) & OPTIONAL_MODULES.keys()):
        pytest.importorskip(module, reason=f"needs the {OPTIONAL_MODULES[module]} extra")
    exec(compile(source, _SOURCES.get(source, str(README)), "exec"), {"__name__": "readme_example"})


def test_a_failing_check_in_an_example_fails_the_test() -> None:
    # The examples' checks are live: a false one fails the run (under python -O, compile
    # would strip them, and this test would say so).
    source = README_BLOCKS[0] + "\nassert report.max_rel_error > 1.0  # false: the check passed\n"
    with pytest.raises(AssertionError):
        test_readme_example_runs_and_its_checks_hold(source)


def test_readme_stays_short() -> None:
    # Issue 23: the README had grown to 1,846 lines; the details live in docs/ now.
    lines = len(README.read_text().splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move details to docs/"


def test_readme_keeps_the_quick_start_ci_runs() -> None:
    lines = README.read_text().splitlines()
    for line in QUICK_START:
        assert line in lines, f"the README's quick start lost {line.strip()!r}"


def _quick_start_commands() -> list[str]:
    """The commands of the README's quick start, its optional step included: the indented
    lines between "## Quick start" and the next level-2 heading."""
    text = README.read_text()
    section = text[
        text.index("## Quick start\n") : text.index("\n## ", text.index("## Quick start"))
    ]
    return [line.strip() for line in section.splitlines() if line.startswith("    ")]


def test_ci_runs_every_quick_start_command_as_the_readme_writes_it() -> None:
    # Issue 36: CI must install exactly as the README says; a command changed in one and not
    # the other would let CI pass on an install no user runs.
    ci = {line.strip() for line in CI_SCRIPT.read_text().splitlines()}
    commands = _quick_start_commands()
    assert len(commands) >= 6, commands  # the three of the quick start, three optional
    missing = [command for command in commands if command not in ci]
    assert not missing, f".ci/run does not run the README's {missing}"


def test_the_quick_start_asks_only_the_default_index() -> None:
    # Issue 36: with --extra-index-url pip asked PyTorch's index for every dependency and, where
    # it could not reach it, retried each five times (13 minutes); only torch's own line may
    # name another index.
    for command in _quick_start_commands():
        if "index-url" in command:
            assert command.startswith("pip install torch --index-url"), command
            assert "--extra-index-url" not in command, command


def test_every_py_block_in_the_docs_is_the_readme_one() -> None:
    # ```py blocks need torch and are not run here; tests/interop/test_crosscheck.py and
    # tests/interop/test_pyg_module.py run the README's. A copy in the docs must be one of
    # them, so it is tested too.
    readme = set(_blocks(README, "py"))
    for page in PAGES[1:]:
        for block in _blocks(page, "py"):
            assert block in readme, f"{_name(page)} has a ```py block that is not the README's"


# [text](target) and ![alt](target), outside code: the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"^```.*?^```$|^(?: {4}|\t).*$|`+[^`\n]*`+", flags=re.DOTALL | re.MULTILINE)


def _relative_links(text: str) -> list[str]:
    text = CODE.sub("", text)
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE) or target.startswith("#"):
            continue  # https:, mailto:, or an anchor on the same page
        targets.append(target)
    return targets


def test_the_link_finder_finds_links_and_skips_code() -> None:
    text = "See [a](x.md#s), ![b](i.png), [c](https://e.org), [d](#top).\n\n    [e](no.md)\n"
    assert _relative_links(text + "`[f](no.md)`\n") == ["x.md#s", "i.png"]


@pytest.mark.parametrize("page", PAGES, ids=[_name(p) for p in PAGES])
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    missing = []
    for target in _relative_links(page.read_text()):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{_name(page)} links to files that do not exist: {missing}"


def test_readme_links_into_the_docs() -> None:
    assert any(t.startswith("docs/") for t in _relative_links(README.read_text()))


API_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", flags=re.MULTILINE)


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_api_directive_names_an_importable_object() -> None:
    # A module moved or a name renamed breaks `mkdocs build --strict`; this says which, without
    # MkDocs installed.
    names = [
        n for page in sorted(DOCS.rglob("*.md")) for n in API_DIRECTIVE.findall(page.read_text())
    ]
    assert names, "the API pages render nothing"
    broken = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            broken.append(name)
    assert not broken, f"API pages render names that do not import: {broken}"


def _docs_extension():  # docs/griffe_rst.py, which needs griffe (the "docs" extra)
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_rst", DOCS / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_build_turns_rest_roles_into_code() -> None:
    rewrite = _docs_extension().rewrite
    text = "Uses :class:`GATConv` and :func:`~refimpl.init.balance`, like this::\n\n    x = 1\n"
    assert rewrite(text) == "Uses `GATConv` and `balance`, like this:\n\n    x = 1\n"


def test_docs_build_shows_a_deferred_module_docstring_before_the_sections() -> None:
    combine = _docs_extension().with_module_docstring
    class_doc = "A layer; see the module docstring.\n\n$$\ny = W x\n$$\n\nParameters\n----------\nx"
    out = combine(class_doc, "Eq. 1: y = W x.\n\nRow blocks\n----------\ntext")
    summary, equation, box, *_ = out.split("\n\n")
    assert summary == "A layer; see the module docstring."
    # the class's own text (its equations) first, then the module's, in a box (issue 36: the
    # box came first and pushed the class's equations down the page)
    assert equation == "$$\ny = W x\n$$"
    assert box.startswith("!!! abstract") and "\n    Eq. 1: y = W x." in out
    # The module's text is indented inside the box (no numpy section can start there), its
    # reST headings bold lines (an underlined heading rendered as garbled text in a box); the
    # class's own sections follow, unindented, so they parse as before.
    assert "\n    **Row blocks**\n    text" in out and "----------\n    text" not in out
    assert out.endswith("\n\nParameters\n----------\nx")
