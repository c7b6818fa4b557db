"""G2T1xx: device placement. Code that names CUDA where it means "the accelerator"."""

from __future__ import annotations

import re

import libcst as cst

from ..analysis.edits import guarded_line, sole_statement, without_args
from ..analysis.literals import attribute_named, cuda_literal, is_call_to_attr, string_value
from ..analysis.names import defines_attribute, is_store
from ..model import Safety, Severity
from .base import Rule

DEVICE_KWARGS = frozenset({"device", "map_location", "output_device"})
# CUDA APIs no rule rewrites: a guard around them must stay CUDA's own.
_CUDA_ONLY = re.compile(
    r"cuda\.(get_device_name|get_device_properties|get_device_capability|get_arch_list|"
    r"Stream|stream|CUDAGraph|graph|make_graphed_callables|nvtx|ipc_collect|jiterator)\b"
)


def _is_torch_device_call(rule: Rule, node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and bool(rule.matches_name(node, "torch.device"))


class CudaMethod(Rule):
    """`.cuda()` moves a tensor or module to an NVIDIA GPU.

    Why: the call fails on TPUs and on machines without CUDA. `.to(device)` with the module's
    device runs anywhere. A device index is dropped: the module's device is the process's own
    accelerator (`torch.accelerator.set_device_index` selects it on CUDA; a TPU process owns
    one chip, `tpu:0`).

    Example:
        model.cuda()               ->  model.to(device)
        x.cuda(non_blocking=True)  ->  x.to(device, non_blocking=True)
        x.cuda(local_rank)         ->  x.to(device)
    """

    code = "G2T101"
    name = "cuda-method"
    safety = Safety.SAFE
    message = "`.cuda()` ties the value to NVIDIA GPUs; use the module's device"
    hint = "use `.to(device)`"

    def visit_Call(self, node: cst.Call) -> None:
        if not is_call_to_attr(node, "cuda"):
            return
        value = node.func.value  # type: ignore[attr-defined]
        if isinstance(value, cst.Name | cst.Attribute) and self.qualified_names(value):
            return  # `<imported module or class>.cuda(...)`, not a tensor or module method
        if any(a.star for a in node.args):
            self.report(node, hint="unpacked arguments to `.cuda()`: move to `.to(device)` by hand")
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
            rest = without_args(updated, drop_positional=True, drop=frozenset({"device"}))
            dev = cst.Arg(
                ctx.device(),
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                if rest
                else cst.MaybeSentinel.DEFAULT,
            )
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=[dev, *rest]
            )

        self.report(node, fix=fix, uses_device=True)


class CudaDeviceString(Rule):
    """A device string such as `'cuda'`, `'cuda:0'` or `f'cuda:{rank}'`.

    Why: the string names NVIDIA GPUs; on a TPU (or any other accelerator) it fails. The
    module's device variable names whatever accelerator the process has. Covered places:
    `device=`, `map_location=` and `output_device=` arguments of any call (tensor factories,
    `torch.load`, `torch.Generator`, ...), the first argument of `.to(...)`, and
    `torch.device(...)` itself.

    Example:
        torch.zeros(3, device="cuda")           ->  torch.zeros(3, device=device)
        x.to("cuda:0")                          ->  x.to(device)
        torch.device(f"cuda:{rank}")            ->  device
        torch.load(p, map_location="cuda")      ->  torch.load(p, map_location=device)
    """

    code = "G2T102"
    name = "cuda-device-string"
    safety = Safety.SAFE
    message = "device string {value} names NVIDIA GPUs; use the module's device"
    hint = "use the module's `device` variable"

    def visit_Call(self, node: cst.Call) -> None:
        if _is_torch_device_call(self, node):
            args = [
                a for a in node.args if a.keyword is None or a.keyword.value in ("type", "index")
            ]
            if args and cuda_literal(args[0].value) and len(args) <= 2:
                parent = self.parent(node)
                if isinstance(parent, cst.Call) and _is_torch_device_call(self, parent):
                    return
                self._report_literal(node, args[0].value, whole=True)
            return
        if attribute_named(node.func, "to") and node.args:
            first = node.args[0]
            if first.keyword is None and not first.star and cuda_literal(first.value):
                self._report_literal(first.value, first.value)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in DEVICE_KWARGS:
                if cuda_literal(arg.value):
                    self._report_literal(arg.value, arg.value)

    def _report_literal(self, node: cst.CSTNode, literal: cst.CSTNode, whole: bool = False) -> None:
        value = self.code_for(literal)
        self.report(
            node,
            self.message.format(value=f"`{value}`"),
            fix=lambda updated: self.ctx.device(),
            uses_device=True,
        )


def _idiom_parts(rule: Rule, node: cst.CSTNode) -> str | None:
    """For the `'cuda' if torch.cuda.is_available() else 'cpu'` idiom, its value kind."""
    if not isinstance(node, cst.IfExp):
        return None
    test, body, orelse = node.test, node.body, node.orelse
    negated = False
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, negated = test.expression, True
        body, orelse = orelse, body
    if not (isinstance(test, cst.Call) and rule.matches_name(test, "torch.cuda.is_available")):
        return None
    del negated

    def kind(expr: cst.BaseExpression, want_cuda: bool) -> str | None:
        if isinstance(expr, cst.Call) and _is_torch_device_call(rule, expr) and expr.args:
            inner = expr.args[0].value
            return "device" if kind(inner, want_cuda) == "str" else None
        if want_cuda and cuda_literal(expr):
            return "str"
        if not want_cuda and string_value(expr) == "cpu":
            return "str"
        return None

    cuda_kind, cpu_kind = kind(body, True), kind(orelse, False)
    if cuda_kind and cuda_kind == cpu_kind:
        return cuda_kind
    return None


class CudaDeviceIdiom(Rule):
    """The idiom `'cuda' if torch.cuda.is_available() else 'cpu'` and its variants.

    Why: it only knows two devices, so on a TPU it silently falls back to the CPU. The checked
    accelerator (`current_accelerator(check_available=True)`) picks CUDA, TPU, MPS, XPU or the
    CPU. A module-level variable built by the idiom becomes the module's device variable and
    keeps its kind: a string stays a string (`.type`), a `torch.device` stays a device.
    A plain `device = 'cuda'` configuration at module level counts too.

    Example:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        ->  device = (torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")).type
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        ->  dev = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
    """

    code = "G2T103"
    name = "cuda-device-idiom"
    safety = Safety.SAFE
    message = "`'cuda' if torch.cuda.is_available() else 'cpu'` knows only CUDA and the CPU"
    hint = "use `torch.accelerator.current_accelerator(check_available=True)`"

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Call(self, node: cst.Call) -> None:
        # torch.device(<idiom>) -> the device expression (a torch.device)
        if _is_torch_device_call(self, node) and len(node.args) == 1:
            if _idiom_parts(self, node.args[0].value) == "str":
                self._fix(node, "device")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        kind = _idiom_parts(self, node)
        if kind is None:
            return
        parent = self.parent(self.parent(node) or node)
        if isinstance(parent, cst.Call) and _is_torch_device_call(self, parent):
            return  # handled as a whole by visit_Call
        self._fix(node, kind)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = node.targets[0].target
        if not isinstance(target, cst.Name):
            return
        value = node.value
        kind = _idiom_parts(self, value)
        if kind is None and isinstance(value, cst.Call) and _is_torch_device_call(self, value):
            if len(value.args) == 1 and _idiom_parts(self, value.args[0].value) == "str":
                kind = "device"
        if kind is None and "device" in target.value.lower() and cuda_literal(value):
            assignment = f"`{target.value} = {self.code_for(value)}`"
            literal = string_value(value) or ""
            if isinstance(value, cst.FormattedString) or literal not in ("cuda", "cuda:0"):
                # An index: on CUDA it picks the process's GPU, on a TPU every process owns
                # `tpu:0`. No single expression keeps both, so a person decides.
                self.ctx.claim(value)
                self.report(
                    value,
                    f"{assignment} picks a CUDA device by index",
                    hint="on CUDA keep the index (torch.device(kind, local_rank)); on a TPU each "
                    "process owns one chip: use the module's device",
                )
                return
            kind = "str"
            self._fix(value, "str", message=f"{assignment} names NVIDIA GPUs")
        if kind is None or self.depth:
            return
        if self.ctx.adopted_device is None:
            self.ctx.adopted_device = (target.value, self.position(node)[0])
            self.ctx.adopted_kind = kind

    def _fix(self, node: cst.CSTNode, kind: str, message: str | None = None) -> None:
        ctx = self.ctx
        ctx.claim(node)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            expr = ctx.device_expression(kind)
            parent_needs_parens = isinstance(updated, cst.IfExp) and bool(updated.lpar)
            if parent_needs_parens and isinstance(expr, cst.BooleanOperation):
                return expr.with_changes(lpar=updated.lpar, rpar=updated.rpar)
            return expr

        self.report(node, message, fix=fix)


_RUNTIME = {
    # torch.cuda.X -> (torch.accelerator.Y, code, rule name)
    "torch.cuda.is_available": "accelerator.is_available",
    "torch.cuda.device_count": "accelerator.device_count",
    "torch.cuda.current_device": "accelerator.current_device_index",
}


class _CudaRuntimeCall(Rule):
    """Shared shape of the `torch.cuda.X()` -> `torch.accelerator.Y()` rules."""

    cuda_name: str = ""
    accel_name: str = ""
    guard: bool = False

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(node, self.cuda_name):
            return
        ctx = self.ctx
        accel = self.accel_name

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return updated.with_changes(func=ctx.torch_attr(accel))

        fixed = self.report(node, fix=fix)
        stmt = sole_statement(self, node) if self.guard else None
        if stmt is not None and fixed:
            # The guard belongs to the same edit: a noqa comment on the line drops both.
            pending = self.ctx.pending[-1]
            self.ctx.fixes.setdefault(id(stmt), []).append((self._guard, pending))

    def _guard(self, updated: cst.CSTNode) -> cst.CSTNode:
        """`stmt` -> `if torch.accelerator.is_available(): stmt` (on the same line)."""
        assert isinstance(updated, cst.SimpleStatementLine)
        assert len(updated.body) == 1
        return guarded_line(self.ctx, updated, updated.body[0])


class CudaIsAvailable(_CudaRuntimeCall):
    """`torch.cuda.is_available()` asks only about NVIDIA GPUs.

    Why: on a TPU it is False, so code guarded by it runs on the CPU. `torch.accelerator`
    answers for whatever accelerator is present.

    Example:
        if torch.cuda.is_available():  ->  if torch.accelerator.is_available():
    """

    code = "G2T104"
    name = "cuda-is-available"
    safety = Safety.SAFE
    message = "`torch.cuda.is_available()` asks only about NVIDIA GPUs"
    hint = "use `torch.accelerator.is_available()`"
    cuda_name = "torch.cuda.is_available"
    accel_name = "accelerator.is_available"

    def visit_Call(self, node: cst.Call) -> None:
        guarded = self._guarded_code(node)
        if guarded and self.matches_name(node, self.cuda_name) and _CUDA_ONLY.search(guarded):
            # The guard protects an API only CUDA has: on a TPU it would now run it and fail.
            self.report(
                node,
                "`torch.cuda.is_available()` guards a CUDA-only API here",
                hint="migrate the guarded CUDA-only call first, then the guard "
                "(`torch.accelerator.is_available()`)",
            )
            return
        super().visit_Call(node)

    def _guarded_code(self, node: cst.Call) -> str:
        parent = self.parent(node)
        if isinstance(parent, cst.IfExp) and parent.test is node:
            return self.code_for(parent.body)
        if isinstance(parent, cst.If) and parent.test is node:
            return self.code_for(parent.body)
        if isinstance(parent, cst.BooleanOperation) and parent.left is node:
            return self.code_for(parent.right)
        return ""


class CudaDeviceCount(_CudaRuntimeCall):
    """`torch.cuda.device_count()` counts only NVIDIA GPUs.

    Why: on a TPU host it is 0. `torch.accelerator.device_count()` counts the local chips.

    Example:
        n = torch.cuda.device_count()  ->  n = torch.accelerator.device_count()
    """

    code = "G2T105"
    name = "cuda-device-count"
    safety = Safety.SAFE
    message = "`torch.cuda.device_count()` counts only NVIDIA GPUs"
    hint = "use `torch.accelerator.device_count()`"
    cuda_name = "torch.cuda.device_count"
    accel_name = "accelerator.device_count"


class CudaCurrentDevice(_CudaRuntimeCall):
    """`torch.cuda.current_device()` is the CUDA device index.

    Why: it fails without CUDA. `torch.accelerator.current_device_index()` (torch 2.7+) gives
    the index on any accelerator.

    Example:
        i = torch.cuda.current_device()  ->  i = torch.accelerator.current_device_index()
    """

    code = "G2T106"
    name = "cuda-current-device"
    safety = Safety.SAFE
    message = "`torch.cuda.current_device()` fails without CUDA"
    hint = "use `torch.accelerator.current_device_index()`"
    cuda_name = "torch.cuda.current_device"
    accel_name = "accelerator.current_device_index"


class CudaSetDevice(_CudaRuntimeCall):
    """`torch.cuda.set_device(i)` selects a CUDA device.

    Why: it fails without CUDA. `torch.accelerator.set_device_index(i)` does the same on any
    accelerator; as a statement it is guarded by `torch.accelerator.is_available()` so that the
    same file still runs on a CPU-only machine. On a TPU each process owns one chip: the index
    must be that chip's (0).

    Example:
        torch.cuda.set_device(rank)
        ->  if torch.accelerator.is_available(): torch.accelerator.set_device_index(rank)
    """

    code = "G2T107"
    name = "cuda-set-device"
    safety = Safety.SAFE
    message = "`torch.cuda.set_device()` fails without CUDA"
    hint = "use `torch.accelerator.set_device_index()`"
    cuda_name = "torch.cuda.set_device"
    accel_name = "accelerator.set_device_index"
    guard = True


class CudaSynchronize(_CudaRuntimeCall):
    """`torch.cuda.synchronize()` waits for CUDA work.

    Why: it fails without CUDA. `torch.accelerator.synchronize()` waits for any accelerator;
    as a statement it is guarded by `torch.accelerator.is_available()`, because it raises on a
    machine with no accelerator. Inside a training loop it is also a TPU performance hazard
    (G2T6xx).

    Example:
        torch.cuda.synchronize()
        ->  if torch.accelerator.is_available(): torch.accelerator.synchronize()
    """

    code = "G2T108"
    name = "cuda-synchronize"
    safety = Safety.SAFE
    message = "`torch.cuda.synchronize()` fails without CUDA"
    hint = "use `torch.accelerator.synchronize()`"
    cuda_name = "torch.cuda.synchronize"
    accel_name = "accelerator.synchronize"
    guard = True


class TensorIsCuda(Rule):
    """`x.is_cuda` asks whether a tensor lives on an NVIDIA GPU.

    Why: on a TPU it is False for every tensor, so code that means "is it on the accelerator?"
    takes the CPU branch. `x.device.type != "cpu"` asks that question on any backend.

    Example:
        if x.is_cuda:  ->  if x.device.type != "cpu":
    """

    code = "G2T109"
    name = "tensor-is-cuda"
    safety = Safety.SAFE
    message = "`.is_cuda` is False on TPUs; ask whether the tensor is on an accelerator"
    hint = 'use `x.device.type != "cpu"`'
    tokens = (b"is_cuda",)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "is_cuda" or is_store(self.ctx, node):
            return  # `self.is_cuda = ...` sets an attribute of the user's own
        if defines_attribute(self.ctx, "is_cuda"):
            self.report(
                node,
                hint="this module gives objects an `is_cuda` of its own: check whether this "
                "one is a tensor's, and use `x.device.type == \"cuda\"` or the module's device",
            )
            return
        parent = self.parent(node)
        wrap = isinstance(
            parent,
            cst.Comparison
            | cst.ComparisonTarget
            | cst.BinaryOperation
            | cst.Attribute
            | cst.Subscript,
        )
        wrap = wrap or (isinstance(parent, cst.Call) and parent.func is node)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Attribute)
            device_type = cst.Attribute(
                value=cst.Attribute(value=updated.value, attr=cst.Name("device")),
                attr=cst.Name("type"),
            )
            expr = cst.Comparison(
                left=device_type,
                comparisons=[cst.ComparisonTarget(cst.NotEqual(), cst.SimpleString('"cpu"'))],
            )
            if wrap or updated.lpar:
                expr = expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return expr

        self.report(node, fix=fix)


class CudaDeviceContext(_CudaRuntimeCall):
    """`with torch.cuda.device(i):` selects a CUDA device for a block.

    Why: it fails without CUDA. `torch.accelerator.device_index(i)` (torch 2.8+) does the same
    on any accelerator.

    Example:
        with torch.cuda.device(1):  ->  with torch.accelerator.device_index(1):
    """

    code = "G2T110"
    name = "cuda-device-context"
    safety = Safety.SAFE
    message = "`torch.cuda.device(...)` fails without CUDA"
    hint = "use `torch.accelerator.device_index(...)` (torch 2.8+)"
    cuda_name = "torch.cuda.device"
    accel_name = "accelerator.device_index"
    min_torch = "2.8"


class CudaDeviceComparison(Rule):
    """A comparison with the string `'cuda'`: `x.device.type == 'cuda'`, `'cuda' in device`.

    Why: whether the code means "is this CUDA?" or "is this an accelerator?" is a decision the
    codemod cannot make; on a TPU the comparison is simply False.

    Example:
        if x.device.type == "cuda":  # decide: `!= "cpu"` (any accelerator) or keep (CUDA only)
    """

    code = "G2T111"
    name = "cuda-device-comparison"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "comparison with `{value}`: on a TPU it is always False"
    hint = 'compare with `"cpu"` (any accelerator) or with `device.type`, whichever is meant'

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(t.comparator for t in node.comparisons)]
        ops = [t.operator for t in node.comparisons]
        if not any(
            isinstance(o, cst.Equal | cst.NotEqual | cst.In | cst.NotIn | cst.Is | cst.IsNot)
            for o in ops
        ):
            return
        for operand in operands:
            if cuda_literal(operand):
                self.report(node, self.message.format(value=self.code_for(operand)))
                return


class PinMemory(Rule):
    """`x.pin_memory()` pins host memory for copies to an accelerator.

    Why: on a machine with no accelerator (and on a CUDA build of torch without a GPU) the call
    raises. Guarded by `torch.accelerator.is_available()` it pins where pinning helps and
    passes the tensor through elsewhere. Only a plain name or attribute is guarded (it is read
    twice); anything else is reported. `DataLoader(pin_memory=True)` only warns, and is kept.

    Example:
        batch = batch.pin_memory()
        ->  batch = batch.pin_memory() if torch.accelerator.is_available() else batch
    """

    code = "G2T112"
    name = "pin-memory"
    safety = Safety.SAFE
    message = "`.pin_memory()` raises where no accelerator is present"
    hint = "guard it: `x.pin_memory() if torch.accelerator.is_available() else x`"
    tokens = (b"pin_memory()",)

    def visit_Call(self, node: cst.Call) -> None:
        if not is_call_to_attr(node, "pin_memory") or node.args:
            return
        parent = self.parent(node)
        if isinstance(parent, cst.IfExp) and parent.body is node or self._guarded(node):
            return  # already guarded
        receiver = node.func.value  # type: ignore[attr-defined]
        if not isinstance(receiver, cst.Name | cst.Attribute):
            self.report(node)
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
            test = cst.Call(func=ctx.torch_attr("accelerator.is_available"))
            expr = cst.IfExp(test=test, body=updated, orelse=updated.func.value)
            if isinstance(parent, cst.Arg | cst.Assign | cst.Return | cst.Expr):
                return expr
            return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

        self.report(node, fix=fix)

    def _guarded(self, node: cst.CSTNode) -> bool:
        """Inside `if device_type == "cuda":` or `if torch.accelerator.is_available():`."""
        current: cst.CSTNode | None = node
        while current is not None:
            current = self.parent(current)
            if isinstance(current, cst.If):
                test = self.code_for(current.test)
                if "cuda" in test or "is_available" in test or "pin" in test:
                    return True
        return False
