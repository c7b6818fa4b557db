"""Names: what a dotted name refers to, through the module's imports.

`torch.cuda.synchronize` is spelled `T.cuda.synchronize` after `import torch as T`, `cuda.
synchronize` after `from torch import cuda`, or `sync` after `from torch.cuda import
synchronize as sync`; rules match the qualified name, never the spelling. The table of import
bindings is built once per module; each node's answer is cached on the run's context, because
most rules ask about the same names and attributes.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from ..rules.base import RuleContext


def full_name(node: cst.CSTNode) -> str:
    """libcst's dotted name of an import's module or alias (`torch.cuda.amp`)."""
    return cst.helpers.get_full_name_for_node(node) or ""


class ImportTable:
    """Local name -> qualified name, from the module's import statements."""

    def __init__(self) -> None:
        self.imports: dict[str, str] = {}
        self.torch_alias: str | None = None  # `import torch [as X]` at module level

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        """Record the names an import statement binds."""
        imports = self.imports
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = full_name(alias.name)
                if alias.asname is not None:
                    imports[alias.evaluated_alias or full] = full
                else:
                    top = full.split(".")[0]
                    imports[top] = top
            return
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        base = full_name(node.module)
        for alias in node.names:
            name = alias.evaluated_name
            imports[alias.evaluated_alias or name] = f"{base}.{name}"

    def note_torch(self, node: cst.Import) -> None:
        """Remember the module-level name of torch itself (`torch`, or an alias)."""
        for alias in node.names:
            if full_name(alias.name) == "torch":
                name = alias.evaluated_alias or "torch"
                if self.torch_alias is None or name == "torch":
                    self.torch_alias = name


def qualified_name(ctx: RuleContext, node: cst.CSTNode) -> str | None:
    """`torch.cuda.synchronize` for `T.cuda.synchronize` after `import torch as T` (uncached).

    `torch` itself resolves even when this text does not import it (a notebook cell after the
    import cell, or code the rewrite adds `import torch` to).
    """
    if not isinstance(node, cst.Name | cst.Attribute):
        return None
    dotted = cst.helpers.get_full_name_for_node(node)
    if not dotted:
        return None
    head, _, rest = dotted.partition(".")
    target = ctx.imports.get(head, "torch" if head == "torch" else None)
    if target is None:
        return None
    return f"{target}.{rest}" if rest else target


def qualified(ctx: RuleContext, node: cst.CSTNode) -> str | None:
    """The imported qualified name `node` (or a call's function) refers to, if any (cached)."""
    target = node.func if isinstance(node, cst.Call) else node
    head = target
    while isinstance(head, cst.Attribute):
        head = head.value
    if not isinstance(head, cst.Name):
        return None  # `x().mean`, `a[0].b`: not an imported name
    if head.value not in ctx.imports and head.value != "torch":
        return None
    cache = ctx.qualified_cache
    key = id(target)
    if key not in cache:
        cache[key] = qualified_name(ctx, target)
    return cache[key]


def matches(ctx: RuleContext, node: cst.CSTNode, *names: str) -> str | None:
    """The one of `names` that `node` (or a call's function) refers to, if any."""
    name = qualified(ctx, node)
    return name if name in names else None


def is_reference_end(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """True for the whole of a dotted name that is read: not a prefix of a longer one (`a.b` in
    `a.b.c`), not an attribute's own name (`b` in `a.b`), not a keyword, parameter, definition
    or import."""
    parent = ctx.parents.get(id(node))
    if isinstance(parent, cst.Attribute):
        return False  # either the prefix `parent.value` or the attribute name `parent.attr`
    if isinstance(node, cst.Name):
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return False
        if isinstance(parent, cst.FunctionDef | cst.ClassDef | cst.Param) and parent.name is node:
            return False
    return not isinstance(parent, cst.ImportAlias | cst.AsName | cst.Import | cst.ImportFrom)


def module_level_alias(module: cst.Module | None, qualified: str) -> str | None:
    """The name a module-level import binds to `qualified` (`dist` for torch.distributed)."""
    for stmt in module.body if module is not None else ():
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if full_name(alias.name) == qualified and alias.asname is not None:
                        return alias.evaluated_alias
            elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                base = full_name(small.module) if small.module else None
                for alias in small.names:
                    if not small.relative and f"{base}.{alias.evaluated_name}" == qualified:
                        return alias.evaluated_alias or alias.evaluated_name
    return None


def variable_names(tree: ast.AST) -> frozenset[str]:
    """The names a Python `ast` tree binds or reads: variables, parameters, functions and
    classes, imported names, `global`/`nonlocal` names, `except ... as` names (not attributes
    or keywords). A new variable must not take any of them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return frozenset(names)
