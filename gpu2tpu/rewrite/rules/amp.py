"""G2T2xx: precision and AMP. Mixed precision spelled for CUDA, and float16 where TPUs want bf16.

TPUs compute in bfloat16: it has float32's exponent range, so no loss scaling is needed, and
it is the MXU's native input format, and TorchTPU's default autocast dtype (`_autocast_dtype`
in its device module, torch_tpu 0.2.0). CUDA's default is float16, so an autocast without
`dtype=` computes in float16 on CUDA and in bfloat16 on a TPU: the same code, two numerics.
The safe rules here only make AMP device-agnostic; the switch to bfloat16 is an unsafe fix
(`--unsafe-fixes`) because it changes numerics on CUDA.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import ClassVar

import libcst as cst

from ..analysis.branches import device_branch
from ..analysis.edits import (
    append_arg,
    as_keyword,
    drop_imported_names,
    find_arg,
    insert_arg,
    keyword,
    prepend_arg,
)
from ..analysis.literals import attribute_named, cuda_literal, is_false, is_name, string_value
from ..analysis.names import full_name, is_reference_end, matches, qualified
from ..core.model import Safety, Severity
from .base import Fix, Rule, RuleContext

CUDA_AUTOCAST = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
CUDA_SCALER = ("torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")
SCALER = ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler")
FLOAT16 = ("torch.float16", "torch.half")
# Legacy typed tensors of float16 (G2T314 rewrites the CUDA ones into `dtype=torch.float16`).
LEGACY_HALF = ("torch.cuda.HalfTensor", "torch.HalfTensor")
BFLOAT16 = ("torch.bfloat16",)

# Functions whose first positional parameter is a device *type* string.
DEVICE_TYPE_FIRST = (
    *AUTOCAST,
    *SCALER,
    "torch.get_autocast_dtype",
    "torch.set_autocast_dtype",
    "torch.is_autocast_enabled",
    "torch.set_autocast_enabled",
    "torch.amp.is_autocast_available",
    "torch.get_device_module",
)

DTYPE_NOTE = (
    "without `dtype=` autocast takes the device's default: float16 on CUDA, bfloat16 on "
    "TorchTPU and the CPU; pass `dtype=` to compute alike everywhere (G2T203 sets bfloat16 "
    "with --unsafe-fixes)"
)
NUMERICS_NOTE = (
    "bfloat16 keeps float32's range (no overflow, no loss scaling) but has 8 bits of precision "
    "against float16's 11; it is the TPU's native format"
)


class _CudaAmpName(Rule):
    """Shared shape of the rules for a `torch.cuda.amp` name.

    They rewrite calls (and, in subclasses, other references) and, once every use of a name
    imported with `from torch.cuda.amp import ...` has been rewritten, drop it from the import.
    Their tokens include the bare name: a statement that only says `autocast()` must still be
    visited.
    """

    api: ClassVar[tuple[str, ...]] = ()
    imported_names: ClassVar[frozenset[str]] = frozenset()
    tokens: ClassVar[tuple[bytes, ...]] = (b"cuda.amp", b"import amp")

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.amp_imports: list[cst.ImportFrom] = []
        self.fixed_references: Counter[str] = Counter()

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        if full_name(node.module) == "torch.cuda.amp":
            self.amp_imports.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        if matches(self.ctx, node, *self.api):
            self.fix_call(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> None:
        if not matches(self.ctx, node, *self.api) or not is_reference_end(self.ctx, node):
            return
        parent = self.parent(node)
        if not (isinstance(parent, cst.Call) and parent.func is node):
            self.fix_reference(node)

    def fix_call(self, node: cst.Call) -> None:
        raise NotImplementedError

    def fix_reference(self, node: cst.Name | cst.Attribute) -> None:
        """A use that is not a call: nothing to rewrite mechanically."""
        self.report(node, hint=f"{self.hint}, by hand: the name is used without a call here")

    def fixed(self, reference: cst.CSTNode) -> None:
        if isinstance(reference, cst.Name):
            self.fixed_references[reference.value] += 1

    def leave_Module(self, original_node: cst.Module) -> None:
        for imp in self.amp_imports:
            removable = self._removable_names(imp)
            if removable:
                self.ctx.add_fix(imp, drop_imported_names(removable))

    def _removable_names(self, imp: cst.ImportFrom) -> frozenset[str]:
        """Imported names whose every use in the text was rewritten.

        Uses are counted in the text (the name standing alone, not after a dot) rather than
        through libcst's scope analysis, which costs several parses: a mention in a comment, a
        string or another scope only makes the count larger, and then the import stays.
        """
        if isinstance(imp.names, cst.ImportStar):
            return frozenset()
        statement = self.code_for(imp)
        removable: set[str] = set()
        for alias in imp.names:
            if alias.evaluated_name not in self.imported_names:
                continue
            local = alias.evaluated_alias or alias.evaluated_name
            word = re.compile(rf"(?<![\w.]){re.escape(local)}(?!\w)")
            uses = len(word.findall(self.ctx.source)) - len(word.findall(statement))
            if uses and uses == self.fixed_references[local]:
                removable.add(local)
        return frozenset(removable)


class CudaAmpAutocast(_CudaAmpName):
    """`torch.cuda.amp.autocast(...)`, as a context manager, a decorator or a call.

    Why: `torch.cuda.amp.autocast` only knows CUDA (and is deprecated since torch 2.4);
    `torch.amp.autocast(device_type=...)` with the module's device type runs on any backend.
    Positional arguments become keywords, because the two signatures differ. The dtype is
    kept as given; without `dtype=`, autocast takes the device's default, which is float16 on
    CUDA (unchanged), and bfloat16 on TorchTPU and on the CPU. To compute alike everywhere,
    G2T203 adds `dtype=torch.bfloat16` with `--unsafe-fixes`. A name imported with `from torch.cuda.amp import autocast` is
    dropped from the import once every use is rewritten.

    Example:
        with torch.cuda.amp.autocast():        ->  with torch.amp.autocast(device_type=device.type):
        @autocast(dtype=torch.bfloat16)        ->  @torch.amp.autocast(device_type=device.type, dtype=torch.bfloat16)
        torch.cuda.amp.autocast(False)         ->  torch.amp.autocast(device_type=device.type, enabled=False)
    """

    code = "G2T201"
    name = "cuda-amp-autocast"
    safety = Safety.SAFE
    message = "`{call}` is CUDA autocast only; use `torch.amp.autocast(device_type=...)`"
    hint = "use `torch.amp.autocast(device_type=device.type, ...)`"
    api = CUDA_AUTOCAST
    imported_names = frozenset({"autocast"})
    tokens = (b"cuda.amp", b"import amp", b"autocast")
    PARAMETERS = ("enabled", "dtype", "cache_enabled")

    def fix_call(self, node: cst.Call) -> None:
        if any(a.star for a in node.args):
            self.report(node, hint=f"{self.hint}, by hand: the call unpacks its arguments")
            return
        ctx = self.ctx
        params = self.PARAMETERS

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            args: list[cst.Arg] = []
            index = 0
            for arg in updated.args:
                if arg.keyword is None and index < len(params):
                    arg = as_keyword(arg, params[index])
                    index += 1
                args.append(arg)
            device_type = keyword("device_type", ctx.device_type())
            return updated.with_changes(
                func=ctx.torch_attr("amp.autocast"), args=prepend_arg(args, device_type)
            )

        has_dtype = find_arg(node, "dtype", 1) is not None
        hint = self.hint if has_dtype else f"{self.hint}; {DTYPE_NOTE}"
        if self.report(node, fix=fix, hint=hint, uses_device=True):
            self.fixed(node.func)


class AutocastCudaDeviceType(Rule):
    """The device type string `'cuda'` given to autocast, GradScaler and their kin.

    Why: `torch.autocast("cuda")`, `torch.amp.autocast(device_type="cuda")` and
    `torch.amp.GradScaler("cuda")` name NVIDIA GPUs; on a TPU autocast is then disabled with a
    warning and the model runs in float32. The module's device type names whatever
    accelerator the process has. Covered: a `device_type=` argument of any call, and the
    first argument of autocast, GradScaler, `torch.get_autocast_dtype` and friends.

    Autocast through a name the code assigns it to (`precision_scope = autocast`, or `autocast
    if precision == "autocast" else nullcontext`, then `with precision_scope("cuda"):`) counts
    too: `nullcontext` takes the device type as the value it gives, and ignores it.

    Example:
        with torch.autocast("cuda", dtype=torch.bfloat16):
        ->  with torch.autocast(device.type, dtype=torch.bfloat16):
        scaler = torch.amp.GradScaler("cuda")  ->  scaler = torch.amp.GradScaler(device.type)
        precision_scope = autocast; with precision_scope("cuda"):  ->  precision_scope(device.type)
    """

    code = "G2T202"
    compat_torch = "0.4"
    name = "autocast-cuda-device-type"
    safety = Safety.SAFE
    message = "device type {value} names NVIDIA GPUs; use the module's device type"
    hint = "use `device.type`"
    uses_flow = True  # an alias of autocast is followed to its assignment

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        # `alias("cuda")`: decided once the alias's assignments are known (flow).
        self.aliased: list[tuple[cst.Call, cst.Name, cst.BaseExpression]] = []

    def visit_Call(self, node: cst.Call) -> None:
        literal: cst.BaseExpression | None = None
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "device_type":
                literal = arg.value
        first = node.args[0] if node.args else None
        if literal is None and first is not None and first.keyword is None and not first.star:
            if matches(self.ctx, node, *DEVICE_TYPE_FIRST):
                literal = first.value
            elif isinstance(node.func, cst.Name) and cuda_literal(first.value):
                self.aliased.append((node, node.func, first.value))
                return
        if literal is None or not cuda_literal(literal):
            return
        self._fix(node, literal)

    def leave_Module(self, original_node: cst.Module) -> None:
        flow = self.ctx.flow
        for node, name, literal in self.aliased:
            if any(self._autocast(v) for v in flow.assigned_values(name)):
                self._fix(node, literal)

    def _autocast(self, value: cst.CSTNode) -> bool:
        """Whether an alias's value is autocast: `autocast`, `torch.autocast`, or one branch of
        a conditional expression (`autocast if ... else nullcontext`)."""
        if isinstance(value, cst.IfExp):
            return self._autocast(value.body) or self._autocast(value.orelse)
        if isinstance(value, cst.Name) and self.ctx.names.module_binding(value.value) in AUTOCAST:
            return True
        return isinstance(value, cst.Name | cst.Attribute) and bool(
            matches(self.ctx, value, *AUTOCAST)
        )

    def _fix(self, node: cst.Call, literal: cst.BaseExpression) -> None:
        hint = self.hint
        if matches(self.ctx, node, *AUTOCAST) and find_arg(node, "dtype", 1) is None:
            hint = f"{hint}; {DTYPE_NOTE}"
        self.report(
            literal,
            self.message.format(value=f"`{self.code_for(literal)}`"),
            fix=lambda updated: self.ctx.device_type(),
            hint=hint,
            uses_device=True,
        )


class AutocastGpuDtype(Rule):
    """`torch.get_autocast_gpu_dtype()`: CUDA's autocast dtype, asked on every device.

    Why: code that keeps the autocast it runs under (a checkpoint that re-enters autocast for
    the backward pass, a decorator that wraps a function in the current autocast) reads the
    dtype with `torch.get_autocast_gpu_dtype()`, which is CUDA's, whatever device computes.
    Once the autocast itself is device-agnostic (G2T201), that carries CUDA's dtype (float16
    by default) to a TPU or the CPU, whose own autocast dtype the enclosing autocast set.
    `torch.get_autocast_dtype(device.type)` is the same call on CUDA (it is CUDA's dtype
    there) and the current device's elsewhere; `torch.set_autocast_gpu_dtype(d)` likewise
    becomes `torch.set_autocast_dtype(device.type, d)`. Code for CUDA only (`if x.device.type
    == "cuda":`) is left alone.

    Example:
        with torch.cuda.amp.autocast(dtype=torch.get_autocast_gpu_dtype()):
        ->  with torch.amp.autocast(device_type=device.type, dtype=torch.get_autocast_dtype(device.type)):
    """

    code = "G2T214"
    name = "autocast-gpu-dtype"
    safety = Safety.SAFE
    message = "`{call}` is CUDA's autocast dtype; on another device autocast computes in its own"
    hint = "use `torch.get_autocast_dtype(device.type)` (CUDA's dtype on CUDA)"
    tokens = (b"autocast_gpu_dtype",)
    CALLS: ClassVar[dict[str, str]] = {
        "torch.get_autocast_gpu_dtype": "get_autocast_dtype",
        "torch.set_autocast_gpu_dtype": "set_autocast_dtype",
    }

    def visit_Call(self, node: cst.Call) -> None:
        name = matches(self.ctx, node, *self.CALLS)
        if name is None or device_branch(self.ctx, node, actual=True) == "cuda":
            return
        if any(a.star or a.keyword is not None for a in node.args):
            self.report(node, hint=f"{self.hint}, by hand: arguments it cannot carry over")
            return
        ctx = self.ctx
        generic = self.CALLS[name]

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return updated.with_changes(
                func=ctx.torch_attr(generic),
                args=prepend_arg(list(updated.args), cst.Arg(ctx.device_type())),
            )

        self.report(node, fix=fix, uses_device=True)


def autocast_dtype(rule: Rule, call: cst.Call) -> cst.BaseExpression | None:
    """The `dtype` argument of an autocast call, in either signature."""
    position = 1  # torch.autocast(device_type, dtype, ...) and cuda.amp.autocast(enabled, dtype)
    arg = find_arg(call, "dtype", position)
    return arg.value if arg is not None else None


def autocast_disabled(call: cst.Call, cuda_signature: bool) -> bool:
    arg = find_arg(call, "enabled", 0 if cuda_signature else 2)
    return arg is not None and is_false(arg.value)


def autocast_on_cpu(call: cst.Call) -> bool:
    """`torch.autocast("cpu")`: its default dtype is already bfloat16."""
    arg = find_arg(call, "device_type", 0)
    return arg is not None and string_value(arg.value) == "cpu"


def float16_fix(rule: Rule, fix: Fix) -> tuple[Fix | None, str]:
    """The fix of a float16 -> bfloat16 rule, and its hint: no fix when the module also tests
    for float16 (`if x.dtype == torch.float16:`), since the switch must change every related
    test with it or none of them."""
    lines = rule.ctx.float16_tests()
    if not lines:
        return fix, rule.hint
    where = ", ".join(str(n) for n in lines[:3])
    return None, (
        f"{rule.hint}; not changed: the module tests for float16 (line {where}), so the "
        "switch to bfloat16 changes those tests too or nothing: decide together, by hand"
    )


class AutocastWithoutDtype(Rule):
    """An autocast with no `dtype=`, which takes the device's default dtype.

    Why: the default is float16 on CUDA but bfloat16 on TorchTPU (its device module sets
    `_autocast_dtype = torch.bfloat16`, torch_tpu 0.2.0) and on the CPU, so the same code
    computes with different numerics on the GPU and on the TPU, and a GradScaler tuned for
    float16 runs beside bfloat16. The fix passes `dtype=torch.bfloat16`, the TPU's native
    format, so every device computes alike. It is unsafe because on CUDA it changes
    numerics (bfloat16 has float32's range but 8 bits of precision against float16's 11) and
    needs an Ampere or newer GPU. CPU autocast already defaults to bfloat16 and is left alone.

    Example:
        with torch.amp.autocast(device_type=device.type):
        ->  with torch.amp.autocast(device_type=device.type, dtype=torch.bfloat16):
    """

    code = "G2T203"
    name = "autocast-without-dtype"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = (
        "autocast without `dtype=` uses the device's default: float16 on CUDA, bfloat16 on "
        "TorchTPU and the CPU; the GPU and the TPU compute differently"
    )
    hint = f"pass `dtype=torch.bfloat16`; {NUMERICS_NOTE}"
    tokens = (b"autocast",)

    def visit_Call(self, node: cst.Call) -> None:
        cuda_signature = bool(matches(self.ctx, node, *CUDA_AUTOCAST))
        if not cuda_signature and not matches(self.ctx, node, *AUTOCAST):
            return
        if any(a.star for a in node.args) or autocast_dtype(self, node) is not None:
            return
        if autocast_disabled(node, cuda_signature) or autocast_on_cpu(node):
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            dtype = keyword("dtype", ctx.torch_attr("bfloat16"))
            return updated.with_changes(args=append_arg(updated.args, dtype))

        consistent, hint = float16_fix(self, fix)
        self.report(node, fix=consistent, hint=hint)


class CudaAmpGradScaler(_CudaAmpName):
    """`torch.cuda.amp.GradScaler(...)` scales losses for float16 training on CUDA.

    Why: the CUDA spelling is deprecated since torch 2.4 and disables itself, with a warning,
    on any other device. `torch.amp.GradScaler(device.type, ...)` (torch 2.3+) scales on the
    module's device; the other arguments keep their positions. With bfloat16 autocast, the
    TPU format, no loss scaling is needed: see G2T205.

    Example:
        scaler = torch.cuda.amp.GradScaler()       ->  scaler = torch.amp.GradScaler(device.type)
        GradScaler(init_scale=1024)                ->  torch.amp.GradScaler(device.type, init_scale=1024)
    """

    code = "G2T204"
    name = "cuda-amp-grad-scaler"
    safety = Safety.SAFE
    message = "`{call}` is CUDA-only; use `torch.amp.GradScaler(device.type)`"
    hint = "use `torch.amp.GradScaler(device.type, ...)`"
    api = CUDA_SCALER
    imported_names = frozenset({"GradScaler"})
    tokens = (b"cuda.amp", b"import amp", b"GradScaler")

    def fix_call(self, node: cst.Call) -> None:
        if any(a.star for a in node.args):
            self.report(node, hint=f"{self.hint}, by hand: the call unpacks its arguments")
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            device = cst.Arg(ctx.device_type())
            return updated.with_changes(
                func=ctx.torch_attr("amp.GradScaler"), args=prepend_arg(updated.args, device)
            )

        if self.report(node, fix=fix, uses_device=True):
            self.fixed(node.func)


class GradScalerWithBfloat16(Rule):
    """A GradScaler in a module whose autocast computes in bfloat16.

    Why: loss scaling exists for float16, whose range is too narrow for small gradients.
    bfloat16 has float32's range, so the scaler only costs time; on a TPU its inf check also
    forces a host sync every step. Removing the `scale`/`unscale_`/`step`/`update` plumbing is
    a control-flow edit left to a person; `enabled=False` is the one-word alternative. The
    autocast counts as bfloat16 when it says so, when it runs on the CPU without a dtype, or
    when this run's unsafe fixes make it bfloat16 (G2T203, G2T212).

    Example:
        with torch.autocast(device.type, dtype=torch.bfloat16): ...
        scaler = torch.amp.GradScaler(device.type)  # -> GradScaler(device.type, enabled=False)
    """

    code = "G2T205"
    name = "grad-scaler-with-bfloat16"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "GradScaler with bfloat16 autocast: loss scaling is only needed for float16"
    hint = "pass `enabled=False` or remove the scale/unscale_/step/update plumbing"
    tokens = (b"GradScaler",)

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.scalers: list[cst.Call] = []
        self.bfloat16 = False

    def visit_Call(self, node: cst.Call) -> None:
        if matches(self.ctx, node, *CUDA_SCALER, *SCALER):
            enabled = find_arg(node, "enabled", None)
            if enabled is None or not is_false(enabled.value):
                self.scalers.append(node)
            return
        cuda_signature = bool(matches(self.ctx, node, *CUDA_AUTOCAST))
        if not cuda_signature and not matches(self.ctx, node, *AUTOCAST):
            return
        if autocast_disabled(node, cuda_signature):
            return
        self.bfloat16 = self.bfloat16 or self._computes_in_bfloat16(node)

    def _computes_in_bfloat16(self, call: cst.Call) -> bool:
        dtype = autocast_dtype(self, call)
        ctx = self.ctx
        if dtype is None:
            if autocast_on_cpu(call):
                return True
            return ctx.fix_active(AutocastWithoutDtype)
        if matches(self.ctx, dtype, *BFLOAT16):
            return True
        if matches(self.ctx, dtype, *FLOAT16):
            return ctx.fix_active(Float16Dtype)
        return False

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.bfloat16:
            for scaler in self.scalers:
                self.report(scaler)


class CudaAmpCustomFwdBwd(_CudaAmpName):
    """`@torch.cuda.amp.custom_fwd` / `custom_bwd` on a custom autograd Function.

    Why: the CUDA spelling is deprecated since torch 2.4 and only knows CUDA autocast.
    `torch.amp.custom_fwd(device_type=...)` / `custom_bwd(device_type=...)` (torch 2.4+) take the
    device type as a keyword; a bare decorator becomes a call.

    Example:
        @torch.cuda.amp.custom_fwd                 ->  @torch.amp.custom_fwd(device_type=device.type)
        @custom_fwd(cast_inputs=torch.float32)     ->  @torch.amp.custom_fwd(device_type=device.type, cast_inputs=torch.float32)
        @torch.cuda.amp.custom_bwd                 ->  @torch.amp.custom_bwd(device_type=device.type)
    """

    code = "G2T206"
    name = "cuda-amp-custom-fwd-bwd"
    safety = Safety.SAFE
    message = "`torch.cuda.amp.{func}` is CUDA-only; use `torch.amp.{func}(device_type=...)`"
    hint = "use `torch.amp.custom_fwd(device_type=device.type)` (custom_bwd likewise)"
    api = (
        "torch.cuda.amp.custom_fwd",
        "torch.cuda.amp.custom_bwd",
        "torch.cuda.amp.autocast_mode.custom_fwd",
        "torch.cuda.amp.autocast_mode.custom_bwd",
    )
    imported_names = frozenset({"custom_fwd", "custom_bwd"})
    tokens = (b"custom_fwd", b"custom_bwd")

    def _func(self, node: cst.CSTNode) -> str:
        name = matches(self.ctx, node, *self.api) or ""
        return name.rsplit(".", 1)[-1]

    def fix_call(self, node: cst.Call) -> None:
        func = self._func(node)
        if any(a.star for a in node.args):
            self.report(node, self.message.format(func=func))
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            positional = sum(1 for a in updated.args if a.keyword is None)
            device_type = keyword("device_type", ctx.device_type())
            args = insert_arg(updated.args, positional, device_type)
            return updated.with_changes(func=ctx.torch_attr(f"amp.{func}"), args=args)

        if self.report(node, self.message.format(func=func), fix=fix, uses_device=True):
            self.fixed(node.func)

    def fix_reference(self, node: cst.Name | cst.Attribute) -> None:
        func = self._func(node)
        message = self.message.format(func=func)
        if not isinstance(self.parent(node), cst.Decorator):
            self.report(
                node, message, hint=f"{self.hint}, by hand: the name is used without a call"
            )
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            device_type = keyword("device_type", ctx.device_type())
            return cst.Call(func=ctx.torch_attr(f"amp.{func}"), args=[device_type])

        if self.report(node, message, fix=fix, uses_device=True):
            self.fixed(node)


def assigned_flag(rule: Rule, node: cst.Assign, *qualified: str) -> str | None:
    """For `<flag> = value` with a single target, the flag's qualified name."""
    if len(node.targets) != 1:
        return None
    target = node.targets[0].target
    if not isinstance(target, cst.Attribute):
        return None
    return matches(rule.ctx, target, *qualified)


def matmul_precision_call(ctx: RuleContext, value: cst.BaseExpression) -> cst.Expr:
    """`torch.set_float32_matmul_precision(...)` for an `allow_tf32 = value` assignment."""
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        precision: cst.BaseExpression = cst.SimpleString(
            '"high"' if value.value == "True" else '"highest"'
        )
    else:
        precision = cst.IfExp(
            test=value, body=cst.SimpleString('"high"'), orelse=cst.SimpleString('"highest"')
        )
    call = cst.Call(func=ctx.torch_attr("set_float32_matmul_precision"), args=[cst.Arg(precision)])
    return cst.Expr(call)


class _AllowTf32(Rule):
    """Shared shape of the two `allow_tf32 = ...` rules."""

    flag: ClassVar[str] = ""
    tokens = (b"allow_tf32",)

    def visit_Assign(self, node: cst.Assign) -> None:
        if not assigned_flag(self, node, self.flag):
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Assign)
            return matmul_precision_call(ctx, updated.value)

        self.report(node, fix=fix)


class CudaMatmulAllowTf32(_AllowTf32):
    """`torch.backends.cuda.matmul.allow_tf32 = ...` lets CUDA matmuls run in TF32.

    Why: the flag only speaks to cuBLAS. `torch.set_float32_matmul_precision("high")` is the
    device-agnostic way to say that float32 matmuls may trade precision for speed, and on
    CUDA the same switch. The fix is unsafe: it also lets oneDNN run the CPU's float32
    matmuls in lower precision (`torch.backends.mkldnn.matmul.fp32_precision` becomes
    `"tf32"`; the CUDA flag leaves it alone), so CPU results change, on a CUDA machine too.
    On a TPU, float32 matmuls already run as bfloat16 passes with float32 accumulation; for
    full float32 fidelity TorchTPU has `torch.tpu.precision(...)`.

    Example:
        torch.backends.cuda.matmul.allow_tf32 = True   ->  torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = False  ->  torch.set_float32_matmul_precision("highest")
    """

    code = "G2T207"
    name = "cuda-matmul-allow-tf32"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = "`torch.backends.cuda.matmul.allow_tf32` only speaks to CUDA"
    hint = 'use `torch.set_float32_matmul_precision("high")` (it also lowers the CPU\'s float32 matmul precision); TPU float32 matmuls default to bfloat16 passes'
    flag = "torch.backends.cuda.matmul.allow_tf32"


class CudnnAllowTf32(_AllowTf32):
    """`torch.backends.cudnn.allow_tf32 = ...` lets cuDNN convolutions run in TF32.

    Why: the flag does nothing off CUDA. Its intent, float32 work that may trade precision for
    speed, is `torch.set_float32_matmul_precision` on other backends. The fix is unsafe: on
    CUDA it switches TF32 matmuls (not convolutions) on or off, and cuDNN's own flag
    (default True) is no longer set.

    Example:
        torch.backends.cudnn.allow_tf32 = True   ->  torch.set_float32_matmul_precision("high")
    """

    code = "G2T208"
    name = "cudnn-allow-tf32"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = "`torch.backends.cudnn.allow_tf32` only tunes cuDNN convolutions"
    hint = 'use `torch.set_float32_matmul_precision("high")` (on CUDA it governs matmuls, not convolutions)'
    flag = "torch.backends.cudnn.allow_tf32"


class CudnnBenchmark(Rule):
    """`torch.backends.cudnn.benchmark = ...` lets cuDNN time convolution kernels.

    Why: it is harmless to keep, and it only matters on CUDA: on a TPU, XLA picks the kernels
    when it compiles the graph, and nothing reads the flag. Reported so that nothing
    CUDA-specific passes silently; no change is needed.

    Example:
        torch.backends.cudnn.benchmark = True  # keep: a no-op off CUDA
    """

    code = "G2T209"
    name = "cudnn-benchmark"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`torch.backends.cudnn.benchmark` only tunes cuDNN; it does nothing on a TPU"
    hint = "keep it (harmless off CUDA); XLA chooses TPU kernels when it compiles"
    tokens = (b"cudnn",)

    def visit_Assign(self, node: cst.Assign) -> None:
        if assigned_flag(self, node, "torch.backends.cudnn.benchmark"):
            self.report(node)


class CudnnDeterministic(Rule):
    """`torch.backends.cudnn.deterministic = True` asks cuDNN for deterministic kernels.

    Why: it only speaks to cuDNN. `torch.use_deterministic_algorithms(True)` covers every
    backend, but it is stricter: it raises on ops without a deterministic implementation, and
    on CUDA it needs `CUBLAS_WORKSPACE_CONFIG=:4096:8`. Which one is wanted is a person's call.

    Example:
        torch.backends.cudnn.deterministic = True  # -> torch.use_deterministic_algorithms(True)
    """

    code = "G2T210"
    name = "cudnn-deterministic"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`torch.backends.cudnn.deterministic` only speaks to cuDNN"
    hint = (
        "use `torch.use_deterministic_algorithms(True)` (raises on nondeterministic ops; "
        "CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8)"
    )
    tokens = (b"cudnn",)

    def visit_Assign(self, node: cst.Assign) -> None:
        if assigned_flag(self, node, "torch.backends.cudnn.deterministic"):
            self.report(node)


class HalfMethod(Rule):
    """`.half()` casts a tensor or module to float16.

    Why: float16 is not the TPU's native format; bfloat16 is. The fix, `.bfloat16()`, is
    unsafe because it changes numerics: bfloat16 keeps float32's range (no overflow, no loss
    scaling) but has 8 bits of precision against float16's 11.

    Example:
        model.half()  ->  model.bfloat16()
    """

    code = "G2T211"
    name = "half-method"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = "`.half()` casts to float16; TPUs compute in bfloat16"
    hint = f"use `.bfloat16()`; {NUMERICS_NOTE}"
    tokens = (b".half(",)

    def visit_Call(self, node: cst.Call) -> None:
        if node.args or not attribute_named(node.func, "half"):
            return
        value = node.func.value  # type: ignore[attr-defined]  # func is an Attribute, matched above
        if isinstance(value, cst.Name | cst.Attribute) and qualified(self.ctx, value):
            return  # `<module>.half()` is not the tensor method

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("bfloat16")))

        consistent, hint = float16_fix(self, fix)
        self.report(node, fix=consistent, hint=hint)


# String spellings of float16 that libraries take, and their bfloat16 counterparts.
FLOAT16_STRINGS = {
    "torch_dtype": {"float16": "bfloat16", "half": "bfloat16", "fp16": "bf16"},
    "dtype": {"float16": "bfloat16", "half": "bfloat16"},
    "mixed_precision": {"fp16": "bf16"},
    "precision": {"16-mixed": "bf16-mixed", "16": "bf16-mixed"},
}


# Calls that describe a dtype instead of computing in it.
DESCRIBES = ("torch.finfo", "torch.iinfo")


def _in_comparison(rule: Rule, node: cst.CSTNode) -> bool:
    parent = rule.parent(node)
    while isinstance(parent, cst.Element | cst.Tuple | cst.List | cst.Set):
        parent = rule.parent(parent)
    return isinstance(parent, cst.Comparison | cst.ComparisonTarget)


class Float16Dtype(Rule):
    """`torch.float16` / `torch.half` (and `torch_dtype="float16"`) where a dtype is chosen.

    Why: TPUs compute in bfloat16; float16 is not native there. The fix, `torch.bfloat16`, is
    unsafe because it changes numerics: bfloat16 keeps float32's range (no overflow, no loss
    scaling) but has 8 bits of precision against float16's 11. Comparisons such as
    `x.dtype == torch.float16` are reported, not rewritten: what they test is a person's call,
    and while a module has one, none of its float16 is switched (nor `.half()`, G2T211, nor
    autocast's default, G2T203): every related choice changes together, or none does.
    String spellings taken by libraries are covered too: `torch_dtype="float16"`
    (transformers), `mixed_precision="fp16"` (accelerate), `precision="16-mixed"` (Lightning).

    Example:
        x.to(torch.float16)                 ->  x.to(torch.bfloat16)
        from_pretrained(p, torch_dtype=torch.half)  ->  from_pretrained(p, torch_dtype=torch.bfloat16)
        Accelerator(mixed_precision="fp16") ->  Accelerator(mixed_precision="bf16")
    """

    code = "G2T212"
    name = "float16-dtype"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = "float16 `{value}`: TPUs compute in bfloat16"
    hint = f"use bfloat16; {NUMERICS_NOTE}"
    tokens = (b"float16", b".half", b"fp16", b"16-mixed", b"HalfTensor")

    def visit_Name(self, node: cst.Name) -> None:
        self._dtype(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._dtype(node)

    def _dtype(self, node: cst.Name | cst.Attribute) -> None:
        if matches(self.ctx, node, *LEGACY_HALF) and is_reference_end(self.ctx, node):
            self._legacy(node, self.code_for(node))
            return
        if not matches(self.ctx, node, *FLOAT16) or not is_reference_end(self.ctx, node):
            return
        if self._not_a_choice(node):
            return
        message = self.message.format(value=self.code_for(node))
        if _in_comparison(self, node):
            self.report(node, message, hint="decide whether the test should accept bfloat16")
            return
        fix, hint = float16_fix(self, lambda updated: self.ctx.torch_attr("bfloat16"))
        self.report(node, message, fix=fix, hint=hint)

    def _legacy(self, node: cst.CSTNode, name: str) -> None:
        """A legacy half tensor type: G2T314 makes it `dtype=torch.float16` (or leaves it to a
        person), so the float16 is named here already, as the next run would name it."""
        self.report(
            node,
            self.message.format(value=name),
            hint=f"use bfloat16 (`dtype=torch.bfloat16`); {NUMERICS_NOTE}",
        )

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        """`x.type("torch.cuda.HalfTensor")`: the type by its name."""
        if string_value(node) in LEGACY_HALF:
            arg = self.parent(node)
            call = self.parent(arg) if isinstance(arg, cst.Arg) else None
            if isinstance(call, cst.Call) and attribute_named(call.func, "type"):
                self._legacy(node, self.code_for(node))

    def _not_a_choice(self, node: cst.CSTNode) -> bool:
        """Whether the dtype is named, not chosen: a key of a table (`{torch.float16: 312e12}`,
        peak FLOP/s by dtype), something printed or logged (a dtype tutorial's
        `print(torch.float16)`), or what `torch.finfo`/`torch.iinfo` describe."""
        child, parent = node, self.parent(node)
        while parent is not None and not isinstance(parent, cst.BaseStatement):
            if isinstance(parent, cst.DictElement) and parent.key is child:
                return True
            if isinstance(parent, cst.Call) and child is not parent.func:
                if is_name(parent.func, "print") or self.matches_name(parent, *DESCRIBES):
                    return True
            child, parent = parent, self.parent(parent)
        return False

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None or not isinstance(node.value, cst.SimpleString):
            return
        table = FLOAT16_STRINGS.get(node.keyword.value)
        value = string_value(node.value)
        if table is None or not isinstance(value, str) or value not in table:
            return
        quote = node.value.quote
        replacement = cst.SimpleString(f"{node.value.prefix}{quote}{table[value]}{quote}")
        message = self.message.format(value=f"{node.keyword.value}={self.code_for(node.value)}")
        fix, hint = float16_fix(self, lambda updated: replacement)
        self.report(node.value, message, fix=fix, hint=hint)


# Argument classes of the Hugging Face trainers (TRL's configs subclass TrainingArguments).
TRAINING_ARGUMENTS_PACKAGES = ("transformers", "trl", "sentence_transformers", "setfit")


class TrainingArgumentsFloat16(Rule):
    """`TrainingArguments(fp16=True)`: the Hugging Face Trainer's float16 mixed precision.

    Why: `fp16=True` (and `fp16_full_eval=True`) run the Trainer in float16 autocast with a
    loss scaler, a recipe made for CUDA; TPUs compute in bfloat16 and need no loss scaling,
    so `bf16=True` is the TPU's setting (it also runs on Ampere and newer NVIDIA GPUs). The
    switch changes numerics on CUDA, and a value computed at run time (`fp16=args.fp16`,
    `fp16=torch.cuda.is_available()`, which becomes True on a TPU once migrated) may choose
    float16 there: both are a person's call, so this is reported. Calls count when they
    resolve through the module's imports to an argument class of transformers, TRL,
    sentence-transformers or SetFit (`TrainingArguments`, `Seq2SeqTrainingArguments`,
    `SFTConfig`, ...).

    Example:
        args = TrainingArguments("out", fp16=True)  # -> TrainingArguments("out", bf16=True)
    """

    code = "G2T213"
    name = "training-arguments-fp16"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`{call}` asks the Trainer for float16 with loss scaling; TPUs compute in bfloat16"
    hint = f"use `bf16=True` instead; {NUMERICS_NOTE}"
    tokens = (b"fp16",)

    def visit_Call(self, node: cst.Call) -> None:
        fp16 = [
            a
            for a in node.args
            if a.keyword is not None
            and a.keyword.value in ("fp16", "fp16_full_eval")
            and not is_false(a.value)
            and not (isinstance(a.value, cst.Name) and a.value.value == "None")
        ]
        if not fp16 or not self._training_arguments(node):
            return
        for arg in fp16:
            assert arg.keyword is not None
            call = f"{arg.keyword.value}={self.code_for(arg.value)}"
            hint = self.hint
            if not isinstance(arg.value, cst.Name) or arg.value.value != "True":
                hint = (
                    f"{hint}; the value is chosen at run time: make sure it is False on a TPU "
                    "and set `bf16=` there"
                )
            self.report(arg.value, self.message.format(call=call), hint=hint)

    def _training_arguments(self, node: cst.Call) -> bool:
        name = qualified(self.ctx, node)
        if name is None:
            return False
        package, _, last = name.rpartition(".")
        if package.split(".")[0] not in TRAINING_ARGUMENTS_PACKAGES:
            return False
        return last.endswith("TrainingArguments") or (
            package.split(".")[0] == "trl" and last.endswith("Config")
        )
