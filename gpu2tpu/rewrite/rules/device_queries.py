"""G2T1xx: torch.cuda's device queries and the tests built on them.

`torch.cuda.is_available()`, `device_count()`, `current_device()`, `set_device()`,
`synchronize()` and `torch.cuda.device(...)` become their `torch.accelerator` equivalents,
guarded where a CPU-only run would fail; `x.is_cuda` and `x.device.type == "cuda"` are
read as "on the accelerator" where that is what the code means. Placement itself (`.cuda()`,
device strings, the device idiom, defaults) is in devices.py. As there, every fix does on an
NVIDIA GPU exactly what the original did.
"""

from __future__ import annotations

import libcst as cst

from ..analysis.branches import (
    accelerator_known,
    cuda_only_use,
    device_branch,
    guarded_region,
    left_on_cuda,
    other_backend_branch,
    other_path,
)
from ..analysis.defaults import device_type_defaults, fed_names, scaled_later
from ..analysis.edits import (
    as_positional,
    comparison_needs_parentheses,
    cuda_only_choice,
    find_arg,
    guarded_line,
    parenthesized,
    sole_statement,
    unpacks,
)
from ..analysis.literals import (
    attribute_named,
    cuda_literal,
    is_name,
    last_segment,
    literal_index,
    short,
    string_value,
)
from ..analysis.names import defines_attribute, is_store, is_torch_device_call
from ..analysis.ranks import spawn_counts
from ..analysis.values import module_values
from ..core.model import Safety, Severity
from .base import DEVICE_FUNCTIONS, DEVICE_NAMES, Rule, RuleContext

OTHER_PATH_HINT = (
    "keep the test for CUDA if its path needs CUDA; widen it by hand "
    "(`torch.accelerator.is_available()`) if that path runs anywhere"
)
# Operators through which a device count of 0 makes a size of 0 (or a division by 0).
SCALING = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo)
# Calls that skip tests on a condition (pytest, unittest).
SKIP_CALLS = frozenset({"skipif", "skipIf", "skipUnless"})


class _CudaRuntimeCall(Rule):
    """Shared shape of the `torch.cuda.X(device)` -> `torch.accelerator.Y(device)` rules.

    The accelerator functions take the device by position only: a `device=` keyword becomes
    positional, and a call with any other argument is reported. `guard` rules make a
    statement of their own run only where an accelerator is (the call raises elsewhere),
    unless a branch around it has checked already.
    """

    cuda_name: str = ""
    accel_name: str = ""
    guard: bool = False
    takes_device: bool = False
    # The accelerator function takes an int index only (a device or string is reported).
    index_only: bool = False

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(node, self.cuda_name):
            return
        self.rewrite(node)

    def message_for(self, node: cst.Call) -> str:
        return self.message.format(call=self.short(node, 50))

    def rewrite(self, node: cst.Call) -> None:
        message = self.message_for(node)
        device = find_arg(node, "device", 0) if self.takes_device else None
        extra = [a for a in node.args if a is not device]
        if unpacks(node) or extra:
            self.report(node, message, hint=f"{self.hint}, by hand: arguments it does not take")
            return
        if self.index_only and device is not None:
            value = device.value
            if literal_index(value) is None and not is_name(value, "None"):
                self.report(
                    node, message, hint=f"{self.hint} with an int index (it takes no device)"
                )
                return
        ctx = self.ctx
        accel = self.accel_name

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            args = [as_positional(a) for a in updated.args]
            return updated.with_changes(func=ctx.torch_attr(accel), args=args)

        guard_test = self.guard_test(node) if self.guard else None
        stmt = sole_statement(self, node) if guard_test is not None else None
        fixed = self.report(node, message, fix=fix, uses_device=guard_test == "device")
        if stmt is not None and fixed:
            # The guard belongs to the same edit: a noqa comment on the line drops both.
            pending = ctx.last_report()
            on_cuda = guard_test == "device"

            def guard(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.SimpleStatementLine) and len(updated.body) == 1
                test = None
                if on_cuda:
                    test = cst.Comparison(
                        left=ctx.device_type(),
                        comparisons=[cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cuda"'))],
                    )
                return guarded_line(ctx, updated, updated.body[0], test)

            ctx.add_fix(stmt, guard, pending)

    def guard_test(self, node: cst.Call) -> str | None:
        """Which guard the statement needs: "available" (any accelerator), "device" (CUDA
        only, `device.type == "cuda"`), or None when a branch around it has checked."""
        if accelerator_known(self.ctx, node):
            return None
        return "available"


class CudaIsAvailable(_CudaRuntimeCall):
    """`torch.cuda.is_available()` asks only about NVIDIA GPUs.

    Why: on a TPU it is False, so code guarded by it runs on the CPU. `torch.accelerator`
    answers for whatever accelerator is present. A test and what it guards are decided
    together: it is widened only where everything it guards runs on every accelerator once
    this run's fixes are made. It is reported instead where it guards code only CUDA can run
    (Triton kernels, apex, bitsandbytes, FlexAttention, CUDA APIs no rule rewrites, an import
    of GPU kernels such as `from .triton_ops import ...`, a function of the module that uses
    one of those or raises unless its tensor is on CUDA, followed one call deep) or a line
    the rewrite leaves CUDA-only (`torch.cuda.manual_seed_all` without `--unsafe-fixes`),
    also through a variable (`USE_FLEX = ... and torch.cuda.is_available()`, then `if
    USE_FLEX:`), where its `else` is the code's own path for every other device (work that
    names no CPU), and where it states that CUDA is required: an `assert` of it, `if not
    torch.cuda.is_available(): raise ...` (also as a part of the test: `if name == "cuda" and
    not ...: raise`), a test-skip condition (`pytest.mark.skipif(not torch.cuda.
    is_available(), ...)`). In a chain that picks a backend (`if torch.cuda.is_available():
    ... elif torch.backends.mps.is_available(): ... else: cpu`) a pure device choice is
    migrated whole (the accelerator first, which is CUDA or MPS where those are) when the
    CUDA value it sets is one the rewrite replaces too (it reaches a device); any other
    chain is reported: it picks the CPU on a TPU, and widened alone it would pick "cuda" on
    a Mac (`accelerator = "cuda"` handed to Lightning).

    Example:
        if torch.cuda.is_available():  ->  if torch.accelerator.is_available():
        assert torch.cuda.is_available(), "CUDA required"  # reported
        if torch.cuda.is_available(): torch.cuda.manual_seed_all(s)  # reported (G2T307 left)
    """

    code = "G2T104"
    compat_torch = "0.4"
    name = "cuda-is-available"
    safety = Safety.SAFE
    message = "`{call}` asks only about NVIDIA GPUs"
    hint = "use `torch.accelerator.is_available()`"
    cuda_name = "torch.cuda.is_available"
    accel_name = "accelerator.is_available"
    decides_last = True  # what it guards is decided by the other rules first

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.candidates: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.matches_name(node, self.cuda_name):
            self.candidates.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        for node in self.candidates:
            self.decide(node)

    def decide(self, node: cst.Call) -> None:
        ctx = self.ctx
        region, how = guarded_region(ctx, node)
        if how == "assert" or (how == "if" and self._raises_without(node)):
            self.report(
                node,
                "`torch.cuda.is_available()` here requires CUDA",
                hint="if the code that follows runs on any accelerator, use "
                "`torch.accelerator.is_available()`; otherwise keep it",
            )
            return
        if self._skips_tests(node):
            self.report(
                node,
                "`torch.cuda.is_available()` skips tests that require CUDA",
                hint="keep it for tests that need CUDA; a test that runs on any accelerator "
                "can ask `torch.accelerator.is_available()`",
            )
            return
        other = other_backend_branch(ctx, node)
        if other is not None:
            unfixed = self._unfixed_cuda_value(node) if self._device_choice(node) else None
            if self._device_choice(node) and unfixed is None:
                self.rewrite(node)  # the accelerator first: CUDA or MPS where they are
                return
            if unfixed is not None:
                self.report(
                    node,
                    f"`torch.cuda.is_available()` picks CUDA first among backends (`{other}()` "
                    f"follows), and its branch sets `{unfixed}`, which this rewrite does not "
                    "follow to a device: widened, the test would pick CUDA on every "
                    "accelerator (MPS included)",
                    hint="test `torch.accelerator.is_available()` and set the value from "
                    "`torch.accelerator.current_accelerator().type` if it names a torch device; "
                    "keep the chain if it names a library's own accelerator (Lightning's)",
                )
                return
            self.report(
                node,
                f"`torch.cuda.is_available()` picks CUDA first among backends (`{other}()` "
                "follows): on a TPU this code takes the CPU branch",
                hint="test `torch.accelerator.is_available()` first and use "
                "`torch.accelerator.current_accelerator()`; keep the other branches for what "
                "they do differently",
            )
            return
        values = module_values(ctx)
        blocks = values.guarded_by_value(*self.position(node)) if values is not None else []
        left = left_on_cuda(ctx, region, blocks, exclude=node)
        if left is not None:
            # The guard protects code only CUDA has: on a TPU it would now run it and fail.
            self.report(
                node,
                f"`torch.cuda.is_available()` guards {left}, which only CUDA runs",
                hint="keep the test for CUDA; give other devices their own path "
                "(`torch.accelerator.is_available()` for code that runs anywhere)",
            )
            return
        own = other_path(ctx, node)
        if own is not None:
            self.report(
                node,
                "`torch.cuda.is_available()` chooses between CUDA's path and the code's own "
                f"path for every other device (line {self.position(own)[0]}): widened, a "
                "TPU would take CUDA's",
                hint=OTHER_PATH_HINT,
            )
            return
        self.rewrite(node)

    def _raises_without(self, node: cst.Call) -> bool:
        """`if not torch.cuda.is_available(): raise ...` (also as a part of an `and` test):
        the code states it needs CUDA."""
        parent = self.parent(node)
        if not (isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)):
            return False
        test: cst.CSTNode = parent
        branch = self.parent(test)
        while isinstance(branch, cst.BooleanOperation) and isinstance(branch.operator, cst.And):
            test, branch = branch, self.parent(branch)
        if not (isinstance(branch, cst.If) and branch.test is test):
            return False
        body = branch.body
        lines = body.body if isinstance(body, cst.IndentedBlock) else [body]
        return any(
            isinstance(small, cst.Raise)
            for line in lines
            if isinstance(line, cst.SimpleStatementLine | cst.SimpleStatementSuite)
            for small in line.body
        )

    def _skips_tests(self, node: cst.Call) -> bool:
        """Whether the test is a condition of a test-skip call (`pytest.mark.skipif`,
        `unittest.skipIf`/`skipUnless`): the tests it guards say they need CUDA."""
        current = self.parent(node)
        while current is not None and not isinstance(current, cst.BaseStatement):
            if isinstance(current, cst.Call) and last_segment(current.func) in SKIP_CALLS:
                return True
            current = self.parent(current)
        return False

    def _device_choice(self, node: cst.Call) -> bool:
        """Whether the `if` chain tested by `node` alone only chooses a device: every branch
        assigns a device (a string or `torch.device(...)`) to the same names, and maybe
        prints. Testing the accelerator first then picks what the chain picked on CUDA, MPS
        and the CPU, and the TPU where there is one."""
        branch = self.parent(node)
        if not (isinstance(branch, cst.If) and branch.test is node):
            return False
        targets: set[str] | None = None
        current: cst.CSTNode | None = branch
        while current is not None:
            body = current.body if isinstance(current, cst.If | cst.Else) else None
            if not isinstance(body, cst.IndentedBlock):
                return False
            chosen: set[str] = set()
            for line in body.body:
                if not isinstance(line, cst.SimpleStatementLine):
                    return False
                for small in line.body:
                    if isinstance(small, cst.Assign) and self._device_value(small.value):
                        chosen.update(self.code_for(t.target) for t in small.targets)
                    elif not (
                        isinstance(small, cst.Expr)
                        and isinstance(small.value, cst.Call)
                        and last_segment(small.value.func) in ("print", "info", "warning")
                    ):
                        return False
            if not chosen or (targets is not None and chosen != targets):
                return False
            targets = chosen
            current = current.orelse if isinstance(current, cst.If) else None
        return True

    def _unfixed_cuda_value(self, node: cst.Call) -> str | None:
        """In a device-choice chain tested by `node`, the first assignment of its CUDA branch
        whose CUDA value no fix of this run replaces (`accelerator = "cuda"` handed to
        Lightning, not to torch), for a message; None when every one is replaced."""
        branch = self.parent(node)
        assert isinstance(branch, cst.If) and isinstance(branch.body, cst.IndentedBlock)
        ctx = self.ctx
        covered = {id(p.node) for p in ctx.reports() if p.settled(ctx.options)}
        for line in branch.body.body:
            for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                if not isinstance(small, cst.Assign) or not self._device_value(small.value):
                    continue
                stack: list[cst.CSTNode] = [small.value]
                found = cuda_literal(small.value) or is_torch_device_call(ctx, small.value)
                while stack and found:
                    current = stack.pop()
                    if id(current) in covered:
                        found = False
                    stack.extend(current.children)
                if found:
                    return self.code_for(small).strip()
        return None

    def _device_value(self, value: cst.BaseExpression) -> bool:
        if is_torch_device_call(self.ctx, value):
            args = value.args  # type: ignore[attr-defined]  # a Call: is_torch_device_call said so
            return len(args) == 1 and string_value(args[0].value) is not None
        return string_value(value) is not None


class CudaDeviceCount(_CudaRuntimeCall):
    """`torch.cuda.device_count()` counts only NVIDIA GPUs.

    Why: on a TPU host it is 0. `torch.accelerator.device_count()` counts the local chips.
    Where the count is how many processes `torch.multiprocessing.spawn` starts (`world_size =
    torch.cuda.device_count()` then `mp.spawn(main, nprocs=world_size)`, the DDP tutorial),
    it is at least one: `torch.accelerator.device_count() or 1`, the same count wherever
    there is a GPU, and one CPU process (gloo) where there is none, instead of no process.

    Example:
        n = torch.cuda.device_count()  ->  n = torch.accelerator.device_count()
        world_size = torch.cuda.device_count()  # then mp.spawn(..., nprocs=world_size)
        ->  world_size = torch.accelerator.device_count() or 1
    """

    code = "G2T105"
    compat_torch = "0.4"
    name = "cuda-device-count"
    safety = Safety.SAFE
    message = "`{call}` counts only NVIDIA GPUs"
    hint = "use `torch.accelerator.device_count()`"
    cuda_name = "torch.cuda.device_count"
    accel_name = "accelerator.device_count"

    def rewrite(self, node: cst.Call) -> None:
        if node.args or not self._spawn_count(node):
            super().rewrite(node)
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            count = updated.with_changes(func=ctx.torch_attr(self.accel_name))
            return cst.BooleanOperation(left=count, operator=cst.Or(), right=cst.Integer("1"))

        self.report(
            node,
            self.message_for(node),
            fix=fix,
            hint="use `torch.accelerator.device_count() or 1`: the processes `mp.spawn` starts",
        )

    def _spawn_count(self, node: cst.Call) -> bool:
        """Whether the count is the `nprocs` of a `torch.multiprocessing.spawn` call, directly
        or through a module-level or local name assigned from it alone."""
        parent = self.parent(node)
        if isinstance(parent, cst.Arg) and parent.keyword is not None:
            return parent.keyword.value == "nprocs"
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return False
        target = parent.targets[0].target
        return isinstance(target, cst.Name) and target.value in spawn_counts(self.ctx)


class DeviceCountZero(Rule):
    """A device count that scales a size: 0 where there is no accelerator.

    Why: `torch.cuda.device_count()` and `torch.accelerator.device_count()` (what G2T105
    writes) are 0 on a machine without an accelerator, the CPU fallback included, so `BATCH
    = 64 * torch.cuda.device_count()` is a batch of 0 there (and a division by it raises).
    On CUDA and on a TPU the count is right; without an accelerator it needs a floor the
    code chooses (`max(1, ...)`). Reported where the count is a factor, divisor or modulus,
    directly or through a name assigned from it alone, on the original call and the
    rewritten one alike, so `check` says the same before and after; not inside a branch that
    has found an accelerator. `%%tpu` says it when such a cell runs without one.

    Example:
        BATCH = 64 * torch.cuda.device_count()
        # -> 64 * torch.accelerator.device_count() (G2T105); G2T116: 0 without an accelerator
    """

    code = "G2T116"
    name = "device-count-zero"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "`{call}` is 0 where there is no accelerator (the CPU fallback): {use}"
    hint = "give it a floor if the code also runs on the CPU (`max(1, ...)`), or say so"
    tokens = (b"device_count",)

    def visit_Call(self, node: cst.Call) -> None:
        if node.args or not self.matches_name(
            node, "torch.cuda.device_count", "torch.accelerator.device_count"
        ):
            return
        if accelerator_known(self.ctx, node):
            return
        parent = self.parent(node)
        use: str | None = None
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, SCALING):
            other = parent.left if parent.right is node else parent.right
            if isinstance(other, cst.List | cst.Tuple | cst.BaseString):
                return  # `[None] * count`: one item per device, none without one
            divides = parent.right is node and not isinstance(parent.operator, cst.Multiply)
            use = f"`{short(parent, 40)}` {'divides by 0' if divides else 'is 0'} there"
        elif isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
            if isinstance(target, cst.Name):
                line = scaled_later(self.ctx, target.value, self.position(node)[0])
                scales = (
                    f"`{target.value}` scales a value at line {line} (0 there, or a division by 0)"
                )
                use = scales if line else None
        if use is not None:
            self.report(node, self.message.format(call=short(node, 50), use=use))


class CudaCurrentDevice(_CudaRuntimeCall):
    """`torch.cuda.current_device()` is the CUDA device index.

    Why: it fails without CUDA. `torch.accelerator.current_device_index()` (torch 2.7+) gives
    the index on any accelerator.

    Example:
        i = torch.cuda.current_device()  ->  i = torch.accelerator.current_device_index()
    """

    code = "G2T106"
    compat_torch = "0.4"
    name = "cuda-current-device"
    safety = Safety.SAFE
    message = "`{call}` fails without CUDA"
    hint = "use `torch.accelerator.current_device_index()`"
    cuda_name = "torch.cuda.current_device"
    accel_name = "accelerator.current_device_index"


class CudaSetDevice(_CudaRuntimeCall):
    """`torch.cuda.set_device(i)` selects a CUDA device.

    Why: it fails without CUDA. `torch.accelerator.set_device_index(i)` does the same on any
    accelerator (it takes the device by position). As a statement it runs only where an
    accelerator is, so the same file still runs on a CPU-only machine. When the index is the
    process's rank (`local_rank`), it runs on CUDA only (`if device.type == "cuda":`): a TPU
    process owns one chip, index 0, and selecting the rank's index there raises (this is what
    G2T407 asks for, so it does not report the line again). Only a branch that tests a
    device (`x.device.type == "cuda"`, `x.is_cuda`) makes the guard redundant: a name the
    user sets (`if accelerator == "cuda":`, from a configuration, on any machine) does not.

    Example:
        torch.cuda.set_device(0)
        ->  if torch.accelerator.is_available():
                torch.accelerator.set_device_index(0)
        torch.cuda.set_device(local_rank)
        ->  if device.type == "cuda":
                torch.accelerator.set_device_index(local_rank)
    """

    code = "G2T107"
    compat_torch = "0.4"
    name = "cuda-set-device"
    safety = Safety.SAFE
    message = "`{call}` fails without CUDA"
    hint = "use `torch.accelerator.set_device_index()`"
    cuda_name = "torch.cuda.set_device"
    accel_name = "accelerator.set_device_index"
    guard = True
    takes_device = True

    def guard_test(self, node: cst.Call) -> str | None:
        index = find_arg(node, "device", 0)
        ctx = self.ctx
        if index is not None and ctx.flow.refers_to_rank(index.value, index_only=True):
            if device_branch(ctx, node, actual=True) == "cuda":
                return None  # a branch for a CUDA device (not for a name set to "cuda")
            return "device"
        return super().guard_test(node)

    def rewrite(self, node: cst.Call) -> None:
        before = self.ctx.report_count()
        super().rewrite(node)
        if any(p.applies and p.uses_device for p in self.ctx.reports(before)):
            self.ctx.claim_node(node)  # G2T407's question is answered by the guard


class CudaSynchronize(_CudaRuntimeCall):
    """`torch.cuda.synchronize()` waits for CUDA work.

    Why: it fails without CUDA. `torch.accelerator.synchronize()` waits for any accelerator
    (a device is passed by position); as a statement it runs only where an accelerator is,
    because it raises on a machine with none, unless a branch around it has checked already.
    Inside a training loop it is also a TPU performance hazard (G2T6xx).

    Example:
        torch.cuda.synchronize()
        ->  if torch.accelerator.is_available():
                torch.accelerator.synchronize()
        torch.cuda.synchronize(device=d)  ->  torch.accelerator.synchronize(d)  (guarded)
    """

    code = "G2T108"
    compat_torch = "0.4"
    name = "cuda-synchronize"
    safety = Safety.SAFE
    message = "`{call}` fails without CUDA"
    hint = "use `torch.accelerator.synchronize()`"
    cuda_name = "torch.cuda.synchronize"
    accel_name = "accelerator.synchronize"
    guard = True
    takes_device = True


class TensorIsCuda(Rule):
    """`x.is_cuda` asks whether a tensor lives on an NVIDIA GPU.

    Why: on a TPU it is False for every tensor, so code that means "is it on the accelerator?"
    takes the CPU branch. `x.device.type == device.type != "cpu"` asks whether the tensor is on
    the process's accelerator: on a CUDA machine that is `x.is_cuda` exactly (a CPU, meta or
    other tensor answers False), on a TPU it is True for TPU tensors, and without an
    accelerator it is False. A test that guards code only CUDA can run (a Triton kernel, apex,
    an import of GPU kernels, a function of the module that needs CUDA, as for G2T104) or
    whose `else` is the code's own path for every other device is reported instead, and so
    are reads where the module gives objects an `is_cuda` of its own; stores (`self.is_cuda =
    ...`) are the user's attribute and left alone.

    Example:
        if x.is_cuda:  ->  if x.device.type == device.type != "cpu":
    """

    code = "G2T109"
    compat_torch = "0.4"
    name = "tensor-is-cuda"
    safety = Safety.SAFE
    message = "`{attr}` is False on TPUs; ask whether the tensor is on the accelerator"
    hint = 'use `x.device.type == device.type != "cpu"` (`x.is_cuda` on CUDA)'
    tokens = (b"is_cuda",)
    decides_last = True  # what its branch runs is decided by the other rules first

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Attribute, bool]] = []
        self.widened: set[tuple[int, int]] = set()
        self.reports_read = 0

    def _widened(self) -> set[tuple[int, int]]:
        """Where the CUDA tests this run widens (G2T104) are: what they guard is there on
        every device. Only the reports since the last question are read (all of them on each
        question cost their square on a module with a test on every few lines)."""
        ctx = self.ctx
        if ctx.report_count() < self.reports_read:
            self.widened, self.reports_read = set(), 0
        for p in ctx.reports(self.reports_read):
            if p.rule.code == "G2T104" and p.settled(ctx.options):
                self.widened.add(ctx.position(p.node))
        self.reports_read = ctx.report_count()
        return self.widened

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "is_cuda" or is_store(self.ctx, node):
            return  # `self.is_cuda = ...` sets an attribute of the user's own
        self.candidates.append((node, comparison_needs_parentheses(self, node)))

    def leave_Module(self, original_node: cst.Module) -> None:
        for node, parens in self.candidates:
            self.decide(node, parens)

    def decide(self, node: cst.Attribute, parens: bool) -> None:
        message = self.message.format(attr=short(node, 40))
        if defines_attribute(self.ctx, "is_cuda"):
            self.report(
                node,
                message,
                hint="this module gives objects an `is_cuda` of its own: check whether this "
                "one is a tensor's, and use `x.device.type == \"cuda\"` or the module's device",
            )
            return
        region, _ = guarded_region(self.ctx, node)
        cuda_only = left_on_cuda(self.ctx, region, []) if region else None
        if cuda_only is not None:
            cuda_only = f"guards {cuda_only}, which only CUDA runs"
        elif region:
            cuda_only = self._cuda_only_value(region)
        other = other_path(self.ctx, node) if cuda_only is None else None
        if other is not None:
            cuda_only = (
                "chooses between CUDA's path and the code's own path for every other device "
                f"(line {self.position(other)[0]})"
            )
        if cuda_only is not None:
            self.report(
                node,
                f"`{short(node, 40)}` {cuda_only}",
                hint="keep the test for CUDA; give other devices their own path (a value "
                'every accelerator has, or `x.device.type == "cuda"` for CUDA\'s own)',
            )
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Attribute)
            tensor_type = cst.Attribute(
                value=cst.Attribute(value=updated.value, attr=cst.Name("device")),
                attr=cst.Name("type"),
            )
            expr = cst.Comparison(
                left=tensor_type,
                comparisons=[
                    cst.ComparisonTarget(cst.Equal(), ctx.device_type()),
                    cst.ComparisonTarget(cst.NotEqual(), cst.SimpleString('"cpu"')),
                ],
            )
            if updated.lpar:
                return expr.with_changes(lpar=updated.lpar, rpar=updated.rpar)
            return parenthesized(expr, parens)

        self.report(node, message, fix=fix, uses_device=True)

    def _cuda_only_value(self, region: list[cst.CSTNode]) -> str | None:
        """A value the branch reads that the module makes only where CUDA is (`self.
        cuda_config`, set under `if torch.cuda.is_available():`, None elsewhere)."""
        values = module_values(self.ctx)
        if values is None:
            return None
        widened = self._widened()

        def is_widened(line: int, column: int) -> bool:
            return (line, column) in widened

        stack = list(region)
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Attribute) and is_name(current.value, "self"):
                line = values.cuda_only_value(
                    current.attr.value, self.position(current)[0], True, is_widened
                )
                if line is not None:
                    return f"picks `{short(current, 30)}`, set only where CUDA is (line {line})"
                continue
            if isinstance(current, cst.Name):
                line = values.cuda_only_value(
                    current.value, self.position(current)[0], widened=is_widened
                )
                if line is not None:
                    return f"picks `{current.value}`, set only where CUDA is (line {line})"
                continue
            stack.extend(current.children)
        return None


class CudaDeviceContext(_CudaRuntimeCall):
    """`with torch.cuda.device(i):` selects a CUDA device for a block.

    Why: it fails without CUDA. `torch.accelerator.device_index(i)` (torch 2.8+) does the same
    on any accelerator. It takes an int index only (or None), where `torch.cuda.device` also
    takes a device or a string: those are reported.

    Example:
        with torch.cuda.device(1):  ->  with torch.accelerator.device_index(1):
    """

    code = "G2T110"
    name = "cuda-device-context"
    safety = Safety.SAFE
    message = "`{call}` fails without CUDA"
    hint = "use `torch.accelerator.device_index(...)` (torch 2.8+)"
    cuda_name = "torch.cuda.device"
    accel_name = "accelerator.device_index"
    min_torch = "2.8"
    takes_device = True
    index_only = True


class CudaDeviceComparison(Rule):
    """A comparison with the string `'cuda'`: `x.device.type == 'cuda'`, `'cuda' in device`,
    `device in ["cuda", "xpu"]`, `device.startswith("cuda")`.

    Why: whether the code means "is this CUDA?" or "is this an accelerator?" is a decision the
    codemod cannot make; on a TPU the comparison is simply False. A test that guards code
    only CUDA runs means "is it CUDA?" and is left alone, as are the CUDA-only choices fixes
    write (`rank if device.type == "cuda" else device`), unless it reads a name whose
    `"cuda"` default this rewrite makes the device's type (G2T113): the test that was True
    by default is then False on a TPU (sam2's `accelerator="cuda"`, then `if accelerator ==
    "cuda": ... else: raise ValueError`), so it is reported with the default.

    Example:
        if x.device.type == "cuda":  # decide: `!= "cpu"` (any accelerator) or keep (CUDA only)
        def setup(accelerator="cuda"):   # -> accelerator=device.type (G2T113)
            if accelerator == "cuda":    # reported: by default False on a TPU now
    """

    code = "G2T111"
    name = "cuda-device-comparison"
    safety = Safety.REPORT
    severity = Severity.WARNING
    message = "comparison with `{value}`: on a TPU it is always False"
    hint = 'compare with `"cpu"` (any accelerator) or with `device.type`, whichever is meant'

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        # Tests of CUDA's own code, with the name they compare: reported only when that
        # name's "cuda" default is rewritten (decided once the defaults are all seen).
        self.cuda_only: list[tuple[cst.Comparison, cst.BaseExpression, str]] = []

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(t.comparator for t in node.comparisons)]
        ops = [t.operator for t in node.comparisons]
        if not any(
            isinstance(o, cst.Equal | cst.NotEqual | cst.In | cst.NotIn | cst.Is | cst.IsNot)
            for o in ops
        ):
            return
        membership = any(isinstance(o, cst.In | cst.NotIn) for o in ops)
        for operand in operands:
            literal: cst.BaseExpression | None = operand
            if membership and isinstance(operand, cst.List | cst.Tuple | cst.Set):
                # `device in ["cuda", "xpu"]`
                literal = next((e.value for e in operand.elements if cuda_literal(e.value)), None)
            if literal is not None and cuda_literal(literal):
                if self._cuda_only_branch(node):
                    # the code it guards is CUDA's own: the test means "is it CUDA?"
                    names = [last_segment(o) for o in operands if o is not operand]
                    if names and names[0]:
                        self.cuda_only.append((node, literal, names[0]))
                    return
                self.report(node, self.message.format(value=self.code_for(literal)))
                return

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.cuda_only:
            return
        ctx = self.ctx
        defaults = device_type_defaults(ctx.tree, (*DEVICE_NAMES, *DEVICE_FUNCTIONS))
        for p in ctx.reports():
            if p.rule.code == "G2T113" and p.settled(ctx.options):
                for name in fed_names(ctx, p.node):
                    defaults.setdefault(name, self.position(p.node)[0])
        for node, literal, name in self.cuda_only:
            line = defaults.get(name)
            if line is None:
                continue
            self.report(
                node,
                f"comparison with `{self.code_for(literal)}` reads `{name}`, whose default "
                f"is the device's type once rewritten (line {line}): by default it is False "
                "on a TPU",
                hint="decide what another device takes here: the accelerator's path (compare "
                'with `"cpu"`) or CUDA\'s own (then say what other devices do instead)',
            )

    def visit_Call(self, node: cst.Call) -> None:
        """`device.startswith("cuda")`, also with a tuple of prefixes."""
        if not attribute_named(node.func, "startswith") or len(node.args) != 1:
            return
        value = node.args[0].value
        prefixes = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        literal = next((p for p in prefixes if string_value(p) in ("cuda", "cuda:")), None)
        if literal is None or self._cuda_only_branch(node):
            return
        self.report(
            node,
            f"`.startswith({self.code_for(literal)})`: on a TPU it is always False",
        )

    def _cuda_only_branch(self, node: cst.Comparison | cst.Call) -> bool:
        """Whether the comparison guards code only CUDA runs, or selects the CUDA device index
        of a process (what G2T107 writes for a rank's index)."""
        parent = self.parent(node)
        if isinstance(parent, cst.IfExp) and parent.test is node and cuda_only_choice(parent):
            return True  # a CUDA value with the device itself elsewhere (what fixes write)
        region, how = guarded_region(self.ctx, node)
        if how != "if" or not region:
            return False
        if cuda_only_use(self.ctx, region) is not None:
            return True
        stack = list(region)
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Call) and self.matches_name(
                current, "torch.accelerator.set_device_index", "torch.cuda.set_device"
            ):
                return True
            stack.extend(current.children)
        return False
