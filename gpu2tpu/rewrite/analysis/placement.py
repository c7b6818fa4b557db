"""Where new statements go: the module's device line, `import torch`, `import time`.

A statement the rewrite adds must come after everything it uses and before everything that
uses it, and must not move the module's own start-up order around.
"""

from __future__ import annotations

import sys

import libcst as cst

from .names import full_name


def is_import_line(stmt: cst.BaseStatement) -> bool:
    """A line of imports, or a `try`/`if` block holding only import lines."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body)
    if isinstance(stmt, cst.Try | cst.If):
        return all(is_import_line(s) for s in stmt.body.body)
    return False


def is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def is_future_import(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.ImportFrom)
        and isinstance(stmt.body[0].module, cst.Name)
        and stmt.body[0].module.value == "__future__"
    )


def leading_imports_end(module: cst.Module) -> int:
    """The index after the module's docstring and its leading block of import lines."""
    insert_at = 0
    for i, stmt in enumerate(module.body):
        if is_import_line(stmt) or (i == 0 and is_docstring(stmt)):
            insert_at = i + 1
        else:
            break
    return insert_at


def _is_plain_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body
    )


def _is_stdlib_import(stmt: cst.BaseStatement) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import):
            names = [full_name(a.name) for a in small.names]
        elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            names = [full_name(small.module)]
        else:
            return False
        if not all(n.split(".")[0] in sys.stdlib_module_names for n in names):
            return False
    return True


def _sorts_after(stmt: cst.BaseStatement, name: str) -> bool:
    """Whether isort would put `stmt` after `import <name>` in the standard-library section."""
    assert isinstance(stmt, cst.SimpleStatementLine)
    small = stmt.body[0]
    if isinstance(small, cst.ImportFrom):
        return True  # plain imports come first
    assert isinstance(small, cst.Import)
    return full_name(small.names[0].name) > name


def add_stdlib_import(module: cst.Module, name: str) -> cst.Module:
    """`import <name>` among the module's leading standard-library imports, in isort's order."""
    body = list(module.body)
    start = 0
    if body and is_docstring(body[0]):
        start = 1
    while start < len(body) and is_future_import(body[start]):
        start += 1
    at = start
    while at < len(body) and _is_plain_import_line(body[at]):
        if not _is_stdlib_import(body[at]) or _sorts_after(body[at], name):
            break
        at += 1
    new = cst.parse_statement(f"import {name}\n")
    if at == start and at < len(body):
        nxt = body[at]
        new = new.with_changes(leading_lines=nxt.leading_lines)  # type: ignore[union-attr]
        if _is_stdlib_import(nxt):
            body[at] = nxt.with_changes(leading_lines=[])  # type: ignore[union-attr]
        elif not nxt.leading_lines:  # type: ignore[union-attr]
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine()])  # type: ignore[union-attr]
    return module.with_changes(body=[*body[:at], new, *body[at:]])


def imports_module(module: cst.Module, name: str) -> bool:
    """Whether the module imports `name` (as itself) in a top-level import line."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import) and any(
                full_name(a.name) == name and a.asname is None for a in small.names
            ):
                return True
    return False
