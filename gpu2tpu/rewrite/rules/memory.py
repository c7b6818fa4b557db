"""G2T301-G2T305: device memory. `torch.cuda` memory queries and cache control.

The device-agnostic API is `torch.accelerator.memory` (torch 2.9+). It raises on a machine
with no accelerator (a CUDA build of torch without a GPU: "Found no NVIDIA driver"), so every
rewrite is guarded by `torch.accelerator.is_available()` and answers what an idle device
would (0 bytes, no statistics) where there is none. Memory numbers are mostly logged, which
is why the guard is the right trade: the script keeps running and the log says 0.

The statement helpers here are shared with the other G2T3xx modules.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from functools import cache, partial
from typing import ClassVar

import libcst as cst

from ..model import Safety, Severity
from .amp import matches, report_fixed
from .base import Rule, RuleContext, cuda_literal

Fix = Callable[[cst.CSTNode], cst.CSTNode]

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
    if not report_fixed(rule, node, message, fix=fix, hint=hint, uses_device=uses_device):
        return False
    ctx = rule.ctx
    entries = ctx.fixes[id(node)]
    entry = entries.pop()
    if not entries:
        del ctx.fixes[id(node)]
    ctx.fixes.setdefault(id(line), []).append(entry)
    return True


# Per run, per block: the statements to remove, as (code, occurrence among equal lines).
_REMOVALS: weakref.WeakKeyDictionary[RuleContext, dict[int, list[tuple[str, int]]]] = (
    weakref.WeakKeyDictionary()
)
_BLANK = cst.Module(body=[])


def report_removal(
    rule: Rule, node: cst.CSTNode, line: cst.SimpleStatementLine, message: str | None = None
) -> bool:
    """Report at `node` and, if the fix applies, remove the statement `line` from its block."""
    if not report_fixed(rule, node, message, fix=_unchanged):
        return False
    ctx = rule.ctx
    entries = ctx.fixes[id(node)]
    entries.pop()
    if not entries:
        del ctx.fixes[id(node)]
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
    if not isinstance(block, cst.IndentedBlock | cst.Module):
        rule.ctx.fixes.setdefault(id(line), []).append((_removed, None))
        return
    code = _BLANK.code_for_node(line)
    index = next(i for i, stmt in enumerate(block.body) if stmt is line)
    occurrence = sum(1 for stmt in block.body[:index] if _BLANK.code_for_node(stmt) == code)
    per_block = _REMOVALS.setdefault(rule.ctx, {})
    targets = per_block.get(id(block))
    if targets is None:
        targets = per_block[id(block)] = []
        rule.ctx.fixes.setdefault(id(block), []).append((partial(_remove_lines, targets), None))
    targets.append((code, occurrence))


def _removed(updated: cst.CSTNode) -> cst.CSTNode:
    return cst.RemovalSentinel.REMOVE  # type: ignore[return-value]


def _remove_lines(targets: list[tuple[str, int]], updated: cst.CSTNode) -> cst.CSTNode:
    if not isinstance(updated, cst.IndentedBlock | cst.Module):
        return updated
    wanted = set(targets)
    seen: Counter[str] = Counter()
    kept: list[cst.BaseStatement] = []
    carry: list[cst.EmptyLine] = []
    for stmt in updated.body:
        code = _BLANK.code_for_node(stmt)
        occurrence = seen[code]
        seen[code] += 1
        if (code, occurrence) in wanted:
            carry.extend(stmt.leading_lines)  # type: ignore[attr-defined]
            continue
        if carry:
            own = list(stmt.leading_lines)  # type: ignore[attr-defined]
            comments = [ln for ln in carry if ln.comment is not None]
            stmt = stmt.with_changes(leading_lines=[*comments, *own] if own else carry)
            carry = []
        kept.append(stmt)
    if not kept and isinstance(updated, cst.IndentedBlock):
        kept = [cst.SimpleStatementLine(body=[cst.Pass()])]
    return updated.with_changes(body=kept)


def accelerator_available(ctx: RuleContext) -> cst.Call:
    return cst.Call(func=ctx.torch_attr("accelerator.is_available"))


def guarded_line(
    ctx: RuleContext, line: cst.SimpleStatementLine, small: cst.BaseSmallStatement
) -> cst.If:
    """`if torch.accelerator.is_available(): <small>` on one line, in place of `line`."""
    body = cst.SimpleStatementSuite(body=[small], trailing_whitespace=line.trailing_whitespace)
    return cst.If(test=accelerator_available(ctx), body=body, leading_lines=line.leading_lines)


def string_literal(rule: Rule, node: cst.CSTNode, value: str) -> cst.SimpleString:
    """A string literal to put in place of (or inside) `node`: in single quotes inside a
    double-quoted f-string, since Python before 3.12 cannot reuse the quote there."""
    parent = rule.parent(node)
    while parent is not None:
        if isinstance(parent, cst.FormattedString) and '"' in parent.quote:
            return cst.SimpleString(f"'{value}'")
        parent = rule.parent(parent)
    return cst.SimpleString(f'"{value}"')


def needs_parentheses(rule: Rule, node: cst.CSTNode) -> bool:
    """Whether an expression put in place of `node` must carry its own parentheses.

    Asked while visiting: parent metadata is gone by the time fixes run.
    """
    return not isinstance(rule.parent(node), _BARE_OK)


def parenthesized(expr: cst.BaseExpression, needed: bool) -> cst.BaseExpression:
    if not needed or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def device_positional(ctx: RuleContext, args: tuple[cst.Arg, ...] | list[cst.Arg]) -> list[cst.Arg]:
    """`torch.cuda` memory arguments for `torch.accelerator.memory`, whose device is positional.

    A CUDA device string becomes the module's device.
    """
    out: list[cst.Arg] = []
    for arg in args:
        if arg.keyword is not None and arg.keyword.value == "device":
            arg = arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
        if cuda_literal(arg.value):
            arg = arg.with_changes(value=ctx.device())
        out.append(arg)
    return out


def _has_cuda_literal(call: cst.Call) -> bool:
    return any(cuda_literal(a.value) for a in call.args)


@cache
def _qualified(*names: str) -> tuple[str, ...]:
    """`torch.cuda.X` and its home `torch.cuda.memory.X`."""
    return tuple(q for n in names for q in (f"torch.cuda.{n}", f"torch.cuda.memory.{n}"))


class _AcceleratorMemoryCall(Rule):
    """Shared shape: `torch.cuda.<name>(...)` -> guarded `torch.accelerator.memory.<new>(...)`.

    `functions` maps each CUDA name to its accelerator name and to what the call gives where
    there is no accelerator. A call that returns nothing and is a statement of its own is
    guarded by an `if`; otherwise it becomes a conditional expression.
    """

    functions: ClassVar[dict[str, tuple[str, str]]] = {}
    min_torch = "2.9"

    def visit_Call(self, node: cst.Call) -> None:
        cuda = matches(self, node, *_qualified(*self.functions))
        if cuda is None:
            return
        if any(a.star for a in node.args):
            self.report(node, hint=f"{self.hint}, by hand: the call unpacks its arguments")
            return
        name, fallback = self.functions[cuda.rsplit(".", 1)[-1]]
        ctx = self.ctx
        uses_device = _has_cuda_literal(node)
        message = self.message.format(func=cuda.replace("torch.cuda.memory.", "torch.cuda."))

        def accelerator_call(updated: cst.Call) -> cst.Call:
            return updated.with_changes(
                func=ctx.torch_attr(f"accelerator.memory.{name}"),
                args=device_positional(ctx, updated.args),
            )

        line = sole_statement(self, node)
        if line is not None and fallback == "None":

            def fix_line(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.SimpleStatementLine)
                small = cst.Expr(accelerator_call(statement_call(updated)))
                return guarded_line(ctx, updated, small)

            report_statement_fix(self, node, line, fix_line, message, uses_device=uses_device)
            return

        parens = needs_parentheses(self, node)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            expr = cst.IfExp(
                test=accelerator_available(ctx),
                body=accelerator_call(updated),
                orelse=cst.parse_expression(fallback),
            )
            return parenthesized(expr, parens)

        self.report(node, message, fix=fix, uses_device=uses_device)


class CudaEmptyCache(_AcceleratorMemoryCall):
    """`torch.cuda.empty_cache()` returns cached blocks to the CUDA driver.

    Why: it is CUDA-only. `torch.accelerator.memory.empty_cache()` (torch 2.9+) does the same
    for the current accelerator; it is guarded by `torch.accelerator.is_available()` because it
    raises where there is no accelerator, and there is no cache to empty there anyway.

    Example:
        torch.cuda.empty_cache()
        ->  if torch.accelerator.is_available(): torch.accelerator.memory.empty_cache()
    """

    code = "G2T301"
    name = "cuda-empty-cache"
    safety = Safety.SAFE
    message = "`{func}()` is CUDA-only"
    hint = "use `torch.accelerator.memory.empty_cache()` (torch 2.9+), guarded by `torch.accelerator.is_available()`"
    functions = {"empty_cache": ("empty_cache", "None")}


class CudaMemoryStats(_AcceleratorMemoryCall):
    """`torch.cuda.memory_allocated()` and the other allocator statistics.

    Why: they are CUDA-only. `torch.accelerator.memory.memory_allocated()` and its siblings
    (torch 2.9+) answer for the current accelerator. The call is guarded by
    `torch.accelerator.is_available()` and gives 0 (or `{}` for `memory_stats`) where there is
    no accelerator, which is what they report for an idle device. A `device=` argument
    becomes positional, as the accelerator API wants it. The deprecated `memory_cached` names
    map to `memory_reserved`.

    Example:
        mb = torch.cuda.max_memory_allocated() / 2**20
        ->  mb = (torch.accelerator.memory.max_memory_allocated() if torch.accelerator.is_available() else 0) / 2**20
    """

    code = "G2T302"
    name = "cuda-memory-stats"
    safety = Safety.SAFE
    message = "`{func}()` is CUDA-only"
    hint = (
        "use `torch.accelerator.memory` (torch 2.9+), guarded by `torch.accelerator.is_available()`"
    )
    functions = {
        "memory_allocated": ("memory_allocated", "0"),
        "max_memory_allocated": ("max_memory_allocated", "0"),
        "memory_reserved": ("memory_reserved", "0"),
        "max_memory_reserved": ("max_memory_reserved", "0"),
        "memory_cached": ("memory_reserved", "0"),
        "max_memory_cached": ("max_memory_reserved", "0"),
        "memory_stats": ("memory_stats", "{}"),
    }


class CudaResetMemoryStats(_AcceleratorMemoryCall):
    """`torch.cuda.reset_peak_memory_stats()` and the other counter resets.

    Why: they are CUDA-only, and raise on a machine without a GPU.
    `torch.accelerator.memory.reset_peak_memory_stats()` (torch 2.9+) resets the current
    accelerator's counters; it is guarded by `torch.accelerator.is_available()`. The
    deprecated `reset_max_memory_allocated` / `reset_max_memory_cached` map to it too.

    Example:
        torch.cuda.reset_peak_memory_stats()
        ->  if torch.accelerator.is_available(): torch.accelerator.memory.reset_peak_memory_stats()
    """

    code = "G2T303"
    name = "cuda-reset-memory-stats"
    safety = Safety.SAFE
    message = "`{func}()` is CUDA-only"
    hint = "use `torch.accelerator.memory.reset_peak_memory_stats()` (torch 2.9+), guarded"
    functions = {
        "reset_peak_memory_stats": ("reset_peak_memory_stats", "None"),
        "reset_accumulated_memory_stats": ("reset_accumulated_memory_stats", "None"),
        "reset_max_memory_allocated": ("reset_peak_memory_stats", "None"),
        "reset_max_memory_cached": ("reset_peak_memory_stats", "None"),
    }


class CudaMemGetInfo(_AcceleratorMemoryCall):
    """`torch.cuda.mem_get_info()` gives the device's free and total bytes.

    Why: it is CUDA-only. `torch.accelerator.memory.get_memory_info()` answers for any
    accelerator but is newer than torch 2.9, so the rewrite checks for it and gives `(0, 0)`
    where it is missing or there is no accelerator. The fix is unsafe: on CUDA with torch 2.9
    it turns a real answer into `(0, 0)`, and code that divides by the total breaks.

    Example:
        free, total = torch.cuda.mem_get_info()
        ->  free, total = torch.accelerator.memory.get_memory_info() if torch.accelerator.is_available() and hasattr(torch.accelerator.memory, "get_memory_info") else (0, 0)
    """

    code = "G2T304"
    name = "cuda-mem-get-info"
    safety = Safety.UNSAFE
    message = "`{func}()` is CUDA-only"
    hint = "use `torch.accelerator.memory.get_memory_info()` (newer than torch 2.9), guarded"
    functions = {"mem_get_info": ("get_memory_info", "(0, 0)")}

    def visit_Call(self, node: cst.Call) -> None:
        cuda = matches(self, node, *_qualified("mem_get_info"))
        if cuda is None:
            return
        if any(a.star for a in node.args):
            self.report(node, hint=f"{self.hint}, by hand: the call unpacks its arguments")
            return
        ctx = self.ctx
        parens = needs_parentheses(self, node)
        name = string_literal(self, node, "get_memory_info")

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            memory = ctx.torch_attr("accelerator.memory")
            test = cst.BooleanOperation(
                left=accelerator_available(ctx),
                operator=cst.And(),
                right=cst.Call(
                    func=cst.Name("hasattr"),
                    args=[
                        cst.Arg(
                            memory, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                        ),
                        cst.Arg(name),
                    ],
                ),
            )
            call = updated.with_changes(
                func=ctx.torch_attr("accelerator.memory.get_memory_info"),
                args=device_positional(ctx, updated.args),
            )
            expr = cst.IfExp(test=test, body=call, orelse=cst.parse_expression("(0, 0)"))
            return parenthesized(expr, parens)

        message = self.message.format(func="torch.cuda.mem_get_info")
        self.report(node, message, fix=fix, uses_device=_has_cuda_literal(node))


# CUDA allocator tooling with no device-agnostic counterpart, and what to do instead.
MEMORY_TOOLING = {
    "memory_summary": "log `torch.accelerator.memory.memory_stats()` (guarded) instead",
    "memory_snapshot": "CUDA allocator snapshots have no TPU counterpart; guard it for CUDA",
    "memory_stats_as_nested_dict": "use `torch.accelerator.memory.memory_stats()` (guarded)",
    "set_per_process_memory_fraction": "no TPU counterpart: XLA reserves TPU memory itself",
    "get_per_process_memory_fraction": "no TPU counterpart: XLA reserves TPU memory itself",
    "caching_allocator_alloc": "allocate tensors with `torch.empty(..., device=device)`",
    "caching_allocator_delete": "let tensors free their memory",
    "_record_memory_history": "use the torch profiler's memory view; CUDA snapshots only",
    "_dump_snapshot": "use the torch profiler's memory view; CUDA snapshots only",
    "CUDAPluggableAllocator": "custom CUDA allocators have no TPU counterpart",
    "change_current_allocator": "custom CUDA allocators have no TPU counterpart",
    "MemPool": "CUDA memory pools have no TPU counterpart",
    "use_mem_pool": "CUDA memory pools have no TPU counterpart",
}


class CudaMemoryTooling(Rule):
    """`torch.cuda.memory_summary()` and other CUDA allocator tooling.

    Why: these read or steer the CUDA caching allocator (summaries, snapshots, memory
    fractions, pluggable allocators, pools). No device-agnostic API covers them, and a TPU's
    memory is managed by XLA; what to keep is a person's call.

    Example:
        print(torch.cuda.memory_summary())  # -> log torch.accelerator.memory.memory_stats()
    """

    code = "G2T305"
    name = "cuda-memory-tooling"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`torch.cuda.{func}` is CUDA allocator tooling with no TPU counterpart"
    hint = "decide by hand"

    def visit_Call(self, node: cst.Call) -> None:
        cuda = matches(self, node, *_qualified(*MEMORY_TOOLING))
        if cuda is not None:
            func = cuda.rsplit(".", 1)[-1]
            self.report(node, self.message.format(func=func), hint=MEMORY_TOOLING[func])
