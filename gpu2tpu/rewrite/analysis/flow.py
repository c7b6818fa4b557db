"""Flow facts: loops, training loops, branches only some ranks take, what values are tensors.

The hazards they report only cost something when they run every step, or when only some
ranks run them, so each rule asks the same questions about a node: is it inside a training
loop, and which one? Is it under a branch taken every N steps only? Is it in a branch only some
ranks take? Is this expression a tensor? `FlowFacts` answers them lazily, walking up from the
node through libcst's parent metadata and looking names up through its scope metadata, and
caches the answers for every rule of one `rewrite_source` call (`RuleContext.flow`). Nothing is
computed for a file where no rule asks.

The inference is deliberately simple and biased towards silence: an expression is a tensor
only when the code shows it (a torch function, a model call, a batch from a data loader,
arithmetic on tensors); anything unknown is not a tensor, so a loop that prints Python numbers
is never flagged.

Cost: libcst's scope and parent metadata each cost more than a parse, so neither is used. Name
bindings and the calls in each loop are recorded while the engine's one traversal passes by
(`flow_recorder.FlowRecorder` does it, for runs with a rule that sets `uses_flow`), parents come from that
traversal, and rules decide in `leave_Module`, once everything is recorded. Bindings of the
top-level statements the engine skips are read on demand, one level deep.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, cast

import libcst as cst

from .blocks import statement_index
from .flow_recorder import Binding, FlowRecord
from .literals import code_for, last_segment, short, string_value
from .names import qualified

if TYPE_CHECKING:
    from ..rules.base import RuleContext


class Kind(Enum):
    """What an expression evaluates to, as far as the rules care."""

    TENSOR = "tensor"  # a tensor, or a container of tensors (a batch, a model output)
    HOST = "host"  # a value already read back to the host (`.item()`, numpy, math)
    MODULE = "module"  # an nn.Module (calling it gives a tensor)
    MODULE_CLASS = "module class"  # a class whose instances are modules
    LOADER = "loader"  # a data loader (iterating it gives batches)


# Methods that copy a tensor's value to the host and wait for the device.
HOST_READS = frozenset({"item", "cpu", "tolist", "numpy"})
# Tensor methods and attributes whose result is not a tensor (no device value is involved).
NON_TENSOR_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "data_ptr",
        "stride",
        "get_device",
        "keys",
        "items",
        "values",
        "type",
        "register_hook",
        "__len__",
    }
)
NON_TENSOR_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "requires_grad",
        "is_cuda",
        "is_leaf",
        "layout",
        "names",
        "grad_fn",
        "is_sparse",
        "is_quantized",
        "is_meta",
    }
)
# Module methods that return the module itself.
MODULE_METHODS = frozenset(
    {"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double", "requires_grad_"}
)
# Top-level `torch.X(...)` functions that do not return a tensor.
NON_TENSOR_TORCH = frozenset(
    {
        "device",
        "dtype",
        "manual_seed",
        "seed",
        "initial_seed",
        "no_grad",
        "enable_grad",
        "inference_mode",
        "autocast",
        "load",
        "save",
        "numel",
        "typename",
        "compile",
        "cond",
        "finfo",
        "iinfo",
        "Size",
        "Generator",
        "Stream",
        "Event",
    }
)
# `torch.X(...)` functions that read a device value to compute a Python bool.
HOST_TORCH = frozenset({"torch.equal", "torch.allclose", "torch.is_nonzero"})
# Calls that wrap an iterable without changing what it yields.
ITER_WRAPPERS = frozenset(
    {"enumerate", "tqdm", "zip", "iter", "islice", "cycle", "track", "chain", "prefetch"}
)
# Names that say "this is a model": `model`, `self.model`, `ddp_model`, `net`, `netG`, `resnet`.
MODEL_NAME = re.compile(r"(?i)(?:model|network)$|^net|net$")
LOSS_NAME = re.compile(r"(?i)^(?:criterion|loss_?fn|loss_?func(?:tion)?|compute_loss)$|criterion$")
FACTORY_NAME = re.compile(r"(?i)^(?:create|build|get|load|make|init|setup|prepare|new)_\w*model$")
LOADER_NAME = re.compile(r"(?i)loader|(?:^|_)dl$")
OPTIMIZER_NAME = re.compile(r"(?i)opt|scaler|engine")
# Names and calls that identify the process in a multi-process job.
RANK_NAME = re.compile(
    r"""^(?:
        (?:ddp_|global_|local_|world_|node_|process_|proc_|my_|cur_|current_|dist_)?rank
      | get_(?:local_|global_|node_local_)?rank
      | (?:get_)?(?:global_|local_)?ordinal
      | process_index
      | is_(?:local_|global_)?(?:master|main)(?:_(?:process|proc|rank|worker|node|ordinal))?
      | (?:local_|global_)?master_(?:process|proc|rank|worker|node)
      | is_(?:global|local|world)_zero
      | is_(?:world|local)_process_zero
      | (?:is_)?rank_?(?:zero|0)
    )$""",
    re.X,
)
# Just the integer rank, for device indices (`.to(local_rank)`).
RANK_INDEX_NAME = re.compile(
    r"^(?:(?:ddp|global|local|world|node|process|proc|my|cur|current|dist)_){0,2}rank$"
    r"|^get_(?:local_|global_|node_local_)?rank$"
)
RANK_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
    }
)
# Decorators that run a function on one process only (Lightning, Accelerate).
RANK_DECORATORS = frozenset(
    {
        "rank_zero_only",
        "rank0_only",
        "master_only",
        "main_process_only",
        "on_main_process",
        "on_local_main_process",
        "on_process",
        "on_local_process",
    }
)
LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception"})
LOGGER_NAME = re.compile(r"(?i)log")
TRACKER_NAME = re.compile(r"(?i)log|wandb|run|experiment|tracker|writer")
LOG_METHODS = frozenset(
    {
        "add_scalar",
        "add_scalars",
        "add_histogram",
        "add_text",
        "log_metric",
        "log_metrics",
        "log_dict",
        "set_postfix",
        "set_postfix_str",
        "set_description",
        "master_print",
    }
)

_SCOPE_BOUNDARIES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclass(frozen=True)
class Loop:
    """A `for` or `while` loop the rules name in their messages.

    `ctx` places it: its line is computed only when a message needs it, because placing a
    node lays out its whole top-level statement.
    """

    node: cst.For | cst.While
    ctx: RuleContext

    @property
    def keyword(self) -> str:
        return "for" if isinstance(self.node, cst.For) else "while"

    @property
    def line(self) -> int:
        return self.ctx.position(self.node)[0]

    @property
    def role(self) -> str | None:
        """ "training" (it steps an optimizer or calls `.backward()`), "evaluation" (it runs a
        model under a name that says so: val, eval, test), "inference" (under `no_grad` or
        `inference_mode`), else None."""
        return self.ctx.flow.loop_role(self.node)

    def describe(self) -> str:
        role = self.role
        if role is None:
            # In parentheses: the sentence around it goes on with its own verb.
            return f"the `{self.keyword}` loop at line {self.line} (it runs the model)"
        return f"the {role} loop (`{self.keyword}` at line {self.line})"


@dataclass(frozen=True)
class RankBranch:
    """Code that only some ranks run, and what makes it so (placed lazily, like `Loop`)."""

    how: str  # "if", "part" (of a longer test), "exit" or "decorator"
    text: str  # the test or decorator, shortened
    node: cst.CSTNode  # the `if`, or the decorator
    ctx: RuleContext

    @property
    def line(self) -> int:
        return self.ctx.position(self.node)[0]

    def describe(self) -> str:
        if self.how == "decorator":
            return f"a function only some ranks run (`@{self.text}` at line {self.line})"
        if self.how == "exit":
            return f"code only some ranks reach (after `if {self.text}:` at line {self.line})"
        if self.how == "part":
            return f"a branch only some ranks take (`{self.text}` in the test at line {self.line})"
        return f"a branch only some ranks take (`if {self.text}:` at line {self.line})"


def _is_string(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleString | cst.ConcatenatedString | cst.FormattedString)


class FlowFacts:
    """Control-flow and value facts about one module, shared by all rules of one run.

    The facts are recorded by a `FlowRecorder` (analysis/flow_recorder.py) while the engine traverses the module and
    answered lazily (with caches) when a rule asks, from `leave_Module` on.
    """

    def __init__(self, ctx: RuleContext) -> None:
        # Weak: the context holds these facts, and a strong path back would make a cycle that
        # keeps every parsed module alive until the next garbage collection.
        self._ctx_ref = weakref.ref(ctx)
        # What the traversal recorded (`FlowRecorder`): bindings, scopes, the calls in loops.
        self.record = FlowRecord()
        self._name_kinds: dict[tuple[int, str], Kind | None] = {}
        self._kinds: dict[int, Kind | None] = {}
        self._training: dict[int, bool] = {}
        self._roles: dict[tuple[str, int], str | None] = {}
        self._exits: dict[int, list[tuple[int, cst.If]]] = {}

    @property
    def ctx(self) -> RuleContext:
        ctx = self._ctx_ref()
        assert ctx is not None, "flow facts are asked only while their run lasts"
        return ctx

    # -- tree ------------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.ctx.parents.get(id(node))

    def line(self, node: cst.CSTNode) -> int:
        return self.ctx.position(node)[0]

    def qualified(self, node: cst.CSTNode) -> set[str]:
        name = qualified(self.ctx, node)
        return {name} if name else set()

    def _ancestors(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
        """(parent, child on the path) pairs from `node` up to the module."""
        child = node
        parent = self.parent(node)
        while parent is not None:
            yield parent, child
            child, parent = parent, self.parent(parent)

    def _scope_of(self, node: cst.CSTNode) -> int:
        """The function, class or lambda around `node`; else the module (also for nodes in
        top-level statements the traversal skipped, which have no recorded parents)."""
        scopes = self.record.scopes
        if self.parent(node) is None and node is not self.ctx.module and scopes:
            # Not reached by the traversal yet (a part of the node a rule is visiting): it is
            # in the scope the traversal is in.
            return scopes[-1]
        for parent, _child in self._ancestors(node):
            if isinstance(parent, (*_SCOPE_BOUNDARIES, cst.Module)):
                return id(parent)
        return id(self.ctx.module)

    def _lookup(self, name: cst.Name) -> tuple[int, list[Binding]] | None:
        """The scope that binds `name` where it is used, and its bindings there."""
        scope: int | None = self._scope_of(name)
        module = id(self.ctx.module)
        record = self.record
        while scope is not None:
            if scope == module:
                ctx = self.ctx
                record.bind_skipped_statements(ctx.module, ctx.parents, ctx.real_statement)
            found = record.bindings.get(scope, {}).get(name.value)
            if found:
                return scope, found
            scope = record.scope_parent.get(scope, module if scope != module else None)
        return None

    # -- loops -----------------------------------------------------------------------------

    def enclosing_loops(self, node: cst.CSTNode) -> Iterator[cst.For | cst.While]:
        """Loops whose every iteration runs `node`, innermost first, within one function."""
        for parent, child in self._ancestors(node):
            if isinstance(parent, _SCOPE_BOUNDARIES):
                return
            in_for = isinstance(parent, cst.For) and child is parent.body
            in_while = isinstance(parent, cst.While) and child in (parent.body, parent.test)
            if in_for or in_while:
                yield parent  # type: ignore[misc]  # a For or a While, tested above

    def training_loop(self, node: cst.CSTNode) -> Loop | None:
        """The innermost training loop that runs `node` every iteration, if any.

        A training loop is a `for` or `while` loop whose own body (outside nested loops and
        functions) calls `.backward()`, steps an optimizer (`optimizer.step()`,
        `scaler.step(opt)`), or calls a model (`model(x)`, an `nn.Module` built in this file),
        or a `for` loop over a data loader. Code in loops nested inside a training loop runs
        every step too, so it counts; an epoch loop around a training loop does not.
        """
        for loop in self.enclosing_loops(node):
            if self.is_training_loop(loop):
                return Loop(loop, self.ctx)
        return None

    def loop_role(self, loop: cst.For | cst.While) -> str | None:
        """What a loop that runs every step is for, as `Loop.role` says (cached)."""
        key = ("role", id(loop))
        if key not in self._roles:
            self._roles[key] = self._compute_role(loop)
        return self._roles[key]

    def _compute_role(self, loop: cst.For | cst.While) -> str | None:
        stack: list[cst.CSTNode] = [loop.body]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Call) and self._is_optimizer_step(node):
                return "training"
            if not isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Lambda):
                stack.extend(node.children)
        words = [code_for(loop.iter) if isinstance(loop, cst.For) else ""]
        quiet = False
        for parent, _child in self._ancestors(loop):
            if isinstance(parent, cst.FunctionDef):
                words.append(parent.name.value)
                if any(_is_no_grad(self, d.decorator) for d in parent.decorators):
                    quiet = True
                break
            if isinstance(parent, cst.With | cst.For) and not quiet:
                items = parent.items if isinstance(parent, cst.With) else ()
                quiet = any(_is_no_grad(self, item.item) for item in items)
                if isinstance(parent, cst.For):
                    words.append(code_for(parent.iter))
        if EVAL_NAME.search(" ".join(words)):
            return "evaluation"
        return "inference" if quiet else None

    def is_training_loop(self, loop: cst.For | cst.While) -> bool:
        key = id(loop)
        if key not in self._training:
            self._training[key] = self._compute_training(loop)
        return self._training[key]

    def _compute_training(self, loop: cst.For | cst.While) -> bool:
        if isinstance(loop, cst.For) and self.iterates_loader(loop.iter):
            return True
        calls = self.record.loop_calls.get(id(loop), [])
        return any(self._is_optimizer_step(c) for c in calls) or any(
            self._calls_model(c) for c in calls
        )

    @staticmethod
    def _is_optimizer_step(call: cst.Call) -> bool:
        func = call.func
        if not isinstance(func, cst.Attribute):
            return False
        attr = func.attr.value
        if attr in ("backward", "optimizer_step"):
            return True
        receiver = last_segment(func.value)
        return attr == "step" and bool(receiver and OPTIMIZER_NAME.search(receiver))

    def _calls_model(self, call: cst.Call) -> bool:
        func = call.func
        if not isinstance(func, cst.Name | cst.Attribute):
            return False
        if self.kind(func) is Kind.MODULE:
            return True
        name = last_segment(func)
        if name == "forward" and isinstance(func, cst.Attribute):
            name = last_segment(func.value)
        return bool(name and MODEL_NAME.search(name) and not FACTORY_NAME.match(name))

    def iterates_loader(self, iterable: cst.BaseExpression) -> bool:
        """Whether a `for` loop over `iterable` walks a data loader's batches."""
        for expr in self._unwrap_iterable(iterable):
            if self.kind(expr) is Kind.LOADER:
                return True
            name = last_segment(expr)
            if name and LOADER_NAME.search(name):
                return True
        return False

    @staticmethod
    def _unwrap_iterable(iterable: cst.BaseExpression) -> list[cst.BaseExpression]:
        """`enumerate(tqdm(loader))` -> [loader]; `zip(a, b)` -> [a, b]."""
        out: list[cst.BaseExpression] = []
        stack = [iterable]
        while stack:
            expr = stack.pop()
            if isinstance(expr, cst.Call) and last_segment(expr.func) in ITER_WRAPPERS:
                positional = [a.value for a in expr.args if a.keyword is None and not a.star]
                if last_segment(expr.func) == "zip":
                    stack.extend(positional)
                elif positional:
                    stack.append(positional[0])
            else:
                out.append(expr)
        return out

    def periodic(self, node: cst.CSTNode, loop: Loop) -> bool:
        """Whether `node` sits under `if step % N == 0:` inside `loop` (runs every N steps)."""
        for parent, child in self._ancestors(node):
            if parent is loop.node:
                return False
            if isinstance(parent, cst.If) and child is parent.body and _is_periodic(parent.test):
                return True
        return False

    # -- ranks -----------------------------------------------------------------------------

    def rank_branch(self, node: cst.CSTNode) -> RankBranch | None:
        """The branch, early exit or decorator that makes only some ranks run `node`."""
        for parent, child in self._ancestors(node):
            if isinstance(parent, cst.If | cst.IfExp) and child in (parent.body, parent.orelse):
                if self.is_rank_test(parent.test):
                    return self._branch(parent.test, parent)
            elif isinstance(parent, cst.BooleanOperation) and child is parent.right:
                # `rank == 0 and loss.item() > 1`: the right side runs on some ranks only
                if isinstance(parent.operator, cst.And) and self.is_rank_test(parent.left):
                    return self._branch(parent.left, parent)
            elif isinstance(parent, cst.IndentedBlock | cst.Module):
                exit_if = self._rank_exit_before(parent, child)
                if exit_if is not None:
                    return RankBranch("exit", short(exit_if.test), exit_if, self.ctx)
            elif isinstance(parent, cst.FunctionDef):
                for deco in parent.decorators:
                    target = deco.decorator
                    if isinstance(target, cst.Call):
                        target = target.func
                    if last_segment(target) in RANK_DECORATORS:
                        return RankBranch("decorator", short(target), deco, self.ctx)
                return None
            elif isinstance(parent, cst.ClassDef | cst.Lambda):
                return None
        return None

    def _branch(self, test: cst.BaseExpression, where: cst.CSTNode) -> RankBranch:
        """Name a short test whole, and a long one by the part that depends on the rank."""
        part = test
        while isinstance(part, cst.BooleanOperation | cst.UnaryOperation):
            if isinstance(part, cst.UnaryOperation):
                if not isinstance(part.operator, cst.Not):
                    break
                part = part.expression
            else:
                part = part.left if self.is_rank_test(part.left) else part.right
        if part is test or len(short(test, 80)) <= 40:
            return RankBranch("if", short(test), where, self.ctx)
        return RankBranch("part", short(part), where, self.ctx)

    def _rank_exit_before(
        self, block: cst.IndentedBlock | cst.Module, stmt: cst.CSTNode
    ) -> cst.If | None:
        """An `if <rank test>: return/continue/break/raise` before `stmt` in `block`."""
        key = id(block)
        if key not in self._exits:
            exits = []
            for i, s in enumerate(block.body):
                exit_if = isinstance(s, cst.If) and s.orelse is None and _exits(s.body)
                if exit_if and self.is_rank_test(cast(cst.If, s).test):
                    exits.append((i, s))
            self._exits[key] = exits  # type: ignore[assignment]  # the If statements found above
        if not self._exits[key]:
            return None
        index = statement_index(self.ctx, block, stmt)
        index = -1 if index is None else index
        return next((s for i, s in self._exits[key] if i < index), None)

    def is_rank_test(self, test: cst.BaseExpression, depth: int = 0) -> bool:
        """Whether a test's outcome differs between ranks (`rank == 0`, `is_master`, ...).

        A comparison of the rank with -1 or None only asks "is this job distributed?", which
        every rank answers alike, so it does not count.
        """
        if isinstance(test, cst.BooleanOperation):
            return self.is_rank_test(test.left, depth) or self.is_rank_test(test.right, depth)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.is_rank_test(test.expression, depth)
        if isinstance(test, cst.Comparison):
            operands = [test.left, *(c.comparator for c in test.comparisons)]
            ranked = [o for o in operands if self.refers_to_rank(o, depth=depth)]
            others = [o for o in operands if not any(o is r for r in ranked)]
            if not ranked:
                return False
            return not (others and all(_is_minus_one_or_none(o) for o in others))
        return self.refers_to_rank(test, depth=depth)

    def refers_to_rank(
        self, expr: cst.CSTNode, *, index_only: bool = False, depth: int = 0
    ) -> bool:
        """Whether `expr` reads the process's rank (a rank name, `get_rank()`, `$RANK`).

        A name that is the whole expression is also followed to its assignments
        (`log_here = rank == 0`), one level; names inside a larger expression are not.
        With `index_only`, only the integer rank counts, not `is_master` and friends.
        """
        pattern = RANK_INDEX_NAME if index_only else RANK_NAME
        stack = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Lambda):
                continue
            if isinstance(node, cst.Attribute):
                if pattern.match(node.attr.value):
                    return True
                stack.append(node.value)
                continue
            if isinstance(node, cst.Name):
                if pattern.match(node.value):
                    return True
                if (
                    depth == 0
                    and node is expr
                    and any(
                        self.refers_to_rank(v, index_only=True, depth=1)
                        if index_only
                        else self.is_rank_test(cast(cst.BaseExpression, v), depth=1)
                        for v in self.assigned_values(node)
                    )
                ):
                    return True
                continue
            if isinstance(node, cst.SimpleString) and string_value(node) in RANK_ENV:
                return True
            stack.extend(node.children)
        return False

    def assigned_values(self, name: cst.Name) -> list[cst.CSTNode]:
        """The right-hand sides of the plain `name = ...` assignments that reach `name`."""
        found = self._lookup(name)
        if found is None:
            return []
        return [b.value for b in found[1] if b.how == "assign" and not b.path and b.value]

    # -- values ----------------------------------------------------------------------------

    def kind(self, node: cst.CSTNode) -> Kind | None:
        """What `node` evaluates to, or None when the code does not show it."""
        key = id(node)
        if key in self._kinds:
            return self._kinds[key]
        self._kinds[key] = None  # a cycle through this node means "unknown"
        result = self._kind(node)
        self._kinds[key] = result
        return result

    def is_tensor(self, node: cst.CSTNode) -> bool:
        return self.kind(node) is Kind.TENSOR

    def _kind(self, node: cst.CSTNode) -> Kind | None:
        if isinstance(node, cst.Name):
            return self._name_kind(node)
        if isinstance(node, cst.Attribute):
            base = self.kind(node.value)
            if base is Kind.TENSOR:
                return None if node.attr.value in NON_TENSOR_ATTRS else Kind.TENSOR
            return Kind.HOST if base is Kind.HOST else None
        if isinstance(node, cst.Subscript):
            base = self.kind(node.value)
            return base if base in (Kind.TENSOR, Kind.HOST) else None
        if isinstance(node, cst.Call):
            return self.call_kind(node)
        if isinstance(node, cst.BinaryOperation):
            sides = {self.kind(node.left), self.kind(node.right)}
            if Kind.TENSOR in sides:
                return Kind.TENSOR
            return Kind.HOST if Kind.HOST in sides else None
        if isinstance(node, cst.UnaryOperation):
            inner = self.kind(node.expression)
            if isinstance(node.operator, cst.Not):
                return Kind.HOST if inner in (Kind.TENSOR, Kind.HOST) else None
            return inner if inner in (Kind.TENSOR, Kind.HOST) else None
        if isinstance(node, cst.Comparison):
            if all(_is_identity(c.operator) for c in node.comparisons):
                return None
            operands = [node.left, *(c.comparator for c in node.comparisons)]
            return Kind.TENSOR if any(self.is_tensor(o) for o in operands) else None
        if isinstance(node, cst.BooleanOperation):
            return Kind.TENSOR if self.is_tensor(node.left) or self.is_tensor(node.right) else None
        if isinstance(node, cst.IfExp):
            return Kind.TENSOR if self.is_tensor(node.body) or self.is_tensor(node.orelse) else None
        if isinstance(node, cst.NamedExpr):
            return self.kind(node.value)
        return None

    def call_kind(self, call: cst.Call) -> Kind | None:
        for name in self.qualified(call):
            kind = _qualified_call_kind(name)
            if kind is not None:
                return kind
        func = call.func
        if isinstance(func, cst.Name) and func.value in ("float", "int", "bool", "round"):
            args = [a.value for a in call.args]
            if args and self.kind(args[0]) in (Kind.TENSOR, Kind.HOST):
                return Kind.HOST
            return None
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            receiver = self.kind(func.value)
            if receiver is Kind.TENSOR:
                if attr in HOST_READS - {"cpu"}:
                    return Kind.HOST
                return None if attr in NON_TENSOR_METHODS else Kind.TENSOR
            if receiver is Kind.HOST:
                return Kind.HOST
            if receiver is Kind.MODULE:
                if attr in MODULE_METHODS:
                    return Kind.MODULE
                return Kind.TENSOR if attr in ("forward", "generate") else None
            if attr in HOST_READS - {"cpu"}:
                return Kind.HOST
            if attr == "from_pretrained":
                return Kind.MODULE
        callee = self.kind(func)
        if callee is Kind.MODULE:
            return Kind.TENSOR
        if callee is Kind.MODULE_CLASS:
            return Kind.MODULE
        last = last_segment(func)
        if last is None or callee is not None:
            return None
        name = last
        if FACTORY_NAME.match(name):
            return Kind.MODULE
        if MODEL_NAME.search(name) or LOSS_NAME.search(name):
            return Kind.TENSOR
        if "loader" in name.lower():
            return Kind.LOADER
        return None

    def _name_kind(self, name: cst.Name) -> Kind | None:
        """A name's kind over all its bindings in scope: one agreed kind, or None.

        Bindings that show nothing (`total = 0.0`) do not count against the others, so
        `total = 0.0; total += loss` makes `total` a tensor.
        """
        found = self._lookup(name)
        if found is None:
            return None
        scope, bindings = found
        key = (scope, name.value)
        if key in self._name_kinds:
            return self._name_kinds[key]
        self._name_kinds[key] = None
        kinds = {k for k in (self._binding_kind(b) for b in bindings) if k is not None}
        result = kinds.pop() if len(kinds) == 1 else None
        self._name_kinds[key] = result
        return result

    def _binding_kind(self, binding: Binding) -> Kind | None:
        value = binding.value
        if binding.how == "param" and isinstance(value, cst.Param):
            annotation = value.annotation
            if annotation is not None and "Tensor" in code_for(annotation.annotation):
                return Kind.TENSOR
            name = value.name.value
            if MODEL_NAME.search(name) or LOSS_NAME.search(name):
                return Kind.MODULE
            return Kind.LOADER if LOADER_NAME.search(name) else None
        if binding.how == "class" and isinstance(value, cst.ClassDef):
            bases = " ".join(code_for(b.value) for b in value.bases)
            return Kind.MODULE_CLASS if re.search(r"(Module|Model)\b", bases) else None
        if value is None:
            return None
        if binding.how == "assign":
            return self._destructured(value, binding.path)
        if binding.how == "aug":
            kind = self.kind(value)
            return kind if kind in (Kind.TENSOR, Kind.HOST) else None
        if binding.how == "for" and isinstance(value, cst.BaseExpression):
            return self._item_kind(value, binding.path)
        return None

    def _destructured(self, value: cst.CSTNode, path: tuple[int, ...]) -> Kind | None:
        for index in path:
            if isinstance(value, cst.Tuple | cst.List) and 0 <= index < len(value.elements):
                value = value.elements[index].value
            else:
                kind = self.kind(value)
                return kind if kind in (Kind.TENSOR, Kind.HOST) else None
        return self.kind(value)

    def _item_kind(self, iterable: cst.BaseExpression, path: tuple[int, ...]) -> Kind | None:
        """The kind of the loop variable at `path` in `for <target> in iterable`."""
        expr: cst.BaseExpression | None = iterable
        while isinstance(expr, cst.Call) and last_segment(expr.func) in ITER_WRAPPERS:
            wrapper = last_segment(expr.func)
            positional = [a.value for a in expr.args if a.keyword is None and not a.star]
            if wrapper in ("enumerate", "zip"):
                if not path:
                    return None
                head, path = path[0], path[1:]
                if wrapper == "enumerate":
                    if head == 0:
                        return None  # the index
                    expr = positional[0] if positional else None
                else:
                    expr = positional[head] if head < len(positional) else None
            else:
                expr = positional[0] if positional else None
        if expr is None:
            return None
        if self.iterates_loader(expr) or self.is_tensor(expr):
            return Kind.TENSOR
        return None

    def is_mask(self, expr: cst.CSTNode, depth: int = 0) -> bool:
        """Whether `expr` is a boolean tensor (a comparison of tensors, `isnan`, `~mask`)."""
        if depth > 3:
            return False
        if isinstance(expr, cst.Comparison):
            return self.is_tensor(expr)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert):
            return self.is_mask(expr.expression, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and isinstance(
            expr.operator, cst.BitAnd | cst.BitOr | cst.BitXor
        ):
            return self.is_mask(expr.left, depth + 1) or self.is_mask(expr.right, depth + 1)
        if isinstance(expr, cst.Call):
            if any(q in MASK_TORCH for q in self.qualified(expr)):
                return True
            func = expr.func
            return (
                isinstance(func, cst.Attribute)
                and func.attr.value in MASK_METHODS
                and self.is_tensor(func.value)
            )
        if isinstance(expr, cst.Name):
            values = self.assigned_values(expr)
            return bool(values) and all(self.is_mask(v, depth + 1) for v in values)
        return False

    def carries_tensor(self, expr: cst.CSTNode) -> bool:
        """Whether printing or logging `expr` formats a tensor's value (not one already read)."""
        if self.is_tensor(expr):
            return True
        if isinstance(expr, cst.FormattedString):
            return any(
                isinstance(p, cst.FormattedStringExpression) and self.carries_tensor(p.expression)
                for p in expr.parts
            )
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
            return _is_string(expr.left) and self.carries_tensor(expr.right)
        if isinstance(expr, cst.Call):
            func = expr.func
            is_format = isinstance(func, cst.Attribute) and func.attr.value == "format"
            is_str = isinstance(func, cst.Name) and func.value in ("str", "repr")
            if is_format or is_str:
                return any(self.carries_tensor(a.value) for a in expr.args)
            return False
        if isinstance(expr, cst.Tuple | cst.List | cst.Set):
            return any(self.carries_tensor(e.value) for e in expr.elements)
        if isinstance(expr, cst.Dict):
            return any(
                isinstance(e, cst.DictElement) and self.carries_tensor(e.value)
                for e in expr.elements
            )
        return False

    @staticmethod
    def may_read(call: cst.Call) -> bool:
        """A cheap syntactic test: could `host_read(call)` be true?"""
        func = call.func
        if isinstance(func, cst.Attribute):
            return func.attr.value in HOST_READS
        return isinstance(func, cst.Name) and func.value in ("float", "int", "bool")

    def host_read(self, call: cst.Call) -> str | None:
        """`.item()` etc. when `call` copies a tensor to the host; None otherwise.

        Only the first read of a chain counts (`x.cpu().numpy()` is one read, at `.cpu()`),
        and values the code shows are already on the host (numpy arrays) are skipped.
        """
        func = call.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method not in HOST_READS:
                return None
            if method in ("item", "tolist") and any(a.keyword is None for a in call.args):
                return None
            receiver = func.value
            if isinstance(receiver, cst.Name | cst.Attribute) and self.qualified(receiver):
                return None  # a module's function, not a tensor's method
            if self.kind(receiver) is Kind.HOST or _chain_has_read(receiver):
                return None
            return f".{method}()"
        if (
            isinstance(func, cst.Name)
            and func.value in ("float", "int", "bool")
            and len(call.args) == 1
            and not self.qualified(func)
            and self.is_tensor(call.args[0].value)
        ):
            return f"{func.value}(...)"
        return None

    def is_log_call(self, call: cst.Call) -> bool:
        """`print`, a logger's level methods, trackers (wandb, TensorBoard, tqdm postfix)."""
        func = call.func
        if isinstance(func, cst.Name):
            return func.value == "print"
        if not isinstance(func, cst.Attribute):
            return False
        method = func.attr.value
        receiver = last_segment(func.value)
        if method == "print" or (method == "write" and receiver == "tqdm"):
            return True
        if method in LOG_METHODS:
            return True
        if any(q.startswith("logging.") for q in self.qualified(call)):
            return True
        if receiver is None:
            return False
        if method in LOG_LEVELS:
            return bool(LOGGER_NAME.search(receiver))
        return method == "log" and bool(TRACKER_NAME.search(receiver))


# Words that name evaluation: `val_loader`, `evaluate`, `test_set`, `validation`.
EVAL_NAME = re.compile(r"(?i)(?:^|[^a-z])(?:val|valid|validation|eval|evaluate|test)(?:[^a-z]|$)")
NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad")


def _is_no_grad(facts: FlowFacts, expr: cst.BaseExpression) -> bool:
    target = expr.func if isinstance(expr, cst.Call) else expr
    return bool(facts.qualified(target) & set(NO_GRAD))


MASK_TORCH = frozenset(
    f"torch.{n}"
    for n in (
        "isnan",
        "isinf",
        "isfinite",
        "isneginf",
        "isposinf",
        "logical_and",
        "logical_or",
        "logical_not",
        "logical_xor",
        "eq",
        "ne",
        "gt",
        "ge",
        "lt",
        "le",
        "isin",
        "isclose",
    )
)
MASK_METHODS = frozenset(
    {"bool", "isnan", "isinf", "isfinite", "eq", "ne", "gt", "ge", "lt", "le", "logical_not"}
    | {"logical_and", "logical_or", "isin"}
)


def _qualified_call_kind(name: str) -> Kind | None:
    """The kind of a call to an imported name, from its qualified name alone."""
    if name in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"):
        return Kind.LOADER
    if name in HOST_TORCH or name.startswith(("numpy.", "math.")):
        return Kind.HOST
    if name.startswith(("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")):
        return Kind.TENSOR
    last = name.rsplit(".", 1)[-1]
    if name.startswith("torch.nn.") and last[:1].isupper():
        return Kind.MODULE
    if (
        name == "torch.compile"
        or name.startswith("torchvision.models.")
        or name.endswith(".create_model")
    ):
        return Kind.MODULE
    parts = name.split(".")
    if len(parts) == 2 and parts[0] == "torch":
        if last in NON_TENSOR_TORCH or last.startswith(("set_", "get_", "is_", "use_")):
            return None
        if last[:1].isupper() and last != "Tensor":
            return None
        return Kind.TENSOR
    return None


def _chain_has_read(expr: cst.CSTNode) -> bool:
    """Whether an attribute/call/subscript chain already contains a host read."""
    node: cst.CSTNode | None = expr
    while node is not None:
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in HOST_READS:
                return True
            node = func.value if isinstance(func, cst.Attribute) else None
        elif isinstance(node, cst.Attribute | cst.Subscript):
            node = node.value
        else:
            node = None
    return False


def _is_identity(op: cst.BaseCompOp) -> bool:
    return isinstance(op, cst.Is | cst.IsNot | cst.In | cst.NotIn)


def _is_minus_one_or_none(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Name):
        return node.value == "None"
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
        and node.expression.value == "1"
    )


def _is_periodic(test: cst.BaseExpression) -> bool:
    """`step % N == 0`, `not step % N`, possibly joined with `and` to other conditions."""
    if isinstance(test, cst.BooleanOperation):
        if isinstance(test.operator, cst.And):
            return _is_periodic(test.left) or _is_periodic(test.right)
        return _is_periodic(test.left) and _is_periodic(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _is_modulo(test.expression)
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
    ):
        return _is_modulo(test.left) or _is_modulo(test.comparisons[0].comparator)
    return False


def _is_modulo(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo)


def _exits(body: cst.BaseSuite) -> bool:
    """Whether a block always leaves early (ends in return, continue or break).

    `raise` does not count: an `if ...: raise` is an error check every healthy rank passes.
    """
    if isinstance(body, cst.SimpleStatementSuite):
        statements: list[cst.CSTNode] = list(body.body)
    else:
        last = body.body[-1] if body.body else None
        if not isinstance(last, cst.SimpleStatementLine):
            return False
        statements = list(last.body)
    return bool(statements) and isinstance(statements[-1], cst.Return | cst.Continue | cst.Break)
