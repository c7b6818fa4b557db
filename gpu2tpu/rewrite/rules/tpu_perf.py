"""G2T6xx: TPU performance hazards. Code that runs on a TPU, but slowly, or hangs.

A TPU runs compiled graphs. Reading a value back to the host, branching on it in Python, or
changing a shape forces the device to finish (and often to compile again) before Python can go
on; once a step that costs nothing on a GPU, every step on a TPU. These rules only report, as
warnings. The per-step hazards (G2T601-604, G2T607) are reported only where the cost recurs:
inside a training loop (see `analysis.flow.FlowFacts.training_loop` for what counts as one), never in
code outside loops, and each finding names the loop and its line; reads under
`if step % N == 0:` run every N steps and are not reported. The others concern what is built,
wherever it is: float64 tensors (G2T605), training loaders that keep a ragged last batch
(G2T606), inference mode on compiled code (G2T608), and host reads in code only some ranks run
(G2T609), which name the branch instead.
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from ..analysis.blocks import statement_index
from ..analysis.branches import device_branch
from ..analysis.flow import FlowFacts, Loop
from ..analysis.literals import is_name, last_segment, short, string_value
from ..core.model import Safety, Severity
from .base import Rule, RuleContext

# Tokens of the files that can hold a training loop (see FlowFacts.training_loop).
TRAINING_LOOP_TOKENS = (b".backward(", b".step(", b"loader", b"Loader", b"model(", b"net(")
SYNC_NAMES = tuple(f"torch.{m}.synchronize" for m in ("cuda", "accelerator", "xpu", "mps", "tpu"))
FLOAT64 = ("torch.float64", "torch.double")
# Legacy typed tensors of float64 (G2T314 rewrites the CUDA ones into `dtype=torch.float64`).
LEGACY_DOUBLE = ("torch.DoubleTensor", "torch.cuda.DoubleTensor")
# Clocks a benchmark reads around the work it times.
CLOCKS = tuple(
    f"time.{c}"
    for c in ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns")
) + ("timeit.default_timer",)
# Index expressions that can be boolean masks (others, such as `x[0]` or `x[i:j]`, cannot).
MASK_SHAPES = (cst.Comparison, cst.UnaryOperation, cst.BinaryOperation, cst.Call, cst.Name)


class _Warning(Rule):
    """A report-only TPU performance rule that decides from syntax and imports alone."""

    safety: ClassVar[Safety] = Safety.REPORT
    severity: ClassVar[Severity] = Severity.WARNING


class _PerfRule(Rule):
    """A report-only TPU performance rule that needs the flow facts: it collects candidate
    nodes while visiting and decides once the traversal has recorded everything."""

    safety: ClassVar[Safety] = Safety.REPORT
    severity: ClassVar[Severity] = Severity.WARNING
    uses_flow = True

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.candidates: list[cst.CSTNode] = []

    @property
    def facts(self) -> FlowFacts:
        return self.ctx.flow

    def step_loop(self, node: cst.CSTNode) -> Loop | None:
        """The training loop that runs `node` every step, unless only every N steps."""
        loop = self.facts.training_loop(node)
        if loop is None or self.facts.periodic(node, loop):
            return None
        return loop

    def left_to_rank_lint(self, node: cst.CSTNode) -> bool:
        """Whether the rank-divergence lint (G2T609) reports `node` instead of this rule."""
        return self.ctx.options.enabled("G2T609") and self.facts.rank_branch(node) is not None

    def leave_Module(self, original_node: cst.Module) -> None:
        for node in self.candidates:
            self.decide(node)

    def decide(self, node: cst.CSTNode) -> None:
        """Report `node` if it is a hazard; called once per candidate, after the traversal.

        Every subclass that collects candidates defines it.
        """
        raise NotImplementedError(f"{type(self).__name__} collects candidates but lacks decide")


class HostSyncInLoop(_PerfRule):
    """`.item()`, `.cpu()`, `.tolist()`, `.numpy()` (or `float(t)`) inside a training loop.

    Why: each call copies a tensor to the host, so the TPU must finish the step's graph first
    and Python waits for it every step, instead of queuing the next one. Keep values on the
    device (accumulate `total += loss.detach()`) and read them every N steps. A training loop
    is a `for`/`while` loop whose own body calls `.backward()`, steps an optimizer or calls a
    model, or a `for` loop over a data loader; loops nested inside one count too. Reads under
    `if step % N == 0:` are not reported, nor reads in a branch only some ranks take (G2T609).

    Example:
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            print(loss.item())      # G2T601: a host sync every step
    """

    code = "G2T601"
    in_loops_only = True  # inside a training loop
    name = "host-sync-in-loop"
    message = "`{read}` inside {loop} copies to the host and waits every step"
    hint = "keep it on the device (`total += loss.detach()`) and read it every N steps"
    tokens = (b".item()", b".cpu()", b".tolist()", b".numpy(", b".backward(")

    def visit_Call(self, node: cst.Call) -> None:
        if FlowFacts.may_read(node):
            self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        assert isinstance(node, cst.Call)
        read = self.facts.host_read(node)
        if read is None:
            return
        loop = self.step_loop(node)
        if loop is None or self.left_to_rank_lint(node):
            return
        self.report(node, self.message.format(read=read, loop=loop.describe()))


class PrintTensorInLoop(_PerfRule):
    """`print(tensor)` or logging a tensor (logger, wandb, TensorBoard) in a training loop.

    Why: formatting a tensor reads its value, which makes the TPU finish the step and Python
    wait, every step. Only tensors the code shows are reported: a loop that prints Python
    numbers (`print(step, lr)`, `print(loss.item())`, whose `.item()` is G2T601) is not.

    Example:
        for x, y in loader:
            loss = criterion(model(x), y)
            print(f"loss {loss}")    # G2T602; log every N steps, or after the loop
    """

    code = "G2T602"
    in_loops_only = True  # inside a training loop
    name = "print-tensor-in-loop"
    message = "printing or logging a tensor inside {loop} waits every step"
    hint = "log it every N steps (`if step % 100 == 0:`), or accumulate on the device"
    tokens = TRAINING_LOOP_TOKENS

    def visit_Call(self, node: cst.Call) -> None:
        if node.args and self.facts.is_log_call(node):
            self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        assert isinstance(node, cst.Call)
        if not any(self.facts.carries_tensor(a.value) for a in node.args):
            return
        loop = self.step_loop(node)
        if loop is None or self.left_to_rank_lint(node):
            return
        self.report(node, self.message.format(loop=loop.describe()))


class TensorControlFlow(_PerfRule):
    """Python control flow on a tensor value: `if loss > x:`, `if t.any():`, `while (x > 0).all():`.

    Why: Python must know the value to choose a branch, so the TPU finishes the step and
    Python waits; with the graph split at the branch, each path compiles separately. Inside a
    training loop this happens every step; a `while` loop whose test is a tensor does it every
    iteration wherever it is. Keep the decision on the device (`torch.where`, masks) or make it
    every N steps. Tests on shapes, lengths and Python numbers are not reported.

    Example:
        for x, y in loader:
            loss = criterion(model(x), y)
            if torch.isnan(loss).any():   # G2T603
                continue
    """

    code = "G2T603"
    in_loops_only = True  # in a training loop (or a `while` loop's test)
    name = "tensor-control-flow"
    message = "`{what}` branches on a tensor value inside {loop}"
    hint = "keep the decision on the device (`torch.where`, a mask), or decide every N steps"
    tokens = (*TRAINING_LOOP_TOKENS, b"while ")

    def visit_If(self, node: cst.If) -> None:
        self.candidates.append(node)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.candidates.append(node)

    def visit_Assert(self, node: cst.Assert) -> None:
        self.candidates.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        assert isinstance(node, cst.If | cst.IfExp | cst.Assert | cst.While)
        if isinstance(node, cst.While):
            if self.syncs(node.test):
                message = (
                    f"the test of {Loop(node, self.ctx).describe()} reads a tensor value every "
                    "iteration"
                )
                self.report(node, message)
            return
        loop = self.step_loop(node)
        if loop is None or not self.syncs(node.test):
            return
        if isinstance(node, cst.IfExp):
            what = "... if ... else ..."
        else:
            keyword = "assert" if isinstance(node, cst.Assert) else "if"
            what = f"{keyword} {short(node.test, 30)}"
        self.report(node, self.message.format(what=what, loop=loop.describe()))

    def syncs(self, test: cst.BaseExpression) -> bool:
        """Whether deciding `test` in Python needs a tensor's value."""
        facts = self.facts
        if isinstance(test, cst.BooleanOperation):
            return self.syncs(test.left) or self.syncs(test.right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.syncs(test.expression)
        if isinstance(test, cst.Comparison | cst.Call) and facts.is_tensor(test):
            return True
        if isinstance(test, cst.Call):
            if self.matches_name(test, "torch.equal", "torch.allclose", "torch.is_nonzero"):
                return True
            if self.matches_name(test, "math.isnan", "math.isinf", "math.isfinite"):
                return any(facts.is_tensor(a.value) for a in test.args)
        return False


class DynamicShapeInLoop(_PerfRule):
    """`nonzero`, `unique`, `masked_select` and boolean-mask indexing `x[mask]` in a training loop.

    Why: the result's shape depends on the data, so a TPU compiles the step again for every
    new shape (and reads the count back to the host). Keep shapes static: `torch.where(mask,
    x, 0)` or `x * mask` instead of `x[mask]`, `torch.nonzero_static(x, size=k)` instead of
    `nonzero`. Assigning through a mask (`x[mask] = 0`) keeps the shape and is not reported.

    Example:
        for x, y in loader:
            valid = y != -100
            loss = criterion(model(x)[valid], y[valid])   # G2T604 (twice)
    """

    code = "G2T604"
    in_loops_only = True  # inside a training loop
    name = "dynamic-shape-in-loop"
    message = "`{what}` inside {loop} has a data-dependent shape"
    hint = "keep shapes static: `torch.where(mask, x, 0)` or `x * mask`; `torch.nonzero_static`"
    tokens = TRAINING_LOOP_TOKENS

    OPS: ClassVar[frozenset[str]] = frozenset(
        {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"}
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = last_segment(func)
        if name in self.OPS or (name == "where" and len(node.args) == 1):
            self.candidates.append(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            index = node.slice[0].slice.value
            if isinstance(index, MASK_SHAPES):
                self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Subscript):
            self._decide_subscript(node)
            return
        assert isinstance(node, cst.Call)
        what = self._dynamic_op(node)
        if what is None:
            return
        loop = self.step_loop(node)
        if loop is not None:
            self.report(node, self.message.format(what=what, loop=loop.describe()))

    def _dynamic_op(self, node: cst.Call) -> str | None:
        func = node.func
        torch_op = next((q for q in self.qualified_names(node) if q.startswith("torch.")), None)
        if torch_op is not None:
            op = torch_op.removeprefix("torch.")
            if op in self.OPS:
                return f"{torch_op}()"
            positional = [a for a in node.args if a.keyword is None]
            if op == "where" and len(node.args) == 1 and positional:
                return "torch.where(condition)"
            return None
        if isinstance(func, cst.Attribute) and func.attr.value in self.OPS:
            receiver = func.value
            if isinstance(receiver, cst.Name | cst.Attribute) and self.qualified_names(receiver):
                return None  # numpy or another module's function
            if self.facts.kind(receiver) is not None and not self.facts.is_tensor(receiver):
                return None  # a host value (a numpy array)
            return f".{func.attr.value}()"
        return None

    def _decide_subscript(self, node: cst.Subscript) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.AssignTarget) or (
            isinstance(parent, cst.AugAssign) and parent.target is node
        ):
            return
        facts = self.facts
        index = node.slice[0].slice.value  # type: ignore[attr-defined]  # one plain index, matched above
        if not facts.is_mask(index) or not facts.is_tensor(node.value):
            return
        loop = self.step_loop(node)
        if loop is not None:
            what = f"{short(node.value, 20)}[{short(index, 20)}]"
            self.report(node, self.message.format(what=what, loop=loop.describe()))


class Float64Tensor(_Warning):
    """A float64 tensor: `dtype=torch.float64` / `torch.double`, `.double()`.

    Why: TPUs have no float64 units; float64 math is emulated, many times slower, or refused.
    Use float32 (or bfloat16), and keep float64 for host-side numpy. The dtype is a hazard
    wherever the tensor is made, so this rule does not need a loop; tensors that the code
    keeps on the CPU (`device="cpu"`, `x.cpu().double()`) are not reported.

    Example:
        torch.zeros(3, dtype=torch.float64)   ->  torch.zeros(3, dtype=torch.float32)
        x.double()                            ->  x.float()
    """

    code = "G2T605"
    name = "float64-tensor"
    message = "float64 (`{what}`): TPUs have no float64 units and emulate it slowly"
    hint = "use `torch.float32` (or `torch.bfloat16`); keep float64 for host-side numpy"
    tokens = (b"float64", b"double", b"DoubleTensor")

    DTYPE_METHODS: ClassVar[frozenset[str]] = frozenset({"to", "type", "new_tensor"})
    DTYPE_FUNCS: ClassVar[tuple[str, ...]] = (
        "torch.set_default_dtype",
        "torch.set_default_tensor_type",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self.matches_name(node, *LEGACY_DOUBLE):
            self.report(node, self.message.format(what=short(node, 30)))
            return
        if isinstance(func, cst.Attribute) and func.attr.value == "type" and len(node.args) == 1:
            if string_value(node.args[0].value) in LEGACY_DOUBLE:  # `x.type("torch.DoubleTensor")`
                self.report(node.args[0].value, self.message.format(what=short(node.args[0], 30)))
                return
        if isinstance(func, cst.Attribute) and func.attr.value == "double" and not node.args:
            module = isinstance(func.value, cst.Name) and self.qualified_names(func.value)
            if not module and not _on_host(func.value):
                self.report(node, self.message.format(what=".double()"))
            return
        for arg in node.args:
            if not self.matches_name(arg.value, *FLOAT64, *LEGACY_DOUBLE):
                continue
            if arg.keyword is not None and arg.keyword.value not in ("dtype", "torch_dtype"):
                continue
            if arg.keyword is None and not self._takes_dtype_positionally(node):
                continue
            if self._kept_on_host(node):
                continue
            self.report(arg.value, self.message.format(what=short(arg, 30)))

    def _takes_dtype_positionally(self, node: cst.Call) -> bool:
        if self.matches_name(node, *self.DTYPE_FUNCS):
            return True
        return isinstance(node.func, cst.Attribute) and node.func.attr.value in self.DTYPE_METHODS

    def _kept_on_host(self, node: cst.Call) -> bool:
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "device":
                value = arg.value
                if string_value(value) == "cpu":
                    return True
        return isinstance(node.func, cst.Attribute) and _on_host(node.func.value)


def _on_host(expr: cst.CSTNode) -> bool:
    """Whether a method chain already moved its tensor to the host (`x.cpu()`, `.numpy()`)."""
    node: cst.CSTNode | None = expr
    while node is not None:
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("cpu", "numpy"):
                return True
            node = func.value if isinstance(func, cst.Attribute) else None
        elif isinstance(node, cst.Attribute | cst.Subscript):
            node = node.value
        else:
            node = None
    return False


class DataLoaderDropLast(_Warning):
    """A training `DataLoader` without `drop_last=True`.

    Why: the last batch of an epoch is usually smaller, and a TPU compiles the step again for
    the new shape (and once more when the next epoch starts). Dropping it (or padding it)
    keeps one shape. A loader counts as a training loader when it shuffles (`shuffle=True`)
    or its name or dataset says "train"; loaders with a `batch_sampler` choose their own
    batches and are not reported.

    Example:
        DataLoader(train_ds, batch_size=32, shuffle=True)
        ->  DataLoader(train_ds, batch_size=32, shuffle=True, drop_last=True)
    """

    code = "G2T606"
    name = "dataloader-drop-last"
    message = "training `DataLoader` without `drop_last=True`: its last, smaller batch recompiles"
    hint = "pass `drop_last=True` (or pad the last batch to the batch size)"
    tokens = (b"DataLoader",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(
            node, "torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"
        ):
            return
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if "batch_sampler" in keywords or is_name(keywords.get("batch_size"), "None"):
            return
        drop_last = keywords.get("drop_last")
        if drop_last is not None and not is_name(drop_last, "False"):
            return
        if not self._for_training(node, keywords):
            return
        self.report(node)

    def _for_training(self, node: cst.Call, keywords: dict[str, cst.BaseExpression]) -> bool:
        if is_name(keywords.get("shuffle"), "True"):
            return True
        names = []
        dataset = keywords.get("dataset")
        positional = [a.value for a in node.args if a.keyword is None]
        if dataset is None and positional:
            dataset = positional[0]
        if dataset is not None:
            names.append(self.code_for(dataset))
        parent = self.parent(node)
        if isinstance(parent, cst.Assign):
            names.extend(self.code_for(t.target) for t in parent.targets)
        return any("train" in n.lower() for n in names)


class SynchronizeInLoop(_PerfRule):
    """`torch.cuda.synchronize()` / `torch.accelerator.synchronize()` inside a training loop.

    Why: it makes Python wait until the device has finished everything queued, every step;
    on a TPU it also cuts the step's graph. Synchronize once, before reading a timer, and
    outside the loop. (`torch.cuda.synchronize` is also rewritten by G2T108; this rule
    reports the cost that remains.)

    Example:
        for x, y in loader:
            loss = step(x, y)
            torch.cuda.synchronize()   # G2T607: drop it, or time N steps at once
    """

    code = "G2T607"
    name = "synchronize-in-loop"
    message = "`{what}` inside {loop} waits for the device every step"
    hint = "synchronize once outside the loop (before reading a timer)"
    tokens = (b"synchronize",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.matches_name(node, *SYNC_NAMES):
            self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        assert isinstance(node, cst.Call)
        branch = device_branch(self.ctx, node)
        if branch is not None and branch not in ("tpu", "xla"):
            return  # code for one other device (`if device == "mps":`) never runs on a TPU
        if self._times_work(node):
            return  # it brackets a timer reading: what a benchmark must do on every device
        loop = self.step_loop(node)
        if loop is not None:
            what = f"{self.code_for(node.func)}()"
            self.report(node, self.message.format(what=what, loop=loop.describe()))

    def _times_work(self, node: cst.Call) -> bool:
        """Whether the synchronize is a statement next to one that reads a clock
        (`time.perf_counter()`, an event's `record()`): it makes the timer measure the queued
        work, in a benchmark loop as outside one."""
        expr = self.parent(node)
        if isinstance(expr, cst.IfExp):  # `(a.synchronize() if hasattr(...) else c.synchronize())`
            expr = self.parent(expr)  # for a torch without torch.accelerator (torch_compat.py)
        line = self.parent(expr) if isinstance(expr, cst.Expr) else None
        block = self.parent(line) if isinstance(line, cst.SimpleStatementLine) else None
        guard = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(guard, cst.If) and guard.orelse is None and len(block.body) == 1:  # type: ignore[union-attr]  # an IndentedBlock whenever guard is set
            # `if torch.accelerator.is_available(): torch.accelerator.synchronize()`: the
            # guard's neighbours are the synchronize's
            line, block = guard, self.parent(guard)
        if not isinstance(block, cst.IndentedBlock | cst.Module):
            return False
        assert line is not None  # `block` is its parent
        body = block.body
        index = statement_index(self.ctx, block, line)
        assert index is not None  # `line` is a statement of its parent block
        return any(self._reads_clock(body[j]) for j in (index - 1, index + 1) if 0 <= j < len(body))

    def _reads_clock(self, stmt: cst.CSTNode) -> bool:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        stack: list[cst.CSTNode] = [stmt]
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Call):
                if self.matches_name(current, *CLOCKS):
                    return True
                if isinstance(current.func, cst.Attribute) and current.func.attr.value in (
                    "record",
                    "elapsed_time",
                ):
                    return True
            stack.extend(current.children)
        return False


class InferenceModeCompiled(_Warning):
    """`@torch.inference_mode()` on a function that is also compiled with `torch.compile`.

    Why: inference tensors carry no version counter and cannot be used by autograd later;
    `torch.compile`'s graph capture (AOTAutograd) has known failures and recompilations on
    them, and recompiling is costly on a TPU. `torch.no_grad()`
    turns off autograd just as well and compiles. (The released torch_tpu 0.2.0 sources say
    nothing specific about inference mode; this is a hint, not a known crash.) Reported: a
    function with both decorators, an inference-mode function passed to `torch.compile`
    anywhere in the module, and a `with torch.inference_mode():` block that calls a compiled
    function or model.

    Example:
        @torch.compile
        @torch.inference_mode()      ->  @torch.no_grad()
        def predict(x): ...
    """

    code = "G2T608"
    name = "inference-mode-compiled"
    message = (
        "`torch.inference_mode` on compiled code (`{what}`): compiled graphs may fail or "
        "recompile on inference tensors"
    )
    hint = "use `torch.no_grad()` instead of `torch.inference_mode()`"
    tokens = (b"inference_mode",)
    whole_module = True  # `torch.compile(f)` may sit in a statement without the token

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.compiled: set[str] = set()  # names passed to, or bound from, torch.compile
        self.decorated: list[tuple[str, cst.Decorator]] = []
        self.blocks: list[tuple[cst.WithItem, cst.With]] = []

    def _is_inference_mode(self, expr: cst.BaseExpression) -> bool:
        target = expr.func if isinstance(expr, cst.Call) else expr
        return bool(self.matches_name(target, "torch.inference_mode"))

    def _is_compile(self, expr: cst.BaseExpression) -> bool:
        target = expr.func if isinstance(expr, cst.Call) else expr
        return bool(self.matches_name(target, "torch.compile"))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        inference = next((d for d in node.decorators if self._is_inference_mode(d.decorator)), None)
        if inference is None:
            return
        if any(self._is_compile(d.decorator) for d in node.decorators):
            self.report(inference, self.message.format(what=node.name.value))
        else:
            self.decorated.append((node.name.value, inference))

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_compile(node):
            return
        for arg in node.args[:1]:
            name = last_segment(arg.value)
            if name:
                self.compiled.add(name)
        parent = self.parent(node)
        if isinstance(parent, cst.Assign):
            for target in parent.targets:
                name = last_segment(target.target)
                if name:
                    self.compiled.add(name)

    def visit_With(self, node: cst.With) -> None:
        for item in node.items:
            if self._is_inference_mode(item.item):
                self.blocks.append((item, node))

    def leave_Module(self, original_node: cst.Module) -> None:
        for name, decorator in self.decorated:
            if name in self.compiled:
                self.report(decorator, self.message.format(what=name))
        for item, block in self.blocks:
            called = self._first_compiled_call(block.body)
            if called is not None:
                self.report(item, self.message.format(what=called))

    def _first_compiled_call(self, body: cst.CSTNode) -> str | None:
        stack = [body]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Call):
                name = last_segment(node.func)
                if name in self.compiled:
                    return f"{name}(...)"
            stack.extend(reversed(node.children))
        return None


class RankDivergentRead(_PerfRule):
    """A device-to-host read in a branch only some ranks take: `if rank == 0: print(loss.item())`.

    Why: on a TPU every rank must run the same graphs. When only rank 0 reads a tensor
    (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`, printing or logging it), rank 0 runs a
    graph the other ranks never join, and with a collective pending (DDP's gradient
    all-reduce) the whole job hangs. Compute the value on every rank, then print it on one.
    Ranks-only code is `if rank == 0:` and its else branch, `if dist.get_rank() == 0:`,
    `if local_rank == 0:`, `if is_master:` / `master_process` / `is_main_process`,
    `int(os.environ["RANK"]) == 0`, code after `if rank != 0: return`, and functions decorated
    `@rank_zero_only`. Printing Python numbers there is fine and is not reported.

    Example:
        if rank == 0:
            print(loss.item())       # G2T609
        ->
        loss_value = loss.item()     # every rank
        if rank == 0:
            print(loss_value)
    """

    code = "G2T609"
    name = "rank-divergent-read"
    message = "`{what}` in {where}: a host read on some ranks only can hang a TPU job"
    hint = "compute the value on every rank (`value = loss.item()`) before the branch; print on one"
    tokens = (b"rank", b"RANK", b"master", b"main_process", b"is_global_zero", b"process_zero")

    def visit_Call(self, node: cst.Call) -> None:
        if FlowFacts.may_read(node) or (node.args and self.facts.is_log_call(node)):
            self.candidates.append(node)

    def decide(self, node: cst.CSTNode) -> None:
        assert isinstance(node, cst.Call)
        facts = self.facts
        what = facts.host_read(node)
        if what is None:
            if not facts.is_log_call(node):
                return
            if not any(facts.carries_tensor(a.value) for a in node.args):
                return
            what = f"{self.code_for(node.func)}(<tensor>)"
        branch = facts.rank_branch(node)
        if branch is not None:
            self.report(node, self.message.format(what=what, where=branch.describe()))
