"""Facts about torch's own API that more than one rule family needs.

A `torch.cuda` name that one family handles must not be reported again by the catch-all rule
(G2T319), so the tables of names live here, where both can read them.
"""

from __future__ import annotations

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
