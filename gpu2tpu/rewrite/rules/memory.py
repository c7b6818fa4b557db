"""G2T301-G2T305: device memory. `torch.cuda` memory queries and cache control.

The device-agnostic API is `torch.accelerator.memory` (torch 2.9+). It raises on a machine
with no accelerator (a CUDA build of torch without a GPU: "Found no NVIDIA driver"), so every
rewrite is guarded by `torch.accelerator.is_available()` and answers what an idle device
would (0 bytes, no statistics) where there is none. Memory numbers are mostly logged, which
is why the guard is the right trade: the script keeps running and the log says 0.

"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import ClassVar

import libcst as cst

from ..analysis.branches import accelerator_known, conjuncts
from ..analysis.edits import (
    accelerator_available,
    as_positional,
    guarded_line,
    indexed_device_string,
    needs_parentheses,
    parenthesized,
    report_statement_fix,
    sole_statement,
    statement_call,
    string_literal,
    unpacks,
)
from ..analysis.literals import cuda_literal, cuda_string_index
from ..analysis.names import matches
from ..analysis.torch_api import MEMORY_TOOLING
from ..core.model import Safety, Severity
from .base import Rule, RuleContext


def device_positional(ctx: RuleContext, args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """`torch.cuda` memory arguments for `torch.accelerator.memory`, whose device is positional.

    A CUDA device string becomes the module's device, keeping its index (`"cuda:1"` ->
    `f"{device.type}:1"`).
    """
    out: list[cst.Arg] = []
    for arg in args:
        if arg.keyword is not None and arg.keyword.value == "device":
            arg = as_positional(arg)
        if cuda_string_index(arg.value) == "":
            arg = arg.with_changes(value=ctx.device())
        elif cuda_literal(arg.value):
            arg = arg.with_changes(value=indexed_device_string(ctx, arg.value))
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
        cuda = matches(self.ctx, node, *_qualified(*self.functions))
        if cuda is None:
            return
        if unpacks(node):
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

        if accelerator_known(ctx, node):
            # a branch around the call has found an accelerator: no guard, no fallback
            self.report(node, message, fix=accelerator_call, uses_device=uses_device)  # type: ignore[arg-type]  # a fix of Calls only: it is reported at a Call
            return
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
    accelerator from torch 2.10 on (the rest of `torch.accelerator.memory` is in 2.9, this
    one is not), so the fix needs torch 2.10; the rewrite still checks for it and gives
    `(0, 0)` where it is missing or there is no accelerator. The fix is unsafe: run on CUDA
    with a torch older than 2.10 it turns a real answer into `(0, 0)`, and code that divides
    by the total breaks.

    Example:
        free, total = torch.cuda.mem_get_info()
        ->  free, total = torch.accelerator.memory.get_memory_info() if torch.accelerator.is_available() and hasattr(torch.accelerator.memory, "get_memory_info") else (0, 0)
    """

    code = "G2T304"
    name = "cuda-mem-get-info"
    safety = Safety.UNSAFE
    message = "`{func}()` is CUDA-only"
    hint = "use `torch.accelerator.memory.get_memory_info()` (torch 2.10+), guarded"
    functions = {"mem_get_info": ("get_memory_info", "(0, 0)")}
    min_torch = "2.10"

    def visit_Call(self, node: cst.Call) -> None:
        cuda = matches(self.ctx, node, *_qualified("mem_get_info"))
        if cuda is None:
            return
        if unpacks(node):
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
        cuda = matches(self.ctx, node, *_qualified(*MEMORY_TOOLING))
        if cuda is not None:
            func = cuda.rsplit(".", 1)[-1]
            self.report(node, self.message.format(func=func), hint=MEMORY_TOOLING[func])


# What the rewrite gives a memory figure where no accelerator counts it, by accelerator name.
FIGURE_FALLBACKS = {
    **{name: fallback for name, fallback in CudaMemoryStats.functions.values()},
    "get_memory_info": "(0, 0)",
}


class MemoryFigureFallback(Rule):
    """A memory figure that reads 0 where no accelerator counts it.

    Why: G2T302 and G2T304 guard the `torch.accelerator.memory` reads they write with
    `torch.accelerator.is_available()` and give 0 (`{}`, `(0, 0)`) elsewhere, and a backend
    that does not count its memory answers 0 too. A notebook that measures memory then
    prints "0.0 GB" everywhere and nothing says why: a fallback that changes what the
    program reports is a finding, always, on the original call (when the rewrite gives it a
    fallback) and on the rewritten one alike, so `check` says the same before and after.

    Example:
        print(torch.cuda.max_memory_allocated() / 1e9)
        # -> (torch.accelerator.memory.max_memory_allocated() if torch.accelerator.is_available() else 0) / 1e9
        # G2T320: reads 0 without an accelerator; say so where it is printed
    """

    code = "G2T320"
    name = "memory-figure-fallback"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`{call}` reads {fallback} where no accelerator counts memory: the figure it reports changes"
    hint = (
        "say so where it is printed, or skip the figure where "
        "`torch.accelerator.is_available()` is False"
    )
    tokens = (b"memory_", b"mem_get_info", b"get_memory_info")

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        cuda = matches(ctx, node, *_qualified(*CudaMemoryStats.functions, "mem_get_info"))
        if cuda is not None:
            name = cuda.rsplit(".", 1)[-1]
            rule = "G2T304" if name == "mem_get_info" else "G2T302"
            unsafe = rule == "G2T304"
            options = ctx.options
            rewritten = options.enabled(rule) and (options.unsafe_fixes or not unsafe)
            if rewritten and not unpacks(node) and not accelerator_known(ctx, node):
                fallback = "(0, 0)" if unsafe else CudaMemoryStats.functions[name][1]
                self.report(node, self.message.format(call=self.short(node, 50), fallback=fallback))
            return
        accel = matches(ctx, node, *(f"torch.accelerator.memory.{n}" for n in FIGURE_FALLBACKS))
        parent = self.parent(node)
        if accel is None or not (isinstance(parent, cst.IfExp) and parent.body is node):
            return
        if not any(
            isinstance(part, cst.Call)
            and matches(ctx, part, "torch.accelerator.is_available") is not None
            for part in conjuncts(parent.test)
        ):
            return
        fallback = FIGURE_FALLBACKS[accel.rsplit(".", 1)[-1]]
        self.report(node, self.message.format(call=self.short(node, 50), fallback=fallback))
