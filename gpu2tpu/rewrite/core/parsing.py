"""Parse a text for the codemod: Python's own parser first, then libcst, safely.

libcst's parser is native code and recursive: a statement nested a few thousand levels deep
(3,000 brackets, an `and` chain of 8,000 terms) overflows its stack and kills the process, and
long operator chains take super-linear time (2,000 `+` terms: about 20 s). Its Python side, and
the codemod's own traversal, raise `RecursionError` near 320 levels. So before libcst sees a
text:

- Python's parser reads it (C, about a tenth of libcst's time). What it rejects is not Python
  and is reported with its message; what it accepts tells where every statement is.
- Any statement nested deeper than `DEPTH_LIMIT` (counted the way libcst nests: each `and` of a
  chain, each piece of an implicit string concatenation, each bracket level) is held out: it
  is replaced by a placeholder of the same lines, `(_gpu2tpu_held_0)`, and put back verbatim
  after the rewrite. A statement that holds no token of any selected rule has nothing to
  rewrite; one that does makes the file an error, told in one line.
- A statement Python accepts but libcst's grammar does not (`(y): int = 1`) is held out the
  same way, found from the line libcst names.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import libcst as cst

from ..analysis.lines import python_lines
from . import cst_internals
from .statements import Group, Plan, groups

# Weighted nesting levels a statement may have (libcst and the traversal fail near 320 at an
# ordinary call depth; the margin is for callers deep in a stack, such as an IPython magic).
DEPTH_LIMIT = 200
_MAX_HOLDS = 64  # statements libcst's grammar rejects, held out one at a time

# How many libcst levels one `ast` level costs, measured with `rewrite_source` on chains of
# each kind (a call argument is Call > Arg > value; a subscript is Subscript > Element > Index).
_CALL_ARG = 2.4
_ELEMENT = 2.4
_SLICE = 3.3
_BLOCK = 2.0  # a nested block: the statement, its indented block

_ERROR_AT = re.compile(r"error at (\d+):(\d+):?")


class SourceError(ValueError):
    """The text is not Python the codemod can parse; carries a one-line reason."""

    def __init__(self, reason: str, line: int | None = None, col: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.col = col


def parse_module(text: str) -> cst.Module:
    """libcst's parse with its error turned into a `SourceError` (no guard: see `prepare`)."""
    try:
        return cst_internals.parse_module(text)
    except cst.ParserSyntaxError as err:
        first = str(err.message).strip().splitlines()[0] if err.message else "invalid syntax"
        # libcst's raw_line can point past the error; its message names the real place.
        at = _ERROR_AT.search(first)
        line, col = (int(at[1]), int(at[2]) + 1) if at else (err.raw_line, err.raw_column + 1)
        first = _ERROR_AT.sub("", first).removeprefix("parser error: ").strip(" :")
        raise SourceError(f"syntax error: {first}", line, col) from None
    except RecursionError:
        raise SourceError("too deeply nested for the parser") from None


@dataclass(frozen=True)
class Hold:
    """A statement kept away from libcst: where it was, and what stands in for it."""

    line: int
    original: str
    placeholder: str
    prefix: str  # the text before it on its first line
    compound: bool


@dataclass
class Prepared:
    """A text ready for the rules: Python's tree of it, and libcst's module of `text`."""

    original: str
    tree: ast.Module
    text: str  # the original with held statements replaced by placeholders
    module: cst.Module | None = None
    holds: list[Hold] = field(default_factory=list)
    # The top-level statements held out because nothing in them is to be rewritten
    # (statements.py), in the order of `module.body`'s placeholders; None: libcst parsed
    # every top-level statement (the whole-module path).
    skipped: tuple[Group, ...] | None = None
    marker: str = ""

    def restore(self, new_text: str) -> tuple[str, int]:
        """Put the held statements back into a rewritten text: (text, 0), or (the text as
        far as it went, the line of a placeholder that a fix moved or changed)."""
        return self._put_back(new_text, self.holds)

    def restore_within(self, piece: str) -> str | None:
        """`piece` (the code of some top-level statements) with the placeholders it holds
        put back; None when one was moved or changed. For a statement libcst wrote again only
        because something around it changed (a new statement before it gives it a blank
        leading line), while the other held statements are copied as written."""
        if not self.marker or self.marker not in piece:
            return piece
        text, moved = self._put_back(piece, [h for h in self.holds if h.placeholder in piece])
        return None if moved else text

    def _put_back(self, new_text: str, holds: list[Hold]) -> tuple[str, int]:
        if holds and new_text.count(self.marker) == len(holds):
            done = self._restore_in_order(new_text, holds)
            if done is not None:
                return done
        for hold in holds:
            at = new_text.find(hold.placeholder)
            if at < 0 or new_text.find(hold.placeholder, at + 1) >= 0:
                return new_text, hold.line
            start = new_text.rfind("\n", 0, at) + 1
            start = max(start, new_text.rfind("\r", 0, at) + 1)
            if hold.compound and new_text[start:at] != hold.prefix:
                return new_text, new_text.count("\n", 0, at) + 1
            new_text = new_text[:at] + hold.original + new_text[at + len(hold.placeholder) :]
        return new_text, 0

    def _restore_in_order(self, new_text: str, holds: list[Hold]) -> tuple[str, int] | None:
        """`restore` in one pass, when each placeholder occurs once and in the original order
        (a large file has one per top-level statement held out); None when they do not."""
        pieces: list[str] = []
        last = 0
        for hold in holds:
            at = new_text.find(hold.placeholder, last)
            if at < 0:
                return None
            if hold.compound:
                start = max(new_text.rfind("\n", 0, at), new_text.rfind("\r", 0, at)) + 1
                if new_text[start:at] != hold.prefix:
                    return new_text, new_text.count("\n", 0, at) + 1
            pieces += [new_text[last:at], hold.original]
            last = at + len(hold.placeholder)
        pieces.append(new_text[last:])
        return "".join(pieces), 0


Planner = Callable[[ast.Module, list[str]], "Plan | None"]


def prepare(text: str, tokens: Iterable[str], planner: Planner | None = None) -> Prepared:
    """Read `text` with Python's parser, hold out what libcst cannot take, parse the rest with
    libcst. Raises `SourceError` for text that is not Python, and for a statement libcst cannot
    take that holds a token (`tokens`: those of the selected rules).

    With a `planner` (statements.py), the top-level statements it names are held out too:
    nothing in them is rewritten, so libcst need not parse them (`Prepared.skipped`). A
    statement too deep for libcst among those it would parse, a statement libcst rejects, or
    libcst counting the top-level statements otherwise than Python turns the plan off.
    """
    tokens = tuple(tokens)
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        col = err.offset if err.offset and err.offset > 0 else None
        raise SourceError(f"syntax error: {err.msg}", err.lineno, col) from None
    except (RecursionError, MemoryError):
        raise SourceError("too deeply nested for Python's parser") from None
    except ValueError as err:  # NUL bytes
        raise SourceError(f"not Python source: {err}") from None
    prepared = Prepared(text, tree, text)
    lines = python_lines(text)
    statements = _Statements(tree, lines)
    if planner is not None:
        # Only the statements libcst is to parse are measured for depth: a deep one among
        # them turns the plan off (the whole-module path below holds it out instead).
        skip = planner(tree, lines)
        if skip is not None:
            out = {id(stmt) for group in skip.held for stmt in group.stmts}
            parsed = {id(stmt) for stmt in tree.body if id(stmt) not in out}
            if not statements.deep(parsed) and _parse_skipping(
                prepared, lines, statements, skip, tokens
            ):
                return prepared
    held: list[tuple[ast.stmt, str]] = []
    for stmt, depth in statements.deep():
        held.append(
            (stmt, f"nested {depth} levels deep, more than the codemod takes ({DEPTH_LIMIT})")
        )
    if held:
        prepared.text = _hold(prepared, lines, statements, held, tokens)
    for _ in range(_MAX_HOLDS):
        try:
            prepared.module = parse_module(prepared.text)
            return prepared
        except SourceError as err:
            inner = statements.innermost(err.line or 0)
            if inner is None or any(inner is s for s, _ in held):
                raise
            rejected = err.reason.removeprefix("syntax error: ")
            held.append((inner, f"that libcst's parser rejects although it is Python ({rejected})"))
            prepared.holds.clear()
            prepared.text = _hold(prepared, lines, statements, held, tokens)
    raise SourceError("too many statements libcst cannot parse")


def _parse_skipping(
    prepared: Prepared,
    lines: list[str],
    statements: _Statements,
    skip: Plan,
    tokens: tuple[str, ...],
) -> bool:
    """Parse `prepared`'s text with the top-level statements of `skip` held out; False (and
    `prepared` as it was) when libcst rejects a statement or counts the statements otherwise."""
    held = [
        (stmt, "with nothing to rewrite")
        for group in (*skip.held, *skip.methods)
        for stmt in group.stmts
    ]
    blocks = {}
    if skip.first_block is not None and skip.indent is not None:
        blocks[id(skip.first_block.stmts[0])] = skip.indent
    # What a held statement may not hold (a guard): the plan's own tokens, less those that
    # count only where a loop is (a statement holding one and no loop is held).
    guard = tuple(t for t in tokens if t not in skip.in_loops)
    cst_text = _hold(prepared, lines, statements, held, guard, blocks)
    try:
        module = parse_module(cst_text)
    except SourceError:
        module = None
    if (
        module is None
        or len(module.body) != len(groups(prepared.tree))
        or (skip.indent is not None and module.default_indent != skip.indent)
    ):
        prepared.holds.clear()
        return False
    prepared.module = module
    prepared.skipped = skip.held
    return True


def _hold(
    prepared: Prepared,
    lines: list[str],
    statements: _Statements,
    held: list[tuple[ast.stmt, str]],
    tokens: tuple[str, ...],
    blocks: dict[int, str] | None = None,
) -> str:
    """The original text with each held statement (outermost ones only) replaced; those in
    `blocks` (id -> indent) by a placeholder with an indented block."""
    spans: list[tuple[int, int, ast.stmt, str]] = []
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for stmt, why in held:
        first, col = statements.start(stmt)
        start = offsets[first - 1] + _chars(lines[first - 1], col)
        end_line = stmt.end_lineno or first
        end = offsets[end_line - 1] + _chars(lines[end_line - 1], stmt.end_col_offset or 0)
        spans.append((start, end, stmt, why))
    spans.sort(key=lambda s: (s[0], -s[1]))
    outer: list[tuple[int, int, ast.stmt, str]] = []
    for span in spans:
        if outer and span[0] < outer[-1][1]:
            continue  # inside a statement already held
        outer.append(span)
    text = prepared.original
    marker = "_gpu2tpu_held_"
    while marker in text:
        marker = "_" + marker
    prepared.marker = marker
    pieces: list[str] = []
    last = 0
    for index, (start, end, stmt, why) in enumerate(outer):
        original = text[start:end]
        if any(t in original for t in tokens):
            raise SourceError(f"a statement {why}", statements.start(stmt)[0])
        indent = blocks.get(id(stmt)) if blocks else None
        if indent is not None:
            placeholder = _block_placeholder(f"{marker}{index}", original, indent)
        else:
            placeholder = _placeholder(f"{marker}{index}", original)
        line_start = max(text.rfind("\n", 0, start), text.rfind("\r", 0, start)) + 1
        prepared.holds.append(
            Hold(
                line=statements.start(stmt)[0],
                original=original,
                placeholder=placeholder,
                prefix=text[line_start:start],
                compound=not isinstance(stmt, _SIMPLE),
            )
        )
        pieces += [text[last:start], placeholder]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _chars(line: str, byte_col: int) -> int:
    """`ast` columns count UTF-8 bytes; text offsets count characters."""
    if line.isascii():
        return byte_col
    return len(line.encode("utf-8", "surrogatepass")[:byte_col].decode("utf-8", "ignore"))


def _placeholder(name: str, original: str) -> str:
    """`(name)` spanning the same lines as `original`, padded to its last line's length, so
    that every later line and column keeps its number."""
    parts: list[str] = python_lines(original) or [original]
    if len(parts) == 1:
        return f"({name}{' ' * max(0, len(original) - len(name) - 2)})"
    ends = [p[len(p.rstrip("\r\n")) :] for p in parts[:-1]]
    body = f"({name}" + ends[0] + "".join(ends[1:])
    return body + " " * max(0, len(parts[-1]) - 1) + ")"


def _block_placeholder(name: str, original: str, indent: str) -> str:
    """`if name:` with an indented `pass`, spanning the same lines as `original` (a compound
    statement of two lines or more)."""
    parts = python_lines(original)
    ends = [p[len(p.rstrip("\r\n")) :] for p in parts[:-1]]
    last = f"{indent}pass"
    last += " " * max(0, len(parts[-1]) - len(last))
    if len(ends) == 1:
        return f"if {name}:{ends[0]}{last}"
    return f"if ({name}{ends[0]}{''.join(ends[1:-1])}):{ends[-1]}{last}"


_SIMPLE = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Raise, ast.Assert,
    ast.Delete, ast.Pass, ast.Break, ast.Continue, ast.Import, ast.ImportFrom, ast.Global,
    ast.Nonlocal,
)  # fmt: skip


class _Statements:
    """Every statement of a tree with its nesting, found without recursion (a chain of 1,000
    `elif`s is 1,000 levels deep)."""

    def __init__(self, tree: ast.Module, lines: list[str]) -> None:
        self.lines = lines
        self.items: list[tuple[ast.stmt, float]] = []
        stack: list[tuple[ast.stmt, float]] = [(s, 0.0) for s in reversed(tree.body)]
        while stack:
            stmt, depth = stack.pop()
            self.items.append((stmt, depth))
            inner = depth + _BLOCK
            children: list[tuple[ast.stmt, float]] = []
            for name in ("body", "orelse", "finalbody"):
                body = getattr(stmt, name, None)
                if not isinstance(body, list):
                    continue
                # libcst nests an `elif` inside the `if` before it: one level per link.
                step = depth + 1 if name == "orelse" and _is_elif(stmt) else inner
                children += [(s, step) for s in body]
            for handler in getattr(stmt, "handlers", ()):
                children += [(s, inner + 1) for s in handler.body]
            for case in getattr(stmt, "cases", ()):
                children += [(s, inner + 1) for s in case.body]
            stack.extend(reversed(children))

    def start(self, stmt: ast.stmt) -> tuple[int, int]:
        """(line, byte column) where the statement's text begins (its first decorator)."""
        decorators = getattr(stmt, "decorator_list", None)
        if decorators:
            first = min(decorators, key=lambda d: (d.lineno, d.col_offset))
            # the `@` is one character before the decorator's expression
            line = self.lines[first.lineno - 1]
            col = line.encode("utf-8", "surrogatepass")[: first.col_offset].rfind(b"@")
            return first.lineno, max(col, 0)
        return stmt.lineno, stmt.col_offset

    def deep(self, within: set[int] | None = None) -> list[tuple[ast.stmt, int]]:
        """Statements nested deeper than the limit (the outermost statement of each); only
        under the top-level statements whose ids are `within`, if given."""
        found: list[tuple[ast.stmt, int]] = []
        elif_head: dict[int, ast.stmt] = {}
        inside = True
        for stmt, depth in self.items:
            if within is not None:
                if depth == 0:  # a top-level statement: the items that follow are its own
                    inside = id(stmt) in within
                if not inside:
                    continue
            if isinstance(stmt, ast.If) and _is_elif(stmt):
                head = elif_head.get(id(stmt), stmt)
                elif_head[id(stmt.orelse[0])] = head
            if depth > DEPTH_LIMIT:
                head = elif_head.get(id(stmt), stmt)
                found.append((head, int(depth)))
                continue
            budget = DEPTH_LIMIT - depth
            for expr in _header(stmt):
                if self._span(expr) * _SLICE < budget:
                    continue
                level = _expression_depth(expr, self.lines, budget)
                if level > budget:
                    found.append((stmt, int(depth + level)))
                    break
        return found

    def _span(self, node: ast.expr) -> int:
        """An upper bound of the characters a node spans."""
        first, last = node.lineno, node.end_lineno or node.lineno
        if first == last:
            return (node.end_col_offset or 0) - node.col_offset
        return sum(len(self.lines[i]) for i in range(first - 1, min(last, len(self.lines))))

    def innermost(self, line: int) -> ast.stmt | None:
        """The most deeply nested statement that spans `line`."""
        best: tuple[ast.stmt, float] | None = None
        for stmt, depth in self.items:
            first = self.start(stmt)[0]
            if first <= line <= (stmt.end_lineno or first) and (best is None or depth >= best[1]):
                best = (stmt, depth)
        return best[0] if best else None


def _is_elif(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If)


def _header(stmt: ast.stmt) -> list[ast.expr]:
    """The expressions a statement holds itself (not those of the statements in its body)."""
    out = []
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        if isinstance(value, ast.expr):
            out.append(value)
        elif isinstance(value, list):
            out += [v for v in value if isinstance(v, ast.expr)]
        elif isinstance(value, ast.arguments):
            out += [*value.defaults, *(d for d in value.kw_defaults if d is not None)]
            args = (*value.posonlyargs, *value.args, *value.kwonlyargs, value.vararg, value.kwarg)
            out += [a.annotation for a in args if a is not None and a.annotation is not None]
        elif isinstance(value, ast.withitem | ast.keyword):
            out += [v for v in ast.iter_child_nodes(value) if isinstance(v, ast.expr)]
    for item in getattr(stmt, "items", ()):
        out += [v for v in ast.iter_child_nodes(item) if isinstance(v, ast.expr)]
    return out


def _expression_depth(node: ast.expr, lines: list[str], budget: float) -> float:
    """libcst levels of an expression (stops counting once past `budget`)."""
    best = 0.0
    stack: list[tuple[ast.AST, float]] = [(node, 1.0)]
    while stack:
        cur, depth = stack.pop()
        if isinstance(cur, ast.Constant | ast.JoinedStr):
            depth += _string_pieces(cur, lines) - 1
        if depth > best:
            best = depth
            if best > budget:
                return best
        if isinstance(cur, ast.BoolOp):
            step = float(len(cur.values))
            stack += [(v, depth + step) for v in cur.values]
            continue
        for name, value in ast.iter_fields(cur):
            if isinstance(cur, ast.Call) and name in ("args", "keywords"):
                step = _CALL_ARG
            elif isinstance(cur, ast.Subscript) and name == "slice":
                step = _SLICE
            elif isinstance(cur, ast.List | ast.Tuple | ast.Set | ast.Dict):
                step = _ELEMENT
            else:
                step = 1.0
            if isinstance(value, ast.AST):
                stack.append((value, depth + step))
            elif isinstance(value, list):
                stack += [(v, depth + step) for v in value if isinstance(v, ast.AST)]
    return best


def _string_pieces(node: ast.AST, lines: list[str]) -> int:
    """How many literals an implicit concatenation (`"a" "b"`) joins; libcst nests each."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, str | bytes):
        return 1
    first, last = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]  # a node of Python's tree with a position
    start, end = node.col_offset, node.end_col_offset or 0  # type: ignore[attr-defined]  # a node of Python's tree with a position
    if first == last and end - start < DEPTH_LIMIT // 2:
        return 1  # too short to join more pieces than the limit cares about
    if first == last:
        segment = lines[first - 1][_chars(lines[first - 1], start) : _chars(lines[first - 1], end)]
    else:
        middle = "".join(lines[first : last - 1])
        head = lines[first - 1][_chars(lines[first - 1], start) :]
        segment = head + middle + lines[last - 1][: _chars(lines[last - 1], end)]
    count = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(f"({segment}\n)\n").readline):
            if tok.type in _STRING_STARTS:
                count += 1
    except (tokenize.TokenError, SyntaxError):
        return 1
    return max(count, 1)


_STRING_STARTS = frozenset(
    t for t in (tokenize.STRING, getattr(tokenize, "FSTRING_START", None)) if t is not None
)
