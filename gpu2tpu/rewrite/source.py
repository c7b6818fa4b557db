"""`rewrite_source`: CUDA-specific PyTorch text in, device-agnostic text out. Pure: no I/O.

One libcst parse, every selected rule in one batched visit over qualified names, one
transformer pass that applies the fixes, one codegen. Text that no rule could touch comes back
as the very same string object.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper

from .model import Options, Result
from .rules.base import RuleContext, Rule, finalize, rules_for


class SourceError(ValueError):
    """The text is not Python that libcst can parse; carries a one-line reason."""

    def __init__(self, reason: str, line: int | None = None, col: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
        self.col = col


def parse_module(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as err:
        first = str(err.message).strip().splitlines()[0] if err.message else "invalid syntax"
        raise SourceError(f"syntax error: {first}", err.raw_line, err.raw_column + 1) from None
    except RecursionError:
        raise SourceError("too deeply nested for the parser") from None


def prefilter_tokens(options: Options) -> tuple[bytes, ...]:
    """Byte strings at least one of which a file must contain for any selected rule to fire."""
    tokens: set[bytes] = set()
    for rule in rules_for(options):
        tokens.update(rule.tokens)
    return tuple(sorted(tokens))


def might_need_rewrite(data: bytes, tokens: tuple[bytes, ...]) -> bool:
    return any(t in data for t in tokens)


def rewrite_source(text: str, options: Options | None = None) -> Result:
    """Rewrite one module's text; raise `SourceError` when it does not parse."""
    options = options or Options()
    module = parse_module(text)
    ctx = RuleContext(text, options)
    rules: list[Rule] = [rule(ctx) for rule in rules_for(options)]
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    wrapper.visit_batched([_ModuleFacts(ctx), *rules])
    ctx.decide_device_name()
    if not ctx.fixes:
        edits, findings = finalize(ctx)
        return Result(text, (), tuple(findings), ctx.device_name_or_none(), False)
    new_module = wrapper.module.visit(_ApplyFixes(ctx))
    new_module = _define_device(new_module, ctx)
    new_text = new_module.code
    edits, findings = finalize(ctx)
    if new_text == text:
        return Result(text, (), tuple(findings), ctx.device_name_or_none(), False)
    return Result(
        new_text, tuple(edits), tuple(findings), ctx.device_name_or_none(), ctx.device_defined
    )


class _ModuleFacts(cst.BatchableCSTVisitor):
    """Facts every rule relies on: names in use, torch's alias, module-level imports."""

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.depth = 0
        self.not_variables: set[int] = set()  # attribute names and keyword names

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_variables.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_variables.add(id(node.keyword))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.not_variables:
            self.ctx.names_in_use.add(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Import(self, node: cst.Import) -> None:
        if self.depth:
            return
        for alias in node.names:
            if cst.helpers.get_full_name_for_node(alias.name) == "torch":
                as_name = alias.asname.name.value if alias.asname else "torch"  # type: ignore[union-attr]
                if self.ctx.torch_alias is None or as_name == "torch":
                    self.ctx.torch_alias = as_name


class _ApplyFixes(cst.CSTTransformer):
    """Apply every registered fix at its node, innermost first, in one pass."""

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__()
        self.fixes = ctx.fixes
        self.blank = cst.Module(body=[])

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        fixes = self.fixes.get(id(original_node))
        if fixes is None:
            return super().on_leave(original_node, updated_node)
        node = super().on_leave(original_node, updated_node)
        for fix, pending in fixes:
            node = fix(node)
            if pending is not None and isinstance(node, cst.CSTNode):
                pending.after.append(self.blank.code_for_node(node))
        return node


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body)
    if isinstance(stmt, cst.Try):
        return all(_is_import_line(s) for s in stmt.body.body)
    if isinstance(stmt, cst.If):
        return all(_is_import_line(s) for s in stmt.body.body)
    return False


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _define_device(module: cst.Module, ctx: RuleContext) -> cst.Module:
    """Insert `import torch` and the device definition after the leading imports, if needed."""
    body = list(module.body)
    insert_at = 0
    for i, stmt in enumerate(body):
        if _is_import_line(stmt) or (i == 0 and _is_docstring(stmt)):
            insert_at = i + 1
        else:
            break
    new: list[cst.BaseStatement] = []
    if ctx.device_defined:
        expr = cst.Module(body=[]).code_for_node(ctx.device_expression())
        definition = cst.parse_statement(f"{ctx.device_name()} = {expr}\n")
        new.append(definition.with_changes(leading_lines=[cst.EmptyLine()] if insert_at else []))
    if ctx.needs_torch_import:
        new.insert(0, cst.parse_statement("import torch\n"))
    if not new:
        return module
    if insert_at < len(body) and insert_at > 0 and ctx.device_defined:
        nxt = body[insert_at]
        if not nxt.leading_lines:  # type: ignore[union-attr]
            body[insert_at] = nxt.with_changes(leading_lines=[cst.EmptyLine()])  # type: ignore[union-attr]
    elif insert_at == 0 and body and ctx.device_defined:
        nxt = body[0]
        body[0] = nxt.with_changes(leading_lines=[cst.EmptyLine(), *nxt.leading_lines])  # type: ignore[union-attr]
    return module.with_changes(body=[*body[:insert_at], *new, *body[insert_at:]])
