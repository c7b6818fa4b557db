"""Facts about torch's own API that more than one rule family needs.

A `torch.cuda` name that one family handles must not be reported again by the catch-all rule
(G2T319), so the tables of names live here, where both can read them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

# CUDA allocator tooling with no device-agnostic counterpart, and what to do instead (G2T305).
MEMORY_TOOLING = {
    "memory_summary": "log `torch.accelerator.memory.memory_stats()` (guarded) instead",
    "memory_snapshot": "CUDA allocator snapshots have no TPU counterpart; guard it for CUDA",
    "memory_stats_as_nested_dict": "use `torch.accelerator.memory.memory_stats()` (guarded)",
    "set_per_process_memory_fraction": "no TPU counterpart: XLA reserves TPU memory itself",
    "get_per_process_memory_fraction": "no TPU counterpart: XLA reserves TPU memory itself",
    "caching_allocator_alloc": "allocate tensors with `torch.empty(..., device=device)`",
    "caching_allocator_delete": "let tensors free their memory",
    "_record_memory_history": "use the torch profiler's memory view; CUDA snapshots only",
    "_dump_snapshot": "use the torch profiler's memory view; CUDA snapshots only",
    "CUDAPluggableAllocator": "custom CUDA allocators have no TPU counterpart",
    "change_current_allocator": "custom CUDA allocators have no TPU counterpart",
    "MemPool": "CUDA memory pools have no TPU counterpart",
    "use_mem_pool": "CUDA memory pools have no TPU counterpart",
}


# `torch.cuda` names some rule rewrites to a device-agnostic form (a CUDA test that guards only
# these may be widened to every accelerator); any other `torch.cuda` name is CUDA's own.
REWRITTEN_CUDA = frozenset(
    {
        "is_available", "device_count", "current_device", "set_device", "synchronize",
        "device", "amp", "empty_cache", "memory_allocated", "max_memory_allocated",
        "memory_reserved", "max_memory_reserved", "memory_cached", "max_memory_cached",
        "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
        "reset_max_memory_allocated", "reset_max_memory_cached", "manual_seed",
        "manual_seed_all", "get_rng_state", "set_rng_state", "OutOfMemoryError", "init",
        "Event", "nvtx", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
        "LongTensor", "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor",
        "is_bf16_supported",
    }
)  # fmt: skip
# The rules that rewrite each of `REWRITTEN_CUDA`'s names (those left out have one each
# that is always on). With all of a name's rules off (`--ignore`, or held back by
# target-torch), the name stays CUDA's own: a test that guards it must not be widened.
REWRITTEN_BY: dict[str, tuple[str, ...]] = {
    "device": ("G2T110",),
    "amp": ("G2T201", "G2T204", "G2T206"),
    "empty_cache": ("G2T301",),
    **dict.fromkeys(
        (
            "memory_allocated",
            "max_memory_allocated",
            "memory_reserved",
            "max_memory_reserved",
            "memory_cached",
            "max_memory_cached",
            "memory_stats",
        ),
        ("G2T302",),
    ),  # fmt: skip
    **dict.fromkeys(
        (
            "reset_peak_memory_stats",
            "reset_accumulated_memory_stats",
            "reset_max_memory_allocated",
            "reset_max_memory_cached",
        ),
        ("G2T303",),
    ),  # fmt: skip
    "manual_seed": ("G2T306", "G2T307"),
    "manual_seed_all": ("G2T306", "G2T307"),
    "OutOfMemoryError": ("G2T317",),
    "init": ("G2T315",),
    "Event": ("G2T309",),
    "nvtx": ("G2T311",),
}


def rewritten_off(enabled: Callable[[str], bool]) -> frozenset[str]:
    """The names of `REWRITTEN_CUDA` no switched-on rule rewrites in this run."""
    return frozenset(
        name for name, codes in REWRITTEN_BY.items() if not any(enabled(c) for c in codes)
    )


# Availability tests of the other backends: a CUDA test next to them picks CUDA by name.
OTHER_BACKENDS = tuple(
    f"torch.{b}.is_available" for b in ("xpu", "mps", "npu", "hpu", "mtia", "backends.mps")
)


def cuda_member(qualified: str | None) -> str | None:
    """`X` for the qualified name `torch.cuda.X` (the submodules `memory`, `random` and
    `streams` folded: `torch.cuda.memory.empty_cache` is `empty_cache`); None otherwise."""
    if qualified is None or not qualified.startswith("torch.cuda."):
        return None
    rest = qualified[len("torch.cuda.") :]
    head, _, tail = rest.partition(".")
    if head in ("memory", "random", "streams") and tail:
        return tail
    return rest


FLOAT16_STRINGS = frozenset({"float16", "fp16", "half", "16-mixed"})


def float16_tests(tree: ast.Module | None, torch_names: frozenset[str]) -> tuple[int, ...]:
    """Lines of the comparisons that test for float16: `x.dtype == torch.float16`,
    `dtype in (torch.half, torch.bfloat16)`, `dtype == "float16"`. A switch from float16 to
    bfloat16 must change them with the rest, or not at all. `torch_names` are the module's
    names for torch."""
    if tree is None:
        return ()
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in list(operands):
            if isinstance(operand, ast.Tuple | ast.List | ast.Set):
                operands.extend(operand.elts)
        if any(_is_float16(o, torch_names) for o in operands):
            lines.append(node.lineno)
    return tuple(sorted(set(lines)))


def _is_float16(node: ast.AST, torch_names: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in FLOAT16_STRINGS
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("float16", "half")
        and isinstance(node.value, ast.Name)
        and node.value.id in torch_names
    )


def _major_minor(target_torch: str) -> tuple[int, int]:
    parts = [int(p) for p in re.findall(r"\d+", str(target_torch))[:2]]
    major, minor = (*parts, 0, 0)[:2]
    return major, minor


def checks_available(target_torch: str | None) -> bool:
    """Whether `torch.accelerator.current_accelerator(check_available=True)` exists in the
    oldest torch the rewritten code must run on (it arrived in torch 2.7; no target: yes).
    docs/torch-versions.md has the table."""
    return not target_torch or _major_minor(target_torch) >= (2, 7)


def has_accelerator(target_torch: str | None) -> bool:
    """Whether `torch.accelerator` exists in the oldest torch the rewritten code must run on
    (torch 2.6; no target: yes). Below it, what the fixes write asks `hasattr(torch,
    "accelerator")` first and falls back to the CUDA call (core/torch_compat.py)."""
    return not target_torch or _major_minor(target_torch) >= (2, 6)
