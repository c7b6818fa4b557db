"""What the engine's one traversal records for the flow facts: bindings, scopes, loop calls.

`FlowRecorder` rides along the traversal (the engine runs it ahead of the rules whenever a
selected rule sets `uses_flow`) and writes a `FlowRecord`; `flow.FlowFacts` answers the rules'
questions from that record, lazily. The two are apart because they change for different
reasons: the record follows the tree's shape (which nodes bind, open a scope, loop), the facts
follow what the rules ask (training loops, ranks, tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from ..rules.base import RuleContext


@dataclass(frozen=True)
class Binding:
    """One way a name gets its value in a scope."""

    how: str  # "assign", "aug" (+=), "for" (loop target), "param", "class", "def"
    value: cst.CSTNode | None  # the value, the iterable, the Param or the ClassDef
    path: tuple[int, ...] = ()  # position inside a tuple target: `x, (y, z) = ...`


class FlowRecord:
    """Bindings per scope, the scopes' nesting and the calls made directly in each loop, all
    keyed by node id, as the traversal found them."""

    def __init__(self) -> None:
        self.bindings: dict[int, dict[str, list[Binding]]] = {}
        self.scope_parent: dict[int, int | None] = {}
        self.scopes: list[int] = []
        self.loops: list[int | None] = []  # enclosing loops; None marks a function boundary
        self.loop_calls: dict[int, list[cst.Call]] = {}
        self._skipped_bound = False

    def enter_scope(self, node: cst.CSTNode) -> None:
        self.scope_parent[id(node)] = self.scopes[-1] if self.scopes else None
        self.scopes.append(id(node))
        if not isinstance(node, cst.Module | cst.ClassDef):
            self.loops.append(None)

    def leave_scope(self, node: cst.CSTNode) -> None:
        if self.scopes and self.scopes[-1] == id(node):
            self.scopes.pop()
            if not isinstance(node, cst.Module | cst.ClassDef):
                self.loops.pop()

    def enter_loop(self, node: cst.For | cst.While) -> None:
        self.loops.append(id(node))
        self.loop_calls[id(node)] = []

    def leave_loop(self) -> None:
        self.loops.pop()

    def record_call(self, node: cst.Call) -> None:
        """Remember a call made directly in the innermost loop (a possible training step)."""
        if self.loops and self.loops[-1] is not None:
            self.loop_calls[self.loops[-1]].append(node)

    def bind(self, target: cst.CSTNode, how: str, value: cst.CSTNode | None) -> None:
        """Record the names an assignment target binds in the current scope."""
        if not self.scopes:
            return
        table = self.bindings.setdefault(self.scopes[-1], {})
        for name, path in target_names(target, ()):
            table.setdefault(name, []).append(Binding(how, value, path))

    def bind_name(self, name: str, how: str, value: cst.CSTNode) -> None:
        if self.scopes:
            self.bindings.setdefault(self.scopes[-1], {}).setdefault(name, []).append(
                Binding(how, value)
            )

    def bind_skipped_statements(
        self,
        module: cst.Module | None,
        visited: Mapping[int, cst.CSTNode],
        real_statement: Callable[[cst.BaseStatement], cst.BaseStatement],
    ) -> None:
        """Record the bindings of the top-level statements the traversal skipped (no token of
        any selected rule), once: plain assignments, classes and functions, no deeper.
        `visited` holds the nodes the traversal reached (their parents); `real_statement`
        parses a statement libcst was given a placeholder for."""
        if self._skipped_bound or module is None:
            return
        self._skipped_bound = True
        table = self.bindings.setdefault(id(module), {})
        for stmt in map(real_statement, module.body):
            if any(id(child) in visited for child in stmt.children[:1]):
                continue  # visited: its bindings are recorded already
            if isinstance(stmt, cst.ClassDef):
                table.setdefault(stmt.name.value, []).append(Binding("class", stmt))
            elif isinstance(stmt, cst.FunctionDef):
                table.setdefault(stmt.name.value, []).append(Binding("def", stmt))
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    pairs: list[tuple[cst.CSTNode, str, cst.CSTNode | None]] = []
                    if isinstance(small, cst.Assign):
                        pairs = [(t.target, "assign", small.value) for t in small.targets]
                    elif isinstance(small, cst.AnnAssign) and small.value is not None:
                        pairs = [(small.target, "assign", small.value)]
                    elif isinstance(small, cst.AugAssign):
                        pairs = [(small.target, "aug", small.value)]
                    for target, how, value in pairs:
                        for name, path in target_names(target, ()):
                            table.setdefault(name, []).append(Binding(how, value, path))


def target_names(
    target: cst.CSTNode, path: tuple[int, ...]
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The names an assignment target binds, with their positions in nested tuples."""
    if isinstance(target, cst.Name):
        yield target.value, path
    elif isinstance(target, cst.Tuple | cst.List):
        for i, element in enumerate(target.elements):
            inner = element.value
            if isinstance(element, cst.StarredElement):
                yield from target_names(inner, (*path, -1))
            else:
                yield from target_names(inner, (*path, i))


class FlowRecorder:
    """Records bindings, scopes, loops and the calls in each loop into the run's `FlowRecord`
    (`ctx.flow.record`) while the engine's one traversal passes by. The engine runs it, ahead
    of the rules, whenever a selected rule sets `uses_flow`; its methods are hooks the walk
    finds by name, as a rule's are (`rules.base.hook_methods`)."""

    def __init__(self, ctx: RuleContext) -> None:
        self.record = ctx.flow.record

    def visit_Module(self, node: cst.Module) -> None:
        self.record.enter_scope(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.record.bind_name(node.name.value, "def", node)
        self.record.enter_scope(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.record.leave_scope(original_node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.record.bind_name(node.name.value, "class", node)
        self.record.enter_scope(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.record.leave_scope(original_node)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.record.enter_scope(node)

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.record.leave_scope(original_node)

    def visit_Param(self, node: cst.Param) -> None:
        self.record.bind_name(node.name.value, "param", node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.record.bind(target.target, "assign", node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.record.bind(node.target, "assign", node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.record.bind(node.target, "aug", node.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.record.bind(node.target, "assign", node.value)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.record.bind(node.target, "for", node.iter)

    def visit_For(self, node: cst.For) -> None:
        self.record.bind(node.target, "for", node.iter)
        self.record.enter_loop(node)

    def leave_For(self, original_node: cst.For) -> None:
        self.record.leave_loop()

    def visit_While(self, node: cst.While) -> None:
        self.record.enter_loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self.record.leave_loop()

    def visit_Call(self, node: cst.Call) -> None:
        self.record.record_call(node)
