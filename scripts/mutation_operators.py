"""The mutation operators of ``scripts/mutate.py``: realistic bugs as rewrites of one AST node.

A mutant replaces one node of a module (an expression, or an augmented
assignment) by another; the rest of the file is left byte for byte, so the
mutated source reads like the original with one slip in it. Six operators,
each a bug that review misses and a weak test lets through:

- ``sign``: ``a + b`` <-> ``a - b``; ``-x`` -> ``x``; a product assigned or returned negated,
  ``y = a * b`` -> ``y = -(a * b)``
- ``drop_term``: a term of a sum dropped, ``a + b`` -> ``a`` or ``b``, ``a - b`` -> ``a``; an
  accumulation overwritten, ``x += e`` -> ``x = e``
- ``swap_src_dst``: an identifier's ``src`` <-> ``dst`` (a name, an attribute, a string key such
  as ``"att_src"``); ``edge_index[0]`` <-> ``edge_index[1]``
- ``scale_const``: a numeric constant times 10 or divided by 10 (``sqrt(8)`` -> ``sqrt(80)``)
- ``slip``: a 1e-4 relative slip: an assigned or returned expression times ``(1 + 1e-4)``
- ``loosen``: ``<`` -> ``<=`` and ``>`` -> ``>=``; a tolerance or bound constant loosened
  tenfold (times 10; divided by 10 for a lower bound, a name ending in ``AT_LEAST``, or a
  false-alarm rate)

Which nodes are candidates is the caller's choice (:class:`Scope`): the
functions whose qualified names it selects, and the module-level constants it
names (tolerances get only ``loosen``: a tighter tolerance that the suite
still passes is the tolerance's own claim, not a bug). Never candidates: what
only builds an error message (a ``raise`` statement, f-strings, the
assignments of names that are read only there, such as ``shown = ...`` read by
a ``raise``'s f-string: :func:`message_names`, and functions annotated
``-> str``: a message or a repr), docstrings, decorators,
annotations, defaults, and class bodies outside any function (a dataclass's
field defaults are configuration, not code).

A mutant's id is a hash of the file, the enclosing function, the operator, the
original and mutated code (as ``ast.unparse`` writes them) and, when that text
occurs several times in one function, its rank among them: not of line
numbers, so ids survive edits elsewhere in the file.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["OPERATORS", "Mutant", "Scope", "apply", "message_names", "mutants_of"]

OPERATORS = {
    "sign": "flip a sign: `a + b` <-> `a - b`, `-x` -> `x`, `y = a * b` -> `y = -(a * b)`",
    "drop_term": "drop a term: `a + b` -> `a` or `b`, `a - b` -> `a`; `x += e` -> `x = e`",
    "swap_src_dst": "swap source and target: `src` <-> `dst` in a name, attribute or key; "
    "`edge_index[0]` <-> `edge_index[1]`",
    "scale_const": "scale a numeric constant: times 10 or divided by 10",
    "slip": "a 1e-4 relative slip: an assigned or returned expression times `(1 + 1e-4)`",
    "loosen": "loosen a comparison (`<` -> `<=`, `>` -> `>=`) or a tolerance / bound constant "
    "tenfold (x10; /10 for a lower bound or a false-alarm rate)",
}

SLIP = 1e-4
# Module-level names read as tolerances or bounds: only their loosening is a bug.
TOLERANCE = re.compile(r"(TOL|ATOL|RTOL|AT_LEAST|ALARM|CONSTANT)$")
_LOWER = re.compile(r"(AT_LEAST|ALARM)$")  # smaller is looser for these
# Calls whose value is a number or an array of numbers: a slip in them is a slip in the math.
_NUMERIC_CALLS = {"float", "sqrt", "exp", "log", "expm1", "log1p", "sum", "einsum", "matmul"}
_EDGE_LIKE = re.compile(r"edge_index|edges|index$")
_SRC_DST = re.compile(r"src|dst")


@dataclass(frozen=True)
class Mutant:
    """One mutant: where it sits, what it changes, and its stable id."""

    id: str
    path: str  # relative to the repository root, with "/"
    line: int
    function: str  # the enclosing qualified name, "<module>" at module level
    operator: str
    original: str  # ast.unparse of the replaced node
    mutated: str  # ast.unparse of its replacement
    span: tuple[int, int, int, int]  # lineno, col (UTF-8 bytes), end_lineno, end_col
    splice: str  # the text that replaces the span


@dataclass(frozen=True)
class Scope:
    """Which nodes of a module are candidates.

    ``functions(qualname)`` selects the functions (with everything nested in
    them; a class's own body only inside a function); ``constants(name)`` the
    module-level assignments ``NAME = value``.
    """

    functions: Callable[[str], bool]
    constants: Callable[[str], bool] = lambda name: False


def _number(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    )


def _scaled(node: ast.Constant, up: bool) -> ast.Constant:
    # In decimal, so 1e-6 becomes 1e-05, not 9.999999999999999e-06.
    value = Decimal(repr(node.value)).scaleb(1 if up else -1)
    return ast.Constant(int(value) if isinstance(node.value, int) and up else float(value))


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _arithmetic(node: ast.AST) -> bool:
    return isinstance(node, (ast.BinOp, ast.UnaryOp)) or _call_name(node) in _NUMERIC_CALLS


def _swapped(text: str) -> str:
    return _SRC_DST.sub(lambda m: "dst" if m.group() == "src" else "src", text)


def _expression_mutants(
    node: ast.AST, parent: ast.AST | None, constant: str | None
) -> Iterator[tuple[str, ast.AST]]:
    """``(operator, replacement)`` for an expression ``node`` (``constant``: the module-level
    name whose value it sits in, if any)."""
    if constant is not None:
        if _number(node) and node.value != 0:
            if TOLERANCE.search(constant):
                yield "loosen", _scaled(node, up=not _LOWER.search(constant))
            else:
                yield "scale_const", _scaled(node, up=True)
                yield "scale_const", _scaled(node, up=False)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        flipped = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        yield "sign", ast.BinOp(node.left, flipped, node.right)
        yield "drop_term", node.left
        if isinstance(node.op, ast.Add):
            yield "drop_term", node.right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        yield "sign", node.operand
    # Floats anywhere; integers only in arithmetic (not axes, sizes, indices or powers).
    if _number(node) and node.value != 0:
        power = isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Pow)
        arithmetic = isinstance(parent, (ast.BinOp, ast.Compare)) and not power
        if isinstance(node.value, float) or arithmetic:
            yield "scale_const", _scaled(node, up=True)
            yield "scale_const", _scaled(node, up=False)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        looser = {ast.Lt: ast.LtE, ast.Gt: ast.GtE}.get(type(node.ops[0]))
        if looser is not None:
            yield "loosen", ast.Compare(node.left, [looser()], node.comparators)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and _SRC_DST.search(node.id):
        yield "swap_src_dst", ast.Name(_swapped(node.id), ast.Load())
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        if _SRC_DST.search(node.attr):
            yield "swap_src_dst", ast.Attribute(node.value, _swapped(node.attr), ast.Load())
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if _SRC_DST.search(node.value) and len(node.value) <= 32:  # a key, not a message
            yield "swap_src_dst", ast.Constant(_swapped(node.value))
    if (
        isinstance(node, ast.Subscript)
        and _EDGE_LIKE.search(ast.unparse(node.value))
        and _number(node.slice)
        and node.slice.value in (0, 1)
    ):
        yield "swap_src_dst", ast.Subscript(node.value, ast.Constant(1 - node.slice.value))
    # The value of an assignment or a return: slipped, and a product negated.
    if isinstance(parent, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)):
        if _arithmetic(node):
            yield "slip", ast.BinOp(node, ast.Mult(), ast.parse(f"(1 + {SLIP!r})").body[0].value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.MatMult)):
            yield "sign", ast.UnaryOp(ast.USub(), node)


class _Collector(ast.NodeVisitor):
    """Walks a module, keeping the qualified name, and collects candidate replacements."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.stack: list[str] = []
        self.functions = 0  # how many of the stack's entries are functions
        self.messages: list[frozenset[str]] = []  # message_names of each open function
        self.constant: str | None = None  # the module-level constant being visited
        self.found: list[tuple[ast.AST, str, str, ast.AST]] = []  # node, function, op, new

    def _in_scope(self) -> bool:
        return self.constant is not None or (
            self.functions > 0 and self.scope.functions(".".join(self.stack))
        )

    def _scoped(self, node: ast.AST, name: str) -> None:
        self.stack.append(name)
        for child in ast.iter_child_nodes(node):
            if child in getattr(node, "decorator_list", ()):
                continue  # decorators (@check(...)) are registration, not math
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if child is node.returns or child is node.args:
                    continue  # annotations and defaults: not in the body
            self.visit(child)
        self.stack.pop()

    def _message_only(self, targets: list[ast.expr]) -> bool:
        """An assignment to names read only in error messages (:func:`message_names`)."""
        names = self.messages[-1] if self.messages else frozenset()
        return all(isinstance(t, ast.Name) and t.id in names for t in targets)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if isinstance(node.returns, ast.Name) and node.returns.id == "str":
            return  # text: a message or a repr, not the math
        self.functions += 1
        self.messages.append(message_names(node))
        self._scoped(node, node.name)
        self.messages.pop()
        self.functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    def visit_Assign(self, node: ast.Assign) -> None:
        targets = node.targets
        if self._message_only(targets):
            return
        if not self.stack and len(targets) == 1 and isinstance(targets[0], ast.Name):
            if self.scope.constants(targets[0].id):
                self.constant = targets[0].id
                self._visit_value(node.value, node)
                self.constant = None
            return
        self._visit_value(node.value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None and not self._message_only([node.target]):
            if not self.stack and isinstance(node.target, ast.Name):
                if self.scope.constants(node.target.id):
                    self.constant = node.target.id
                    self._visit_value(node.value, node)
                    self.constant = None
                return
            self._visit_value(node.value, node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self._message_only([node.target]):
            return
        if self._in_scope() and isinstance(node.op, (ast.Add, ast.Sub)):
            overwrite = ast.Assign([node.target], node.value, lineno=node.lineno)
            self.found.append((node, ".".join(self.stack), "drop_term", overwrite))
        self._visit_value(node.value, node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self._visit_value(node.value, node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # f-strings are messages

    def visit_Raise(self, node: ast.Raise) -> None:
        return  # an error message is not the math

    def _visit_value(self, value: ast.AST, statement: ast.AST) -> None:
        self._expression(value, statement)

    def _expression(self, node: ast.AST, parent: ast.AST) -> None:
        if isinstance(node, (ast.JoinedStr, ast.Lambda)):
            return
        if self._in_scope() and hasattr(node, "end_col_offset"):
            for operator, new in _expression_mutants(node, parent, self.constant):
                self.found.append((node, ".".join(self.stack) or "<module>", operator, new))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._expression(child, node)
            elif isinstance(child, ast.keyword):
                self._expression(child.value, node)
            elif isinstance(child, ast.comprehension):
                for part in (child.iter, *child.ifs):
                    self._expression(part, child)

    def generic_visit(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._expression(child, node)
            else:
                self.visit(child)


def _own_reads(statement: ast.stmt) -> Iterator[str]:
    """Names a statement reads itself, not in the statements nested in it (an ``if``'s body)."""
    for child in ast.iter_child_nodes(statement):
        if not isinstance(child, ast.stmt):
            for node in ast.walk(child):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    yield node.id


def _assigned(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        return statement.targets
    if isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        return [statement.target]
    return []


def message_names(function: ast.AST) -> frozenset[str]:
    """Names ``function`` assigns only to build error messages: every read of them is in a
    ``raise`` statement or in the assignment of another such name (``shown = repr(x)``,
    ``shown = shown[:57] + "..."``, then ``raise ValueError(f"... {shown}")``)."""
    statements = [s for s in ast.walk(function) if isinstance(s, ast.stmt) and s is not function]
    readers: dict[str, list[ast.stmt]] = {}  # name -> the statements that read it
    for statement in statements:
        for name in _own_reads(statement):
            readers.setdefault(name, []).append(statement)
    names = {
        t.id
        for s in statements
        for t in _assigned(s)
        if isinstance(t, ast.Name) and t.id in readers
    }
    while True:  # drop names read anywhere but in a raise or a message's assignment
        kept = {
            name
            for name in names
            if all(
                isinstance(s, ast.Raise)
                or (
                    _assigned(s)
                    and all(isinstance(t, ast.Name) and t.id in names for t in _assigned(s))
                )
                for s in readers[name]
            )
        }
        if kept == names:
            return frozenset(names)
        names = kept


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


def apply(source: str, mutant: Mutant) -> str:
    """``source`` with ``mutant``'s span replaced by its splice."""
    lines = source.encode().splitlines(keepends=True)
    start_line, start_col, end_line, end_col = mutant.span
    start = sum(len(line) for line in lines[: start_line - 1]) + start_col
    end = sum(len(line) for line in lines[: end_line - 1]) + end_col
    data = source.encode()
    return (data[:start] + mutant.splice.encode() + data[end:]).decode()


def mutants_of(path: str, source: str, scope: Scope) -> list[Mutant]:
    """Every mutant of ``source`` (the file at ``path``) within ``scope``, in source order.

    Mutants that leave the module's AST unchanged (``-(0.0)`` and the like) are dropped.
    """
    tree = ast.parse(source)
    collector = _Collector(scope)
    collector.visit(tree)
    original_dump = ast.dump(tree)
    seen: Counter[tuple[str, ...]] = Counter()
    mutants = []
    for node, function, operator, new in sorted(collector.found, key=lambda f: _span(f[0])):
        before, after = ast.unparse(node), ast.unparse(new)
        if before == after:
            continue
        key = (path, function, operator, before, after)
        rank = seen[key]
        seen[key] += 1
        digest = hashlib.sha1("\x1f".join((*key, str(rank))).encode()).hexdigest()[:10]
        # An expression goes in parenthesised, so it parses wherever the node sat.
        splice = after if isinstance(new, ast.stmt) else f"({after})"
        mutant = Mutant(
            digest, path, node.lineno, function, operator, before, after, _span(node), splice
        )
        if ast.dump(ast.parse(apply(source, mutant))) != original_dump:
            mutants.append(mutant)
    return mutants
