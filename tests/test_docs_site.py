"""The docs site renders math, tables and signatures: ``scripts/check_site.py`` on hand-made
pages (each fault it must catch, and a page it must pass), and on a small site built with this
project's ``mkdocs.yml`` from a docstring with math, a table and a long signature.

``.ci/run`` runs the checker on the full site after ``mkdocs build --strict``; the suite
builds only the small site (one page), as the full one renders every module.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KATEX = ROOT / "docs" / "assets" / "katex" / "katex.min.js"


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_site", ROOT / "scripts" / "check_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


check_site = _load_checker()

HEAD = '<html><head><script src="../assets/katex/katex.min.js"></script></head><body>'
GOOD = HEAD + textwrap.dedent(
    r"""
    <p>With <span class="arithmatex">\(x_i^2\)</span>, code <code>$REFIMPL_DATA</code> and
    prices $5 and $6 (no math: a space follows the dollar).</p>
    <div class="arithmatex">\[
    h_v = \sum_{u \to v} \alpha_{uv} W h_u
    \]</div>
    <table><tr><th>ours</th><th>PyG</th></tr><tr><td><code>W</code></td><td>lin</td></tr></table>
    <div class="doc-signature highlight"><pre><code>GATConv(
        in_channels: int,
        concat: bool = True,
    )</code></pre></div>
    <pre><code>====  ====
    $x$   $$
    </code></pre>
    </body></html>
    """
)
# Each fault as it reached a page, and the start of the line the checker must print for it.
FAULTS = {
    "inline_math.html": (
        HEAD + "<p>the score $e_{uv} = a^T [W h_u \\| W h_v]$ per edge</p>",
        "inline math left as text",
    ),
    "display_math_no_blank_line.html": (
        HEAD + "<p>$$\n\\frac{\\partial L}{\\partial \\theta}\n$$\nTensors whose</p>",
        "display math left as text",
    ),
    "rest_table.html": (
        HEAD + "<p>========= ========= =======\nours shape PyG\n========= =========</p>",
        "reST table left as text",
    ),
    "pipe_table_in_paragraph.html": (
        HEAD + "<p>Names:\n| ours | PyG |\n| --- | --- |\n| <code>W</code> | lin |</p>",
        "Markdown table left as text",
    ),
    "rest_role.html": (HEAD + "<p>see :class:`GATConv`</p>", "reST role left as text"),
    "one_line_signature.html": (
        HEAD
        + '<div class="doc-signature"><pre><code>GATConv('
        + ", ".join(f"argument_{k}: bool = True" for k in range(8))
        + ")</code></pre></div>",
        "signature on a line of",
    ),
    "math_from_a_docstring_not_raw.html": (
        HEAD + '<p><span class="arithmatex">\\(\x0crac{a}{b}\\)</span></p>',
        "math with a control character where a backslash was",
    ),
    "math_without_katex.html": (
        '<p>a <span class="arithmatex">\\(x\\)</span></p>',
        "page has math but does not load KaTeX",
    ),
}


def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    site = tmp_path / "site"
    (site / "assets" / "katex").mkdir(parents=True)
    shutil.copy(KATEX, site / "assets" / "katex" / "katex.min.js")
    for name, html in pages.items():
        (site / name).write_text(html, encoding="utf-8")
    return site


def test_a_good_page_passes(tmp_path: Path) -> None:
    problems, summary = check_site.check_site(_site(tmp_path, {"index.html": GOOD}))
    assert problems == []
    assert summary.startswith("1 pages, 2 math expressions") and "1 tables, 1 signatures" in summary


def test_the_good_page_is_read_as_written() -> None:
    page = check_site.read_page(GOOD)
    assert page.math == [("x_i^2", False), (r"h_v = \sum_{u \to v} \alpha_{uv} W h_u", True)]
    assert page.signatures[0].splitlines()[1].strip() == "in_channels: int,"
    assert page.tables == 1 and page.scripts == ["../assets/katex/katex.min.js"]
    assert all("REFIMPL_DATA" not in text and "====" not in text for text in page.prose)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_each_fault_is_one_problem_naming_its_page(tmp_path: Path, name: str) -> None:
    # Unrendered reST tables showed as garbled text on 10 API pages, and the signature of
    # GATConv was cut at "concat: bool = Tru", while mkdocs build --strict passed: strict mode
    # checks links and docstring sections, nothing read what the built pages show.
    html, expected = FAULTS[name]
    problems, _ = check_site.check_site(_site(tmp_path, {"index.html": GOOD, name: html}))
    assert len(problems) == 1 and problems[0].startswith(f"{name}: {expected}"), problems


def test_tex_that_katex_cannot_typeset_is_a_problem(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed: the checker cannot run KaTeX")
    bad = HEAD + r'<p><span class="arithmatex">\(\frac{a}{\mathbb{R}\)</span></p>'
    problems, _ = check_site.check_site(_site(tmp_path, {"index.html": GOOD, "bad.html": bad}))
    assert len(problems) == 1 and problems[0].startswith("bad.html: KaTeX cannot typeset")


def test_a_site_without_math_or_tables_fails(tmp_path: Path) -> None:
    plain = "<html><body><p>No math here.</p></body></html>"
    problems, _ = check_site.check_site(_site(tmp_path, {"index.html": plain}))
    assert [p.split(":")[0] for p in problems] == [
        "no page holds math",
        "no page holds a rendered table",
    ]


def test_main_refuses_a_folder_that_is_not_a_site(tmp_path: Path, capsys) -> None:
    assert check_site.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a built site" in err


# A small site built with the project's configuration: what a docstring writer's math, table
# and signature become on an API page.
PROBE_MODULE = '''
r"""Probe layer module: the equation of :class:`Probe` lives here.

$$
h_v' = \\sum_{u \\in \\mathcal{N}(v)} \\alpha_{uv} W h_u
$$

with $\\alpha_{uv} = \\mathrm{softmax}_u(e_{uv})$ (GAT-balance Eq. 1)::

    not a table, a literal block
"""


class Probe:
    r"""One probe layer; see the module docstring.

    | ours    | PyG          |
    | ------- | ------------ |
    | ``W``   | ``lin.weight`` |

    Parameters
    ----------
    heads : int
        Number of heads $H \\ge 1$; read from ``$REFIMPL_HEADS``.
    """

    def __init__(
        self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
        negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
    ) -> None:
        self.heads = heads
'''


@pytest.fixture(scope="module")
def probe_site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
    yaml = pytest.importorskip("yaml")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    work = tmp_path_factory.mktemp("probe_site")
    package = work / "src" / "probe_pkg"
    package.mkdir(parents=True)
    # exported from a submodule, as refimpl.nn exports GATConv: docs/griffe_rst.py then shows
    # the module's docstring (its equations) inside the class's documentation
    (package / "layer.py").write_text(PROBE_MODULE)
    (package / "__init__.py").write_text(
        "from probe_pkg.layer import Probe\n\n__all__ = ['Probe']\n"
    )
    shutil.copytree(ROOT / "docs" / "assets", work / "docs" / "assets")
    (work / "docs" / "index.md").write_text("# Probe\n\n::: probe_pkg.Probe\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (plugin,) = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    handler = plugin["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(work / "src")]
    handler["options"]["extensions"] = [
        extension.replace("docs/", str(ROOT / "docs") + "/", 1)
        for extension in handler["options"]["extensions"]
    ]
    config.update(docs_dir=str(work / "docs"), site_dir=str(work / "site"), nav=["index.md"])
    config["exclude_docs"] = "assets/katex/README.md\n"
    (work / "mkdocs.yml").write_text(yaml.safe_dump(config))
    build(load_config(str(work / "mkdocs.yml")))
    return work / "site"


def test_docstring_math_tables_and_signatures_render(probe_site: Path) -> None:
    problems, _ = check_site.check_site(probe_site)
    assert problems == []
    page = check_site.read_page((probe_site / "index.html").read_text(encoding="utf-8"))
    assert (r"h_v' = \sum_{u \in \mathcal{N}(v)} \alpha_{uv} W h_u", True) in page.math
    assert (r"\alpha_{uv} = \mathrm{softmax}_u(e_{uv})", False) in page.math
    assert (r"H \ge 1", False) in page.math  # in a Parameters entry too
    assert page.tables >= 2  # the docstring's table and the Parameters table
    (signature,) = page.signatures
    assert len(signature.splitlines()) > 3 and max(map(len, signature.splitlines())) <= 80


# The errata page's blocks: what the CLI prints, at its width.


def _load_errata_page():
    spec = importlib.util.spec_from_file_location(
        "errata_page", ROOT / "scripts" / "errata_page.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_errata_page_blocks_fit_the_cli_width() -> None:
    # The errata page had lines of 380 characters in every printed/correct/counterexample block
    # (pasted unwrapped) while the CLI wraps the same text at 100 columns; nothing checked the
    # page's width, and the blocks ran off a 1280-pixel window.
    from proofs_check.runner import WIDTH

    page = (ROOT / "docs" / "errata.md").read_text(encoding="utf-8")
    blocks = page.split("```text\n")[1:]
    assert len(blocks) >= 30
    assert all(len(line) <= WIDTH for text in blocks for line in text.split("```")[0].splitlines())


def test_errata_block_is_the_cli_text_from_printed_on() -> None:
    from proofs_check.erratum import Erratum, Evidence

    errata_page = _load_errata_page()
    evidence = Evidence(printed_holds=False, correct_holds=True, detail="residual 0.5 " * 10)
    erratum = Erratum(
        "x.y", "Paper", "Sec. 1", "a = b", "a = c", "a 2-node graph", lambda: evidence
    )
    assert errata_page.block(erratum, evidence).splitlines() == [
        "printed: a = b",
        "correct: a = c",
        "counterexample: a 2-node graph:",
        # the CLI's 100 columns with its indent of 6 (here 2): 7 of the 10 fit on a line
        "  " + ("residual 0.5 " * 7).strip(),
        "  " + ("residual 0.5 " * 3).strip(),
    ]


def test_errata_refresh_keeps_prose_and_names_strays() -> None:
    errata_page = _load_errata_page()
    page = (
        "# Errata\n\nIn short: prose.\n\n### `a.one`\n\n**Where:** here\n\n```text\nold\n```\n\n"
        "### `a.gone`\n\n```text\nkept\n```\n"
    )
    updated, problems = errata_page.refresh(page, {"a.one": "new\n  line", "a.new": "x"})
    assert updated == page.replace("```text\nold\n```", "```text\nnew\n  line\n```")
    assert problems == [
        "section `a.gone` names no erratum",
        "erratum a.new has no section on the page",
    ]
