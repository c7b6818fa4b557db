"""G2T4xx: distributed training. Code that assumes NCCL, CUDA device ids or one GPU per rank.

TPUs run one process per chip (each sees its chip as index 0) and use their own collective
backend (`tpu_dist` with TorchTPU), which `dist.get_default_backend_for_device` picks, as it
picks `nccl` for CUDA and `gloo` for the CPU (torch 2.6+).
"""

from __future__ import annotations

import re

import libcst as cst

from ..analysis.branches import device_branch
from ..analysis.edits import is_cuda_only, on_cuda_only, positional_args
from ..analysis.literals import (
    attribute_named,
    cuda_literal,
    is_name,
    last_segment,
    short,
    string_value,
)
from ..analysis.names import is_torch_device_call, module_level_alias
from ..analysis.ranks import device_index_names, rank_string
from ..core.model import Safety, Severity
from .base import Fix, Rule, RuleContext

# Calls that take a process-group backend: qualified name -> its positional index, if any.
BACKEND_CALLS: dict[str, int | None] = {
    "torch.distributed.init_process_group": 0,
    "torch.distributed.distributed_c10d.init_process_group": 0,
    "torch.distributed.new_group": None,
    "torch.distributed.distributed_c10d.new_group": None,
    "torch.distributed.new_subgroups": None,
    "torch.distributed.new_subgroups_by_enumeration": None,
}
AVAILABILITY_CHECKS = (
    "torch.cuda.is_available",
    "torch.accelerator.is_available",
    "torch.distributed.is_nccl_available",
    "torch.cuda.device_count",
)
DDP_NAMES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
DATA_PARALLEL_NAMES = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
)
SET_DEVICE_NAMES = (
    "torch.cuda.set_device",
    "torch.accelerator.set_device_index",
    "torch.accelerator.set_device_idx",
    "torch.cuda.device",
    "torch.accelerator.device_index",
)
MESH_NAMES = (
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.init_device_mesh",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed.DeviceMesh",
)


# A backend spec: `nccl`, `cuda:nccl,cpu:gloo` (not prose that mentions NCCL).
_BACKEND_SPEC = re.compile(r"^\s*(?:\w+:)?\w+(?:\s*,\s*(?:\w+:)?\w+)*\s*$")


def names_nccl(value: str) -> bool:
    """Whether a backend string names NCCL: `'nccl'`, `'cuda:nccl,cpu:gloo'`."""
    if not _BACKEND_SPEC.match(value):
        return False
    return any(part.strip().lower() == "nccl" for part in re.split(r"[,:]", value))


def _is_nccl(node: cst.CSTNode) -> bool:
    value = string_value(node)
    return value is not None and value.strip().lower() == "nccl"


def backend_arg(rule: Rule, call: cst.Call) -> cst.Arg | None:
    """The backend argument of a process-group call, if `call` is one and passes it."""
    qualified = rule.matches_name(call, *BACKEND_CALLS)
    if qualified is None:
        return None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "backend":
            return arg
    index = BACKEND_CALLS[qualified]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if index is not None and index < len(positional):
        return positional[index]
    return None


def nccl_idiom(rule: Rule, node: cst.CSTNode) -> bool:
    """`'nccl' if torch.cuda.is_available() else 'gloo'` and its negated form."""
    if not isinstance(node, cst.IfExp):
        return False
    test, body, orelse = node.test, node.body, node.orelse
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, body, orelse = test.expression, orelse, body
    if not (_is_nccl(body) and (string_value(orelse) or "").strip().lower() == "gloo"):
        return False
    stack: list[cst.CSTNode] = [test]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call) and rule.matches_name(current, *AVAILABILITY_CHECKS):
            return True
        stack.extend(current.children)
    return False


def refers_to_local_rank(rule: Rule, expr: cst.CSTNode) -> bool:
    """Whether a device index is the process's rank (`local_rank`, `$LOCAL_RANK`, `get_rank()`).

    Names are followed to their assignments only when a rule with `uses_flow` runs in the same
    pass (the engine then records them, and the answer is complete from `leave_Module` on);
    otherwise the name alone counts.
    """
    if isinstance(expr, cst.SimpleString | cst.FormattedString | cst.ConcatenatedString):
        return False
    return rule.ctx.flow.refers_to_rank(expr, index_only=True)


class NcclBackend(Rule):
    """The `'nccl'` backend: `init_process_group('nccl')`, `backend='nccl'`.

    Why: NCCL exists only for NVIDIA GPUs; on a TPU (or a CPU) `init_process_group` fails.
    `dist.get_default_backend_for_device(device)` (torch 2.6+) returns the backend of the
    module's device: `nccl` for CUDA, `gloo` for the CPU, the TPU's own backend on a TPU. The
    idiom `'nccl' if torch.cuda.is_available() else 'gloo'` is replaced as a whole.

    Example:
        dist.init_process_group("nccl")
        ->  dist.init_process_group(dist.get_default_backend_for_device(device))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        ->  backend = torch.distributed.get_default_backend_for_device(device)
    """

    code = "G2T401"
    name = "nccl-backend"
    safety = Safety.SAFE
    message = "the `'nccl'` backend exists only for NVIDIA GPUs; ask for the device's backend"
    hint = "use `dist.get_default_backend_for_device(device)` (torch 2.6+)"
    tokens = (b"nccl",)

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.handled: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        arg = backend_arg(self, node)
        if arg is None:
            return
        value = arg.value
        if _is_nccl(value) or nccl_idiom(self, value):
            module = node.func.value if isinstance(node.func, cst.Attribute) else None
            self._replace(value, module)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if id(node) not in self.handled and nccl_idiom(self, node):
            self._replace(node, None)

    def _replace(self, node: cst.BaseExpression, module: cst.BaseExpression | None) -> None:
        self.handled.add(id(node))
        self.ctx.claim(node)
        ctx = self.ctx
        if module is not None:
            prefix: str | None = self.code_for(module)
        else:  # the module's own name for torch.distributed (`dist`), if it has one
            prefix = module_level_alias(ctx, "torch.distributed")

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            if prefix is not None:
                func = cst.parse_expression(f"{prefix}.get_default_backend_for_device")
            else:
                func = ctx.torch_attr("distributed.get_default_backend_for_device")
            call = cst.Call(func=func, args=[cst.Arg(ctx.device())])
            if isinstance(updated, cst.IfExp) and updated.lpar:
                return call.with_changes(lpar=updated.lpar, rpar=updated.rpar)
            return call

        self.report(node, fix=fix, uses_device=True)


class NcclComparison(Rule):
    """A comparison with `'nccl'`: `if backend == 'nccl':`, `dist.get_backend() != 'nccl'`.

    Why: on a TPU the backend is never `'nccl'`, so the comparison silently takes the other
    branch. Whether the code means "is this CUDA?" or "is this the device's backend?" is a
    choice for a person.

    Example:
        if dist.get_backend() == "nccl":   # decide: `device.type == "cuda"`, or compare with
                                           # `dist.get_default_backend_for_device(device)`
    """

    code = "G2T402"
    name = "nccl-comparison"
    safety = Safety.REPORT
    message = "comparison with `'nccl'`: on a TPU the backend is never NCCL"
    hint = 'compare `device.type == "cuda"`, or with `dist.get_default_backend_for_device(device)`'
    tokens = (b"nccl",)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(_names_nccl_deep(o) for o in operands):
            self.report(node)


def _names_nccl_deep(node: cst.CSTNode) -> bool:
    """A string naming NCCL, alone or inside a tuple, list or set literal."""
    value = string_value(node)
    if value is not None:
        return names_nccl(value)
    if isinstance(node, cst.Tuple | cst.List | cst.Set):
        return any(_names_nccl_deep(e.value) for e in node.elements)
    return False


class IsNcclAvailable(Rule):
    """`dist.is_nccl_available()` asks about NVIDIA's collective library.

    Why: it says nothing about a TPU (or any other device); code that branches on it usually
    means "can I use the fast backend for my device?", which
    `dist.is_backend_available(dist.get_default_backend_for_device(device))` answers.

    Example:
        if dist.is_nccl_available():
        ->  if dist.is_backend_available(dist.get_default_backend_for_device(device)):
    """

    code = "G2T403"
    name = "is-nccl-available"
    safety = Safety.REPORT
    message = "`is_nccl_available()` asks about NVIDIA's NCCL only"
    hint = "ask `dist.is_backend_available(dist.get_default_backend_for_device(device))`"
    tokens = (b"is_nccl_available",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.matches_name(node, "torch.distributed.is_nccl_available"):
            self.report(node)


class NcclString(Rule):
    """Any other string that names NCCL: `'cuda:nccl,cpu:gloo'`, `default='nccl'`, `Backend.NCCL`.

    Why: a backend chosen ahead of time as NCCL fails on a TPU when it reaches
    `init_process_group`. (A plain `'nccl'` backend argument is rewritten by G2T401 and a
    comparison is reported by G2T402; this rule reports the rest.)

    Example:
        parser.add_argument("--backend", default="nccl")
        ->  let the default be None and pass `dist.get_default_backend_for_device(device)`
    """

    code = "G2T404"
    name = "nccl-string"
    safety = Safety.REPORT
    message = "`{value}` names NVIDIA's NCCL backend, which TPUs lack"
    hint = "choose the backend with `dist.get_default_backend_for_device(device)`"
    tokens = (b"nccl", b"NCCL")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is None or not names_nccl(value) or self._reported_elsewhere(node):
            return
        self.report(node, self.message.format(value=self.code_for(node)))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "NCCL" and self.matches_name(node, "torch.distributed.Backend.NCCL"):
            self.report(node, self.message.format(value=self.code_for(node)))

    def _reported_elsewhere(self, node: cst.SimpleString) -> bool:
        ancestor = self.parent(node)
        while ancestor is not None and not isinstance(ancestor, cst.BaseSmallStatement):
            if isinstance(ancestor, cst.Annotation):
                return True  # a type (`Literal["NCCL"]`), not a backend choice
            ancestor = self.parent(ancestor)
        parent = self.parent(node)
        while isinstance(parent, cst.Element | cst.Tuple | cst.List | cst.Set):
            parent = self.parent(parent)
        if isinstance(parent, cst.Comparison | cst.ComparisonTarget):
            return True  # G2T402
        if isinstance(parent, cst.IfExp) and nccl_idiom(self, parent):
            return True  # G2T401
        if isinstance(parent, cst.Arg) and _is_nccl(node):
            call = self.parent(parent)
            return isinstance(call, cst.Call) and backend_arg(self, call) is parent
        return False


class DdpDeviceIds(Rule):
    """`DistributedDataParallel(model, device_ids=[rank], output_device=rank)`.

    Why: device ids are CUDA ordinals. For a module on the CPU DDP raises a ValueError; on
    another accelerator it moves each input to `device_ids[0]` on that device, the rank's
    index, which a TPU process (one chip, index 0) does not have. Dropping them is not the same
    on CUDA: with `device_ids`, DDP's forward also moves inputs still on the CPU to the
    rank's GPU. So each is passed on CUDA only (`[rank] if device.type == "cuda" else None`),
    which is the original on CUDA and DDP's default (the module's own device) elsewhere.

    Example:
        DDP(model, device_ids=[local_rank], output_device=local_rank)
        ->  DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                output_device=local_rank if device.type == "cuda" else None)
    """

    code = "G2T405"
    compat_torch = "0.4"
    name = "ddp-device-ids"
    safety = Safety.SAFE
    message = "`device_ids`/`output_device` work only for CUDA modules"
    hint = 'pass them on CUDA only: `device_ids=[rank] if device.type == "cuda" else None`'
    tokens = (b"device_ids", b"output_device")

    PARAMS = ("device_ids", "output_device")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(node, *DDP_NAMES):
            return
        found = self._device_args(node)
        wrap = {i for i in found.values() if not _is_guarded(node.args[i].value)}
        if not wrap:
            return
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            args = [
                a.with_changes(value=on_cuda_only(ctx, a.value, cst.Name("None")))
                if i in wrap
                else a
                for i, a in enumerate(updated.args)
            ]
            return updated.with_changes(args=args)

        self.report(node, fix=fix, uses_device=True)

    def _device_args(self, node: cst.Call) -> dict[str, int]:
        found: dict[str, int] = {}
        positional = 0
        for i, arg in enumerate(node.args):
            if arg.star:
                continue
            if arg.keyword is None:
                if 1 <= positional <= 2:
                    found[self.PARAMS[positional - 1]] = i
                positional += 1
            elif arg.keyword.value in self.PARAMS:
                found[arg.keyword.value] = i
        return {p: i for p, i in found.items() if not is_name(node.args[i].value, "None")}


def _is_guarded(node: cst.CSTNode) -> bool:
    """`x if <test> else None`: already passed only on some devices."""
    return isinstance(node, cst.IfExp) and is_name(node.orelse, "None")


class DataParallel(Rule):
    """`torch.nn.DataParallel(model)`: one process driving several GPUs.

    Why: TPUs (like TorchTPU's and PyTorch's own guidance) need one process per device, so
    DataParallel has no TPU form. Moving to `DistributedDataParallel` also changes how the
    script is started (`torchrun --nproc-per-node=N`), which is a person's decision.

    Example:
        model = nn.DataParallel(model)
        ->  model = DistributedDataParallel(model), launched with `torchrun`
    """

    code = "G2T406"
    name = "data-parallel"
    safety = Safety.REPORT
    message = "`DataParallel` drives several devices from one process; TPUs need one per device"
    hint = "use `DistributedDataParallel`, one process per device, started with `torchrun`"
    tokens = (b"DataParallel", b"data_parallel")

    def visit_Call(self, node: cst.Call) -> None:
        if self.matches_name(node, *DATA_PARALLEL_NAMES):
            self.report(node)


class LocalRankDevice(Rule):
    """A device chosen by the process's rank: `torch.cuda.set_device(local_rank)`, `.to(rank)`.

    Why: on CUDA each rank picks its GPU by index. A TPU process owns exactly one chip, which
    is always index 0, so `set_device_index(local_rank)` raises on every rank but the first,
    and `.to(rank)` (an integer device is a CUDA ordinal) fails on every other device, the
    CPU included. `.to(rank)` becomes `.to(rank if device.type == "cuda" else device)`: the
    same ordinal on CUDA, the module's device elsewhere. An index is the rank when its name
    says so (`local_rank`, `get_rank()`, `$LOCAL_RANK`) or when the module uses the value as
    one: DDP's `device_ids=[gpu_id]`, `set_device(gpu_id)`, `gpu_id = int(os.environ[
    "LOCAL_RANK"])` (the DDP tutorial's `self.gpu_id`). `set_device(local_rank)` is G2T107's
    fix (selected on CUDA only); where it cannot be, it is reported here.

    Example:
        model = model.to(self.gpu_id)
        ->  model = model.to(self.gpu_id if device.type == "cuda" else device)
        torch.cuda.set_device(local_rank)
        ->  if device.type == "cuda": torch.accelerator.set_device_index(local_rank)  (G2T107)
    """

    code = "G2T407"
    compat_torch = "0.4"
    name = "local-rank-device"
    safety = Safety.SAFE
    message = "device index `{index}` is the process's rank; a TPU process owns only index 0"
    hint = (
        'select it only on CUDA: `if device.type == "cuda": '
        "torch.accelerator.set_device_index(local_rank)`, then use `.to(device)`"
    )
    tokens = (b"rank", b"RANK", b"set_device", b"device_ids", b"output_device")
    uses_flow = True

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.candidates: list[tuple[cst.Call, cst.BaseExpression]] = []

    def visit_Call(self, node: cst.Call) -> None:
        positional = positional_args(node)
        if self.matches_name(node, *SET_DEVICE_NAMES):
            index = positional[0].value if positional else None
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "to" and positional:
            receiver = node.func.value
            if isinstance(receiver, cst.Name | cst.Attribute) and self.qualified_names(receiver):
                return  # a module's `to` function, not a tensor's or module's method
            index = positional[0].value
        else:
            return
        if index is not None:
            self.candidates.append((node, index))

    def leave_Module(self, original_node: cst.Module) -> None:
        ctx = self.ctx
        for node, index in self.candidates:
            if device_branch(ctx, node, actual=True) == "cuda" or is_cuda_only(index):
                continue  # selected on CUDA only, as asked (G2T107 writes this)
            if self._device_object(index):
                continue  # a device built from the rank: G2T102 fixes it where it is built
            is_to = attribute_named(node.func, "to")
            named = is_to and last_segment(index) in device_index_names(ctx)
            if not (named or refers_to_local_rank(self, index)):
                continue
            message = self.message.format(index=short(index, 30))
            if not is_to:
                self.report(node, message)
                continue
            arg = positional_args(node)[0]
            self.report(
                node,
                message,
                fix=self._move(node, arg),
                hint="on CUDA keep the index, elsewhere use the module's device: `.to(rank if "
                'device.type == "cuda" else device)`',
                uses_device=True,
            )

    def _device_object(self, index: cst.BaseExpression) -> bool:
        """Whether `index` is a name every assignment of which makes a device that is right
        on every device type once this run's fixes are made, not an int: `device =
        torch.device("cuda", rank)`, which G2T102 makes the rank's GPU on CUDA and the
        module's device elsewhere, or what such a fix wrote. `.to(device)` then needs nothing
        more. A CUDA device left as it is (reported, not fixed) still needs the `.to` fix."""
        if not isinstance(index, cst.Name):
            return False
        ctx = self.ctx
        values = ctx.flow.assigned_values(index)
        if not values:
            return False
        fixed = {id(p.node) for p in ctx.reports() if p.settled(ctx.options)}

        def agnostic(value: cst.CSTNode) -> bool:
            if is_cuda_only(value):
                return True  # what G2T102 writes for a rank's device
            if isinstance(value, cst.IfExp) and (
                _indexed_device_string(value.body) or _indexed_device_string(value.orelse)
            ):
                # `f"cuda:{rank}" if torch.cuda.is_available() else "cpu"`: G2T103's fix
                # keeps the rank on CUDA only (a later run reads that form as CUDA-only
                # above); an index that is not the rank, or a choice left as it is, does not
                return id(value) in fixed and (
                    rank_string(ctx, value.body) or rank_string(ctx, value.orelse)
                )
            if id(value) in fixed:
                return True  # what a fix of this run rewrites
            if isinstance(value, cst.IfExp):
                return agnostic(value.body) and agnostic(value.orelse)
            if string_value(value) is not None:
                return not cuda_literal(value)  # "cpu"
            if isinstance(value, cst.Call) and value.args and is_torch_device_call(ctx, value):
                first = value.args[0].value
                if isinstance(first, cst.IfExp):
                    return agnostic(first)
                if id(first) in fixed:
                    return True  # torch.device("cuda", i) -> torch.device(device.type, i)
                plain = len(value.args) == 1 and string_value(first) is not None
                return plain and not cuda_literal(first)
            return False  # `torch.device(rank)`, `devices[0]`: an ordinal the `.to` fix needs

        return all(agnostic(v) for v in values)

    def _move(self, node: cst.Call, arg: cst.Arg) -> Fix:
        """The fix of `.to(rank)`: the same index on CUDA, the module's device elsewhere."""
        ctx = self.ctx
        position = list(node.args).index(arg)

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            args = list(updated.args)
            args[position] = args[position].with_changes(
                value=on_cuda_only(ctx, args[position].value, ctx.device())
            )
            return updated.with_changes(args=args)

        return fix


class DeviceMeshCuda(Rule):
    """`init_device_mesh("cuda", ...)` / `DeviceMesh("cuda", ...)`: a mesh of NVIDIA GPUs.

    Why: the mesh's device type names CUDA, so it fails on a TPU or the CPU. The module's
    device type builds the same mesh on CUDA and a mesh of the local devices elsewhere.

    Example:
        init_device_mesh("cuda", (2, 4))  ->  init_device_mesh(device.type, (2, 4))
    """

    code = "G2T408"
    compat_torch = "0.4"
    name = "device-mesh-cuda"
    safety = Safety.SAFE
    severity = Severity.ERROR
    message = 'the device mesh names `"cuda"`; use the module\'s device type'
    hint = "use `device.type`"
    tokens = (b"init_device_mesh", b"DeviceMesh")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(node, *MESH_NAMES):
            return
        target = next(
            (a for a in node.args if a.keyword is not None and a.keyword.value == "device_type"),
            None,
        )
        if target is None and node.args and node.args[0].keyword is None:
            target = node.args[0]
        if target is None or string_value(target.value) != "cuda":
            return
        ctx = self.ctx
        self.report(target.value, fix=lambda updated: ctx.device_type(), uses_device=True)


def _indexed_device_string(node: cst.CSTNode) -> bool:
    """Whether `node` writes an index into a device string: `f"cuda:{rank}"`,
    `f"{kind}:{rank}"`, `"cuda:{}".format(rank)`."""
    if isinstance(node, cst.FormattedString):
        parts = list(node.parts)
        return any(
            isinstance(a, cst.FormattedStringText)
            and a.value.endswith(":")
            and isinstance(b, cst.FormattedStringExpression)
            for a, b in zip(parts, parts[1:], strict=False)
        )
    if isinstance(node, cst.Call) and attribute_named(node.func, "format"):
        owner = node.func.value  # type: ignore[attr-defined]  # an Attribute: attribute_named said so
        text = string_value(owner)
        return text is not None and ":{" in text
    return False
