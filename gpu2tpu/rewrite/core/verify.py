"""The safety net's checks: is a rewritten text at least as sound as the text it came from?

A rewrite must never hand back code that no longer compiles, that refers to a name nothing
binds, or that uses a name at module level before the statement that binds it (a device line
put above `import torch`). Each check compares the new text with the original and counts only
NEW problems: a notebook cell refers to names earlier cells bind, a script may already be
broken, and neither is the rewrite's doing.

Everything heavy runs in C: `ast.parse`, `compile` and `symtable` (scopes: globals, locals,
free variables, `global` declarations). Only the module-level statements are walked in
Python, for the order of bindings; function bodies are not (they run later). The checks run
only on texts the rewrite changed.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import re
import symtable
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

from ..analysis.lines import python_lines

# Names every module has without binding them, and those a class body has.
_MODULE_NAMES = frozenset(
    {"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__", "__path__",
     "__builtins__", "__cached__", "__annotations__", "__module__", "__qualname__", "__class__",
     "__debug__"}
)  # fmt: skip
_BUILTINS = frozenset(dir(builtins)) | _MODULE_NAMES
_STAR = re.compile(r"\bimport\s*\*|\bimport\s*\(\s*\*")


@dataclass(frozen=True)
class Problem:
    """One new problem in a rewritten text, at a line of that text (0: unknown)."""

    kind: str  # "compile" | "undefined" | "unbound" | "fix-error" | "held"
    line: int
    name: str = ""
    detail: str = ""

    @property
    def reason(self) -> str:
        """Why a fix was withheld, for a person: "the result would not compile: ..."."""
        if self.kind == "compile":
            return f"the result would not compile: {self.detail}"
        if self.kind == "undefined":
            return f"the result would use `{self.name}`, which nothing defines"
        if self.kind == "unbound":
            return f"the result would use `{self.name}` before the statement that binds it"
        if self.kind == "fix-error":
            return f"the fix failed ({self.detail})"
        return "the fix would move a statement the parser could not read"


@dataclass
class Facts:
    """What the checks need to know about one text."""

    error: str | None = None  # why it does not compile ("invalid syntax (line 3)"), if so
    error_line: int = 0
    parsed: bool = False  # `ast` and `symtable` read it (names are known)
    undefined: frozenset[str] = frozenset()  # referenced names nothing binds
    early: dict[str, int] = field(default_factory=dict)  # used at module level before bound
    tree: ast.Module | None = None


def facts(text: str, tree: ast.Module | None = None) -> Facts:
    """Compile `text` and collect its unbound names; never raises (`tree`: its tree from
    Python's parser, if the caller has it)."""
    out = Facts()
    if tree is None:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            out.error, out.error_line = _describe(err)
            return out
    out.tree = tree
    try:
        # Top-level `await` is what an IPython cell may hold; a script's is a runtime error.
        compile(tree, "<gpu2tpu>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        out.error, out.error_line = _describe(err)
    try:
        table = symtable.symtable(text, "<gpu2tpu>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return out
    bound, declared, referenced, functions = _scopes(table)
    try:
        # A name only a function binds (`global x`) is bound whenever that runs: not judged.
        out.early = _ModuleOrder(bound - declared, functions).run(tree)
    except RecursionError:  # names cannot be judged; compiling was checked
        return out
    if not _has_star_import(text, tree):
        out.undefined = frozenset(referenced - bound - declared - _BUILTINS)
    out.parsed = True
    return out


def new_problems(before: Facts, text: str, known: Iterable[str] = ()) -> list[Problem]:
    """The problems `text` has that the original (`before`) did not have.

    `known` names are bound outside the text (a notebook's device variable from an earlier
    cell). When the original itself does not compile, the new text may fail only the same way.
    """
    after = facts(text)
    if after.error is not None and after.error != before.error:
        return [Problem("compile", after.error_line, detail=after.error)]
    if not (after.parsed and before.parsed):
        return []
    known = frozenset(known)
    problems: list[Problem] = []
    undefined = sorted(after.undefined - before.undefined - known)
    if undefined:
        lines = _load_lines(after.tree, set(undefined))
        problems += [Problem("undefined", lines.get(n, 0), n) for n in undefined]
    for name, line in sorted(after.early.items(), key=lambda kv: kv[1]):
        if name not in before.early and name not in known and name not in after.undefined:
            problems.append(Problem("unbound", line, name))
    return problems


def _describe(err: BaseException) -> tuple[str, int]:
    if isinstance(err, SyntaxError):
        return err.msg or "invalid syntax", err.lineno or 0
    if isinstance(err, RecursionError):
        return "too deeply nested", 0
    return str(err) or type(err).__name__, 0


def _has_star_import(text: str, tree: ast.Module) -> bool:
    """`from m import *` anywhere at module level: then no name can be called undefined."""
    if not _STAR.search(text):
        return False
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        for name in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(node, name, ()))
    return False


def _scopes(
    top: symtable.SymbolTable,
) -> tuple[set[str], set[str], set[str], dict[str, frozenset[str]]]:
    """Module-level bindings, names functions bind with `global`, names looked up in the
    module's namespace (from any scope), and for each module-level function or class the global names its code reads (transitively
    through the other module-level functions and classes it names)."""
    bound: set[str] = set()
    declared: set[str] = set()  # bound by a function's `global` statement, when it runs
    referenced: set[str] = set()
    direct: dict[str, set[str]] = {}
    for sym in top.get_symbols():
        name = sym.get_name()
        if sym.is_assigned() or sym.is_imported() or sym.is_namespace() or sym.is_annotated():
            bound.add(name)
        if sym.is_referenced():
            referenced.add(name)
    for child in top.get_children():
        reads: set[str] = set()
        stack = [child]
        while stack:
            table = stack.pop()
            for sym in table.get_symbols():
                name = sym.get_name()
                if sym.is_declared_global() and (
                    sym.is_assigned() or sym.is_imported() or sym.is_namespace()
                ):
                    declared.add(name)
                if sym.is_referenced() and sym.is_global():
                    referenced.add(name)
                    reads.add(name)
            stack.extend(table.get_children())
        if child.get_type() in ("function", "class"):
            direct.setdefault(child.get_name(), set()).update(reads)
    functions: dict[str, frozenset[str]] = {}
    for name, reads in direct.items():
        seen, todo = set(reads), [r for r in reads if r in direct]
        while todo:
            for more in direct[todo.pop()] - seen:
                seen.add(more)
                if more in direct:
                    todo.append(more)
        functions[name] = frozenset(seen)
    return bound, declared, referenced, functions


def _load_lines(tree: ast.Module | None, names: set[str]) -> dict[str, int]:
    """The first line each of `names` is read on."""
    found: dict[str, int] = {}
    if tree is None:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            line = node.lineno
            if node.id not in found or line < found[node.id]:
                found[node.id] = line
    return found


class _ModuleOrder:
    """Names read by module-level code before the module binds them (but bound later on).

    Module-level code runs top to bottom at import: a statement may use only what the
    statements above it bound. Function bodies run later, so they are not walked, except that a
    call at module level of a module-level function (or class) counts as reading the globals
    its code reads. Any path binds: a name bound in one branch of an `if` counts as bound after
    it (the check compares two texts; it is not a type checker).
    """

    def __init__(self, later: set[str], functions: dict[str, frozenset[str]]) -> None:
        self.later = later
        self.functions = functions
        self.bound: set[str] = set()
        self.found: dict[str, int] = {}

    def run(self, tree: ast.Module) -> dict[str, int]:
        for stmt in tree.body:
            self.statement(stmt, None)
        return self.found

    def load(self, name: str, line: int, local: set[str] | None) -> None:
        if local is not None and name in local:
            return
        if name in self.bound or name not in self.later or name in self.found:
            return
        self.found[name] = line

    def bind(self, name: str, local: set[str] | None) -> None:
        (local if local is not None else self.bound).add(name)

    def statement(self, node: ast.stmt, local: set[str] | None) -> None:
        expr = self.expression
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for e in _function_header(node):
                expr(e, local)
            self.bind(node.name, local)
        elif isinstance(node, ast.ClassDef):
            for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                expr(e, local)
            inner: set[str] = set()
            for stmt in node.body:
                self.statement(stmt, inner)
            self.bind(node.name, local)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    self.bind((alias.asname or alias.name).split(".")[0], local)
        elif isinstance(node, ast.Assign):
            expr(node.value, local)
            for target in node.targets:
                self.target(target, local)
        elif isinstance(node, ast.AugAssign):
            expr(node.value, local)
            if isinstance(node.target, ast.Name):
                self.load(node.target.id, node.lineno, local)
            self.target(node.target, local)
        elif isinstance(node, ast.AnnAssign):
            expr(node.annotation, local)
            if node.value is not None:
                expr(node.value, local)
                self.target(node.target, local)
        elif isinstance(node, ast.For | ast.AsyncFor):
            expr(node.iter, local)
            self.target(node.target, local)
            self.block(node.body, local)
            self.block(node.orelse, local)
        elif isinstance(node, ast.While | ast.If):
            expr(node.test, local)
            self.block(node.body, local)
            self.block(node.orelse, local)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                expr(item.context_expr, local)
                if item.optional_vars is not None:
                    self.target(item.optional_vars, local)
            self.block(node.body, local)
        elif isinstance(node, ast.Try | _TRY_STAR):
            try_node = cast(ast.Try, node)  # `try`/`except*` has the same fields
            self.block(try_node.body, local)
            for handler in try_node.handlers:
                if handler.type is not None:
                    expr(handler.type, local)
                if handler.name:
                    self.bind(handler.name, local)
                self.block(handler.body, local)
            self.block(try_node.orelse, local)
            self.block(try_node.finalbody, local)
        elif isinstance(node, ast.Match):
            expr(node.subject, local)
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    name = getattr(sub, "name", None) or getattr(sub, "rest", None)
                    if isinstance(name, str):
                        self.bind(name, local)
                    if isinstance(sub, ast.MatchValue | ast.MatchClass):
                        expr(sub.value if isinstance(sub, ast.MatchValue) else sub.cls, local)
                if case.guard is not None:
                    expr(case.guard, local)
                self.block(case.body, local)
        else:  # Expr, Return, Raise, Assert, Delete, Global, Nonlocal, Pass, Break, Continue
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    expr(child, local)

    def block(self, body: list[ast.stmt], local: set[str] | None) -> None:
        for stmt in body:
            self.statement(stmt, local)

    def target(self, node: ast.expr, local: set[str] | None) -> None:
        """Bind the names an assignment target binds; read what its subscripts read."""
        if isinstance(node, ast.Name):
            self.bind(node.id, local)
        elif isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                self.target(elt, local)
        elif isinstance(node, ast.Starred):
            self.target(node.value, local)
        else:  # attribute or subscript: reads the object (and the index)
            self.expression(node, local)

    def expression(self, node: ast.expr, local: set[str] | None) -> None:
        """Read every name `node` reads now (not lambda bodies); bind `:=` targets."""
        comprehension_targets: set[str] = set()
        stack: list[ast.AST] = [node]
        while stack:
            cur = stack.pop()
            if isinstance(cur, ast.Name):
                if isinstance(cur.ctx, ast.Load) and cur.id not in comprehension_targets:
                    self.load(cur.id, cur.lineno, local)
                continue
            if isinstance(cur, ast.Lambda):
                stack.extend(cur.args.defaults)
                stack.extend(d for d in cur.args.kw_defaults if d is not None)
                continue
            if isinstance(cur, ast.NamedExpr):
                self.expression(cur.value, local)
                self.bind(cur.target.id, local)
                continue
            if isinstance(cur, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
                for gen in cur.generators:
                    comprehension_targets.update(_names(gen.target))
            if isinstance(cur, ast.Call) and isinstance(cur.func, ast.Name):
                for name in self.functions.get(cur.func.id, ()):
                    self.load(name, cur.lineno, local)
            stack.extend(ast.iter_child_nodes(cur))


_TRY_STAR: type = getattr(ast, "TryStar", ast.Try)


def _function_header(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.expr]:
    """What a `def` statement evaluates when it runs: decorators, defaults, annotations."""
    yield from node.decorator_list
    args = node.args
    yield from args.defaults
    yield from (d for d in args.kw_defaults if d is not None)
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None and arg.annotation is not None:
            yield arg.annotation
    if node.returns is not None:
        yield node.returns


def _names(target: ast.expr) -> Iterator[str]:
    for sub in ast.walk(target):
        if isinstance(sub, ast.Name):
            yield sub.id


# -- where in the original a problem of the new text comes from ---------------------------------


def original_lines(old: str, new: str, line: int) -> tuple[int, int] | None:
    """The original lines (first, last; 1-based) that became `line` of the new text, or None
    when that line is unchanged. An inserted line maps to the lines around the insertion."""
    if line <= 0:
        return None
    old_lines = python_lines(old)
    new_lines = python_lines(new)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if not j1 < line <= max(j2, j1 + 1):
            continue
        if tag == "equal":
            return None
        if tag == "insert":
            return max(1, i1), i1 + 1
        return i1 + 1, i2
    return None
