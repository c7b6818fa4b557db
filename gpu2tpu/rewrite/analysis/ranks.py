"""Ranks and processes: which values a module uses as its process's CUDA device index, and
which counts start its processes.

The DDP tutorial pattern names the index after the GPU, not the rank (`self.gpu_id =
int(os.environ["LOCAL_RANK"])`, `Trainer(..., gpu_id=rank)`), so a name pattern alone does not
find it. What the module does with a value does: a value passed as DDP's `device_ids=[x]` or
`output_device=x`, to `torch.cuda.set_device(x)`, or assigned from `$LOCAL_RANK`/`$RANK`, is
an index of the process's device, and `.to(x)` with it is a CUDA ordinal. Likewise the count
given to `mp.spawn(..., nprocs=n)` is how many processes the job starts.

Facts are read once per module from Python's own tree (a walk in C-backed `ast`), and only
for modules that contain one of the tokens these patterns need.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import libcst as cst

from .literals import cuda_format_call, cuda_literal, last_segment

if TYPE_CHECKING:
    from ..rules.base import RuleContext

_RANK_ENV = frozenset({"LOCAL_RANK", "RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"})
_SET_DEVICE = frozenset({"set_device", "set_device_index", "set_device_idx"})
_SPAWN = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
        "torch.multiprocessing.spawn.start_processes",
    }
)
_TOKENS = ("device_ids", "output_device", "set_device", "LOCAL_RANK", "RANK")
# Names of a device rather than of an index: `.to(device)` is never an ordinal.
_DEVICE_SUFFIXES = ("_id", "_idx", "_index", "id", "idx")

_INDEX_CACHE: WeakKeyDictionary[RuleContext, frozenset[str]] = WeakKeyDictionary()
_SPAWN_CACHE: WeakKeyDictionary[RuleContext, frozenset[str]] = WeakKeyDictionary()


def _last(node: ast.AST) -> str | None:
    """`gpu_id` for `gpu_id` and `self.gpu_id`; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _reads_rank_env(node: ast.AST) -> bool:
    """`int(os.environ["LOCAL_RANK"])`, `int(os.getenv("RANK", 0))` and the like."""
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in _RANK_ENV
        for n in ast.walk(node)
    )


def _an_index(name: str | None) -> bool:
    if not name:
        return False
    lowered = name.lower()
    return "device" not in lowered or lowered.endswith(_DEVICE_SUFFIXES)


def device_index_names(ctx: RuleContext) -> frozenset[str]:
    """The names (last segments: `gpu_id` for `self.gpu_id`) the module uses as the index of
    its process's CUDA device: in DDP's `device_ids=[x]` / `output_device=x`, in
    `set_device(x)`, or assigned from the rank's environment variable."""
    found = _INDEX_CACHE.get(ctx)
    if found is not None:
        return found
    names: set[str] = set()
    tree = ctx.tree
    if tree is not None and any(t in ctx.source for t in _TOKENS):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "device_ids" and isinstance(kw.value, ast.List | ast.Tuple):
                        names.update(filter(None, map(_last, kw.value.elts[:1])))
                    elif kw.arg == "output_device":
                        names.add(_last(kw.value) or "")
                func = node.func
                if _last(func) in _SET_DEVICE and len(node.args) == 1:
                    names.add(_last(node.args[0]) or "")
            elif isinstance(node, ast.Assign) and _reads_rank_env(node.value):
                names.update(filter(None, map(_last, node.targets)))
    found = frozenset(n for n in names if _an_index(n))
    _INDEX_CACHE[ctx] = found
    return found


def spawn_counts(ctx: RuleContext) -> frozenset[str]:
    """The names the module passes as the process count of `torch.multiprocessing.spawn`
    (`nprocs=world_size`, or third by position)."""
    found = _SPAWN_CACHE.get(ctx)
    if found is not None:
        return found
    names: set[str] = set()
    tree = ctx.tree
    if tree is not None and ("spawn" in ctx.source or "start_processes" in ctx.source):
        imports = ctx.names.module_imports
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _qualified(node.func, imports) not in _SPAWN:
                continue
            count = next((k.value for k in node.keywords if k.arg == "nprocs"), None)
            if count is None and len(node.args) >= 3:
                count = node.args[2]
            if isinstance(count, ast.Name):
                names.add(count.id)
    found = frozenset(names)
    _SPAWN_CACHE[ctx] = found
    return found


def _qualified(func: ast.AST, imports: dict[str, str]) -> str | None:
    """`torch.multiprocessing.spawn` for `mp.spawn` after `import torch.multiprocessing as
    mp` (module-level imports only: a spawn call sits in the script's main block)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    head = imports.get(func.id, func.id if func.id == "torch" else None)
    if head is None:
        return None
    return ".".join([head, *reversed(parts)])


def rank_index(ctx: RuleContext, value: cst.BaseExpression) -> bool:
    """Whether an index is the process's rank (`local_rank`, a value the module uses as
    DDP's `device_ids`), which a TPU process does not have."""
    if last_segment(value) in device_index_names(ctx):
        return True
    return ctx.flow.refers_to_rank(value, index_only=True)


def rank_string(ctx: RuleContext, literal: cst.CSTNode) -> bool:
    """Whether a device string's index is the process's rank: `f"cuda:{local_rank}"`,
    `"cuda:{}".format(args.local_rank)`."""
    index: cst.CSTNode | None = None
    if isinstance(literal, cst.FormattedString) and cuda_literal(literal):
        part = literal.parts[1]
        index = part.expression if isinstance(part, cst.FormattedStringExpression) else None
    elif isinstance(literal, cst.Call) and cuda_format_call(literal) is not None:
        index = literal.args[0].value
    return isinstance(index, cst.BaseExpression) and rank_index(ctx, index)
