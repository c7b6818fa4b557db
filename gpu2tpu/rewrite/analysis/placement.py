"""Where new statements go: the module's device line, `import torch`, `import time`.

A statement the rewrite adds must come after everything it uses and before everything that
uses it, and must not move the module's own start-up order around.
"""

from __future__ import annotations

import ast
import sys

import libcst as cst

from .names import ast_dotted_name, full_name, statements


def is_import_line(stmt: cst.BaseStatement | cst.BaseSmallStatement) -> bool:
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
        new = new.with_changes(leading_lines=nxt.leading_lines)
        if _is_stdlib_import(nxt):
            body[at] = nxt.with_changes(leading_lines=[])
        elif not nxt.leading_lines:
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], new, *body[at:]])


# -- the device line, from the whole text with Python's own parser --------------------------

# Variables CUDA reads once, when it starts (the first `is_available()` or device count): set
# after the device line has asked for the accelerator, they no longer take effect.
CUDA_START_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
)
_ENV_CALLS = frozenset({"setdefault", "update", "putenv", "__setitem__", "pop"})
_SYS_PATH_CALLS = frozenset({"insert", "append", "extend", "remove"})
_WARNINGS_CALLS = frozenset({"filterwarnings", "simplefilter", "resetwarnings"})


def _is_environ(node: ast.AST) -> bool:
    return ast_dotted_name(node) in ("os.environ", "environ")


def sets_environment(stmt: ast.AST) -> bool:
    """`os.environ[k] = v`, `os.environ.setdefault(...)`, `os.putenv(...)` and the like."""
    if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr in _ENV_CALLS:
            return _is_environ(func.value) or ast_dotted_name(func) == "os.putenv"
    return False


def _edits_sys_path(stmt: ast.AST) -> bool:
    if isinstance(stmt, ast.Assign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(ast_dotted_name(t) == "sys.path" for t in targets)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute):
            if func.attr in _SYS_PATH_CALLS and ast_dotted_name(func.value) == "sys.path":
                return True
            if func.attr in _WARNINGS_CALLS and ast_dotted_name(func.value) == "warnings":
                return True
            if ast_dotted_name(func) == "site.addsitedir":
                return True
    return False


def sets_cuda_start_env(stmt: ast.AST) -> str | None:
    """The CUDA start-up variable (`CUDA_VISIBLE_DEVICES`, ...) a statement sets, if any."""
    if not sets_environment(stmt):
        return None
    for node in ast.walk(stmt):
        if isinstance(node, ast.Constant) and node.value in CUDA_START_ENV:
            return node.value
    return None


def _is_setup(stmt: ast.AST, first: bool) -> bool:
    """A statement of the module's start-up block: docstring, imports, environment and
    `sys.path` set-up, warnings filters, and `try`/`if` blocks of those."""
    if first and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return isinstance(stmt.value.value, str)
    if isinstance(stmt, ast.Import | ast.ImportFrom | ast.Pass):
        return True
    if sets_environment(stmt) or _edits_sys_path(stmt):
        return True
    if isinstance(stmt, ast.Try):
        return bool(stmt.body) and all(_is_setup(s, False) for s in stmt.body)
    if isinstance(stmt, ast.If):
        return all(_is_setup(s, False) for s in (*stmt.body, *stmt.orelse))
    return False


def _imports_torch(stmt: ast.AST) -> bool:
    if isinstance(stmt, ast.Import):
        return any(a.name.split(".")[0] == "torch" for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        return not stmt.level and (stmt.module or "").split(".")[0] == "torch"
    if isinstance(stmt, ast.Try | ast.If | ast.With):
        return any(_imports_torch(s) for s in stmt.body)
    return False


def setup_block_end(tree: ast.Module) -> int:
    """How many top-level statements make the module's start-up block: docstring, imports,
    and the environment, `sys.path` and warnings set-up between them."""
    lead = 0
    for i, stmt in enumerate(tree.body):
        if not _is_setup(stmt, i == 0):
            break
        lead = i + 1
    return lead


def device_line_after(tree: ast.Module) -> int:
    """How many of the module's top-level statements (Python's own count) come before the
    device line: the start-up block, the last statement that imports torch, and the last
    top-level statement that sets a CUDA start-up variable, whichever ends last, and the
    imports and set-up right after that one (never in the middle of an import block)."""
    after = setup_block_end(tree)
    for i, stmt in enumerate(tree.body):
        if _imports_torch(stmt) or sets_cuda_start_env(stmt):
            after = max(after, i + 1)
    while after < len(tree.body) and _is_setup(tree.body[after], False):
        after += 1
    return after


def device_line_blocked(tree: ast.Module | None, source: str) -> str | None:
    """Why this module cannot take a module-level device line, or None.

    The device line asks for the accelerator when the module is imported, which starts CUDA;
    a CUDA start-up variable set later (in a function, or in a block after the module's
    start-up block) would then no longer take effect.
    """
    if tree is None or not any(name in source for name in CUDA_START_ENV):
        return None
    lead = setup_block_end(tree)
    for i, top in enumerate(tree.body):
        if i < lead or not hasattr(top, "body"):
            continue  # the start-up block, and simple statements: the line goes after them
        for stmt, path, _ in statements([top]):
            name = sets_cuda_start_env(stmt)
            if name is None:
                continue
            line = stmt.lineno  # type: ignore[attr-defined]  # a node of Python's tree with a position
            where = f"in `{path[-1]}()`" if path else "in a block"
            return (
                f"`{name}` is set {where} at line {line}, after a module-level device line "
                "would have started CUDA"
            )
    return None


# -- scripts and library modules --------------------------------------------------------------


def runs_as_script(tree: ast.Module, source: str) -> bool:
    """Whether a module is run (a script) rather than imported (a library module).

    A script starts with `#!`, has an `if __name__ == "__main__":` block, or does work at its
    top level: a call, a loop or a `with` block outside any function (`main()`, `for epoch in
    ...`, `torch.manual_seed(0)`). A library module's top level only defines: imports,
    functions, classes, assignments, and `if`/`try` blocks of those; it may also set up its
    logging and warnings (`logging.basicConfig()`, `transformers.logging.
    set_verbosity_error()`, `warnings.filterwarnings(...)`), and say that an optional import
    failed (`try: import boto3` / `except ImportError: print(...)`). A library's device is
    asked for when a function needs it, not when it is imported (a CUDA query at import
    makes forking unsafe: pytorch issue 68861)."""
    if source.startswith("#!"):
        return True
    return any(_does_work(stmt) for stmt in tree.body)


# Method names of a logger (`logger.info(...)`, `log.setLevel(...)`).
_LOGGER_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}
    | {"setLevel", "addHandler", "removeHandler", "addFilter", "propagate"}
)


def _sets_up_messages(call: ast.AST, *, printing: bool = False) -> bool:
    """A call that configures or writes the module's messages, not work: `logging.*`,
    `warnings.*`, a `logging` submodule of a library, a logger's method (on a name with
    `log` in it), and, with `printing`, `print`."""
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        # `logging.getLogger(__name__).setLevel(...)`
        return func.attr in _LOGGER_METHODS and _sets_up_messages(func.value)
    dotted = ast_dotted_name(func)
    parts = dotted.split(".") if dotted else []
    if not parts:
        return False
    if printing and parts == ["print"]:
        return True
    if parts[0] in ("logging", "warnings") or "logging" in parts[1:-1]:
        return True
    return len(parts) >= 2 and parts[-1] in _LOGGER_METHODS and "log" in parts[-2].lower()


def _does_work(stmt: ast.stmt, *, fallback: bool = False) -> bool:
    """Whether a top-level statement does work when the module is imported; `fallback`: in
    the `except` part of a `try`, where a message about a missing import is not work."""
    if isinstance(stmt, ast.Expr):
        if isinstance(stmt.value, ast.Constant):
            return False  # a docstring defines
        return not _sets_up_messages(stmt.value, printing=fallback)
    if isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
        return True
    if isinstance(stmt, ast.If):
        if _is_main_test(stmt.test):
            return True
        return any(_does_work(s, fallback=fallback) for s in (*stmt.body, *stmt.orelse))
    if isinstance(stmt, ast.Try):
        blocks = (stmt.body, stmt.orelse, stmt.finalbody)
        if any(_does_work(s) for block in blocks for s in block):
            return True
        return any(_does_work(s, fallback=True) for h in stmt.handlers for s in h.body)
    return isinstance(stmt, ast.Match)


def _is_main_test(test: ast.AST) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    operands = [test.left, *test.comparators]
    return any(isinstance(o, ast.Name) and o.id == "__name__" for o in operands) and any(
        isinstance(o, ast.Constant) and o.value == "__main__" for o in operands
    )
