"""A griffe extension for the docs build: reST roles as code, module equations shown with classes.

The project's docstrings are numpy-style with reST inline markup: ``literals`` (which
Markdown reads as code already), roles such as :class:`GATConv` or :func:`~refimpl.init.balance`,
and ``::`` before a literal block. Markdown has no roles, so the role name would show as
text. This turns each role into a code span of its target (``~a.b`` shows ``b``) and a
trailing ``::`` into ``:``. Math (``$...$`` inline, ``$$`` blocks) passes through untouched:
``pymdownx.arithmatex`` marks it when mkdocstrings renders the docstring, inside the box below
too (``tests/test_docs_site.py`` builds such a docstring).

Several layers keep their equations in their module's docstring and say so in the class
("see the module docstring"); so do a few functions (``train_model``). For those classes and
functions that a package exports (``__all__`` of an ``__init__``), the module docstring is
shown inside the object's own documentation, in a box after its summary line, so the API pages
can render ``refimpl.nn.GATConv`` by its public name and still show its equations wherever the
module moves. (An object its package does not export is rendered with its module, docstring
included, so it gets no box.) The docstrings in ``refimpl/`` stay as they are.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|term):`(~?)([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(\S)::[ \t]*$", flags=re.MULTILINE)
_DEFERS = re.compile(r"\bmodule(?:'s)? doc(?:string|s)?\b")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    if match.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def rewrite(text: str) -> str:
    """The docstring with its roles as code spans and ``::`` block markers as ``:``."""
    return _LITERAL_BLOCK.sub(r"\1:", _ROLE.sub(_role, text))


_SECTION = re.compile(r"^[A-Z][\w ]*\n-{3,}[ \t]*$", flags=re.MULTILINE)


def with_module_docstring(class_doc: str, module_doc: str) -> str:
    """``class_doc`` with ``module_doc`` in a box after its own text, before its first numpy
    section (``Parameters``, ...), so the class's equations come first.

    Indented inside the box, the module's text cannot start a numpy section of the class
    (``Parameters`` must begin a line), so the class's own sections parse as before; the
    module's reST headings (a line underlined with dashes) become bold lines, which a box can
    hold.
    """
    found = _SECTION.search(class_doc)
    text, sections = (
        (class_doc, "")
        if found is None
        else (
            class_doc[: found.start()],
            class_doc[found.start() :],
        )
    )
    module_text = _SECTION.sub(lambda m: f"**{m.group(0).splitlines()[0].strip()}**", module_doc)
    box = '!!! abstract "Equations and conventions (from the module docstring)"\n\n'
    box += textwrap.indent(module_text.strip(), "    ")
    return "\n\n".join(part.strip("\n") for part in (text, box, sections) if part.strip())


def _exported_targets(module: griffe.Module) -> list[str]:
    """Paths of the objects the packages under ``module`` export from their ``__init__``."""
    found = []
    if module.exports:
        for name in module.exports:
            member = module.members.get(str(name))
            if member is not None and member.is_alias:
                found.append(member.target_path)
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            found.extend(_exported_targets(member))
    return found


class RestRoles(griffe.Extension):
    """Rewrite the docstrings of a loaded package (see this module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[str] = set()  # paths already rewritten (hooks may see a module twice)
        self._exported: set[str] = set()

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._exported = set(_exported_targets(pkg))
        self._visit(pkg)

    def _visit(self, obj: griffe.Object) -> None:
        if obj.path in self._done:
            return
        self._done.add(obj.path)
        module_doc = obj.docstring.value if obj.is_module and obj.docstring else ""
        for member in list(obj.members.values()):
            if member.is_alias:
                continue
            if (member.is_class or member.is_function) and module_doc and member.docstring:
                exported = member.path in self._exported
                if (
                    exported
                    and member.path not in self._done
                    and _DEFERS.search(member.docstring.value)
                ):
                    member.docstring.value = with_module_docstring(
                        member.docstring.value, module_doc
                    )
            if member.is_module or member.is_class:
                self._visit(member)
            elif member.path not in self._done:
                self._done.add(member.path)
                if member.docstring is not None:
                    member.docstring.value = rewrite(member.docstring.value)
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
