"""Lines and columns of reported nodes from the innermost statement, not the top-level one.

libcst computes positions by generating code (`PositionProvider`), which costs several times
a plain codegen. `RuleContext.position` lays out the whole top-level statement that holds a
node; in a large function or class that is most of the file, for one finding. Here the
statement the node sits in is found in Python's own tree instead (same blocks, same order:
`libcst` and `ast` agree on which statements a block holds, up to `a; b` lines, which both
count here as one), so only that statement is laid out, with the indents of the blocks around
it, and its first line comes from `ast`. Where the two trees do not line up, None: the caller
falls back to the top-level layout.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import libcst as cst
from libcst.metadata import CodeRange

from .cst_internals import layout
from .statements import Group, group_statements

if TYPE_CHECKING:
    from ..rules.base import RuleContext

_CST_FOR_AST: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.TryStar: tuple(t for t in (getattr(ast, "TryStar", None),) if t is not None),
    cst.Match: (ast.Match,),
}


class _Layouts:
    """Per `RuleContext`: Python's statement groups per block, and the laid-out statements."""

    def __init__(self) -> None:
        self.groups: dict[int, list[Group]] = {}
        self.computed: dict[int, Mapping[cst.CSTNode, CodeRange]] = {}
        # Each libcst block's statements by id -> their index: found by a scan, one finding
        # per line of a long module cost the module's length each (issue 33).
        self.indexes: dict[int, tuple[cst.CSTNode, dict[int, int]]] = {}


def statement_position(ctx: RuleContext, node: cst.CSTNode) -> tuple[int, int] | None:
    """1-based line and column of `node`, laying out only the innermost statement around it;
    None when that statement cannot be matched with Python's tree."""
    module = ctx.module
    tree = ctx.tree
    if module is None or tree is None:
        return None
    parents = ctx.parents
    chain = [node]
    while chain[-1] is not module:
        parent = parents.get(id(chain[-1]))
        if parent is None:
            return None
        chain.append(parent)
    chain.reverse()  # module first
    layouts = ctx.__dict__.setdefault("_statement_layouts", _Layouts())
    found = _match(chain, tree, layouts)
    if found is None:
        return None
    stmt, group, indents = found
    first = group.first
    computed = layouts.computed.get(id(stmt))
    if computed is None:
        computed = layouts.computed[id(stmt)] = layout(
            stmt, module.default_indent, module.default_newline, indents
        )
    pos = computed.get(node)
    if pos is None:
        return None
    leading = len(getattr(stmt, "leading_lines", ()))
    return first - leading + pos.start.line - 1, pos.start.column + 1


def _match(
    chain: list[cst.CSTNode], tree: ast.Module, layouts: _Layouts
) -> tuple[cst.CSTNode, Group, list[str]] | None:
    """The innermost statement of `chain` (module first) that sits in a block, its group of
    Python's statements (which holds its first line, decorators included), and the indents
    of the blocks around it."""
    module = chain[0]
    assert isinstance(module, cst.Module)
    block_ast: list[ast.stmt] = tree.body
    block_cst: cst.Module | cst.IndentedBlock = module
    indents: list[str] = []
    best: tuple[cst.CSTNode, Group, list[str]] | None = None
    i = 1
    while i < len(chain):
        stmt = chain[i]
        groups = _groups_of(block_ast, layouts)
        body = block_cst.body
        if len(groups) != len(body):
            return best
        index = _index_in(block_cst, stmt, layouts)
        if index is None:
            return best
        group = groups[index]
        best = (stmt, group, list(indents))
        if not isinstance(stmt, cst.BaseCompoundStatement) or len(group.stmts) != 1:
            return best
        node_ast = group.stmts[0]
        # Down the chain to the next indented block inside this statement, if any.
        current_cst: cst.CSTNode = stmt
        current_ast: ast.AST = node_ast
        j = i + 1
        while j < len(chain):
            if not isinstance(current_ast, _CST_FOR_AST.get(type(current_cst), ())):
                return best
            child = chain[j]
            if isinstance(child, cst.IndentedBlock):
                inner = _ast_block(current_cst, current_ast, child, chain[j - 1])
                if inner is None:
                    return best
                block_ast, block_cst = inner, child
                indents.append(child.indent if child.indent is not None else module.default_indent)
                i = j + 1
                break
            if isinstance(current_cst, cst.If) and child is current_cst.orelse:
                orelse = getattr(current_ast, "orelse", [])
                if isinstance(child, cst.If):  # `elif`: an `if` inside the `orelse`
                    if len(orelse) != 1 or not isinstance(orelse[0], ast.If):
                        return best
                    current_cst, current_ast = child, orelse[0]
                    j += 1
                    continue
            if isinstance(child, cst.MatchCase):
                # a match indents its cases one level (its own `indent`), then their blocks
                indent = current_cst.indent if isinstance(current_cst, cst.Match) else None
                indents.append(indent if indent is not None else module.default_indent)
                j += 1
                continue
            if isinstance(child, cst.Else | cst.Finally | cst.ExceptHandler):
                j += 1  # its block comes next in the chain
                continue
            return best  # the node is in the statement's header
        else:
            return best
    return best


def _ast_block(
    owner: cst.CSTNode, owner_ast: ast.AST, block: cst.IndentedBlock, via: cst.CSTNode
) -> list[ast.stmt] | None:
    """Python's statements for the block `block` of `owner` (reached through `via`)."""
    # `owner_ast` is the compound statement matched with `owner` (`_CST_FOR_AST`): it has the
    # field the libcst node has
    if via is owner and getattr(owner, "body", None) is block:
        return cast("list[ast.stmt]", owner_ast.body)  # type: ignore[attr-defined]  # the matched compound statement has the field
    if isinstance(via, cst.Else) and getattr(owner, "orelse", None) is via:
        return cast("list[ast.stmt]", owner_ast.orelse)  # type: ignore[attr-defined]  # the matched compound statement has the field
    if isinstance(via, cst.Finally) and getattr(owner, "finalbody", None) is via:
        return cast("list[ast.stmt]", owner_ast.finalbody)  # type: ignore[attr-defined]  # the matched compound statement has the field
    if isinstance(via, cst.ExceptHandler):
        handlers = list(getattr(owner, "handlers", ()))
        index = next((k for k, h in enumerate(handlers) if h is via), None)
        theirs = getattr(owner_ast, "handlers", [])
        if index is None or len(theirs) != len(handlers):
            return None
        return cast("list[ast.stmt]", theirs[index].body)
    if isinstance(via, cst.MatchCase):
        cases = list(getattr(owner, "cases", ()))
        index = next((k for k, c in enumerate(cases) if c is via), None)
        theirs = getattr(owner_ast, "cases", [])
        if index is None or len(theirs) != len(cases):
            return None
        return cast("list[ast.stmt]", theirs[index].body)
    return None


def _index_in(
    block: cst.Module | cst.IndentedBlock, stmt: cst.CSTNode, layouts: _Layouts
) -> int | None:
    """The index of `stmt` in `block.body` (None if it is not there), by a map made once."""
    entry = layouts.indexes.get(id(block))
    if entry is None or entry[0] is not block:
        entry = layouts.indexes[id(block)] = (block, {id(s): k for k, s in enumerate(block.body)})
    return entry[1].get(id(stmt))


def _groups_of(body: list[ast.stmt], layouts: _Layouts) -> list[Group]:
    found = layouts.groups.get(id(body))
    if found is None:
        found = layouts.groups[id(body)] = group_statements(body)
    return found


# -- a reported node's position and text from Python's tree -----------------------------------
#
# Laying out a statement with libcst costs about half a millisecond per line; Python's tree
# has every expression's start and end already. A reported node is reached from the innermost
# statement around it by a path of fields (`Call.func`, an argument, `Attribute.value`, ...);
# the same path in Python's tree gives its span, which the layout (`cst_internals.layout`)
# agrees with: both start after the node's own parentheses and before its first token.
# Any step this table does not know gives None, and the caller lays the statement out.

# libcst nodes that only wrap one expression of Python's tree (an argument, a list element, a
# decorator): the path passes through them, but they are never the reported node themselves
# (their own text adds a comma, an `@` or a keyword).
_WRAPPERS = (
    cst.Arg, cst.Element, cst.StarredElement, cst.AssignTarget, cst.Annotation,
    cst.ComparisonTarget, cst.SubscriptElement, cst.Index, cst.Decorator, cst.WithItem,
    cst.DictElement,
)  # fmt: skip

_SAME = object()  # a wrapper's child is the wrapper's own counterpart
# The field of each plain wrapper that holds the expression it wraps.
_WRAPPED: dict[type, str] = {
    cst.Arg: "value",
    cst.Element: "value",
    cst.AssignTarget: "target",
    cst.Annotation: "annotation",
    cst.Index: "value",
    cst.Decorator: "decorator",
}


def _paired(child: cst.CSTNode, mine: Sequence[cst.CSTNode], theirs: Sequence[object]) -> object:
    """The item of `theirs` at `child`'s place in `mine` (None: not there, or lengths differ)."""
    if len(mine) != len(theirs):
        return None
    return next((t for m, t in zip(mine, theirs, strict=True) if m is child), None)


def _expression_child(parent: Any, past: object, child: cst.CSTNode) -> object:
    """`parent` is a libcst node, typed Any: the branches test `type(parent)` kept in a local,
    which mypy does not narrow. The counterpart in Python's tree of `child`, a field of `parent` whose counterpart
    is `past`; None when unknown."""
    kind = type(parent)
    if kind is cst.Call and isinstance(past, ast.Call):
        if child is parent.func:
            return past.func
        positional = keyword = 0
        for arg in parent.args:
            star = arg.star
            if arg.keyword is not None or star == "**":
                if arg is child:
                    named = past.keywords[keyword] if keyword < len(past.keywords) else None
                    return named.value if named is not None else None
                keyword += 1
            else:
                if arg is child:
                    found = past.args[positional] if positional < len(past.args) else None
                    if star == "*":
                        return found.value if isinstance(found, ast.Starred) else None
                    return None if isinstance(found, ast.Starred) else found
                positional += 1
        return None
    wrapped = _WRAPPED.get(kind)
    if wrapped is not None:
        return _SAME if child is getattr(parent, wrapped) else None
    if kind is cst.StarredElement:
        return past.value if isinstance(past, ast.Starred) and child is parent.value else None
    if kind is cst.Attribute and isinstance(past, ast.Attribute):
        return past.value if child is parent.value else None
    if kind is cst.Subscript and isinstance(past, ast.Subscript):
        if child is parent.value:
            return past.value
        if len(parent.slice) == 1 and child is parent.slice[0]:
            return past.slice  # a single element: `x[i]`, `x[a:b]`
        return None
    if kind is cst.SubscriptElement:
        return _SAME if child is parent.slice and isinstance(child, cst.Index) else None
    if kind is cst.BinaryOperation and isinstance(past, ast.BinOp):
        return past.left if child is parent.left else past.right if child is parent.right else None
    if kind is cst.UnaryOperation and isinstance(past, ast.UnaryOp):
        return past.operand if child is parent.expression else None
    if kind is cst.Comparison and isinstance(past, ast.Compare):
        return (
            past.left
            if child is parent.left
            else _paired(child, parent.comparisons, past.comparators)
        )
    if kind is cst.ComparisonTarget:
        return _SAME if child is parent.comparator else None
    if kind in (cst.Tuple, cst.List, cst.Set) and isinstance(past, ast.Tuple | ast.List | ast.Set):
        return _paired(child, parent.elements, past.elts)
    if kind is cst.Dict and isinstance(past, ast.Dict):
        if len(parent.elements) != len(past.keys):
            return None
        for i, element in enumerate(parent.elements):
            if element is child:
                if not isinstance(element, cst.DictElement) or past.keys[i] is None:
                    return None
                return (past.keys[i], past.values[i])
        return None
    if kind is cst.DictElement and isinstance(past, tuple):
        return past[0] if child is parent.key else past[1] if child is parent.value else None
    if kind is cst.IfExp and isinstance(past, ast.IfExp):
        for mine, theirs in ((parent.test, past.test), (parent.body, past.body)):
            if child is mine:
                return theirs
        return past.orelse if child is parent.orelse else None
    if kind is cst.Await and isinstance(past, ast.Await):
        return past.value if child is parent.expression else None
    if kind is cst.NamedExpr and isinstance(past, ast.NamedExpr):
        return past.value if child is parent.value else None
    return None


def _statement_child(parent: Any, past: object, child: cst.CSTNode) -> object:
    """`parent` is a libcst node, typed Any as in `_expression_child`. As `_expression_child`, for the fields of statements (`past` is a statement of Python's
    tree, or the list of statements of a `a; b` line)."""
    kind = type(parent)
    if kind is cst.SimpleStatementLine or kind is cst.SimpleStatementSuite:
        return _paired(child, parent.body, past) if isinstance(past, list | tuple) else None
    if kind is cst.Expr and isinstance(past, ast.Expr):
        return past.value if child is parent.value else None
    if kind is cst.Assign and isinstance(past, ast.Assign):
        return past.value if child is parent.value else _paired(child, parent.targets, past.targets)
    if kind is cst.AnnAssign and isinstance(past, ast.AnnAssign):
        for mine, theirs in ((parent.target, past.target), (parent.annotation, past.annotation)):
            if child is mine:
                return theirs
        return past.value if child is parent.value and past.value is not None else None
    if kind is cst.AugAssign and isinstance(past, ast.AugAssign):
        return (
            past.target if child is parent.target else past.value if child is parent.value else None
        )
    if kind is cst.Return and isinstance(past, ast.Return):
        return past.value if child is parent.value else None
    if kind is cst.Assert and isinstance(past, ast.Assert):
        return past.test if child is parent.test else past.msg if child is parent.msg else None
    if kind in (cst.If, cst.While) and isinstance(past, ast.If | ast.While):
        if child is parent.test:
            return past.test
        return (
            past.body
            if child is parent.body and isinstance(child, cst.SimpleStatementSuite)
            else None
        )
    if kind is cst.For and isinstance(past, ast.For | ast.AsyncFor):
        if child is parent.iter:
            return past.iter
        if child is parent.target:
            return past.target
        return (
            past.body
            if child is parent.body and isinstance(child, cst.SimpleStatementSuite)
            else None
        )
    if kind is cst.With and isinstance(past, ast.With | ast.AsyncWith):
        if child is not parent.body:
            return _paired(child, parent.items, past.items)
        return past.body if isinstance(child, cst.SimpleStatementSuite) else None
    if kind is cst.WithItem and isinstance(past, ast.withitem):
        return past.context_expr if child is parent.item else None
    if kind in (cst.FunctionDef, cst.ClassDef) and isinstance(
        past, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ):
        return _paired(child, parent.decorators, past.decorator_list)
    return _expression_child(parent, past, child)


def source_span(ctx: RuleContext, node: cst.CSTNode) -> tuple[int, int, str | None] | None:
    """1-based line, column and source text of `node` (an expression or a simple statement,
    as libcst's `code_for_node` writes it; None for a node over several lines) read from
    Python's tree and the text, without laying anything out; None where the two trees
    cannot be walked side by side."""
    module = ctx.module
    tree = ctx.tree
    if module is None or tree is None or isinstance(node, _WRAPPERS):
        return None
    if getattr(node, "lpar", ()):
        return None
    if isinstance(node, cst.BaseSmallStatement) and not isinstance(
        getattr(node, "semicolon", cst.MaybeSentinel.DEFAULT), cst.MaybeSentinel
    ):
        return None  # its text would include its own `;`
    if isinstance(node, cst.BaseCompoundStatement | cst.SimpleStatementLine | cst.GeneratorExp):
        return None  # (a generator that is a call's only argument starts at the call's `(`)
    parents = ctx.parents
    chain = [node]
    while chain[-1] is not module:
        parent = parents.get(id(chain[-1]))
        if parent is None:
            return None
        chain.append(parent)
    chain.reverse()
    layouts = ctx.__dict__.setdefault("_statement_layouts", _Layouts())
    found = _match(chain, tree, layouts)
    if found is None:
        return None
    stmt, group, _ = found
    at = chain.index(stmt)
    past: object = (
        list(group.stmts) if isinstance(stmt, cst.SimpleStatementLine) else group.stmts[0]
    )
    for parent, child in zip(chain[at:], chain[at + 1 :], strict=False):
        step = _statement_child(parent, past, child)
        if step is None:
            return None
        if step is not _SAME:
            past = step
    if not isinstance(past, ast.expr | ast.stmt) or past.end_lineno is None:
        return None
    lines = _source_lines(ctx)
    if lines is None or past.end_lineno > len(lines):
        return None
    first = lines[past.lineno - 1]
    column = len(first[: past.col_offset].decode("utf-8", "surrogatepass")) + 1
    if past.lineno != past.end_lineno:
        # libcst writes a continuation line without the indent of the blocks around it
        return past.lineno, column, None
    text = first[past.col_offset : past.end_col_offset].decode("utf-8", "surrogatepass")
    return past.lineno, column, text


def _source_lines(ctx: RuleContext) -> list[bytes] | None:
    """The text's lines as Python's parser counts them, in UTF-8 (its columns are bytes);
    None for a text with a line end Python's tree may count otherwise (a lone carriage
    return, a form feed's neighbours are fine)."""
    found = ctx.__dict__.get("_source_lines", False)
    if found is False:
        text = ctx.source
        found = (
            None
            if "\r" in text
            else text.encode("utf-8", "surrogatepass").splitlines(keepends=True)
        )
        ctx.__dict__["_source_lines"] = found
    return cast("list[bytes] | None", found)
