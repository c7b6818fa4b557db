"""Edits the fixes are made of: arguments, parentheses, statements and imports.

A fix is a function from the updated node to its replacement (rules/base.py). These helpers
build the replacements so that every family edits the same way: arguments keep their own
formatting, an expression put where a bare one is not allowed carries parentheses, and a
statement that must go hands its comments to the next one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, cast

import libcst as cst

from .blocks import occurrence as occurrence_in_block
from .blocks import statement_index
from .literals import code_for, dotted_name, string_value

if TYPE_CHECKING:
    from ..rules.base import Rule, RuleContext

Fix = Callable[[cst.CSTNode], cst.CSTNode]

_NO_SPACE = cst.SimpleWhitespace("")
_ONE_SPACE = cst.SimpleWhitespace(" ")

# -- arguments ------------------------------------------------------------------------------


def comma() -> cst.Comma:
    """`, ` as black writes it."""
    return cst.Comma(whitespace_after=_ONE_SPACE)


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spelled the way black and ruff format keyword arguments."""
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
    )


def as_keyword(arg: cst.Arg, name: str) -> cst.Arg:
    """A positional argument passed by keyword instead."""
    return arg.with_changes(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
    )


def as_positional(arg: cst.Arg) -> cst.Arg:
    """A keyword argument passed by position instead."""
    return arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)


def prepend_arg(args: Sequence[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """`new` as the first argument, before `args`, keeping their own formatting."""
    if not args:
        return [new.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    return [new.with_changes(comma=comma()), *args]


def append_arg(args: Sequence[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """`new` as the last argument; a trailing comma (a multi-line call) stays trailing."""
    args = list(args)
    if not args:
        return [new]
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        between = args[-2].comma if len(args) > 1 else cst.MaybeSentinel.DEFAULT
        if not isinstance(between, cst.Comma):
            between = comma()
        return [*args[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]
    return [*args[:-1], last.with_changes(comma=comma()), new]


def insert_arg(args: Sequence[cst.Arg], index: int, new: cst.Arg) -> list[cst.Arg]:
    """`new` at `index` among `args`, keeping their own formatting."""
    if index <= 0:
        return prepend_arg(args, new)
    if index >= len(args):
        return append_arg(args, new)
    return [*args[:index], new.with_changes(comma=comma()), *args[index:]]


def find_arg(call: cst.Call, name: str, position: int | None) -> cst.Arg | None:
    """The argument bound to parameter `name` (keyword, or positional at `position`)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    positional = positional_args(call)
    if position is not None and len(positional) > position:
        return positional[position]
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    """The call's plain positional arguments (not `*args`, not keywords)."""
    return [a for a in call.args if a.keyword is None and not a.star]


def unpacks(call: cst.Call) -> bool:
    """Whether the call passes `*args` or `**kwargs` (its bindings are unknown)."""
    return any(a.star for a in call.args)


# -- expressions ----------------------------------------------------------------------------

# Parents in which a conditional expression needs no parentheses of its own.
_BARE_OK = (
    cst.Arg,
    cst.Assign,
    cst.AnnAssign,
    cst.AugAssign,
    cst.Return,
    cst.Expr,
    cst.FormattedStringExpression,
    cst.Element,
    cst.DictElement,
)


def needs_parentheses(rule: Rule, node: cst.CSTNode) -> bool:
    """Whether an expression put in place of `node` must carry its own parentheses.

    Asked while visiting: parent metadata is gone by the time fixes run.
    """
    return not isinstance(rule.parent(node), _BARE_OK)


# Parents in which a comparison put in place of a node needs parentheses (it binds less
# tightly than they do, or would chain with them).
_TIGHTER_THAN_COMPARISON = (
    cst.Comparison,
    cst.ComparisonTarget,
    cst.BinaryOperation,
    cst.Attribute,
    cst.Subscript,
    cst.Await,
)


def comparison_needs_parentheses(rule: Rule, node: cst.CSTNode) -> bool:
    """Whether a comparison put in place of `node` must carry its own parentheses."""
    parent = rule.parent(node)
    if isinstance(parent, _TIGHTER_THAN_COMPARISON):
        return True
    if isinstance(parent, cst.UnaryOperation):
        return True  # `not (a == b)` reads as meant
    return isinstance(parent, cst.Call) and parent.func is node


def parenthesized(expr: cst.BaseExpression, needed: bool = True) -> cst.BaseExpression:
    if not needed or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def string_literal(rule: Rule, node: cst.CSTNode, value: str) -> cst.SimpleString:
    """A string literal to put in place of (or inside) `node`: in single quotes inside a
    double-quoted f-string, since Python before 3.12 cannot reuse the quote there."""
    parent = rule.parent(node)
    while parent is not None:
        if isinstance(parent, cst.FormattedString) and '"' in parent.quote:
            return cst.SimpleString(f"'{value}'")
        parent = rule.parent(parent)
    return cst.SimpleString(f'"{value}"')


def accelerator_available(ctx: RuleContext) -> cst.Call:
    """`torch.accelerator.is_available()`, through the module's name for torch."""
    return cst.Call(func=ctx.torch_attr("accelerator.is_available"))


# -- statements -----------------------------------------------------------------------------


def sole_statement(rule: Rule, call: cst.CSTNode) -> cst.SimpleStatementLine | None:
    """The line when `call` is the whole of a statement line of its own."""
    expr = rule.parent(call)
    line = rule.parent(expr) if isinstance(expr, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def statement_call(line: cst.CSTNode) -> cst.Call:
    """The call that is the whole of a (fixed) statement line."""
    assert isinstance(line, cst.SimpleStatementLine)
    expr = line.body[0]
    assert isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)
    return expr.value


def guarded_line(
    ctx: RuleContext,
    line: cst.SimpleStatementLine,
    small: cst.BaseSmallStatement,
    test: cst.BaseExpression | None = None,
) -> cst.If:
    """`if torch.accelerator.is_available():` (or `if <test>:`) with `small` indented on the
    next line, in place of `line`: one statement per line, the line's comment kept on it."""
    inner = cst.SimpleStatementLine(body=[small], trailing_whitespace=line.trailing_whitespace)
    return cst.If(
        test=test if test is not None else accelerator_available(ctx),
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=line.leading_lines,
    )


def _accelerator_guard(stmt: cst.CSTNode) -> str | None:
    """The test's text of `if <torch>.accelerator.is_available():` with a block and no
    `else` (what `guarded_line` writes), else None."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return None
    if not isinstance(stmt.body, cst.IndentedBlock):
        return None
    test = stmt.test
    if not (isinstance(test, cst.Call) and not test.args and isinstance(test.func, cst.Attribute)):
        return None
    func = test.func
    inner = func.value
    if func.attr.value != "is_available" or not isinstance(inner, cst.Attribute):
        return None
    if inner.attr.value != "accelerator" or not isinstance(inner.value, cst.Name):
        return None
    return code_for(test)


def _is_synchronize(stmt: cst.CSTNode) -> bool:
    """`<torch>.accelerator.synchronize()` as a statement line of its own."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    expr = stmt.body[0]
    if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
        return False
    call = expr.value
    func = call.func
    return (
        not call.args
        and isinstance(func, cst.Attribute)
        and func.attr.value == "synchronize"
        and isinstance(func.value, cst.Attribute)
        and func.value.attr.value == "accelerator"
    )


def merge_guards(
    body: Sequence[cst.BaseStatement], original: Sequence[cst.BaseStatement]
) -> list[cst.BaseStatement] | None:
    """`body` with each run of adjacent `if torch.accelerator.is_available():` blocks made one
    block, when a fix wrote at least one of them (a statement not in `original`); a
    synchronize right after another one inside it goes (nothing was queued between). The
    test answers the same each time, so one `if` runs what the several ran. The blank lines
    and comments between them stay, before the statement they belonged to. None when nothing
    merges."""
    kept = {id(stmt) for stmt in original}
    out: list[cst.BaseStatement] = []
    merged = False
    for stmt in body:
        test = _accelerator_guard(stmt)
        previous = out[-1] if out else None
        if (
            test is not None
            and previous is not None
            and _accelerator_guard(previous) == test
            and not (id(stmt) in kept and id(previous) in kept)
        ):
            assert isinstance(stmt, cst.If) and isinstance(previous, cst.If)
            inner = list(stmt.body.body)
            if inner and stmt.leading_lines:
                first = inner[0]
                inner[0] = first.with_changes(
                    leading_lines=[*stmt.leading_lines, *first.leading_lines]  # type: ignore[attr-defined]  # statements of a block have leading_lines
                )
            joined = list(previous.body.body)
            for line in inner:
                if _is_synchronize(line) and joined and _is_synchronize(joined[-1]):
                    if not line.leading_lines:  # type: ignore[attr-defined]  # statements of a block have leading_lines
                        continue
                joined.append(line)
            out[-1] = previous.with_changes(body=previous.body.with_changes(body=joined))
            merged = True
            continue
        out.append(stmt)
    return out if merged else None


def move_fix_to(rule: Rule, node: cst.CSTNode, target: cst.CSTNode) -> None:
    """Move the fix just registered at `node` to `target` (its finding stays at `node`)."""
    rule.ctx.move_last_fix(node, target)


def report_statement_fix(
    rule: Rule,
    node: cst.CSTNode,
    line: cst.CSTNode,
    fix: Fix,
    message: str | None = None,
    *,
    hint: str | None = None,
    uses_device: bool = False,
) -> bool:
    """Report at `node` but apply `fix` to the statement `line` that contains it.

    The finding keeps the call's position; the fix sees the line with every inner fix applied.
    """
    if not rule.report(node, message, fix=fix, hint=hint, uses_device=uses_device):
        return False
    move_fix_to(rule, node, line)
    return True


def report_removal(
    rule: Rule, node: cst.CSTNode, line: cst.SimpleStatementLine, message: str | None = None
) -> bool:
    """Report at `node` and, if the fix applies, remove the statement `line` from its block."""
    if not rule.report(node, message, fix=_unchanged):
        return False
    rule.ctx.move_last_fix(node, None)
    remove_line(rule, line)
    return True


def _unchanged(updated: cst.CSTNode) -> cst.CSTNode:
    return updated


def remove_line(rule: Rule, line: cst.SimpleStatementLine) -> None:
    """Remove the statement `line`, handing its leading blank lines and comments to the next one.

    The removal is a fix of the enclosing block, so that the spacing around the statement
    survives; the block finds the line again by its text (fixes see updated nodes, and the
    lines removed here hold nothing another rule rewrites).
    """
    block = rule.parent(line)
    ctx = rule.ctx
    if not isinstance(block, cst.IndentedBlock | cst.Module):
        ctx.add_fix(line, _removed)
        return
    index = statement_index(ctx, block, line)
    assert index is not None  # `line` is a statement of its parent block
    code = code_for(line)
    occurrence = occurrence_in_block(ctx, block, index, code_for)
    targets = ctx.removals.get(id(block))
    if targets is None:
        targets = ctx.removals[id(block)] = []
        ctx.add_fix(block, partial(_remove_lines, targets))
    targets.append((code, occurrence))


def _removed(updated: cst.CSTNode) -> cst.CSTNode:
    return cst.RemovalSentinel.REMOVE  # type: ignore[return-value]  # libcst's transformer takes the sentinel for a node


def _remove_lines(targets: list[tuple[str, int]], updated: cst.CSTNode) -> cst.CSTNode:
    if not isinstance(updated, cst.IndentedBlock | cst.Module):
        return updated
    wanted = set(targets)
    seen: Counter[str] = Counter()
    kept: list[cst.BaseStatement] = []
    carry: list[cst.EmptyLine] = []
    for stmt in updated.body:
        code = code_for(stmt)
        occurrence = seen[code]
        seen[code] += 1
        if (code, occurrence) in wanted:
            carry.extend(stmt.leading_lines)  # type: ignore[attr-defined]  # statements of a block have leading_lines
            continue
        if carry:
            own = list(stmt.leading_lines)  # type: ignore[attr-defined]  # statements of a block have leading_lines
            comments = [ln for ln in carry if ln.comment is not None]
            stmt = stmt.with_changes(leading_lines=[*comments, *own] if own else carry)
            carry = []
        kept.append(stmt)
    if not kept and isinstance(updated, cst.IndentedBlock):
        kept = [cst.SimpleStatementLine(body=[cst.Pass()])]
    return updated.with_changes(body=kept)


# -- imports --------------------------------------------------------------------------------


def drop_imported_names(names: frozenset[str]) -> Fix:
    """A fix that drops the imported `names` from an import, and the import once it is empty."""

    def fix(updated: cst.CSTNode) -> cst.CSTNode:
        if not isinstance(updated, cst.ImportFrom) or isinstance(updated.names, cst.ImportStar):
            return updated
        kept = [a for a in updated.names if (a.evaluated_alias or a.evaluated_name) not in names]
        if not kept:
            return cst.RemovalSentinel.REMOVE  # type: ignore[return-value]  # libcst's transformer takes the sentinel for a node
        if not isinstance(updated.names[-1].comma, cst.Comma) or not updated.rpar:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)

    return fix


# -- device strings --------------------------------------------------------------------------


def indexed_device_string(
    ctx: RuleContext, node: cst.CSTNode, kind: cst.BaseExpression | None = None
) -> cst.BaseExpression:
    """The string for a CUDA device string with an index, on the module's device type:
    `"cuda:1"` -> `f"{device.type}:1"`, `f"cuda:{rank}"` -> `f"{device.type}:{rank}"`,
    `"cuda:{}".format(i)` -> `"{}:{}".format(device.type, i)`. On CUDA each is the original
    string. `kind` is the device type to use (the module's, by default)."""
    kind = kind if kind is not None else ctx.device_type()
    if isinstance(node, cst.FormattedString):
        first, *rest = node.parts
        assert isinstance(first, cst.FormattedStringText)
        parts = [cst.FormattedStringExpression(kind), cst.FormattedStringText(":"), *rest]
        return node.with_changes(parts=parts)
    if isinstance(node, cst.Call):
        func = node.func
        assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.SimpleString)
        quote = func.value.quote
        template = cst.SimpleString(f"{func.value.prefix}{quote}{{}}:{{}}{quote}")
        args = [
            cst.Arg(kind, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            *node.args,
        ]
        return node.with_changes(func=func.with_changes(value=template), args=args)
    assert isinstance(node, cst.SimpleString)
    index = cast(str, node.evaluated_value).partition(":")[2]  # a device string, never bytes
    quote = node.quote
    prefix = node.prefix.replace("r", "").replace("R", "")
    return cst.FormattedString(
        parts=[
            cst.FormattedStringExpression(kind),
            cst.FormattedStringText(f":{index}"),
        ],
        start=f"f{prefix}{quote}",
        end=quote,
    )


def carries_prefix(node: cst.CSTNode) -> bool:
    """Whether `prefixed_device_string` can carry the string's text over verbatim (no
    escapes, no braces, which an f-string reads otherwise)."""
    if not isinstance(node, cst.SimpleString):
        return False
    body = node.raw_value
    return not any(c in body for c in "\\{}")


def prefixed_device_string(ctx: RuleContext, node: cst.CSTNode) -> cst.BaseExpression:
    """`"cuda:%d"` -> `f"{device.type}:%d"`: the start of a device string built by hand, on
    the module's device type (the same text on CUDA)."""
    assert isinstance(node, cst.SimpleString) and carries_prefix(node)
    body = node.raw_value
    prefix = node.prefix.replace("u", "").replace("U", "")
    return cst.FormattedString(
        parts=[
            cst.FormattedStringExpression(ctx.device_type()),
            cst.FormattedStringText(body[len("cuda") :]),
        ],
        start=f"f{prefix}{node.quote}",
        end=node.quote,
    )


def on_cuda_only(
    ctx: RuleContext, value: cst.BaseExpression, otherwise: cst.BaseExpression
) -> cst.IfExp:
    """`value if device.type == "cuda" else otherwise`: what CUDA did, exactly, on CUDA (a
    process's device index, DDP's `device_ids`), and `otherwise` on every other device."""
    test = cst.Comparison(
        left=ctx.device_type(),
        comparisons=[cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cuda"'))],
    )
    body = value.with_changes(lpar=[], rpar=[]) if isinstance(value, cst.IfExp) else value
    if isinstance(value, cst.IfExp | cst.Lambda | cst.NamedExpr):
        body = parenthesized(body)
    return cst.IfExp(test=test, body=body, orelse=otherwise)


def _device_kind(node: cst.CSTNode) -> str | None:
    """`d` for `d`, `d.type`, `d()` or `d().type`: a device or its type, as fixes spell them
    (a library module's device is a function)."""
    if isinstance(node, cst.Attribute) and node.attr.value == "type":
        node = node.value
    if isinstance(node, cst.IfExp) and _current_accelerator(node.body):
        # the same for a torch without `torch.accelerator` (rewrite/core/torch_compat.py)
        return code_for(node)
    if _current_accelerator(node):
        return code_for(node)  # `torch.accelerator.current_accelerator()`, as G2T103 writes
    if isinstance(node, cst.Call) and not node.args:
        node = node.func
    return node.value if isinstance(node, cst.Name) else None


def _current_accelerator(node: cst.CSTNode) -> bool:
    """`torch.accelerator.current_accelerator()` (any alias of torch), no arguments."""
    if not isinstance(node, cst.Call) or node.args:
        return False
    name = dotted_name(node.func)
    return name is not None and name.endswith("accelerator.current_accelerator")


def cuda_only_choice(node: cst.CSTNode) -> bool:
    """`x if d.type == "cuda" else d` (or `else None`, `else d.type`, `else d.type !=
    "cpu"`): a value CUDA gets as before and every other device replaces with the device
    itself or nothing, as `on_cuda_only` and the device-property fixes write it. Its test
    means "is it CUDA?" on purpose."""
    if not isinstance(node, cst.IfExp) or not isinstance(node.test, cst.Comparison):
        return False
    test = node.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    if string_value(test.comparisons[0].comparator) != "cuda":
        return False
    device = _device_kind(test.left)
    if device is None:
        return False
    other = node.orelse
    if isinstance(other, cst.Name) and other.value == "None":
        return True
    if isinstance(other, cst.Comparison) and len(other.comparisons) == 1:
        if string_value(other.comparisons[0].comparator) != "cpu":
            return False
        other = other.left
    return _device_kind(other) == device


def is_cuda_only(node: cst.CSTNode) -> bool:
    """`x if <test> else None` / `x if device.type == "cuda" else device`: a value already
    given on some devices only (what `on_cuda_only` writes)."""
    if not isinstance(node, cst.IfExp) or not isinstance(node.test, cst.Comparison):
        return False
    comparisons = node.test.comparisons
    return (
        len(comparisons) == 1
        and isinstance(comparisons[0].operator, cst.Equal)
        and string_value(comparisons[0].comparator) == "cuda"
    )
