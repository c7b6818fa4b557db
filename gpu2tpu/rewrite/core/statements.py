"""Which top-level statements libcst need not parse: the statement-level path of the codemod.

Most of a large file has nothing to rewrite. Python's own parser (C, about a tenth of a libcst
parse) already says where every top-level statement is; a statement whose text holds no token
of any selected rule is neither visited by the rules nor changed by a fix, so libcst gets a
placeholder of the same lines instead (parsing.py holds it out and puts it back verbatim).
The text around it, and so every line and column, the blank lines and comments each statement
owns, and the module's layout settings, stay as a whole-module parse would have them — that is
the condition for holding a statement out, checked here:

- the statement holds no token, and no name that an import of a token binds (after
  `from torch.cuda import synchronize`, a bare `synchronize()` must be visited), nor the name
  of a CUDA-only package (analysis/branches.py scans what follows a CUDA assertion for them);
- it is not a simple statement next to a kept one, with only simple statements between:
  rules read the lines around the one they visit (a seed call before a CUDA seed call);
- it names no variable that a kept statement holding a token of a rule that follows names
  (`Rule.follows_names`) binds: `start = torch.cuda.Event(...)` is rewritten only when every
  `start.record()` of its scope is, wherever they are;
- it holds no device argument that an int written elsewhere reaches, for a rule that
  follows device values (`Rule.follows_devices`): `net.to(gpu_ids[0])` after `gpu_ids =
  [0, 1]` names a CUDA ordinal with no token in sight;
- it is not an import and not part of the module's start-up block (docstring, imports, set-up,
  up to the place of the device line): module-level fixes (`import torch`, `import time`, the
  device line) read and edit that block;
- a compound statement is followed, up to the next statement, only by empty lines and comments
  in column 0: libcst gives a block the indented comments and blank lines with spaces after
  its last line (its footer), a placeholder would hand them to the next statement;
- the module's default indent (libcst takes it from the first indented block, and leaves
  unset the indent of each block indented alike) stays: when the first statement with an
  indented block is held out, its placeholder is a block of that indent (read with
  `tokenize`).

Inside a kept class the methods are units on the same terms, with what the rules read across
methods kept (`held_methods` says what). Everything else — rules that see the whole module
(`Rule.whole_module`), files with statements held out for depth, short modules — takes the
whole-module parse (`statement_level` False).
"""

from __future__ import annotations

import ast
import bisect
import io
import itertools
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass

from ..analysis.branches import CUDA_ONLY_PACKAGES
from ..analysis.placement import device_line_after

# Statements that must be parsed for the module-level edits, whatever their text.
_IMPORTS = (ast.Import, ast.ImportFrom)
_SIMPLE = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Raise, ast.Assert,
    ast.Delete, ast.Pass, ast.Break, ast.Continue, ast.Import, ast.ImportFrom, ast.Global,
    ast.Nonlocal,
)  # fmt: skip
# Statements that bind a module-level name the flow facts record (analysis/flow.py).
BINDING = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign, ast.AnnAssign,
           ast.AugAssign)  # fmt: skip
MIN_STATEMENTS = 4  # shorter modules are parsed whole (as the traversal visits them whole)


@dataclass(frozen=True)
class Group:
    """One top-level statement as libcst counts them (`a = 1; b = 2` is one): Python's
    statements in it, and its first and last line (decorators included)."""

    stmts: tuple[ast.stmt, ...]
    first: int
    last: int


@dataclass(frozen=True)
class Plan:
    """What to hold out of libcst's parse: the groups, and the default indent to set on the
    module when the block libcst would have read it from is held out (None: leave it)."""

    held: tuple[Group, ...]
    indent: str | None
    # The held statement with the module's first indented block: its placeholder has a block
    # indented alike, so that libcst takes the same default indent (and so leaves the same
    # blocks' own indents unset) as from the whole module.
    first_block: Group | None = None
    # Methods held out of the classes libcst parses (`held_methods`), one group each.
    methods: tuple[Group, ...] = ()
    # Tokens a held statement may hold: those that count only where a loop is.
    in_loops: tuple[str, ...] = ()


def groups(tree: ast.Module) -> list[Group]:
    """The module's top-level statements grouped as libcst groups them."""
    return group_statements(tree.body)


def group_statements(body: list[ast.stmt]) -> list[Group]:
    """The statements of one block grouped as libcst groups them."""
    out: list[Group] = []
    previous_end = -1
    for stmt in body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
        last = stmt.end_lineno or stmt.lineno
        if out and first == previous_end and isinstance(stmt, _SIMPLE):
            head = out[-1]
            out[-1] = Group((*head.stmts, stmt), head.first, last)
        else:
            out.append(Group((stmt,), first, last))
        previous_end = last
    return out


def plan(
    tree: ast.Module,
    lines: list[str],
    tokens: Iterable[str],
    imports: dict[str, str],
    follow: Iterable[str] = (),
    keep_lines: Iterable[int] = (),
    loop_tokens: Iterable[str] = (),
) -> Plan | None:
    """The top-level statements libcst need not parse (None: none, parse the whole module).

    `lines` are the text's lines with their ends (Python's line ends only); `tokens` those of
    the selected rules; `imports` every name an import binds -> its qualified name; `follow`
    the tokens of the rules that follow the names their statements bind; `keep_lines`
    lines whose statements are kept whatever they hold (a device argument that an int
    written elsewhere reaches: analysis/values.py); `loop_tokens` those of `tokens` that only
    rules reporting inside loops hold (`Rule.in_loops_only`): they count in a statement or a
    method that holds a loop.
    """
    found = groups(tree)
    if len(found) < MIN_STATEMENTS:
        return None
    raw = set(tokens)
    # The same widening as the traversal's filter (source._statements_to_visit).
    raw |= {local for local, full in imports.items() if any(t in full for t in raw)}
    raw |= CUDA_ONLY_PACKAGES  # what a region after `assert torch.cuda...` is scanned for
    in_loops = raw & set(loop_tokens)
    holder = _Words(tuple(raw - in_loops), tuple(in_loops))
    protected = device_line_after(tree)  # counted in Python's statements
    keep: list[bool] = []
    startup: list[bool] = []  # in the module's start-up block
    codes = ["".join(lines[group.first - 1 : group.last]) for group in found]
    seen = 0
    wanted = sorted(set(keep_lines))
    for group, code in zip(found, codes, strict=True):
        startup.append(seen < protected)
        keep.append(
            startup[-1]
            or any(isinstance(s, _IMPORTS) for s in group.stmts)
            or holder.held_by(code, group.stmts)
            or any(group.first <= line <= group.last for line in wanted)
        )
        seen += len(group.stmts)
    bound = _keep_users(found, codes, keep, tuple(follow))
    # Rules read the statements next to the one they visit (`torch.manual_seed(s)` before a
    # CUDA seed call, seeding lines between): the simple statements around a kept one are
    # kept too, up to the next compound statement.
    simple = [all(isinstance(s, _SIMPLE) for s in g.stmts) for g in found]
    for index in [i for i, k in enumerate(keep) if k]:
        for step in (-1, 1):
            j = index + step
            while 0 <= j < len(found) and simple[j] and not keep[j]:
                keep[j] = True
                j += step
    held: list[Group] = []
    methods: list[Group] = []
    if any(
        kept and isinstance(g.stmts[0], ast.ClassDef) for g, kept in zip(found, keep, strict=True)
    ):
        bound = _merge(bound, _token_bindings(found, keep, lines, holder.always + holder.in_loops))
    for index, group in enumerate(found):
        if keep[index]:
            if not startup[index]:
                methods += held_methods(group, lines, holder, wanted, bound)
            continue
        if not simple[index]:
            end = found[index + 1].first - 1 if index + 1 < len(found) else len(lines)
            if not _clean_gap(lines[group.last : end]):
                continue
        held.append(group)
    if not held and not methods:
        return None
    first = _first_indented(found, lines)
    if first is None or first[0] not in held:
        return Plan(tuple(held), None, methods=tuple(methods), in_loops=holder.in_loops)
    group, indent = first
    if indent is None or indent.strip(" \t") != "":
        held.remove(group)  # its indent is unknown: libcst reads it from the statement
        if not held and not methods:
            return None
        return Plan(tuple(held), None, methods=tuple(methods), in_loops=holder.in_loops)
    return Plan(tuple(held), indent, group, tuple(methods), holder.in_loops)


def held_methods(
    group: Group, lines: list[str], holder: _Words, wanted: list[int], bound: Bound
) -> list[Group]:
    """The methods of a kept top-level class that libcst need not parse either.

    A class is one top-level statement: one CUDA call in one method of a 2,000-line model
    had libcst parse all of it. A method is held out on the same terms as a top-level
    statement (no token, no name an import of a token binds, no CUDA-only package, no device
    argument an int reaches) and on two more that hold because of what the rules read
    beyond the node they visit: the flow facts (analysis/flow.py) look names up in the
    function's own scopes and the module's, never in a class's, and follow no attribute, so a
    method binds nothing another statement reads, unless it declares a name `global` or
    `nonlocal` (then it is kept); and the rules that follow the names their statements bind
    (`Rule.follows_names`) may follow them into a method as an attribute
    (`self.start = torch.cuda.Event(...)` in `__init__`, `self.start.record()` in `step`), so
    a method that names a variable or attribute such a statement binds is kept. Its
    placeholder spans the same lines from the same column, so every line and column, the
    class's indent and the statements around it stay as a whole parse has them.
    """
    stmt = group.stmts[0]
    if len(group.stmts) != 1 or not isinstance(stmt, ast.ClassDef):
        return []
    names, attributes = bound
    out: list[Group] = []
    for method in stmt.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = min([method.lineno, *(d.lineno for d in method.decorator_list)])
        last = method.end_lineno or method.lineno
        if first <= stmt.lineno or any(first <= line <= last for line in wanted):
            continue
        code = "".join(lines[first - 1 : last])
        if holder.held_by(code, (method,)):
            continue
        # The text says whether the method may name one (a substring search each); only
        # then is its tree walked to tell a name from a word in a string or a comment.
        read = {n for n in names if n in code}
        read_attributes = {a for a in attributes if a in code}
        scoped = "global" in code or "nonlocal" in code
        if (read or read_attributes or scoped) and any(
            isinstance(node, ast.Global | ast.Nonlocal)
            or (isinstance(node, ast.Name) and node.id in read)
            or (isinstance(node, ast.Attribute) and node.attr in read_attributes)
            for node in ast.walk(method)
        ):
            continue
        out.append(Group((method,), first, last))
    return out


Bound = tuple[frozenset[str], frozenset[str]]  # variables, attributes
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class _Words:
    """What makes a statement one to parse: a word of `always`, or a word of `in_loops` in a
    statement that holds a loop (a training loop's hazards are reported inside one only)."""

    always: tuple[str, ...]
    in_loops: tuple[str, ...]

    def held_by(self, code: str, stmts: Iterable[ast.stmt]) -> bool:
        """Whether the statements `stmts`, whose text is `code`, hold such a word."""
        if any(t in code for t in self.always):
            return True
        if not any(t in code for t in self.in_loops):
            return False
        if "for" not in code and "while" not in code:
            return False  # no loop in the text: no need to walk the tree
        return any(isinstance(node, _LOOPS) for stmt in stmts for node in ast.walk(stmt))


_ASSIGNS = (ast.Assign, ast.AnnAssign, ast.AugAssign)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _token_bindings(
    found: list[Group], keep: list[bool], lines: list[str], words: tuple[str, ...]
) -> Bound:
    """The module-level variables and the attributes that kept statements assign from a
    token (`self.gpu_id = int(os.environ["LOCAL_RANK"])`): rules follow such values into
    the statements that read them (`.to(self.gpu_id)`, G2T407), which hold no token."""
    names: set[str] = set()
    attributes: set[str] = set()
    for group, kept in zip(found, keep, strict=True):
        if not kept:
            continue
        marked = _lines_with(lines, group, words)
        if not marked:
            continue
        # Statements only (an assignment is one), not their expressions: a walk of every
        # node of the kept classes cost more than the plan saved.
        # (statement, whether it runs in the module's scope: its names are globals)
        stack: list[tuple[ast.stmt, bool]] = [(stmt, True) for stmt in group.stmts]
        while stack:
            node, module_scope = stack.pop()
            last = node.end_lineno or node.lineno
            at = bisect.bisect_left(marked, node.lineno)
            if at == len(marked) or marked[at] > last:
                continue  # no token in it, nor in anything it holds
            if isinstance(node, _ASSIGNS):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Attribute):
                            attributes.add(part.attr)
                        elif isinstance(part, ast.Name) and module_scope:
                            names.add(part.id)
                continue
            inner = module_scope and not isinstance(node, _DEFINITIONS)
            blocks = [getattr(node, field, ()) for field in ("body", "orelse", "finalbody")]
            blocks += [handler.body for handler in getattr(node, "handlers", ())]
            blocks += [case.body for case in getattr(node, "cases", ())]
            stack.extend((child, inner) for block in blocks for child in block)
    return frozenset(names), frozenset(attributes)


def _lines_with(lines: list[str], group: Group, words: tuple[str, ...]) -> list[int]:
    """The lines of `group` (1-based) that hold one of `words`."""
    own = lines[group.first - 1 : group.last]
    code = "".join(own)
    ends = list(itertools.accumulate(map(len, own)))  # offset just past each line
    found: set[int] = set()
    for word in words:
        at = code.find(word)
        while at >= 0:
            found.add(group.first + bisect.bisect_right(ends, at))
            at = code.find(word, at + 1)
    return sorted(found)


def _merge(a: Bound, b: Bound) -> Bound:
    return a[0] | b[0], a[1] | b[1]


def _keep_users(
    found: list[Group], codes: list[str], keep: list[bool], follow: tuple[str, ...]
) -> Bound:
    """Keep every statement that names a variable bound by a kept statement holding one of
    the `follow` tokens (`codes`: each statement's text); return the variables and the
    attributes (`self.start = ...`) those statements bind."""
    if not follow:
        return frozenset(), frozenset()
    bound: set[str] = set()
    attributes: set[str] = set()
    for group, code, kept in zip(found, codes, keep, strict=True):
        if kept and any(t in code for t in follow):
            for stmt in group.stmts:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        bound.add(node.id)
                    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                        attributes.add(node.attr)
    if bound:
        for index, group in enumerate(found):
            if not keep[index]:
                keep[index] = any(
                    isinstance(node, ast.Name) and node.id in bound
                    for stmt in group.stmts
                    for node in ast.walk(stmt)
                )
    return frozenset(bound), frozenset(attributes)


def _clean_gap(gap: list[str]) -> bool:
    """Whether the lines after a block hold only empty lines and comments in column 0 (which
    libcst gives to the next statement, as it would after a placeholder)."""
    return all(line in ("\n", "\r\n", "\r") or line.startswith("#") for line in gap)


def _first_indented(found: list[Group], lines: list[str]) -> tuple[Group, str | None] | None:
    """The first statement whose text has an indented block, and the block's indent (libcst's
    default indent for the module); None when no statement has one. The indent is None when
    `tokenize` cannot tell it."""
    for group in found:
        stmt = group.stmts[0]
        if isinstance(stmt, _SIMPLE) or group.last == group.first:
            continue  # no block, or one on the same line: no INDENT token
        text = "".join(lines[group.first - 1 : group.last])
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.INDENT:
                    return group, tok.string
        except (tokenize.TokenError, SyntaxError, IndentationError):
            return group, None
    return None
