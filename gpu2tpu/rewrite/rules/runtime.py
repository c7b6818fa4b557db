"""G2T309-G2T319: the rest of the CUDA runtime: events and streams, NVTX, device properties,
legacy typed tensors, initialisation, `torch.compile`'s backend, and any other `torch.cuda`
name that no rule covers.

Memory rules live in `memory.py` (G2T301-G2T305), seed and RNG rules in `seeds.py`
(G2T306-G2T308).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import libcst as cst

from ..analysis.branches import device_branch
from ..analysis.edits import (
    guarded_line,
    keyword,
    needs_parentheses,
    parenthesized,
    remove_line,
    report_removal,
    sole_statement,
    string_literal,
    unpacks,
)
from ..analysis.literals import attribute_named, is_name, short, string_value
from ..analysis.names import is_reference_end, matches, qualified
from ..analysis.placement import add_stdlib_import
from ..analysis.torch_api import MEMORY_TOOLING, cuda_member
from ..core.model import Safety, Severity
from .base import Rule, RuleContext

CUDA_EVENT = ("torch.cuda.Event", "torch.cuda.streams.Event")


def _cuda_name(rule: Rule, node: cst.CSTNode) -> str | None:
    """`X` for a reference to `torch.cuda.X` (submodules `memory`, `random`, `streams` folded)."""
    return cuda_member(qualified(rule.ctx, node))


def _is_full_reference(rule: Rule, node: cst.CSTNode) -> bool:
    return is_reference_end(rule.ctx, node)


# -- events -------------------------------------------------------------------------------


@dataclass
class _EventPlan:
    """How one `name = torch.cuda.Event(enable_timing=True)` becomes wall-clock timing."""

    call: cst.Call
    name: str = ""
    scope: cst.CSTNode | None = None  # the function (or module) whose local the event is
    records: list[cst.SimpleStatementLine] = field(default_factory=list)
    syncs: list[cst.SimpleStatementLine] = field(default_factory=list)
    elapsed: list[tuple[cst.Call, str]] = field(default_factory=list)
    problem: str = ""


_NESTED_SCOPES = (
    cst.FunctionDef,
    cst.ClassDef,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)


class _NameUses(cst.CSTVisitor):
    """The uses of every name in a scope's own code, with every node's parent.

    A cheap stand-in for libcst's scope analysis (which costs several parses of the whole
    module): a use inside a nested function, class, lambda or comprehension is collected apart,
    and the rule gives up on such an event rather than reason about closures. One walk per
    scope serves all its events (a walk per event made a scope of N events cost N walks).
    """

    def __init__(self, parents: dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.parents = parents
        self.stack: list[cst.CSTNode] = []
        self.depth = 0
        self.uses: dict[str, list[cst.Name]] = {}
        self.nested_uses: Counter[str] = Counter()

    def on_visit(self, node: cst.CSTNode) -> bool:
        parent = self.stack[-1] if self.stack else None
        if parent is not None:
            self.parents[id(node)] = parent
        if isinstance(node, cst.Name) and not self._label(node, parent):
            if self.depth:
                self.nested_uses[node.value] += 1
            else:
                self.uses.setdefault(node.value, []).append(node)
        self.stack.append(node)
        if isinstance(node, _NESTED_SCOPES):
            self.depth += 1
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()
        if isinstance(original_node, _NESTED_SCOPES):
            self.depth -= 1

    @staticmethod
    def _label(node: cst.Name, parent: cst.CSTNode | None) -> bool:
        """An attribute's or keyword's own name, which is not a use of the variable."""
        if isinstance(parent, cst.Attribute):
            return parent.attr is node
        return isinstance(parent, cst.Arg) and parent.keyword is node


class CudaEventTiming(Rule):
    """`torch.cuda.Event(enable_timing=True)` timing: `record()` and `elapsed_time()`.

    Why: CUDA events only exist on CUDA, and the generic `torch.Event` cannot record on the
    CPU ("cpu backend doesn't support events"); TorchTPU's events and streams are placeholders
    while execution may be deferred. Wall-clock time after a synchronize measures the same
    interval on every backend. When an event is a plain local name whose only uses are
    `ev.record()` and `ev.synchronize()` statements and `a.elapsed_time(b)` with another such
    event, each `record()` becomes a guarded `torch.accelerator.synchronize()` and a
    `time.perf_counter()` reading, `elapsed_time` the difference in milliseconds, and
    `synchronize()` goes (the reading already waited), as does the line that made the event
    (a reading there would be dead: CUDA raises on an event never recorded); `import time`
    is added if needed.
    Timings now include the host's view of the step; results are unchanged. Other events
    (kept in lists, recorded on a stream, queried, used for synchronisation) are reported.

    Example:
        start = torch.cuda.Event(enable_timing=True)   ->  (dropped: `record()` assigns it)
        start.record()                                 ->  if torch.accelerator.is_available(): torch.accelerator.synchronize()
                                                           start = time.perf_counter()
        ms = start.elapsed_time(end)                   ->  ms = (end - start) * 1000.0
    """

    code = "G2T309"
    compat_torch = "0.4"
    name = "cuda-event-timing"
    safety = Safety.SAFE
    message = "`torch.cuda.Event` timing only works on CUDA"
    hint = "time with `time.perf_counter()` after a guarded `torch.accelerator.synchronize()`"
    tokens = (b"Event(",)
    follows_names = True  # `start.record()`, `start.elapsed_time(end)` hold no token

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.events: list[cst.Call] = []
        # Parents inside the scopes walked for event uses: those may sit in top-level statements
        # that the engine's token filter never visits (a notebook or a flat script).
        self.scope_parents: dict[int, cst.CSTNode] = {}
        self.scope_uses: dict[int, _NameUses] = {}  # by the id of the scope's walked node

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.scope_parents.get(id(node)) or self.ctx.parents.get(id(node))

    def visit_Call(self, node: cst.Call) -> None:
        if matches(self.ctx, node, *CUDA_EVENT):
            self.events.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.events:
            return
        plans = [self._plan(call, original_node) for call in self.events]
        by_name = {(id(p.scope), p.name): p for p in plans if p.scope is not None}
        self._check_partners(plans, by_name)
        time_problem = self._time_problem(original_node)
        needs_import = False
        for plan in plans:
            problem = plan.problem or time_problem
            if problem:
                self.report(plan.call, hint=f"{self.hint}, by hand: {problem}")
                continue
            if self._apply(plan):
                needs_import = True
        if needs_import and not self._time_imported(original_node):
            if self.ctx.options.insert_statements:
                self.ctx.add_fix(original_node, partial(add_stdlib_import, name="time"))
            else:
                self.ctx.require_import("import time")

    def _plan(self, call: cst.Call, module: cst.Module) -> _EventPlan:
        plan = _EventPlan(call=call)
        timing = [
            a for a in call.args if a.keyword is not None and a.keyword.value == "enable_timing"
        ]
        if not timing:
            plan.problem = "an event used for synchronisation, not timing"
            return plan
        if len(call.args) != 1 or not is_name(timing[0].value, "True"):
            plan.problem = "only `torch.cuda.Event(enable_timing=True)` is rewritten"
            return plan
        assign = self.parent(call)
        line = self.parent(assign) if assign is not None else None
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            plan.problem = "the event is not assigned to a plain name"
            return plan
        target = assign.targets[0].target
        assert isinstance(target, cst.Name)
        if self.ctx.binds_in_scopes("time", call):
            plan.problem = "`time` means something else where the event is"
            return plan
        scope = self._scope_of(line, module)
        if scope is None:
            plan.problem = "the event is a class attribute"
            return plan
        plan.name, plan.scope = target.value, scope
        walked = scope.body if isinstance(scope, cst.FunctionDef) else scope
        walker = self.scope_uses.get(id(walked))
        if walker is None:
            walker = self.scope_uses[id(walked)] = _NameUses(self.scope_parents)
            walked.visit(walker)
        if walker.nested_uses[plan.name]:
            plan.problem = f"`{plan.name}` is used in a nested function or comprehension"
            return plan
        for use in walker.uses.get(plan.name, []):
            problem = "" if use is target else self._use(plan, use)
            if problem:
                plan.problem = problem
                return plan
        return plan

    def _scope_of(self, node: cst.CSTNode, module: cst.Module) -> cst.CSTNode | None:
        """The function whose body holds `node`, or the module; None inside a class body."""
        parent = self.parent(node)
        while parent is not None and parent is not module:
            if isinstance(parent, cst.FunctionDef):
                return parent
            if isinstance(parent, cst.ClassDef):
                return None
            parent = self.parent(parent)
        return module

    def _use(self, plan: _EventPlan, node: cst.Name) -> str:
        """Record one use of the event's name; a non-empty answer says why it cannot be kept."""
        parent = self.parent(node)
        if isinstance(parent, cst.Arg):
            call = self.parent(parent)
            if isinstance(call, cst.Call) and attribute_named(call.func, "elapsed_time"):
                return ""  # the partner of `other.elapsed_time(<this>)`, checked with it
            return f"`{plan.name}` is passed to a function"
        if not (isinstance(parent, cst.Attribute) and parent.value is node):
            return f"`{plan.name}` is assigned again or used as a value"
        call = self.parent(parent)
        if not (isinstance(call, cst.Call) and call.func is parent):
            return f"`{plan.name}.{parent.attr.value}` is not a plain call"
        method = parent.attr.value
        if method in ("record", "synchronize") and not call.args:
            line = sole_statement(self, call)
            if line is None:
                return f"`{plan.name}.{method}()` is not a statement of its own"
            (plan.records if method == "record" else plan.syncs).append(line)
            return ""
        if method == "elapsed_time" and len(call.args) == 1:
            other = call.args[0].value
            if call.args[0].keyword is None and isinstance(other, cst.Name):
                plan.elapsed.append((call, other.value))
                return ""
        return f"`{plan.name}.{method}(...)` has no wall-clock counterpart"

    def _check_partners(
        self, plans: list[_EventPlan], by_name: dict[tuple[int, str], _EventPlan]
    ) -> None:
        """An `elapsed_time` pair is rewritten only if both of its events are."""
        changed = True
        while changed:
            changed = False
            for plan in plans:
                if plan.problem:
                    continue
                for _, other in plan.elapsed:
                    partner = by_name.get((id(plan.scope), other))
                    if partner is None or partner.problem:
                        plan.problem = f"`{other}` is not a rewritable timing event"
                        changed = True
                        break
        for plan in plans:
            if not plan.problem and not plan.records:
                plan.problem = f"`{plan.name}` is never recorded"

    def _time_imported(self, module: cst.Module) -> bool:
        """Whether `time` is the time module at the module's level (imported there, or by
        code that ran before this text)."""
        return self.ctx.names.module_binding("time") == "time"

    def _time_problem(self, module: cst.Module) -> str:
        if self._time_imported(module):
            return ""
        if self.ctx.name_in_use("time"):
            return "the name `time` is taken in this module"
        return ""

    def _apply(self, plan: _EventPlan) -> bool:
        ctx = self.ctx

        def now() -> cst.Call:
            return cst.Call(func=cst.parse_expression("time.perf_counter"))

        # Every `record()` assigns a fresh reading before any `elapsed_time` can read it (an
        # event never recorded makes CUDA raise there), so the event's own line goes.
        assign = self.parent(plan.call)
        line = self.parent(assign) if assign is not None else None
        assert isinstance(line, cst.SimpleStatementLine)
        if not report_removal(self, plan.call, line):
            return False
        for line in plan.records:

            def record(updated: cst.CSTNode, name: str = plan.name) -> cst.CSTNode:
                assert isinstance(updated, cst.SimpleStatementLine)
                sync = cst.Expr(cst.Call(func=ctx.torch_attr("accelerator.synchronize")))
                bare = updated.with_changes(trailing_whitespace=cst.TrailingWhitespace())
                reading = cst.SimpleStatementLine(
                    body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=now())],
                    trailing_whitespace=updated.trailing_whitespace,
                )
                return cst.FlattenSentinel([guarded_line(ctx, bare, sync), reading])  # type: ignore[return-value]  # the transformer splices the lines where this one was

            ctx.add_fix(line, record)
        for line in plan.syncs:
            remove_line(self, line)
        for call, other in plan.elapsed:
            parens = needs_parentheses(self, call)

            def elapsed(
                updated: cst.CSTNode, a: str = plan.name, b: str = other, p: bool = parens
            ) -> cst.CSTNode:
                diff = cst.BinaryOperation(
                    left=cst.Name(b),
                    operator=cst.Subtract(),
                    right=cst.Name(a),
                    lpar=[cst.LeftParen()],
                    rpar=[cst.RightParen()],
                )
                ms = cst.BinaryOperation(
                    left=diff, operator=cst.Multiply(), right=cst.Float("1000.0")
                )
                return parenthesized(ms, p)

            ctx.add_fix(call, elapsed)
        return True


STREAM_NAMES = frozenset(
    {
        "Stream",
        "stream",
        "current_stream",
        "default_stream",
        "set_stream",
        "ExternalStream",
        "StreamContext",
    }
)


class CudaStream(Rule):
    """CUDA streams: `torch.cuda.Stream()`, `torch.cuda.stream(s)`, `wait_stream`, `record_stream`.

    Why: streams overlap work on a GPU. On a TPU they are placeholders and XLA/PjRt orders the
    work itself, so overlap logic means nothing there; whether to drop it or keep it for CUDA
    through the generic `torch.Stream(device)` (torch 2.5+) is a person's call.

    Example:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):  # -> drop the stream, or `torch.Stream(device)` for CUDA only
    """

    code = "G2T310"
    name = "cuda-stream"
    safety = Safety.REPORT
    message = "`{value}`: CUDA streams are placeholders on a TPU"
    hint = "drop the stream logic (XLA orders TPU work), or keep it for CUDA via `torch.Stream(device)`"
    tokens = (b"cuda", b"record_stream", b"wait_stream")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> None:
        if _cuda_name(self, node) in STREAM_NAMES and _is_full_reference(self, node):
            self.report(node, self.message.format(value=f"torch.cuda.{_cuda_name(self, node)}"))

    def visit_Call(self, node: cst.Call) -> None:
        if not attribute_named(node.func, "wait_stream", "record_stream"):
            return
        value = node.func.value  # type: ignore[attr-defined]  # func is an Attribute, matched above
        if isinstance(value, cst.Name | cst.Attribute) and qualified(self.ctx, value):
            return
        self.report(node, self.message.format(value=f".{node.func.attr.value}()"))  # type: ignore[attr-defined]  # func is an Attribute, matched above


class CudaNvtxRange(Rule):
    """`torch.cuda.nvtx.range("name")` marks a region for NVIDIA's profilers.

    Why: NVTX is NVIDIA-only. `torch.profiler.record_function("name")` marks the same region
    for the PyTorch profiler on every backend, as a context manager or a decorator, and the
    TPU profiler shows it. Nsight no longer sees the range unless the profile runs under
    `torch.autograd.profiler.emit_nvtx()`. Calls with format arguments are reported.

    Example:
        with torch.cuda.nvtx.range("forward"):  ->  with torch.profiler.record_function("forward"):
    """

    code = "G2T311"
    name = "cuda-nvtx-range"
    safety = Safety.SAFE
    message = "`torch.cuda.nvtx.range` is NVIDIA-only"
    hint = "use `torch.profiler.record_function(name)`"
    tokens = (b"nvtx",)

    def visit_Call(self, node: cst.Call) -> None:
        if matches(self.ctx, node, "torch.cuda.nvtx.range") is None:
            return
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            self.report(node, hint=f"{self.hint} with the formatted name, by hand")
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return updated.with_changes(func=ctx.torch_attr("profiler.record_function"))

        self.report(node, fix=fix)


class CudaNvtxPushPop(Rule):
    """`torch.cuda.nvtx.range_push/range_pop/mark` mark NVTX ranges by hand.

    Why: NVTX is NVIDIA-only. A push/pop pair cannot be turned into a `with` block safely
    (the pair may span branches, loops or functions), so the region is a person's to wrap in
    `with torch.profiler.record_function(name):`.

    Example:
        torch.cuda.nvtx.range_push("step")  # -> with torch.profiler.record_function("step"):
    """

    code = "G2T312"
    name = "cuda-nvtx-push-pop"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`torch.cuda.nvtx.{func}` is NVIDIA-only"
    hint = "wrap the region in `with torch.profiler.record_function(name):`"
    tokens = (b"nvtx",)

    def visit_Call(self, node: cst.Call) -> None:
        name = _cuda_name(self, node.func)
        if name in (
            "nvtx.range_push",
            "nvtx.range_pop",
            "nvtx.mark",
            "nvtx.range_start",
            "nvtx.range_end",
        ):
            self.report(node, self.message.format(func=name.removeprefix("nvtx.")))


DEVICE_PROPERTIES = {
    "get_device_name": "`torch.accelerator.current_accelerator()` names the device type; TorchTPU's module may have `get_device_name`: `getattr(torch.get_device_module(device), 'get_device_name', None)`",
    "get_device_properties": "for memory use `torch.accelerator.memory` (guarded); SM counts and compute capability are NVIDIA notions",
    "get_device_capability": "compute capability is an NVIDIA notion: decide what the check is for (bf16, flash attention, fp8)",
    "is_bf16_supported": "TPUs support bfloat16 natively; ask only when the device type is CUDA",
    "get_arch_list": "an NVIDIA notion: guard it for CUDA",
    "get_gencode_flags": "an NVIDIA notion: guard it for CUDA",
    "is_tf32_supported": "TF32 is an NVIDIA format; TPUs run float32 matmuls as bfloat16 passes",
}


# What a display-only query shows where the device is not CUDA (the device type for a name).
DISPLAY_FALLBACK = {
    "get_device_name": None,  # the device type, `device.type`
    "get_device_capability": "None",
    "get_device_properties": "None",
    "get_arch_list": "[]",
    "get_gencode_flags": '""',
    "is_tf32_supported": "False",
}
# Expressions a value passes through on its way to a print or a log call.
_DISPLAY_PARTS = (
    cst.FormattedStringExpression,
    cst.FormattedString,
    cst.ConcatenatedString,
    cst.BinaryOperation,
    cst.Tuple,
    cst.List,
    cst.Element,
    cst.Dict,
    cst.DictElement,
    cst.Arg,
    cst.Subscript,
    cst.SubscriptElement,
    cst.Index,
    cst.Attribute,
)


class CudaDeviceProperties(Rule):
    """`torch.cuda.get_device_name()`, `get_device_capability()` and other questions about the GPU.

    Why: `get_device_properties()`, `is_bf16_supported()` and their kin ask about the NVIDIA GPU.
    TorchTPU's device module lacks most of them, and the answers are policy decisions
    (a capability of 8.0 or more means bf16 and flash attention on NVIDIA; a TPU has bf16
    always and no capability number). Two uses are fixed, unchanged on CUDA: a query that is
    only printed or logged runs on CUDA and shows the device type (or None) elsewhere, and
    `is_bf16_supported()` answers True on any other accelerator (TPUs, XPUs and recent MPS
    compute in bfloat16) and False on the CPU, so nanoGPT's `dtype = "bfloat16" if ... and
    torch.cuda.is_bf16_supported() else "float16"` picks bfloat16 on a TPU. Everything else,
    and code under `if device.type == "cuda":` aside, is a person's call.

    Example:
        print(torch.cuda.get_device_name(0))
        ->  print(torch.cuda.get_device_name(0) if device.type == "cuda" else device.type)
        torch.cuda.is_bf16_supported()
        ->  (torch.cuda.is_bf16_supported() if device.type == "cuda" else device.type != "cpu")
        if torch.cuda.get_device_capability()[0] >= 8:  # reported: decide what it is for
    """

    code = "G2T313"
    compat_torch = "0.4"
    name = "cuda-device-properties"
    safety = Safety.SAFE
    message = "`{call}` asks about the NVIDIA GPU; a TPU has no answer"
    hint = "decide what the check is for"

    def visit_Call(self, node: cst.Call) -> None:
        name = _cuda_name(self, node.func)
        if name not in DEVICE_PROPERTIES:
            return
        ctx = self.ctx
        if device_branch(ctx, node) == "cuda":
            return  # code for CUDA only (also what the fixes below write)
        message = self.message.format(call=short(node, 50))
        if name == "is_bf16_supported" and not unpacks(node):
            self._guard(node, message, "bf16")
            return
        if name in DISPLAY_FALLBACK and self._displayed(node):
            self._guard(node, message, name)
            return
        self.report(node, message, hint=DEVICE_PROPERTIES[name])

    def _guard(self, node: cst.Call, message: str, name: str) -> None:
        ctx = self.ctx
        parens = needs_parentheses(self, node)
        cuda = string_literal(self, node, "cuda")  # quotes that fit inside an f-string
        cpu = string_literal(self, node, "cpu")

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            on_cuda = cst.Comparison(
                left=ctx.device_type(),
                comparisons=[cst.ComparisonTarget(cst.Equal(), cuda)],
            )
            if name == "bf16":
                other: cst.BaseExpression = cst.Comparison(
                    left=ctx.device_type(),
                    comparisons=[cst.ComparisonTarget(cst.NotEqual(), cpu)],
                )
            elif DISPLAY_FALLBACK[name] is None:
                other = ctx.device_type()
            else:
                other = cst.parse_expression(DISPLAY_FALLBACK[name])  # type: ignore[arg-type]  # not None on this branch
            expr = cst.IfExp(test=on_cuda, body=updated, orelse=other)  # type: ignore[arg-type]  # the fixed node is an expression (a call)
            return parenthesized(expr, parens)

        hint = (
            "ask CUDA only on CUDA: other accelerators compute in bfloat16"
            if name == "bf16"
            else "show it only on CUDA (the device type elsewhere)"
        )
        self.report(node, message, fix=fix, hint=hint, uses_device=True)

    def _displayed(self, node: cst.Call) -> bool:
        """Whether the call's value only goes to `print`, a logger or a tracker."""
        flow = self.ctx.flow
        child: cst.CSTNode = node
        parent = self.parent(node)
        while parent is not None:
            if isinstance(parent, cst.Call) and parent is not node:
                if flow.is_log_call(parent):
                    return True
                if not (
                    isinstance(parent.func, cst.Name) and parent.func.value in ("str", "repr")
                ) and not attribute_named(parent.func, "format"):
                    return False
            elif not isinstance(parent, _DISPLAY_PARTS):
                return False
            child, parent = parent, self.parent(parent)
        del child
        return False


LEGACY_TENSORS = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64",
    "IntTensor": "int32",
    "ShortTensor": "int16",
    "CharTensor": "int8",
    "ByteTensor": "uint8",
    "BoolTensor": "bool",
}


class CudaLegacyTensor(Rule):
    """Legacy typed tensors: `torch.cuda.FloatTensor(...)` and friends.

    Why: they exist only for CUDA (and are legacy everywhere). Their meaning depends on the
    arguments: a list is data (`torch.tensor`), integers are sizes (`torch.empty`, which like
    the legacy constructor leaves the memory uninitialised). Those two, no arguments, and
    `x.type(...)` with the type are rewritten; anything else (names whose kind is unknown,
    `isinstance` checks, `set_default_tensor_type`) is reported.

    Example:
        torch.cuda.FloatTensor([1.0, 2.0])    ->  torch.tensor([1.0, 2.0], dtype=torch.float32, device=device)
        torch.cuda.LongTensor(4, 2)           ->  torch.empty(4, 2, dtype=torch.int64, device=device)
        x.type(torch.cuda.HalfTensor)         ->  x.to(device, torch.float16)
    """

    code = "G2T314"
    compat_torch = "0.4"
    name = "cuda-legacy-tensor"
    safety = Safety.SAFE
    message = "`torch.cuda.{type}` is a legacy CUDA-only tensor type"
    hint = "use `torch.tensor(data, ...)` or `torch.empty(*sizes, ...)` with `dtype=` and `device=device`"
    # `Tensor(` keeps `LongTensor(4, 2)` after `from torch.cuda import LongTensor` visited.
    tokens = (b"cuda", b"Tensor(")

    def _type(self, node: cst.CSTNode) -> str | None:
        name = _cuda_name(self, node)
        if name in LEGACY_TENSORS:
            return name
        value = string_value(node)
        if value is not None and value.startswith("torch.cuda."):
            if value[len("torch.cuda.") :] in LEGACY_TENSORS:
                return value[len("torch.cuda.") :]
        return None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> None:
        kind = self._type(node)
        if kind is None or not _is_full_reference(self, node):
            return
        parent = self.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            self._constructor(parent, kind)
        elif not self._in_type_call(node):
            self.report(node, self.message.format(type=kind), hint=f"{self.hint}, by hand")

    def _in_type_call(self, node: cst.CSTNode) -> bool:
        arg = self.parent(node)
        call = self.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and self._is_type_call(call)

    def _is_type_call(self, call: cst.Call) -> bool:
        return (
            attribute_named(call.func, "type")
            and len(call.args) == 1
            and call.args[0].keyword is None
            and not call.args[0].star
        )

    def _bfloat16_wanted(self, kind: str) -> bool:
        """Whether this run also switches float16 to bfloat16 (G2T212's unsafe fix): a legacy
        half tensor is then a person's call, since the float16 it would become is rewritten
        again by the next run."""
        options = self.ctx.options
        return kind == "HalfTensor" and options.unsafe_fixes and options.enabled("G2T212")

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_type_call(node):
            return
        kind = self._type(node.args[0].value)
        if kind is None:
            return
        if self._bfloat16_wanted(kind):
            message = self.message.format(type=kind)
            self.report(node, message, hint="use `x.to(device, torch.bfloat16)`, by hand")
            return
        ctx = self.ctx
        dtype = LEGACY_TENSORS[kind]

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
            args = [
                cst.Arg(ctx.device(), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(ctx.torch_attr(dtype)),
            ]
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=args
            )

        self.report(
            node,
            self.message.format(type=kind),
            fix=fix,
            hint="use `x.to(device, dtype)`",
            uses_device=True,
        )

    def _constructor(self, call: cst.Call, kind: str) -> None:
        args = call.args
        data = len(args) == 1 and isinstance(args[0].value, cst.List | cst.Tuple)
        sizes = all(isinstance(a.value, cst.Integer) and a.keyword is None for a in args)
        unclear = any(a.star or a.keyword is not None for a in args) or not (data or sizes)
        if unclear or self._bfloat16_wanted(kind):
            self.report(
                call, self.message.format(type=kind), hint=f"{self.hint}, by hand: data or sizes?"
            )
            return
        ctx = self.ctx
        dtype = LEGACY_TENSORS[kind]

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            given = list(updated.args) or [cst.Arg(cst.Integer("0"))]
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            given[-1] = given[-1].with_changes(comma=comma)
            extra = [
                keyword("dtype", ctx.torch_attr(dtype)).with_changes(comma=comma),
                keyword("device", ctx.device()),
            ]
            factory = "tensor" if data else "empty"
            return updated.with_changes(func=ctx.torch_attr(factory), args=[*given, *extra])

        self.report(call, self.message.format(type=kind), fix=fix, uses_device=True)


class CudaInit(Rule):
    """`torch.cuda.init()` initialises CUDA eagerly.

    Why: it raises without CUDA, and no accelerator needs it: every backend initialises
    lazily on first use, CUDA included. As a statement of its own the call is dropped.

    Example:
        torch.cuda.init()  ->  (dropped)
    """

    code = "G2T315"
    compat_torch = "0.4"
    name = "cuda-init"
    safety = Safety.SAFE
    message = "`torch.cuda.init()` is CUDA-only and initialisation is lazy anyway"
    hint = "drop it"

    def visit_Call(self, node: cst.Call) -> None:
        if _cuda_name(self, node.func) != "init":
            return
        line = sole_statement(self, node)
        if line is None or node.args:
            self.report(node, hint="drop it by hand")
            return
        report_removal(self, node, line)


RUNTIME_MANAGEMENT = {
    "is_initialized": "ask `torch.accelerator.is_available()`, or drop the check",
    "ipc_collect": "drop it, or keep it for CUDA only (it frees memory shared across processes)",
}


class CudaRuntimeManagement(Rule):
    """`torch.cuda.is_initialized()` and `torch.cuda.ipc_collect()`: CUDA runtime housekeeping.

    Why: they only speak to the CUDA runtime; `ipc_collect` raises without a GPU. Whether the
    surrounding code still needs them is a person's call.

    Example:
        torch.cuda.ipc_collect()  # -> drop it, or keep it for CUDA only
    """

    code = "G2T316"
    name = "cuda-runtime-management"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`torch.cuda.{func}()` is CUDA runtime housekeeping"
    hint = "decide by hand"

    def visit_Call(self, node: cst.Call) -> None:
        name = _cuda_name(self, node.func)
        if name in RUNTIME_MANAGEMENT:
            self.report(node, self.message.format(func=name), hint=RUNTIME_MANAGEMENT[name])


class CudaOutOfMemoryError(Rule):
    """`torch.cuda.OutOfMemoryError`, caught to back off when the GPU is full.

    Why: `torch.OutOfMemoryError` (torch 2.5+) is the same class (`torch.cuda` re-exports it)
    and names no device, so the `except` reads the same on every backend.

    Example:
        except torch.cuda.OutOfMemoryError:  ->  except torch.OutOfMemoryError:
    """

    code = "G2T317"
    name = "cuda-out-of-memory-error"
    safety = Safety.SAFE
    message = "`torch.cuda.OutOfMemoryError` names CUDA; it is `torch.OutOfMemoryError`"
    hint = "use `torch.OutOfMemoryError`"

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> None:
        if _cuda_name(self, node) == "OutOfMemoryError" and _is_full_reference(self, node):
            self.report(node, fix=lambda updated: self.ctx.torch_attr("OutOfMemoryError"))


class TorchCompileBackend(Rule):
    """`torch.compile(...)` with the default backend (`inductor`).

    Why: Inductor generates Triton kernels for GPUs and C++ for CPUs; on TorchTPU the backend
    is named `"tpu"` (PyTorch/XLA's is `"openxla"`). The backend is a deployment choice, so
    this is a note, not a rewrite: `backend="tpu" if device.type == "tpu" else "inductor"`
    keeps CUDA as it is. `mode="reduce-overhead"` means CUDA graphs, and
    `@torch.inference_mode()` on a compiled function is better `no_grad` (G2T608).

    Example:
        model = torch.compile(model)  # -> torch.compile(model, backend="tpu") on TorchTPU
    """

    code = "G2T318"
    name = "torch-compile-backend"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = '`torch.compile` uses Inductor by default; TorchTPU\'s backend is `"tpu"`'
    hint = 'pass `backend="tpu" if device.type == "tpu" else "inductor"`'
    tokens = (b"torch.compile",)

    def visit_Call(self, node: cst.Call) -> None:
        if matches(self.ctx, node, "torch.compile") is None:
            return
        backend = next((a for a in node.args if a.keyword and a.keyword.value == "backend"), None)
        if backend is not None and string_value(backend.value) != "inductor":
            return
        self.report(node)


# `torch.cuda` names that a rule of this project reports or rewrites (top level of the name).
COVERED = frozenset(
    {
        # G2T1xx devices
        "is_available",
        "device_count",
        "current_device",
        "set_device",
        "synchronize",
        "device",
        # G2T2xx AMP
        "amp",
        # G2T3xx
        "empty_cache",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "memory_cached",
        "max_memory_cached",
        "memory_stats",
        "reset_peak_memory_stats",
        "reset_accumulated_memory_stats",
        "reset_max_memory_allocated",
        "reset_max_memory_cached",
        "mem_get_info",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "get_rng_state",
        "set_rng_state",
        "get_rng_state_all",
        "set_rng_state_all",
        "initial_seed",
        "default_generators",
        "Event",
        "nvtx",
        "init",
        "OutOfMemoryError",
        *STREAM_NAMES,
        *DEVICE_PROPERTIES,
        *LEGACY_TENSORS,
        *RUNTIME_MANAGEMENT,
        # G2T5xx: NVML queries (G2T508) and CUDA graphs (G2T511)
        "utilization",
        "temperature",
        "power_draw",
        "clock_rate",
        "list_gpu_processes",
        "device_memory_used",
        "CUDAGraph",
        "graph",
        "graphs",
        "make_graphed_callables",
        "graph_pool_handle",
    }
)


# Covered names whose rules also report uses that are not calls (a class passed around, an
# `except` clause); for the other covered names only calls are handled.
COVERED_AS_VALUES = frozenset(
    {
        *STREAM_NAMES,
        *LEGACY_TENSORS,
        "OutOfMemoryError",
        "default_generators",
        "CUDAGraph",
        "graph",
        "graphs",
        "make_graphed_callables",
        "graph_pool_handle",
    }
)


class CudaApiOther(Rule):
    """Any other `torch.cuda` name (`set_sync_debug_mode()`, `jiterator`, ...), and CUDA
    functions passed around rather than called.

    Why: nothing CUDA-specific may pass silently. These have no device-agnostic counterpart
    that the codemod knows of, or are used as values (`atexit.register(torch.cuda.empty_cache)`)
    where the call-site rewrites do not reach; a person decides what the code still needs.

    Example:
        torch.cuda.set_sync_debug_mode("warn")  # -> keep it for CUDA only, or drop it
        atexit.register(torch.cuda.empty_cache)  # -> register a function that calls the guard
    """

    code = "G2T319"
    name = "cuda-api-other"
    safety = Safety.REPORT
    message = "`torch.cuda.{func}` is CUDA-only"
    hint = "keep it for CUDA only (`if device.type == ...`), or drop it"

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> None:
        name = _cuda_name(self, node)
        if not name:
            return
        covered = name.split(".")[0] in COVERED or name in MEMORY_TOOLING
        if covered and (name in COVERED_AS_VALUES or name.startswith("amp.")):
            return
        if not _is_full_reference(self, node):
            return
        if not covered:
            self.report(node, self.message.format(func=name))
            return
        parent = self.parent(node)
        if not (isinstance(parent, cst.Call) and parent.func is node):
            message = f"`torch.cuda.{name}` is CUDA-only, and used here without a call"
            self.report(node, message, hint="call it behind a guard, by hand")
