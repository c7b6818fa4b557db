"""What the branches around a node already know, and what a test guards.

A fix must not add a guard the code already has (`if torch.cuda.is_available():` around a
`torch.cuda.synchronize()`), must not fall back to the CPU where the branch has just checked
for an accelerator, and must not widen a CUDA test that protects code only CUDA can run
(Triton kernels, apex, a "CUDA required" assert). These questions walk up from the node through
the parents the engine's traversal recorded.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import libcst as cst

from ..core.model import Severity
from .blocks import statement_index
from .literals import string_value
from .names import ast_dotted_name, full_name, qualified
from .torch_api import OTHER_BACKENDS, REWRITTEN_CUDA, cuda_member, rewritten_off

if TYPE_CHECKING:
    from ..core.module_state import Pending
    from ..rules.base import RuleContext

AVAILABILITY = frozenset(
    {"torch.cuda.is_available", "torch.accelerator.is_available", "torch.backends.cuda.is_built"}
)
DEVICE_TYPES = frozenset({"cuda", "cpu", "mps", "xpu", "tpu", "xla", "meta", "hpu", "npu"})

# Packages whose code runs only on CUDA (or ROCm) GPUs.
CUDA_ONLY_PACKAGES = frozenset(
    {"triton", "apex", "amp_C", "bitsandbytes", "flash_attn", "cupy", "cupyx", "pynvml", "xformers"}
)
# Words in a module's path or an imported name that say it holds GPU kernels: an import of
# `.triton_ops` or `fused_cuda` under a CUDA test is CUDA's own (whisper's median filter).
CUDA_MODULE_WORDS = ("triton", "cuda", "cutlass", "cudnn", "nvrtc")
# torch names that exist only for CUDA and that no rule rewrites to a device-agnostic form.
CUDA_ONLY_TORCH = (
    "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties",
    "torch.cuda.get_device_capability",
    "torch.cuda.get_arch_list",
    "torch.cuda.get_gencode_flags",
    "torch.cuda.is_bf16_supported",
    "torch.cuda.is_tf32_supported",
    "torch.cuda.Stream",
    "torch.cuda.stream",
    "torch.cuda.current_stream",
    "torch.cuda.CUDAGraph",
    "torch.cuda.graph",
    "torch.cuda.make_graphed_callables",
    "torch.cuda.nvtx",
    "torch.cuda.ipc_collect",
    "torch.cuda.jiterator",
    "torch.cuda.comm",
    "torch.cuda.nccl",
    "torch.cuda._sleep",
    "torch.nn.attention.flex_attention",  # Inductor's GPU templates; no TPU lowering
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.DataParallel",
    "torch.utils.cpp_extension",
    "torch.backends.cudnn.version",
    "torch.version.cuda",
    "torch._C._cuda",
)
# Exceptions a compatibility fallback catches when a newer API is missing.
COMPAT_ERRORS = frozenset({"AttributeError", "TypeError", "ImportError", "ModuleNotFoundError"})
# The device-agnostic APIs the rewrite moves code to: a `try` that uses one has a fallback.
MODERN_API = (
    "torch.amp.",
    "torch.get_autocast_dtype",
    "torch.set_autocast_dtype",
    "torch.accelerator.",
    "torch.OutOfMemoryError",
    "torch.get_device_module",
    "torch.nn.attention.sdpa_kernel",
    "torch.distributed.get_default_backend_for_device",
    "torch.profiler.record_function",
)


def _parent(ctx: RuleContext, node: cst.CSTNode) -> cst.CSTNode | None:
    return ctx.parents.get(id(node))


def ancestors(ctx: RuleContext, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
    """(parent, child on the path) pairs from `node` up to the module.

    A node the traversal has not reached yet (a part of the node a rule is visiting) starts
    from the node being visited.
    """
    child = node
    parent = _parent(ctx, node)
    if parent is None and node is not ctx.module and ctx.visiting is not None:
        if ctx.visiting is not node:
            parent = ctx.visiting
    while parent is not None:
        yield parent, child
        child, parent = parent, _parent(ctx, parent)


def conjuncts(test: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The parts of an `and` chain (the test itself when it is not one); parentheses are
    looked through."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        yield from conjuncts(test.left)
        yield from conjuncts(test.right)
    else:
        yield test


def negation(test: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` for `not x`; None otherwise."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return None


def is_availability_call(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """`torch.cuda.is_available()` or `torch.accelerator.is_available()`."""
    return isinstance(node, cst.Call) and qualified(ctx, node) in AVAILABILITY


def _device_type_test(ctx: RuleContext, test: cst.BaseExpression) -> str | None:
    """The device type a comparison tests for: `device.type == "mps"`, `args.device == "cuda"`,
    `x.is_cuda` (cuda). `"!cpu"` for `device.type != "cpu"` (any accelerator)."""
    if isinstance(test, cst.Attribute) and test.attr.value == "is_cuda":
        return "cuda"
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    values = [string_value(test.left), string_value(target.comparator)]
    literal = next((v for v in values if v is not None), None)
    if literal is None:
        return None
    kind = literal.split(":")[0]
    if kind not in DEVICE_TYPES:
        return None
    if isinstance(target.operator, cst.Equal):
        return kind
    if isinstance(target.operator, cst.NotEqual) and kind == "cpu":
        return "!cpu"
    return None


def knows_accelerator(ctx: RuleContext, test: cst.BaseExpression) -> bool:
    """Whether a test, when true, says an accelerator is there: an availability call, a
    device-type test for an accelerator, or an `and` chain holding one."""
    for part in conjuncts(test):
        if is_availability_call(ctx, part):
            return True
        kind = _device_type_test(ctx, part)
        if kind is not None and kind not in ("cpu", "meta"):
            return True
    return False


def taken_branches(
    ctx: RuleContext, node: cst.CSTNode
) -> Iterator[tuple[cst.BaseExpression, bool, cst.CSTNode]]:
    """(test, outcome, branch node) for every branch `node` runs in, innermost first, up to
    its function: `outcome` is True in an `if`'s body, a conditional expression's body or the
    right side of `and`, False in their `else` parts (and the right side of `or`)."""
    for parent, child in ancestors(ctx, node):
        if isinstance(parent, cst.If):
            if child is parent.body:
                yield parent.test, True, parent
            elif child is parent.orelse:
                yield parent.test, False, parent
        elif isinstance(parent, cst.Else):
            continue
        elif isinstance(parent, cst.IfExp):
            if child is parent.body:
                yield parent.test, True, parent
            elif child is parent.orelse:
                yield parent.test, False, parent
        elif isinstance(parent, cst.BooleanOperation) and child is parent.right:
            yield parent.left, isinstance(parent.operator, cst.And), parent
        elif isinstance(parent, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            return


def accelerator_known(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """Whether `node` runs only where a branch around it has found an accelerator (so a guard
    or a CPU fallback there would be dead code)."""
    for test, outcome, _ in taken_branches(ctx, node):
        inner = negation(test)
        if outcome and knows_accelerator(ctx, test):
            return True
        if not outcome and inner is not None and knows_accelerator(ctx, inner):
            return True
    return False


def device_branch(ctx: RuleContext, node: cst.CSTNode, *, actual: bool = False) -> str | None:
    """The one device type the branches around `node` are for (`"mps"` inside `if device ==
    "mps":`), or None. With `actual`, only tests of a real device count (`x.device.type`,
    `device.type`, `x.is_cuda`), not of a name the user chose (`if accelerator == "cuda":`,
    whose default the rewrite may make the device's type, or a configuration may set on any
    machine)."""
    for test, outcome, _ in taken_branches(ctx, node):
        for part in conjuncts(test) if outcome else ():
            if actual and not _tests_a_device(part):
                continue
            kind = _device_type_test(ctx, part)
            if kind is not None and not kind.startswith("!"):
                return kind
    return None


def _tests_a_device(test: cst.BaseExpression) -> bool:
    """`x.is_cuda` or a comparison of a `.type` (`x.device.type == "cuda"`)."""
    if isinstance(test, cst.Attribute):
        return test.attr.value == "is_cuda"
    if isinstance(test, cst.Comparison):
        operands = [test.left, *(t.comparator for t in test.comparisons)]
        return any(isinstance(o, cst.Attribute) and o.attr.value == "type" for o in operands)
    return False


def guarded_region(ctx: RuleContext, call: cst.CSTNode) -> tuple[list[cst.CSTNode], str]:
    """The code a test guards, and what guards it (`if`, `assert`, `raise`, `and`, ...), for a
    test that is `call` or holds it as a conjunct: the `if` body (the `else` part when the
    test is negated), the rest of the block after `if not <test>: raise/return`, everything
    after an `assert`, a conditional expression's branch, the right side of `and`."""
    node = call
    negated = False
    parent = _parent(ctx, node)
    while isinstance(parent, cst.BooleanOperation | cst.UnaryOperation):
        if isinstance(parent, cst.UnaryOperation):
            if not isinstance(parent.operator, cst.Not):
                return [], ""
            negated = not negated
        elif isinstance(parent.operator, cst.And) and parent.left is node:
            if not negated:
                return [parent.right], "and"
        node, parent = parent, _parent(ctx, parent)
    if isinstance(parent, cst.If) and parent.test is node:
        if not negated:
            return [parent.body], "if"
        region: list[cst.CSTNode] = [parent.orelse] if parent.orelse is not None else []
        if _exits(parent.body):
            region.extend(_following(ctx, parent))
        return region, "if"
    if isinstance(parent, cst.IfExp) and parent.test is node:
        return [parent.orelse if negated else parent.body], "if"
    if isinstance(parent, cst.Assert) and parent.test is node and not negated:
        line = _parent(ctx, parent)
        return [parent, *(_following(ctx, line) if line is not None else [])], "assert"
    return [], ""


def _exits(body: cst.BaseSuite) -> bool:
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = statements[-1] if statements else None
    if isinstance(last, cst.SimpleStatementLine | cst.SimpleStatementSuite):
        return any(isinstance(s, cst.Raise | cst.Return) for s in last.body)
    return False


def _following(ctx: RuleContext, stmt: cst.CSTNode) -> list[cst.CSTNode]:
    block = _parent(ctx, stmt)
    if not isinstance(block, cst.IndentedBlock | cst.Module):
        return []
    index = statement_index(ctx, block, stmt)
    return [] if index is None else list(block.body[index + 1 :])


def cuda_only_use(
    ctx: RuleContext, region: list[cst.CSTNode], *, after_fixes: bool = False
) -> str | None:
    """The first thing in `region` that only CUDA can run, named for a message: a name from
    a CUDA-only package (Triton, apex, bitsandbytes, ...), a CUDA API no rule rewrites, a
    function of this module decorated `@triton.jit`; None if there is none. With
    `after_fixes`, what this run's fixes make safe does not count (`is_bf16_supported()`)."""
    for _, what in cuda_only_uses(ctx, region, after_fixes=after_fixes):
        return what
    return None


def cuda_only_uses(
    ctx: RuleContext, region: list[cst.CSTNode], *, after_fixes: bool = False
) -> Iterator[tuple[cst.CSTNode, str]]:
    """Every use in `region` that only CUDA can run (`cuda_only_use`), with its node."""
    kernels = ctx.names.triton_kernels
    # G2T313 makes `is_bf16_supported()` safe on every device wherever it is.
    fixed = set()
    if after_fixes and ctx.options.enabled("G2T313"):
        fixed.add("torch.cuda.is_bf16_supported")
    # after this run's fixes, a name whose rules are all off (held back) is still CUDA's own
    off = rewritten_off(ctx.options.enabled) if after_fixes else frozenset()
    stack = list(reversed(region))
    while stack:
        node = stack.pop()
        if isinstance(node, cst.If | cst.IfExp) and _device_type_test(ctx, node.test) == "cuda":
            # `x if device.type == "cuda" else y`: the CUDA part runs on CUDA only
            stack.extend(n for n in (node.test, node.orelse) if n is not None)
            continue
        if isinstance(node, cst.Import | cst.ImportFrom):
            what = _cuda_only_import(node)
            if what is not None:
                yield node, what
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            what = _cuda_only_function(ctx, node.func, after_fixes)
            if what is not None:
                yield node, what
        if isinstance(node, cst.Name | cst.Attribute):
            name = qualified(ctx, node) if _resolvable(ctx, node) else None
            if name is not None and name not in fixed:
                what = _cuda_only_name(name, off)
                if what is not None:
                    yield node, what
            if isinstance(node, cst.Name) and node.value in kernels:
                yield node, f"the Triton kernel `{node.value}`"
            if isinstance(node, cst.Attribute) and name is None:
                stack.append(node.value)  # `f(x).y`: look inside; a whole dotted name is read
            continue
        stack.extend(reversed(node.children))


def _cuda_module(module: str, names: list[str]) -> str | None:
    """`module` (dotted, maybe relative) for a message when it, or a name imported from it,
    says it holds GPU kernels (`.triton_ops`, `median_filter_cuda`) or is a CUDA-only package;
    torch's own modules are judged by name elsewhere (`_cuda_only_name`)."""
    top = module.lstrip(".").split(".")[0]
    if top == "torch":
        return None
    words = [*module.lower().split("."), *(n.lower() for n in names)]
    if top in CUDA_ONLY_PACKAGES or any(w in p for p in words for w in CUDA_MODULE_WORDS):
        return f"`{module}`"
    return None


def _cuda_only_import(node: cst.Import | cst.ImportFrom) -> str | None:
    """ "the import of `.triton_ops`" for an import of GPU kernels (`_cuda_module`)."""
    if isinstance(node, cst.Import):
        modules = [_cuda_module(full_name(alias.name), []) for alias in node.names]
        what = next((m for m in modules if m is not None), None)
    else:
        module = "." * len(node.relative) + (full_name(node.module) if node.module else "")
        aliases = node.names if not isinstance(node.names, cst.ImportStar) else ()
        what = _cuda_module(module, [full_name(a.name) for a in aliases])
    return f"the import of {what}" if what is not None else None


def _ast_cuda_import(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            what = _cuda_module(alias.name, [])
            if what is not None:
                return what
    elif isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        return _cuda_module(module, [a.name for a in node.names if a.name != "*"])
    return None


def _cuda_only_function(ctx: RuleContext, name: cst.Name, after_fixes: bool) -> str | None:
    """What makes a function of this module, called by `name`, run only on CUDA, one level
    deep (its own calls are not followed): a CUDA-only name no fix of this run covers, an
    import of GPU kernels (whisper's `dtw_cuda` imports `.triton_ops`), or a check that
    raises unless its tensor is on CUDA. None if nothing does, or `name` is not one."""
    function = ctx.names.functions.get(name.value)
    if function is None or ctx.names.module_binding(name.value) is not None:
        return None
    if ctx.binds_in_scopes(name.value, name):
        return None  # a local name, not the module's function
    label = f"`{name.value}()` (line {function.lineno}: it"
    spots: list[tuple[tuple[int, int], int]] = []
    if after_fixes:
        options = ctx.options
        spots = [
            (ctx.position(p.node), len(ctx.source_of(p.node)))
            for p in ctx.reports()
            if p.settled(options)
        ]
    resolve = ctx.names.module_binding
    kernels = ctx.names.triton_kernels
    off = rewritten_off(ctx.options.enabled)
    uses = _ast_cuda_only(
        [function], resolve, kernels, ctx.source, off, walk=_outside_cuda_branches
    )
    for line, column, name_used in uses:
        if not any(at == line and c <= column < c + n for (at, c), n in spots):
            return f"{label} uses {name_used})"
    for node in _outside_cuda_branches(function):
        module = _ast_cuda_import(node)
        if module is not None:
            return f"{label} imports {module})"
        if _raises_unless_cuda(node):
            return f"{label} raises unless its tensor is on CUDA)"
    return None


def _outside_cuda_branches(node: ast.AST) -> Iterator[ast.AST]:
    """`node` and the nodes under it, but for the code of its own CUDA tests (`if
    x.device.type == "cuda": ...`, and what follows `if x.device.type != "cuda": return`): a
    function that keeps its CUDA code there runs on every device."""
    yield node
    if isinstance(node, ast.If | ast.IfExp):
        cuda = _ast_cuda_test(node.test)
        if cuda is not None:
            yield from _outside_cuda_branches(node.test)
            kept = node.orelse if cuda else node.body
            if isinstance(kept, list):
                yield from _outside_cuda_block(kept)
            else:
                yield from _outside_cuda_branches(kept)
            return
    for _, value in ast.iter_fields(node):
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield from _outside_cuda_block(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield from _outside_cuda_branches(item)
        elif isinstance(value, ast.AST):
            yield from _outside_cuda_branches(value)


def _outside_cuda_block(statements: list[ast.stmt]) -> Iterator[ast.AST]:
    for stmt in statements:
        yield from _outside_cuda_branches(stmt)
        if isinstance(stmt, ast.If) and _ast_cuda_test(stmt.test) is False:
            last = stmt.body[-1] if stmt.body else None
            if isinstance(last, ast.Return):
                return  # the rest of the block runs on CUDA only


def _ast_cuda_test(test: ast.AST) -> bool | None:
    """True for a test that holds on CUDA only (`x.is_cuda`, `x.device.type == "cuda"`),
    False for its negation (`not x.is_cuda`, `x.device.type != "cuda"`), None otherwise."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _ast_cuda_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Attribute) and test.attr == "is_cuda":
        return True
    if isinstance(test, ast.Call) and ast_dotted_name(test.func).endswith("cuda.is_available"):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        operands = [test.left, test.comparators[0]]
        literal = any(isinstance(o, ast.Constant) and o.value == "cuda" for o in operands)
        typed = any(isinstance(o, ast.Attribute) and o.attr == "type" for o in operands)
        if literal and typed and isinstance(test.ops[0], ast.Eq | ast.NotEq):
            return isinstance(test.ops[0], ast.Eq)
    return None


def _raises_unless_cuda(node: ast.AST) -> bool:
    """`if x.device.type != "cuda": raise ...` or `assert x.is_cuda`: the function states it
    runs on CUDA tensors only."""
    if isinstance(node, ast.Assert):
        return _ast_cuda_test(node.test) is True
    if isinstance(node, ast.If) and _ast_cuda_test(node.test) is False:
        return any(isinstance(s, ast.Raise) for s in node.body)
    return False


def other_path(ctx: RuleContext, test: cst.CSTNode) -> cst.CSTNode | None:
    """The other branch of a CUDA test when it is the code's own way to do the same work on
    every other device (sam2 repeats a complex tensor on CUDA and expands and flattens it
    elsewhere, as "repeat may not be supported on non-CUDA devices"): an `else` part, or a
    conditional expression's, that does real work and names no CPU path (`.cpu()`, `"cpu"`,
    `dtw_cpu`). Widening the test would send a TPU down the CUDA path, where the code has a
    path of its own for it. None when the test has no such branch."""
    node = test
    negated = False
    parent = _parent(ctx, node)
    while isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        negated = not negated
        node, parent = parent, _parent(ctx, parent)
    # (In `a and b` or `a or b` the other branch also runs on CUDA: a fallback, not a path
    # for the other devices.)
    other: cst.CSTNode | None = None
    if isinstance(parent, cst.If) and parent.test is node:
        if negated:
            other = parent.body
        elif isinstance(parent.orelse, cst.Else):
            other = parent.orelse.body
    elif isinstance(parent, cst.IfExp) and parent.test is node:
        other = parent.body if negated else parent.orelse
    if other is None or _trivial(other) or _names_cpu(other):
        return None
    return other


def _trivial(node: cst.CSTNode) -> bool:
    """A branch that does no work of its own: a name, a constant, `pass`, a message, an
    assignment or return of one of those, `raise`."""
    if isinstance(node, cst.Name | cst.SimpleString | cst.Integer | cst.Float | cst.Ellipsis):
        return True
    if isinstance(node, cst.Attribute):
        return _trivial(node.value)  # `torch.float16`
    if isinstance(node, cst.UnaryOperation):
        return _trivial(node.expression)  # `-1`
    if isinstance(node, cst.List | cst.Tuple | cst.Set):
        return all(_trivial(e.value) for e in node.elements)
    if isinstance(node, cst.Dict):
        return not node.elements  # `{}`
    if isinstance(node, cst.IndentedBlock | cst.SimpleStatementSuite):
        return all(_trivial(line) for line in node.body)
    if isinstance(node, cst.SimpleStatementLine):
        return all(_trivial(small) for small in node.body)
    if isinstance(node, cst.Pass | cst.Raise | cst.Continue | cst.Break):
        return True
    if isinstance(node, cst.Return):
        return node.value is None or _trivial(node.value)
    if isinstance(node, cst.Assign | cst.AnnAssign):
        return node.value is not None and _trivial(node.value)
    if isinstance(node, cst.Expr):
        value = node.value
        if isinstance(value, cst.Call):
            return _is_message(value.func)
        return _trivial(value)
    return False


def _is_message(func: cst.BaseExpression) -> bool:
    """`print`, `warnings.warn`, `logger.info` and kin: a call that only says something."""
    if isinstance(func, cst.Name):
        return func.value in ("print", "warn")
    if isinstance(func, cst.Attribute):
        return func.attr.value in (
            "warn",
            "warning",
            "info",
            "debug",
            "error",
            "print",
            "write",
        )
    return False


def _names_cpu(node: cst.CSTNode) -> bool:
    """Whether a branch names the CPU: `.cpu()`, `"cpu"`, `.numpy()`, `dtw_cpu(...)`."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name) and (
            "cpu" in current.value.lower() or current.value == "numpy"
        ):
            return True
        if isinstance(current, cst.SimpleString):
            value = string_value(current)
            if value is not None and value.split(":")[0] == "cpu":
                return True
        stack.extend(current.children)
    return False


def _cuda_only_name(name: str, off: frozenset[str] = frozenset()) -> str | None:
    """`name` for a message, when the qualified name is one only CUDA runs (`off`: the
    `torch.cuda` names no rule of this run rewrites)."""
    if name.split(".")[0] in CUDA_ONLY_PACKAGES:
        return f"`{name}`"
    if any(name == p or name.startswith(p + ".") for p in CUDA_ONLY_TORCH):
        return f"`{name}`"
    if _cuda_own(name, off):
        return f"`{name}`"
    return None


def left_on_cuda(
    ctx: RuleContext,
    regions: list[cst.CSTNode],
    blocks: list[list[ast.AST]],
    exclude: cst.CSTNode | None = None,
) -> str | None:
    """What in the code a CUDA test guards still runs only on CUDA once this run's fixes are
    made, named for a message; None when nothing does, so that the test may be widened to
    every accelerator. `regions` are libcst nodes, `blocks` statements of Python's tree (the
    blocks of `if use_cuda:` elsewhere, analysis/values.py). Counted: a CUDA-only name that
    no fix covers, and a finding that stops the code on a TPU and that the rewrite leaves
    (`torch.cuda.manual_seed_all` without `--unsafe-fixes`). `exclude` is the test itself."""
    known = _Reported.of(ctx)
    inside = {id(n) for n in regions}
    for node, what in cuda_only_uses(ctx, regions, after_fixes=True):
        if not _under(ctx, node, known.covered, inside):
            return what
    p = known.first_left_under(ctx, regions, exclude)
    if p is not None:
        return f"`{ctx.source_of(p.node)}` ({p.rule.code})"
    if not blocks:
        return None
    spans = [(b[0].lineno, b[-1].end_lineno or b[-1].lineno) for b in blocks if b]  # type: ignore[attr-defined]  # a node of Python's tree with a position
    spots = known.spots(ctx)
    resolve = ctx.names.module_binding
    kernels = ctx.names.triton_kernels
    off = rewritten_off(ctx.options.enabled)
    for block in blocks:
        for line, column, what in _ast_cuda_only(block, resolve, kernels, ctx.source, off):
            if not any(c <= column < c + n for c, n in spots.get(line, ())):
                return what
    p = known.first_left_on_lines(ctx, spans, exclude)
    if p is not None:
        return f"`{ctx.source_of(p.node)}` ({p.rule.code})"
    return None


class _Reported:
    """The run's reports as `left_on_cuda` reads them, brought up to date on each call.

    `left_on_cuda` runs once per CUDA test, after the traversal, while the tests' own
    decisions add reports. Reading every report on every call made a module with a CUDA test
    on every few lines cost the square of its length (issue 33); reports only grow while the
    rules run, so each is read once here: settled (its node `covered`) or left (an error the
    rewrite leaves), each left one under the ids of its ancestors (the parents the traversal
    recorded), in report order. A left report whose ancestors do not reach the module is
    `loose`: climbed on every call, as before.
    """

    def __init__(self) -> None:
        self.count = 0
        self.settled: list[Pending] = []
        self.covered: set[int] = set()
        self.left: list[Pending] = []
        self.under: dict[int, list[int]] = {}  # id of an ancestor -> left reports, in order
        self.loose: list[int] = []
        self.placed = 0  # settled reports placed in `spotted`, left ones in `left_lines`
        self.spotted: dict[int, list[tuple[int, int]]] = {}  # line -> (column, length)
        self.placed_left = 0
        self.left_lines: dict[int, list[int]] = {}

    @classmethod
    def of(cls, ctx: RuleContext) -> _Reported:
        known = ctx.memo.get("left_on_cuda")
        if not isinstance(known, cls) or ctx.report_count() < known.count:
            known = ctx.memo["left_on_cuda"] = cls()
        options = ctx.options
        for p in ctx.reports(known.count):
            if p.settled(options):
                known.settled.append(p)
                known.covered.add(id(p.node))
            elif p.rule.severity is Severity.ERROR:
                known.add_left(ctx, p)
        known.count = ctx.report_count()
        return known

    def add_left(self, ctx: RuleContext, p: Pending) -> None:
        k = len(self.left)
        self.left.append(p)
        chain: list[int] = []
        current: cst.CSTNode | None = p.node
        while current is not None:
            chain.append(id(current))
            last = current
            current = ctx.parents.get(id(current))
        if last is not ctx.module:
            self.loose.append(k)
            return
        for key in chain:
            self.under.setdefault(key, []).append(k)

    def first_left_under(
        self, ctx: RuleContext, regions: list[cst.CSTNode], exclude: cst.CSTNode | None
    ) -> Pending | None:
        """The first left report (not at `exclude`) at or under a node of `regions`."""
        inside = {id(n) for n in regions}
        found = [[k for k in self.loose if _under(ctx, self.left[k].node, inside, set())]]
        found.extend(self.under.get(id(region), []) for region in regions)
        return self._first(found, exclude)

    def first_left_on_lines(
        self, ctx: RuleContext, spans: list[tuple[int, int]], exclude: cst.CSTNode | None
    ) -> Pending | None:
        """The first left report (not at `exclude`) on a line of `spans`."""
        for p in self.left[self.placed_left :]:
            self.left_lines.setdefault(ctx.position(p.node)[0], []).append(self.placed_left)
            self.placed_left += 1
        found = [
            self.left_lines.get(line, [])
            for first, last in spans
            for line in range(first, last + 1)
        ]
        return self._first(found, exclude)

    def _first(self, found: list[list[int]], exclude: cst.CSTNode | None) -> Pending | None:
        """The earliest report of `found` (lists in report order) not at `exclude`."""
        firsts = [next((k for k in ks if self.left[k].node is not exclude), None) for ks in found]
        kept = [k for k in firsts if k is not None]
        return self.left[min(kept)] if kept else None

    def spots(self, ctx: RuleContext) -> dict[int, list[tuple[int, int]]]:
        """Line -> (column, length) of each settled report's node."""
        for p in self.settled[self.placed :]:
            line, column = ctx.position(p.node)
            self.spotted.setdefault(line, []).append((column, len(ctx.source_of(p.node))))
            self.placed += 1
        return self.spotted


def _under(ctx: RuleContext, node: cst.CSTNode, marks: set[int], stop: set[int]) -> bool:
    """Whether `node` or one of its ancestors (up to one in `stop`, or a statement) is in
    `marks`; with `stop` empty, whether an ancestor is in `marks` at all."""
    current: cst.CSTNode | None = node
    while current is not None:
        if id(current) in marks:
            return True
        if id(current) in stop:
            return False
        current = ctx.parents.get(id(current))
    return False


def _ast_cuda_only(
    block: list[ast.AST],
    resolve: Callable[[str], str | None],
    kernels: frozenset[str],
    source: str,
    off: frozenset[str] = frozenset(),
    walk: Callable[[ast.AST], Iterator[ast.AST]] = ast.walk,
) -> Iterator[tuple[int, int, str]]:
    """(line, column, name) of each CUDA-only use in statements of Python's tree, through
    the module's imports (a function's own imports aside); `walk` gives a statement's
    nodes."""
    lines = source.encode("utf-8", "surrogatepass").splitlines(keepends=True)
    inner: set[int] = set()  # the heads of a dotted name: the whole name is read
    for stmt in block:
        for node in walk(stmt):
            if not isinstance(node, ast.Name | ast.Attribute) or id(node) in inner:
                continue
            if isinstance(node, ast.Attribute):
                inner.add(id(node.value))
            parts: list[str] = []
            head: ast.AST = node
            while isinstance(head, ast.Attribute):
                parts.append(head.attr)
                head = head.value
            if not isinstance(head, ast.Name):
                continue
            what = None
            base = resolve(head.id)
            if base is not None:
                what = _cuda_only_name(".".join([base, *reversed(parts)]), off)
            elif isinstance(node, ast.Name) and node.id in kernels:
                what = f"the Triton kernel `{node.id}`"
            if what is not None:
                text = lines[node.lineno - 1][: node.col_offset]
                yield node.lineno, len(text.decode("utf-8", "surrogatepass")) + 1, what


def _cuda_own(name: str, off: frozenset[str] = frozenset()) -> bool:
    """`torch.cuda` itself as a value (`backend = torch.cuda`), or a `torch.cuda` name no rule
    rewrites (or none of this run: `off`)."""
    if name == "torch.cuda":
        return True
    member = cuda_member(name)
    if member is None:
        return False
    head = member.split(".")[0]
    return head not in REWRITTEN_CUDA or head in off


def other_backend_branch(ctx: RuleContext, test: cst.CSTNode) -> str | None:
    """The other backend an `if` chain tests next to a CUDA test (`elif torch.xpu.is_available():`),
    by its qualified name; None if there is none. Such a chain picks CUDA by name: widening
    its test would send every accelerator down the CUDA branch."""
    node: cst.CSTNode = test
    parent = _parent(ctx, node)
    while isinstance(parent, cst.BooleanOperation | cst.UnaryOperation):
        node, parent = parent, _parent(ctx, parent)
    if not (isinstance(parent, cst.If) and parent.test is node):
        return None
    branch = parent.orelse
    while isinstance(branch, cst.If):
        stack: list[cst.CSTNode] = [branch.test]
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Call):
                name = (
                    _dotted_torch(ctx, current.func)
                    if isinstance(current.func, cst.Name | cst.Attribute)
                    else None
                )
                if name in OTHER_BACKENDS:
                    return name
            stack.extend(current.children)
        branch = branch.orelse
    return None


def _resolvable(ctx: RuleContext, node: cst.Name | cst.Attribute) -> bool:
    head: cst.CSTNode = node
    while isinstance(head, cst.Attribute):
        head = head.value
    return isinstance(head, cst.Name) and (head.value in ctx.names.imports or head.value == "torch")


def in_compat_fallback(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """Whether `node` is in the fallback of a compatibility `try`: an `except` for
    AttributeError, TypeError or ImportError whose `try` uses a device-agnostic API the
    rewrite would move to (`torch.amp.GradScaler("cuda")` ... `except AttributeError:
    torch.cuda.amp.GradScaler()`), or in the other branch of a test for such an API (`...
    if hasattr(torch, "accelerator") else torch.cuda.device_count()`). Such code runs only
    on a torch that lacks the new API."""
    for parent, child in ancestors(ctx, node):
        if isinstance(parent, cst.ExceptHandler) and child is parent.body:
            if not _catches_compat(parent):
                continue
            handler_try = _parent(ctx, parent)
            if isinstance(handler_try, cst.Try) and _uses_modern_api(ctx, handler_try.body):
                return True
        elif isinstance(parent, cst.If | cst.IfExp) and child is not parent.test:
            test = parent.test
            inner = negation(test)
            fallback = parent.body if inner is not None else parent.orelse
            if child is fallback and _has_modern_api(ctx, inner if inner is not None else test):
                return True  # `... if hasattr(torch, "accelerator") else <old torch>`
        elif isinstance(parent, cst.FunctionDef | cst.ClassDef):
            return False
    return False


def _has_modern_api(ctx: RuleContext, test: cst.BaseExpression) -> bool:
    """`hasattr(torch, "accelerator")` (also in an `and` chain): a test for the API the
    rewrite moves to, whose other branch is for a torch without it."""
    for part in conjuncts(test):
        if not (isinstance(part, cst.Call) and isinstance(part.func, cst.Name)):
            continue
        if part.func.value != "hasattr" or len(part.args) != 2:
            continue
        owner, attr = part.args[0].value, string_value(part.args[1].value)
        if attr is None or not isinstance(owner, cst.Name | cst.Attribute):
            continue
        base = _dotted_torch(ctx, owner) or qualified(ctx, owner)  # `import torch as th` in a def
        if base is not None and f"{base}.{attr}.".startswith(MODERN_API):
            return True
    return False


def _catches_compat(handler: cst.ExceptHandler) -> bool:
    caught = handler.type
    if caught is None:
        return False
    names = [e.value for e in caught.elements] if isinstance(caught, cst.Tuple) else [caught]
    for name in names:
        last = name.attr.value if isinstance(name, cst.Attribute) else getattr(name, "value", "")
        if last in COMPAT_ERRORS:
            return True
    return False


def _uses_modern_api(ctx: RuleContext, body: cst.CSTNode) -> bool:
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name | cst.Attribute):
            name = _dotted_torch(ctx, node)
            if name is not None and name.startswith(MODERN_API):
                return True
            if isinstance(node, cst.Attribute):
                continue
        stack.extend(node.children)
    return False


def _dotted_torch(ctx: RuleContext, node: cst.Name | cst.Attribute) -> str | None:
    """The qualified name of a torch name or attribute, resolving the module-level imports
    only (nodes of a `try` body the traversal may not have reached yet)."""
    parts: list[str] = []
    head: cst.CSTNode = node
    while isinstance(head, cst.Attribute):
        parts.append(head.attr.value)
        head = head.value
    if not isinstance(head, cst.Name):
        return None
    base = ctx.names.module_binding(head.value)
    if base is None:
        return None
    return ".".join([base, *reversed(parts)])
