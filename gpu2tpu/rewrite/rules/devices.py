"""G2T1xx: device placement. Code that names CUDA where it means "the accelerator".

Every fix here does on an NVIDIA GPU exactly what the original did: a device index is kept
(`"cuda:1"` becomes `f"{device.type}:1"`, which is `"cuda:1"` on CUDA), an argument that
cannot be carried over is reported, and a test that guards code only CUDA can run is not
widened to every accelerator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import libcst as cst

from ..analysis.branches import (
    accelerator_known,
    conjuncts,
)
from ..analysis.defaults import option_name
from ..analysis.edits import (
    carries_prefix,
    cuda_only_choice,
    find_arg,
    indexed_device_string,
    is_cuda_only,
    keyword,
    needs_parentheses,
    on_cuda_only,
    parenthesized,
    prefixed_device_string,
    string_literal,
    unpacks,
)
from ..analysis.literals import (
    attribute_named,
    cuda_format_call,
    cuda_literal,
    cuda_prefix,
    cuda_string_index,
    is_call_to_attr,
    is_name,
    last_segment,
    literal_index,
    short,
    string_value,
)
from ..analysis.names import defines_attribute, is_torch_device_call
from ..analysis.ranks import rank_index, rank_string
from ..analysis.values import DeviceUse, module_values
from ..core.model import Safety
from .base import Rule, RuleContext, own_device_kind

DEVICE_KWARGS = frozenset({"device", "map_location", "output_device"})
STORAGE_METHODS = frozenset({"storage", "untyped_storage", "_typed_storage", "_untyped_storage"})


def _indexed_api(rule: Rule, call: cst.Call) -> bool:
    """A call of torch's per-device APIs (`torch.cuda.memory_allocated(device=0)`): its
    `device` is an index as often as a device, and rules of their own rewrite it."""
    name = rule.ctx.qualified_name(call.func) or ""
    return name.startswith(("torch.cuda.", "torch.accelerator.", "torch.xpu.", "torch.mps."))


class CudaMethod(Rule):
    """`.cuda()` moves a tensor or module to an NVIDIA GPU.

    Why: the call fails on TPUs and on machines without CUDA. `.to(device)` with the module's
    device runs anywhere and is `.cuda()` on CUDA. Every argument is kept: a literal index
    becomes `torch.device(device.type, i)` (`cuda:i` on CUDA), `non_blocking` (also given by
    position) and `memory_format` become keywords of `.to`. The process's rank as index
    (`local_rank`, or a value the module passes to DDP's `device_ids`, G2T407) is kept on
    CUDA: `.to(rank if device.type == "cuda" else device)`. Any other index that is not a
    literal is reported: `.cuda(i)` accepts an int, a string or a device, and `-1` (what
    `get_device()` gives for a CPU tensor) means the current device, which `torch.device`
    does not accept.
    Storages (`x.untyped_storage().cuda()`) are reported: `UntypedStorage.to` takes keywords
    only. A module that defines its own `cuda` method has its `self.cuda()` calls reported.

    Example:
        model.cuda()                  ->  model.to(device)
        x.cuda(non_blocking=True)     ->  x.to(device, non_blocking=True)
        x.cuda(1, True)               ->  x.to(torch.device(device.type, 1), non_blocking=True)
        x.cuda(local_rank)            ->  x.to(local_rank if device.type == "cuda" else device)
        x.cuda(i)                     # reported: keep the index on CUDA, by hand
    """

    code = "G2T101"
    compat_torch = "0.4"
    name = "cuda-method"
    safety = Safety.SAFE
    message = "`{call}` ties the value to NVIDIA GPUs; use the module's device"
    hint = "use `.to(device)`"

    def visit_Call(self, node: cst.Call) -> None:
        if not is_call_to_attr(node, "cuda"):
            return
        receiver = node.func.value  # type: ignore[attr-defined]  # func is an Attribute, matched above
        if isinstance(receiver, cst.Name | cst.Attribute) and self.qualified_names(receiver):
            return  # `<imported module or class>.cuda(...)`, not a tensor or module method
        message = self.message.format(call=self.short(node, 50))
        if unpacks(node):
            self.report(node, message, hint="unpacked arguments to `.cuda()`: move by hand")
            return
        if self._is_storage(receiver):
            self.report(
                node,
                message,
                hint="a storage: keep `.cuda()` for CUDA, or `.to(device=device)` (keywords only)",
            )
            return
        if self._own_method(receiver):
            self.report(
                node, message, hint="this module defines its own `cuda` method: decide by hand"
            )
            return
        device = find_arg(node, "device", 0)
        non_blocking = find_arg(node, "non_blocking", 1)
        known = {id(a) for a in (device, non_blocking) if a is not None}
        others = [a for a in node.args if id(a) not in known]
        if any(a.keyword is None or a.keyword.value != "memory_format" for a in others):
            self.report(node, message, hint="arguments `.to` does not take: move by hand")
            return
        index = None
        rank = False
        if device is not None and not is_name(device.value, "None"):
            index = literal_index(device.value)
            rank = index is None and self._rank_index(device.value)
            if index is None and not rank:
                self.report(
                    node,
                    message,
                    hint="keep the index on CUDA: `.to(torch.device(device.type, i))` when `i` "
                    "is a non-negative int; a TPU process owns only index 0",
                )
                return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
            target = ctx.indexed_device(index) if index is not None else ctx.device()
            if rank:
                moved = find_arg(updated, "device", 0)
                assert moved is not None
                target = on_cuda_only(ctx, moved.value, ctx.device())
            args = [cst.Arg(target)]
            new_blocking = find_arg(updated, "non_blocking", 1)
            if new_blocking is not None:
                args.append(keyword("non_blocking", new_blocking.value))
            args.extend(
                keyword("memory_format", a.value)
                for a in updated.args
                if a.keyword is not None and a.keyword.value == "memory_format"
            )
            spaced = [
                a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                for a in args[:-1]
            ]
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=[*spaced, args[-1]]
            )

        self.report(node, message, fix=fix, uses_device=True)

    def _rank_index(self, value: cst.BaseExpression) -> bool:
        """Whether `.cuda(value)` picks the process's GPU by its rank (`local_rank`, the DDP
        tutorial's `self.gpu_id`): kept on CUDA, the module's device elsewhere."""
        return not is_cuda_only(value) and rank_index(self.ctx, value)

    def _is_storage(self, receiver: cst.CSTNode) -> bool:
        if isinstance(receiver, cst.Call) and attribute_named(receiver.func, *STORAGE_METHODS):
            return True
        name = receiver.attr.value if isinstance(receiver, cst.Attribute) else None
        if isinstance(receiver, cst.Name):
            name = receiver.value
        return name is not None and "storage" in name.lower()

    def _own_method(self, receiver: cst.CSTNode) -> bool:
        if not defines_attribute(self.ctx, "cuda"):
            return False
        if isinstance(receiver, cst.Name) and receiver.value in ("self", "cls"):
            return True
        return isinstance(receiver, cst.Call) and is_name(receiver.func, "super")


class CudaDeviceString(Rule):
    """A device string such as `'cuda'`, `'cuda:1'`, `f'cuda:{rank}'` or `"cuda:{}".format(i)`.

    Why: the string names NVIDIA GPUs; on a TPU (or any other accelerator) it fails. `'cuda'`
    becomes the module's device variable (inside a branch that has just found an
    accelerator, `torch.accelerator.current_accelerator()`); a string with an index keeps the
    index on the module's device type (`f"{device.type}:1"` is `"cuda:1"` on CUDA), and
    `torch.device("cuda", i)` keeps `i`, except the process's rank (`local_rank`), which a
    TPU process does not have: that device is the rank's GPU on CUDA and the module's device
    elsewhere, as `.to(rank)` (G2T407), also when the rank is in the string
    (`f"cuda:{local_rank}"`, `"cuda:{}".format(rank)`). Covered places: `device=`, `map_location=` and
    `output_device=` arguments of any call (tensor factories, `torch.load`,
    `torch.Generator`, ...), the first argument of `.to(...)`, and `torch.device(...)` itself.

    Example:
        torch.zeros(3, device="cuda")           ->  torch.zeros(3, device=device)
        x.to("cuda:1")                          ->  x.to(f"{device.type}:1")
        torch.device("cuda", i)                 ->  torch.device(device.type, i)
        torch.device("cuda", local_rank)        ->  (torch.device(device.type, local_rank)
                                                     if device.type == "cuda" else device)
        x.to(1)                                 ->  x.to(torch.device(device.type, 1))
        torch.load(p, map_location=f"cuda:{r}") ->  torch.load(p, map_location=f"{device.type}:{r}")
        torch.device(f"cuda:{args.local_rank}") ->  (torch.device(f"{device.type}:{args.local_rank}")
                                                     if device.type == "cuda" else device)
    """

    code = "G2T102"
    compat_torch = "0.4"
    name = "cuda-device-string"
    safety = Safety.SAFE
    message = "device string {value} names NVIDIA GPUs; use the module's device"
    hint = "use the module's `device` variable"
    # `.to(1)` and `device=0` have no `cuda` in them: the digits are tokens of their own.
    tokens = (
        b"cuda",
        *(f".to({d}".encode() for d in range(10)),
        *(f"device={d}".encode() for d in range(10)),
    )
    follows_devices = True  # `net.to(gpu_ids[0])` holds no token

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        # CUDA values written outside a device argument, and device arguments that are not
        # literals: where they go is decided once the traversal is done (analysis/values.py).
        self.sources: list[cst.CSTNode] = []
        self.arguments: list[tuple[cst.Call, cst.BaseExpression]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if is_torch_device_call(self.ctx, node):
            self._torch_device(node)
            return
        if cuda_format_call(node) is not None:
            self._source(node)
        if attribute_named(node.func, "to") and node.args:
            first = node.args[0]
            if first.keyword is None and not first.star and self._is_cuda_string(first.value):
                self._replace(first.value)
            elif first.keyword is None and not first.star and literal_index(first.value):
                self._ordinal(node, first.value)
            elif first.keyword is None and not first.star:
                self.arguments.append((node, first.value))
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in DEVICE_KWARGS:
                if self._is_cuda_string(arg.value):
                    self._replace(arg.value, arg.keyword.value == "map_location")
                elif arg.keyword.value == "device" and literal_index(arg.value):
                    if not (_indexed_api(self, node) or attribute_named(node.func, "cuda")):
                        self._ordinal(node, arg.value)  # (`.cuda(device=0)` is G2T101's)
                else:
                    self.arguments.append((node, arg.value))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if cuda_literal(node) or cuda_prefix(node):
            if not attribute_named(self.parent(node) or node, "format"):
                self._source(node)  # (`"cuda:{}".format(i)` is one, as a whole)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        if cuda_literal(node):
            self._source(node)

    def _source(self, node: cst.CSTNode) -> None:
        """A CUDA value that may be kept for later (assigned, returned, a default, an item):
        not compared, not a key, not an index."""
        child, parent = node, self.parent(node)
        while parent is not None and not isinstance(parent, cst.BaseStatement):
            if isinstance(parent, cst.Comparison | cst.ComparisonTarget | cst.SubscriptElement):
                return
            if isinstance(parent, cst.DictElement) and parent.key is child:
                return
            child, parent = parent, self.parent(parent)
        self.sources.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if not (self.sources or self.arguments):
            return
        values = module_values(self.ctx)
        if values is None:
            return
        taken = {id(p.node) for p in self.ctx.reports()}
        for node in self.sources:
            if self._within(node, taken):
                continue  # its own rule has it (`device = "cuda"`: G2T103; a default: G2T113)
            uses = values.device_uses(*self.position(node))
            if uses:
                self._flow(node, uses)
        for call, value in self.arguments:
            if id(value) in taken or id(call) in taken:
                continue  # `.to(rank)`: G2T407; `.cuda(i)`: G2T101
            if cuda_only_choice(value):
                continue  # `i if device.type == "cuda" else None`: the ordinal on CUDA only
            found = values.ordinal_source(*self.position(value))
            if found is None:
                continue
            line, always = found
            message = f"`{short(value, 30)}` is a CUDA device ordinal (the int at line {line})"
            if not always:
                self.report(
                    value,
                    message,
                    hint="on a TPU each process owns one chip: use the module's device, or "
                    "`torch.device(device.type, i)` to keep the index on CUDA",
                )
                continue
            self.report(
                value,
                message,
                fix=self.ctx.indexed_device,  # type: ignore[arg-type]  # takes the ordinal node, returns a Call: a Fix
                hint="use `torch.device(device.type, i)` (`cuda:i` on CUDA)",
                uses_device=True,
            )

    def _within(self, node: cst.CSTNode, taken: set[int]) -> bool:
        """Whether `node` is, or is inside, something a rule has reported already."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, cst.BaseStatement):
            if id(current) in taken or self.ctx.is_claimed(current):
                return True
            current = self.parent(current)
        return False

    def _flow(self, literal: cst.CSTNode, uses: list[DeviceUse]) -> None:
        """A CUDA device value that reaches a device argument through a variable, an item,
        an attribute, a default or a return: it becomes the module's device type as a
        string, as the original was one (`"cuda"` on CUDA), keeping an index."""
        ctx = self.ctx
        use = uses[0]
        where = f"{use.what} at line {use.line}"
        message = f"device string `{short(literal, 30)}` names NVIDIA GPUs and reaches {where}"
        location = any(u.location for u in uses)
        cpu = string_literal(self, literal, "cpu")
        prefix = cuda_prefix(literal)
        if prefix and (location or not carries_prefix(literal)):
            self.report(
                literal,
                message,
                hint="build it from the module's device type (`device.type`), and load with "
                '`map_location="cpu"` where the device is the CPU',
            )
            return

        rank = rank_string(self.ctx, literal)
        parens = needs_parentheses(self, literal)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            if cuda_string_index(updated) == "":
                return ctx.device_type()
            if prefix:
                return prefixed_device_string(ctx, updated)
            indexed = indexed_device_string(ctx, updated)
            if rank:  # the rank's GPU on CUDA, the device's type (a string too) elsewhere
                return parenthesized(on_cuda_only(ctx, indexed, ctx.device_type()), parens)
            if not location:
                return indexed
            on_cpu = cst.Comparison(
                left=ctx.device_type(), comparisons=[cst.ComparisonTarget(cst.NotEqual(), cpu)]
            )
            return parenthesized(
                cst.IfExp(test=on_cpu, body=indexed, orelse=cpu), needs_parentheses(self, literal)
            )

        self.report(
            literal,
            message,
            fix=fix,
            hint='use the module\'s device type: `device.type` (`"cuda"` on CUDA)',
            uses_device=True,
        )

    def _ordinal(self, call: cst.Call, ordinal: cst.BaseExpression) -> None:
        """`x.to(1)`, `torch.zeros(3, device=0)`: an int device is a CUDA ordinal; it becomes
        the device with that index on the module's device type (`cuda:1` on CUDA)."""
        receiver = getattr(call.func, "value", None)
        if isinstance(receiver, cst.Name | cst.Attribute) and self.qualified_names(receiver):
            if attribute_named(call.func, "to"):
                return  # a module's `to` function, not a tensor's or module's method
        index = literal_index(ordinal)
        assert index is not None
        ctx = self.ctx
        self.report(
            ordinal,
            f"device ordinal `{index}` in `{short(call, 40)}` is a CUDA device",
            fix=lambda updated: ctx.indexed_device(index),
            hint="use `torch.device(device.type, i)` (`cuda:i` on CUDA)",
            uses_device=True,
        )

    @staticmethod
    def _is_cuda_string(node: cst.CSTNode) -> bool:
        return cuda_literal(node) or cuda_format_call(node) is not None

    def _torch_device(self, node: cst.Call) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Call) and is_torch_device_call(self.ctx, parent):
            return
        if unpacks(node):
            return
        first = find_arg(node, "type", 0)
        if first is None or not self._is_cuda_string(first.value):
            return
        index = find_arg(node, "index", 1)
        literal = first.value
        message = self.message.format(value=f"`{self.code_for(literal)}`")
        if index is not None:
            if cuda_string_index(literal) != "":
                return
            ctx = self.ctx
            if rank_index(self.ctx, index.value):
                # torch.device("cuda", local_rank): the rank's GPU on CUDA; a TPU process owns
                # one chip, so the module's device elsewhere (as `.to(rank)`, G2T407)
                self._rank_device(
                    node, message, lambda _: ctx.device_type(), "torch.device(device.type, rank)"
                )
                return
            # torch.device("cuda", i) -> torch.device(device.type, i)
            self.report(literal, message, fix=lambda updated: ctx.device_type(), uses_device=True)
            return
        if rank_string(self.ctx, literal):
            # torch.device(f"cuda:{local_rank}"): as `torch.device("cuda", local_rank)`
            ctx = self.ctx
            self._rank_device(
                node,
                message,
                lambda value: indexed_device_string(ctx, value),
                'torch.device(f"{device.type}:{rank}")',
            )
            return
        if cuda_string_index(literal) == "":
            # torch.device("cuda") -> the device itself
            ctx = self.ctx
            known = accelerator_known(ctx, node)
            self.report(
                node,
                message,
                fix=lambda updated: ctx.current_device(known),
                uses_device=not known,
            )
            return
        self._replace(literal)

    def _rank_device(
        self,
        node: cst.Call,
        message: str,
        on_type: Callable[[cst.BaseExpression], cst.BaseExpression],
        example: str,
    ) -> None:
        """`torch.device(...)` of the process's rank: the same call on CUDA, its device type
        given by `on_type` (from the first argument), and the module's device elsewhere."""
        ctx = self.ctx
        parens = needs_parentheses(self, node)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            first = find_arg(updated, "type", 0)
            assert first is not None
            args = [
                a.with_changes(value=on_type(a.value)) if a is first else a for a in updated.args
            ]
            moved = updated.with_changes(args=args)
            return parenthesized(on_cuda_only(ctx, moved, ctx.device()), parens)

        self.report(
            node,
            message,
            fix=fix,
            hint="on CUDA keep the rank's index, elsewhere use the module's device: "
            f'`{example} if device.type == "cuda" else device`',
            uses_device=True,
        )

    def _replace(self, literal: cst.CSTNode, location: bool = False) -> None:
        """Put the module's device in place of a CUDA device string. A `map_location` with an
        index keeps it, except on the CPU, whose storages `torch.load` tags `cpu` only."""
        ctx = self.ctx
        message = self.message.format(value=f"`{self.code_for(literal)}`")
        if cuda_string_index(literal) == "":
            known = accelerator_known(ctx, literal)
            self.report(
                literal,
                message,
                fix=lambda updated: ctx.current_device(known),
                uses_device=not known,
            )
            return

        cpu = string_literal(self, literal, "cpu")
        rank = rank_string(self.ctx, literal)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            indexed = indexed_device_string(ctx, updated)
            if rank:  # the rank's GPU on CUDA; a TPU process owns one chip (an argument)
                return on_cuda_only(ctx, indexed, ctx.device())
            if not location:
                return indexed
            on_cpu = cst.Comparison(
                left=ctx.device_type(), comparisons=[cst.ComparisonTarget(cst.NotEqual(), cpu)]
            )
            return cst.IfExp(test=on_cpu, body=indexed, orelse=cpu)

        self.report(literal, message, fix=fix, uses_device=True)


def _idiom_parts(rule: Rule, node: cst.CSTNode) -> str | None:
    """For the `'cuda' if torch.cuda.is_available() else 'cpu'` idiom, its value kind."""
    if not isinstance(node, cst.IfExp):
        return None
    test, body, orelse = node.test, node.body, node.orelse
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, body, orelse = test.expression, orelse, body
    if not (isinstance(test, cst.Call) and rule.matches_name(test, "torch.cuda.is_available")):
        return None

    def kind(expr: cst.BaseExpression, want_cuda: bool) -> str | None:
        if isinstance(expr, cst.Call) and is_torch_device_call(rule.ctx, expr) and expr.args:
            inner = expr.args[0].value
            return "device" if kind(inner, want_cuda) == "str" else None
        if want_cuda and cuda_string_index(expr) == "":
            return "str"  # an index makes it a choice of its own (`_conjoined`)
        if not want_cuda and string_value(expr) == "cpu":
            return "str"
        return None

    cuda_kind, cpu_kind = kind(body, True), kind(orelse, False)
    if cuda_kind and cuda_kind == cpu_kind:
        return cuda_kind
    return None


def _availability_conjunct(rule: Rule, test: cst.BaseExpression, alone: bool = False) -> int | None:
    """For `a and torch.cuda.is_available() and b`, the position of the availability call
    among the `and` chain's parts (None unless exactly one, in a chain of two or more, or
    of one with `alone`)."""
    parts = list(conjuncts(test))
    found = [i for i, p in enumerate(parts) if rule.matches_name(p, "torch.cuda.is_available")]
    if len(parts) < (1 if alone else 2) or len(found) != 1:
        return None
    return found[0]


def _branch_kind(rule: Rule, expr: cst.BaseExpression, want_cuda: bool) -> str | None:
    """`"str"` for the string `"cuda"` (or `"cpu"`), `"device"` for `torch.device` of one."""
    if isinstance(expr, cst.Call) and is_torch_device_call(rule.ctx, expr) and len(expr.args) == 1:
        return "device" if _branch_kind(rule, expr.args[0].value, want_cuda) == "str" else None
    if want_cuda and cuda_string_index(expr) == "":
        return "str"
    if want_cuda and (cuda_literal(expr) or cuda_format_call(expr) is not None):
        return "indexed"  # `f"cuda:{rank}"`, `"cuda:1"`: a string with an index
    if not want_cuda and string_value(expr) == "cpu":
        return "str"
    return None


def _negated_disjunct(rule: Rule, test: cst.BaseExpression, alone: bool = False) -> int | None:
    """For `a or not torch.cuda.is_available()`, the position of the negated availability
    call among the `or` chain's parts (None unless exactly one, in a chain of two or more)."""
    parts = _disjuncts(test)
    found = [
        i
        for i, p in enumerate(parts)
        if isinstance(p, cst.UnaryOperation)
        and isinstance(p.operator, cst.Not)
        and rule.matches_name(p.expression, "torch.cuda.is_available")
    ]
    if len(parts) < (1 if alone else 2) or len(found) != 1:
        return None
    return found[0]


def _disjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return [*_disjuncts(test.left), *_disjuncts(test.right)]
    return [test]


def _replace_conjunct(
    test: cst.BaseExpression, index: int, new: cst.BaseExpression, and_chain: bool = True
) -> cst.BaseExpression:
    """`test` with the `index`-th part of its `and` (or `or`) chain replaced by `new`."""
    counter = [0]
    operator = cst.And if and_chain else cst.Or

    def walk(node: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, operator):
            return node.with_changes(left=walk(node.left), right=walk(node.right))
        here = counter[0]
        counter[0] += 1
        return new.with_changes(lpar=node.lpar, rpar=node.rpar) if here == index else node

    return walk(test)


class CudaDeviceIdiom(Rule):
    """The idiom `'cuda' if torch.cuda.is_available() else 'cpu'` and its variants.

    Why: it only knows two devices, so on a TPU it silently falls back to the CPU. The checked
    accelerator (`current_accelerator(check_available=True)`) picks CUDA, TPU, MPS, XPU or the
    CPU. A module-level variable built by the idiom becomes the module's device variable and
    keeps its kind: a string stays a string (`.type`), a `torch.device` stays a device.
    A plain `device = 'cuda'` configuration at module level counts too (`'cuda:0'` keeps its
    index). A variable the module binds more than once (or that `exec` may rebind) is
    rewritten but not adopted: other fixes get a device line of their own. With more conditions (`'cuda' if use_gpu and torch.cuda.is_available() else
    'cpu'`) the whole choice is rewritten at once, the test and the device together, and the
    variable is not adopted: the user's condition may pick the CPU where `.cuda()` did not.
    Inside a branch that has just found an accelerator there is no CPU fallback. A branch
    naming the process's GPU (`f"cuda:{local_rank}"`) keeps the rank on CUDA only, as G2T102
    does: a TPU process owns one chip.

    Example:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        ->  device = (torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")).type
        dev = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        ->  dev = torch.device(torch.accelerator.current_accelerator().type if use_gpu and torch.accelerator.is_available() else "cpu")
    """

    code = "G2T103"
    compat_torch = "0.4"
    name = "cuda-device-idiom"
    safety = Safety.SAFE
    message = "`{idiom}` knows only CUDA and the CPU"
    hint = "use `torch.accelerator.current_accelerator(check_available=True)`"
    tokens = (b"cuda", b"current_accelerator")  # an earlier run's device line is adopted

    def __init__(self, ctx: RuleContext) -> None:
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
        if is_torch_device_call(self.ctx, node) and len(node.args) == 1:
            if _idiom_parts(self, node.args[0].value) == "str":
                self._fix(node, "device")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        kind = _idiom_parts(self, node)
        if kind is None:
            self._conjoined(node)
            return
        parent = self.parent(self.parent(node) or node)
        if isinstance(parent, cst.Call) and is_torch_device_call(self.ctx, parent):
            return  # handled as a whole by visit_Call
        self._fix(node, kind)

    def _conjoined(self, node: cst.IfExp) -> None:
        """`'cuda' if cond and torch.cuda.is_available() else 'cpu'` (and `'cpu' if cond or
        not torch.cuda.is_available() else 'cuda'`): all of it, or none of it."""
        cuda_in_body = _branch_kind(self, node.body, True)
        cuda_in_else = _branch_kind(self, node.orelse, True)
        kind = cuda_in_body or cuda_in_else
        other = node.orelse if cuda_in_body else node.body
        other_kind = _branch_kind(self, other, False)
        if kind is None or other_kind != ("str" if kind == "indexed" else kind):
            return
        if not self._mentions_availability(node.test):
            return
        ctx = self.ctx
        ctx.claim(node)  # no rule rewrites a part of the choice on its own
        alone = kind == "indexed"  # with an index, a test of its own is a choice too
        if cuda_in_body:
            index = _availability_conjunct(self, node.test, alone)
        else:
            index = _negated_disjunct(self, node.test, alone)
        message = self.message.format(idiom=short(node, 60))
        if index is None:
            self.report(
                node,
                message,
                hint="rewrite the choice as a whole: the device "
                "(`torch.accelerator.current_accelerator()`) with its test "
                "(`torch.accelerator.is_available()`)",
            )
            return
        body_side = bool(cuda_in_body)
        # `f"cuda:{local_rank}"`: the rank's GPU on CUDA; a TPU process owns one chip, so
        # elsewhere the accelerator itself (as G2T102 writes `torch.device(f"cuda:{rank}")`)
        ranked = kind == "indexed" and rank_string(ctx, node.body if body_side else node.orelse)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.IfExp)
            available: cst.BaseExpression = cst.Call(
                func=ctx.torch_attr("accelerator.is_available")
            )
            if not body_side:
                available = cst.UnaryOperation(operator=cst.Not(), expression=available)
            accelerator = ctx.current_device(known=True)
            if kind == "indexed":
                kind_expr = cst.Attribute(value=accelerator, attr=cst.Name("type"))
                branch = updated.body if body_side else updated.orelse
                accelerator = indexed_device_string(ctx, branch, kind_expr)
                if ranked:
                    on_cuda = cst.Comparison(
                        left=kind_expr,
                        comparisons=[cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cuda"'))],
                    )
                    accelerator = parenthesized(
                        cst.IfExp(test=on_cuda, body=accelerator, orelse=kind_expr)
                    )
            elif kind == "str":
                accelerator = cst.Attribute(value=accelerator, attr=cst.Name("type"))
            test = _replace_conjunct(updated.test, index, available, and_chain=body_side)
            if body_side:
                return updated.with_changes(test=test, body=accelerator)
            return updated.with_changes(test=test, orelse=accelerator)

        self.report(node, message, fix=fix)

    def _mentions_availability(self, test: cst.BaseExpression) -> bool:
        stack: list[cst.CSTNode] = [test]
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Call) and self.matches_name(
                current, "torch.cuda.is_available"
            ):
                return True
            stack.extend(current.children)
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = node.targets[0].target
        if not isinstance(target, cst.Name):
            return
        value = node.value
        own = None
        if isinstance(value, cst.IfExp | cst.BooleanOperation | cst.Attribute):
            own = own_device_kind(self.code_for(value), self.ctx.torch_alias or "torch")
        if own is not None:  # a device line of an earlier run: the module's device
            if not self.depth and self.ctx.names.bound_once_at_module(
                target.value, self.ctx.source
            ):
                self.ctx.adopt_device(target.value, node, own)
            return
        kind = _idiom_parts(self, value)
        if kind is None and isinstance(value, cst.Call) and is_torch_device_call(self.ctx, value):
            if len(value.args) == 1 and _idiom_parts(self, value.args[0].value) == "str":
                kind = "device"
        if kind is None and "device" in target.value.lower() and cuda_literal(value):
            assignment = f"`{target.value} = {self.code_for(value)}`"
            index = cuda_string_index(value)
            if index not in ("", "0"):
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
            self._fix(value, "str", message=f"{assignment} names NVIDIA GPUs", index=index)
            if index:
                return  # `cuda:0` keeps its index: not the module's device
            kind = "str"
        if kind is None or self.depth:
            return
        if not self.ctx.names.bound_once_at_module(target.value, self.ctx.source):
            return  # reassigned elsewhere: other fixes must not rely on its value
        self.ctx.adopt_device(target.value, node, kind)

    def _fix(
        self, node: cst.CSTNode, kind: str, message: str | None = None, index: str = ""
    ) -> None:
        ctx = self.ctx
        ctx.claim(node)
        known = accelerator_known(ctx, node)
        # `or` and `... if ... else ...` bind less tightly than an attribute, a call's
        # receiver or an operand: `torch.device(<idiom>).type` needs the parentheses.
        parens = needs_parentheses(self, node)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            if known:
                expr = ctx.current_device(known=True)
                if kind == "str":
                    expr = cst.Attribute(value=expr, attr=cst.Name("type"))
            else:
                expr = ctx.device_expression(kind)
            if index:
                expr = cst.BinaryOperation(
                    left=expr, operator=cst.Add(), right=cst.SimpleString(f'":{index}"')
                )
            loose = isinstance(expr, cst.BooleanOperation | cst.IfExp)
            if loose and getattr(updated, "lpar", None):
                wrapped: Any = updated  # an expression in parentheses (tested just above)
                return expr.with_changes(lpar=wrapped.lpar, rpar=wrapped.rpar)
            return parenthesized(expr, loose and parens)

        message = message or self.message.format(idiom=short(node, 60))
        self.report(node, message, fix=fix)


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
    compat_torch = "0.4"
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
        receiver = node.func.value  # type: ignore[attr-defined]  # func is an Attribute, matched above
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


# Calls whose first positional argument is a device (a string or a torch.device).
DEVICE_FIRST = ("torch.Generator", "torch.set_default_device")
# Calls whose second positional argument is a fallback value (`os.environ.get(k, "cuda")`).
FALLBACK_METHODS = frozenset({"get", "pop", "setdefault"})
FALLBACK_FUNCTIONS = ("os.getenv", "os.environ.get")


def names_a_device(name: str | None) -> bool:
    """Whether an option, parameter or key called `name` holds a device: `device`,
    `--device`, `device_type`, `train_dev`, `map_location` (not `backend` or `kernel`)."""
    if not name:
        return False
    lowered = name.lower().lstrip("-")
    if "device" in lowered or lowered in ("map_location", "accelerator"):
        return True
    return "dev" in lowered.replace("-", "_").split("_")


class CudaDefault(Rule):
    """A `"cuda"` default: a parameter's, an option's, a fallback's or a configuration's.

    Why: `def __init__(self, device="cuda")`, `parser.add_argument("--device",
    default="cuda")`, `os.environ.get("DEVICE", "cuda")`, `cfg.get("device", "cuda")` and
    `{"device": "cuda"}` make every run that does not say otherwise ask for an NVIDIA GPU,
    which fails on a TPU. The default becomes the module's device type, a string as before:
    `device.type` is `"cuda"` on CUDA (and `"tpu"` on a TPU); `"cuda:0"` keeps its index
    (`f"{device.type}:0"`). A parameter's default runs when the `def` runs, so the module's
    device line goes above it; where it cannot, or where neither the name says it holds a
    device nor the module uses it as one (`backend="cuda"` may choose a kernel, not a device;
    `where="cuda"` then `x.to(where)` is a device), the default is reported.

    Example:
        def __init__(self, device="cuda"):            ->  def __init__(self, device=accel_device.type):
        parser.add_argument("--device", default="cuda")  ->  ... default=accel_device.type)
        def f(x, device="cuda:0"):                     ->  def f(x, device=f"{accel_device.type}:0"):
        def f(x, backend="cuda"):                      # reported: a device, or a kernel choice?
    """

    code = "G2T113"
    compat_torch = "0.4"
    name = "cuda-default"
    safety = Safety.SAFE
    message = "{what} defaults to {value}: every run asks for an NVIDIA GPU"
    hint = 'default to the module\'s device type: `device.type` (`"cuda"` on CUDA)'

    def visit_Param(self, node: cst.Param) -> None:
        default = node.default
        if default is None or not cuda_literal(default):
            return
        name = node.name.value
        self._default(default, f"parameter `{name}`", names_a_device(name))

    def visit_Call(self, node: cst.Call) -> None:
        if unpacks(node):
            return
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "default":
                if cuda_literal(arg.value):
                    option = option_name(node)
                    what = f"option `{option}`" if option else f"`{short(node, 40)}`"
                    self._default(arg.value, what, names_a_device(option))
                return
        if len(node.args) < 2 or any(a.keyword is not None for a in node.args[:2]):
            self._device_first(node)
            return
        key, fallback = node.args[0].value, node.args[1].value
        if is_name(node.func, "getattr") and len(node.args) == 3:
            key, fallback = node.args[1].value, node.args[2].value
        elif not (
            attribute_named(node.func, *FALLBACK_METHODS)
            or self.matches_name(node, *FALLBACK_FUNCTIONS)
        ):
            return
        if cuda_literal(fallback) and names_a_device(string_value(key)):
            self._default(fallback, f"`{short(node, 40)}`", True)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        """`device: str = "cuda"` (a dataclass field, a class's configuration)."""
        if node.value is not None and cuda_literal(node.value):
            name = last_segment(node.target)
            self._default(node.value, f"`{name}`", names_a_device(name))

    def visit_Assign(self, node: cst.Assign) -> None:
        """`self.device = "cuda"`: an object's device setting (a plain variable is G2T103's)."""
        if len(node.targets) != 1 or not cuda_literal(node.value):
            return
        target = node.targets[0].target
        if isinstance(target, cst.Attribute) and names_a_device(target.attr.value):
            self._default(node.value, f"`{short(target, 30)}`", True)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        name = string_value(node.key)
        if names_a_device(name) and cuda_literal(node.value):
            self._default(node.value, f"configuration entry `{name}`", True)

    def _device_first(self, node: cst.Call) -> None:
        """`torch.Generator("cuda")`, `torch.set_default_device("cuda")`: a device by position,
        which becomes the module's device (a `torch.device`, which both take)."""
        if not node.args or node.args[0].keyword is not None or node.args[0].star:
            return
        literal = node.args[0].value
        if cuda_string_index(literal) != "" or not self.matches_name(node, *DEVICE_FIRST):
            return
        ctx = self.ctx
        known = accelerator_known(ctx, node)
        self.report(
            literal,
            f"`{short(node, 40)}` names NVIDIA GPUs",
            fix=lambda updated: ctx.current_device(known),
            hint="use the module's device",
            uses_device=not known,
        )

    def _default(self, literal: cst.BaseExpression, what: str, device_named: bool) -> None:
        message = self.message.format(what=what, value=f"`{self.code_for(literal)}`")
        if not device_named:
            # A name that does not say: what the module does with the value does.
            values = module_values(self.ctx)
            device_named = values is not None and bool(values.device_uses(*self.position(literal)))
        if not device_named:
            self.report(
                literal,
                message,
                hint="if it names a device, default to the module's device type "
                '(`device.type`, `"cuda"` on CUDA); if it chooses a CUDA kernel, keep it for '
                "CUDA and give other devices their own choice",
            )
            return
        ctx = self.ctx
        index = cuda_string_index(literal)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            if index == "":
                return ctx.device_type()
            return indexed_device_string(ctx, updated)

        self.report(literal, message, fix=fix, uses_device=True)


LIGHTNING_TRAINERS = frozenset(
    f"{package}.{name}"
    for package in (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.trainer",
        "lightning.pytorch.trainer.trainer",
        "pytorch_lightning",
        "pytorch_lightning.trainer",
        "pytorch_lightning.trainer.trainer",
        "lightning.fabric",
        "lightning.fabric.fabric",
        "lightning_fabric",
        "lightning_fabric.fabric",
    )
    for name in ("Trainer", "Fabric")
)


class LightningGpuAccelerator(Rule):
    """Lightning asked for NVIDIA GPUs: `Trainer(accelerator="gpu")`, `Trainer(gpus=2)`.

    Why: `accelerator="gpu"` (or `"cuda"`) makes Lightning raise on a machine without an
    NVIDIA GPU, a TPU host included; `gpus=` is Lightning 1.x's spelling of the same, removed
    in 2.0. `accelerator="auto"` picks the TPU, a GPU or the CPU, whichever the machine has
    (Lightning runs TPUs through PyTorch/XLA), and `devices=` says how many. Only calls that
    resolve to Lightning's `Trainer` or `Fabric` through the module's imports count.

    Example:
        trainer = L.Trainer(accelerator="gpu", devices=1)  # -> accelerator="auto"
        trainer = pl.Trainer(gpus=1)                        # -> accelerator="auto", devices=1
    """

    code = "G2T114"
    name = "lightning-gpu-accelerator"
    safety = Safety.REPORT
    message = "`{call}` asks Lightning for NVIDIA GPUs; it raises on a TPU host"
    hint = 'use `accelerator="auto"` (the TPU, a GPU or the CPU, whichever is there) and `devices=`'
    tokens = (b"Trainer", b"Fabric")

    def visit_Call(self, node: cst.Call) -> None:
        if not node.args or not self.matches_name(node, *LIGHTNING_TRAINERS):
            return
        for arg in node.args:
            if arg.keyword is None:
                continue
            key = arg.keyword.value
            message = self.message.format(call=f"{key}={short(arg.value, 30)}")
            if key == "accelerator" and string_value(arg.value) in ("gpu", "cuda"):
                self.report(arg, message)
                return
            if key == "gpus" and not is_name(arg.value, "None"):
                self.report(
                    arg,
                    message,
                    hint='`gpus=` was removed in Lightning 2.0: use `accelerator="auto"` and '
                    "`devices=` (how many)",
                )
                return


class DeviceMapCuda(Rule):
    """`device_map="cuda"` (or `"cuda:0"`, `{"": "cuda"}`) when a model is loaded.

    Why: transformers (with accelerate) and diffusers place the loaded weights on the device
    the map names: CUDA, which fails on a TPU host. The keyword is the libraries' own, so any
    call with it counts (`AutoModel.from_pretrained`, `pipeline`, `DiffusionPipeline`).
    Load on the CPU (no `device_map`) and move the model with `.to(device)`, the module's
    device; whether a sharded map (`"auto"`) places weights on a TPU is the library's choice.

    Example:
        model = AutoModelForCausalLM.from_pretrained(name, device_map="cuda")
        # -> from_pretrained(name) then model.to(device)
    """

    code = "G2T115"
    name = "device-map-cuda"
    safety = Safety.REPORT
    message = "`device_map={value}` loads the weights onto NVIDIA GPUs"
    hint = "load without `device_map` (on the CPU) and move the model with `.to(device)`"
    tokens = (b"device_map",)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None or node.keyword.value != "device_map":
            return
        value = node.value
        named = cuda_literal(value)
        if isinstance(value, cst.Dict):
            named = any(
                isinstance(e, cst.DictElement) and cuda_literal(e.value) for e in value.elements
            )
        if named:
            self.report(value, self.message.format(value=short(value, 30)))
