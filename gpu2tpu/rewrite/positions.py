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

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata import PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState

from .statements import Group, group_statements

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
        self.computed: dict[int, dict[cst.CSTNode, object]] = {}


def statement_position(ctx, node: cst.CSTNode) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
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
    stmt, first, indents = found
    computed = layouts.computed.get(id(stmt))
    if computed is None:
        provider = PositionProvider()
        state = _PositionState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            provider=provider,
        )
        state.indent_tokens.extend(indents)
        stmt._codegen(state)
        computed = layouts.computed[id(stmt)] = provider._computed
    pos = computed.get(node)  # type: ignore[call-overload]
    if pos is None:
        return None
    leading = len(getattr(stmt, "leading_lines", ()))
    return first - leading + pos.start.line - 1, pos.start.column + 1  # type: ignore[attr-defined]


def _match(
    chain: list[cst.CSTNode], tree: ast.Module, layouts: _Layouts
) -> tuple[cst.CSTNode, int, list[str]] | None:
    """The innermost statement of `chain` (module first) that sits in a block, its first line
    (decorators included) from Python's tree, and the indents of the blocks around it."""
    module = chain[0]
    assert isinstance(module, cst.Module)
    block_ast: list[ast.stmt] = tree.body
    block_cst: cst.Module | cst.IndentedBlock = module
    indents: list[str] = []
    best: tuple[cst.CSTNode, int, list[str]] | None = None
    i = 1
    while i < len(chain):
        stmt = chain[i]
        groups = _groups_of(block_ast, layouts)
        body = block_cst.body
        if len(groups) != len(body):
            return best
        index = next((k for k, s in enumerate(body) if s is stmt), None)
        if index is None:
            return best
        group = groups[index]
        best = (stmt, group.first, list(indents))
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
    if via is owner and getattr(owner, "body", None) is block:
        return owner_ast.body  # type: ignore[attr-defined]
    if isinstance(via, cst.Else) and getattr(owner, "orelse", None) is via:
        return owner_ast.orelse  # type: ignore[attr-defined]
    if isinstance(via, cst.Finally) and getattr(owner, "finalbody", None) is via:
        return owner_ast.finalbody  # type: ignore[attr-defined]
    if isinstance(via, cst.ExceptHandler):
        handlers = list(getattr(owner, "handlers", ()))
        index = next((k for k, h in enumerate(handlers) if h is via), None)
        theirs = getattr(owner_ast, "handlers", [])
        if index is None or len(theirs) != len(handlers):
            return None
        return theirs[index].body
    if isinstance(via, cst.MatchCase):
        cases = list(getattr(owner, "cases", ()))
        index = next((k for k, c in enumerate(cases) if c is via), None)
        theirs = getattr(owner_ast, "cases", [])
        if index is None or len(theirs) != len(cases):
            return None
        return theirs[index].body
    return None


def _groups_of(body: list[ast.stmt], layouts: _Layouts) -> list[Group]:
    found = layouts.groups.get(id(body))
    if found is None:
        found = layouts.groups[id(body)] = group_statements(body)
    return found


class _PositionState(PositionProvidingCodegenState):
    """libcst's position layout with the same results, for less: its syntactic positions are
    recorded by a generator-based context manager per node and every token is split on
    newlines; here a small class and a test for a newline first."""

    __slots__ = ()

    def _update_position(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        segments = NEWLINE_RE.split(value)
        self.line += len(segments) - 1
        self.column = len(segments[-1])

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _Record:
        return _Record(self, node, start_node, end_node)


class _Record:
    """`PositionProvidingCodegenState.record_syntactic_position`, as a plain context manager."""

    __slots__ = ("end_node", "node", "start", "start_node", "state")

    def __init__(
        self,
        state: _PositionState,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node
        self.start = CodePosition(state.line, state.column)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        state = self.state
        computed = state.provider._computed
        end = CodePosition(state.line, state.column)
        start = computed[self.start_node].start if self.start_node is not None else self.start
        end = computed[self.end_node].end if self.end_node is not None else end
        computed[self.node] = CodeRange(start, end)
        return False
