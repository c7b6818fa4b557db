"""Forecast a deep model from shallow copies of it: compile k and 2k blocks, extend the line.

A transformer is a stack of identical blocks, and what the compiler reports grows linearly
with the stack: FLOPs and bytes per block are the same at any depth, each block adds its
weights, optimizer state, gradients and saved activations to memory. Compiling the whole
step of an 8B-parameter model takes many minutes on a laptop; compiling it with one and with
two blocks takes seconds to a minute, and the line through those two points, read at the full
depth, lands within a few percent of the full compile (docs/forecast.md has the measured
errors). The copies share the model's parameters (nothing is allocated) and differ only in
the block list.

A stack is a `ModuleList` or `Sequential` whose children have the same structure: module
types, their `extra_repr`, and parameter and buffer names, shapes and dtypes. Blocks that
differ in a plain setting (Gemma's sliding-window layers alternate with global ones) repeat
with a period; k is that period, so k and 2k blocks hold the same mix as the full stack.
Per-block settings that are all different (a layer index) are not a pattern and are ignored.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .aot import CompileOutcome

# Extrapolate by default ("auto") from this many blocks in the stack.
AUTO_MIN_DEPTH = 16
# Plain settings read from each block to find its period (ints, floats, strings, bools).
_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class BlockStack:
    """A run of structurally identical blocks inside a model.

    `path` is the stack's module name ("transformer.h"), `depth` its length, `period` the
    number of blocks after which their settings repeat (1 for identical blocks).
    """

    path: str
    depth: int
    period: int
    block_parameters: int

    @property
    def shallow_depths(self) -> tuple[int, int]:
        """The two depths to compile: one period and two.

        Not none and one: the first block costs more memory than the next (the 8B Llama,
        FSDP on v5p 2x2x2: +1.41 GB for the first, +0.97 GB for the second), so a line
        from no block overstates a 32-block model's memory by a third (docs/forecast.md).
        """
        return self.period, 2 * self.period

    def describe(self, depths: tuple[int, int] | None = None) -> str:
        k, k2 = depths or self.shallow_depths
        return f"{k} and {k2} of the {self.depth} blocks in `{self.path}`"


def find_block_stack(model: torch.nn.Module) -> BlockStack | None:
    """The stack holding the most parameters, or None when the model has no repeated blocks.

    Only stacks of at least 4 periods qualify: with fewer, compiling k and 2k blocks costs
    about as much as the whole model.
    """
    import torch

    best: BlockStack | None = None
    best_size = -1
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList | torch.nn.Sequential) or len(module) < 4:
            continue
        blocks = list(module)
        if len({_structure(b) for b in blocks}) != 1:
            continue
        period = _period([_settings(b) for b in blocks])
        if period is None or len(blocks) < 4 * period:
            continue
        per_block = sum(p.numel() for p in blocks[0].parameters())
        size = per_block * len(blocks)
        if size > best_size:
            best = BlockStack(name, len(blocks), period, per_block)
            best_size = size
    return best


def with_depth(model: torch.nn.Module, stack: BlockStack, depth: int) -> torch.nn.Module:
    """A shallow copy of `model` whose stack holds only its first `depth` blocks.

    Modules on the path to the stack are copied (with their own child dictionaries), all
    else is shared: parameters, buffers, the blocks kept. The model itself is not changed.
    """
    if not stack.path:
        raise ValueError("the model itself is the stack; wrap it in a module to extrapolate")

    def first_blocks(blocks: torch.nn.Module) -> torch.nn.Module:
        kept = _copy_module(blocks)
        kept._modules = dict(list(blocks._modules.items())[:depth])
        return kept

    return _with_stack(model, stack, first_blocks)


def with_checkpointed_blocks(model: torch.nn.Module, stack: BlockStack) -> torch.nn.Module:
    """A copy of `model` whose stack's blocks each run under activation checkpointing.

    What a user would write to fit a large model (`checkpoint(block, x,
    use_reentrant=False)` per block), without touching the model: the blocks on the stack
    are shallow copies whose `forward` goes through `torch.utils.checkpoint.checkpoint`
    (which the trace lowers to `jax.checkpoint`); parameters, buffers and their names are
    the model's own. A model that is the stack itself (an `nn.Sequential` of blocks) has its
    children checkpointed.
    """
    return _with_stack(model, stack, lambda blocks: _checkpoint_children(_copy_module(blocks)))


def _with_stack(
    model: torch.nn.Module,
    stack: BlockStack,
    rebuild: Callable[[torch.nn.Module], torch.nn.Module],
) -> torch.nn.Module:
    """`model` with its stack replaced by `rebuild(stack)`: the modules on the path to it are
    shallow copies, so the model itself is not changed."""
    parts = stack.path.split(".") if stack.path else []
    if not parts:
        return rebuild(model)
    root = _copy_module(model)
    parent = root
    for name in parts[:-1]:
        child = _copy_module(parent._modules[name])
        parent._modules[name] = child
        parent = child
    parent._modules[parts[-1]] = rebuild(parent._modules[parts[-1]])
    return root


def _checkpoint_children(blocks: torch.nn.Module) -> torch.nn.Module:
    """`blocks` (a shallow copy) with each child replaced by a copy that checkpoints."""
    for name, block in list(blocks._modules.items()):
        if block is None:
            continue
        clone = _copy_module(block)
        clone.forward = _checkpointed(type(block).forward.__get__(clone))
        blocks._modules[name] = clone
    return blocks


def _checkpointed(forward: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def extrapolate_outcome(
    shallow: CompileOutcome, deeper: CompileOutcome, depths: tuple[int, int], depth: int
) -> CompileOutcome:
    """The full-depth figures on the line through the compiles at depths a < b.

    Each figure f is f(a) + (depth - a) / (b - a) * (f(b) - f(a)). When either compile ran
    out of memory, the full model does too (memory only grows with depth): the result is
    "oom" with the extrapolated requirement and no FLOPs.
    """
    from .aot import CompileOutcome

    low, high = depths
    periods = (depth - low) / (high - low)

    def line(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return None
        return a + periods * (b - a)

    if "error" in (shallow.status, deeper.status):
        failed = shallow if shallow.status == "error" else deeper
        return CompileOutcome("error", shallow.batch, message=failed.message)
    available = deeper.available_bytes or shallow.available_bytes
    if "oom" in (shallow.status, deeper.status):
        return CompileOutcome(
            "oom",
            shallow.batch,
            required_bytes=line(shallow.memory_bytes, deeper.memory_bytes),
            available_bytes=available,
            message=(deeper if deeper.status == "oom" else shallow).message,
        )

    def sizes(name: str) -> int | None:
        value = line(getattr(shallow, name), getattr(deeper, name))
        return None if value is None else round(value)

    optimal = None
    if (shallow.optimal_seconds or 0) > 0 and (deeper.optimal_seconds or 0) > 0:
        optimal = line(shallow.optimal_seconds, deeper.optimal_seconds)

    def figure(name: str) -> float | None:
        return line(getattr(shallow, name), getattr(deeper, name))

    collectives = {
        kind: {
            key: line(shallow.collectives[kind].get(key, 0.0), value) or 0.0
            for key, value in deeper.collectives[kind].items()
        }
        for kind in deeper.collectives
        if kind in shallow.collectives
    }
    return CompileOutcome(
        "compiled",
        shallow.batch,
        flops=figure("flops"),
        bytes_accessed=figure("bytes_accessed"),
        transcendentals=figure("transcendentals"),
        optimal_seconds=optimal,
        argument_bytes=sizes("argument_bytes"),
        output_bytes=sizes("output_bytes"),
        alias_bytes=sizes("alias_bytes"),
        temp_bytes=sizes("temp_bytes"),
        code_bytes=sizes("code_bytes"),
        available_bytes=available,
        compiler_flops=figure("compiler_flops"),
        compiler_bytes=figure("compiler_bytes"),
        matmul_flops=figure("matmul_flops"),
        attention_flops=figure("attention_flops"),
        loop_flops=figure("loop_flops"),
        ici_bytes=figure("ici_bytes"),
        async_ici_bytes=figure("async_ici_bytes"),
        collectives=collectives,
        custom_calls=dict(deeper.custom_calls),
        attention_kind=deeper.attention_kind,
        attention_fallbacks=list(deeper.attention_fallbacks),
        remat_regions=deeper.remat_regions,
    )


def exceeds(outcome: CompileOutcome, capacity: float | None) -> bool:
    """Whether an extrapolated step needs more than `capacity` bytes per device."""
    memory = outcome.memory_bytes
    return capacity is not None and memory is not None and memory > capacity


# -- structure ------------------------------------------------------------------------------


def _copy_module(module: torch.nn.Module) -> torch.nn.Module:
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def _structure(block: torch.nn.Module) -> tuple[object, ...]:
    """What makes two blocks the same program: module types, settings shown by extra_repr,
    and parameter and buffer names, shapes, dtypes (and whether they train)."""
    modules = tuple(
        (name, type(m).__module__, type(m).__qualname__, m.extra_repr())
        for name, m in block.named_modules()
    )
    params = tuple(
        (name, tuple(p.shape), str(p.dtype), p.requires_grad)
        for name, p in block.named_parameters()
    )
    buffers = tuple((name, tuple(b.shape), str(b.dtype)) for name, b in block.named_buffers())
    return modules, params, buffers


def _settings(block: torch.nn.Module) -> tuple[tuple[str, object], ...]:
    """Plain attributes of the block and its submodules (is_sliding, window, layer_idx...)."""
    items: list[tuple[str, object]] = []
    for name, module in block.named_modules():
        for key, value in sorted(vars(module).items()):
            if key.startswith("_") or key == "training" or not isinstance(value, _PLAIN):
                continue
            items.append((f"{name}.{key}", value))
    return tuple(items)


def _period(settings: list[tuple[tuple[str, object], ...]]) -> int | None:
    """The smallest p with settings[i] == settings[i + p], ignoring per-block indices.

    A setting whose value differs in every block is an index, not a pattern; None when the
    remaining settings do not repeat within half the stack.
    """
    if not settings:
        return 1
    keys = [k for k, _ in settings[0]]
    if any([k for k, _ in s] != keys for s in settings):
        return None
    columns = list(zip(*[[v for _, v in s] for s in settings], strict=True)) if keys else []
    kept = [c for c in columns if len(set(map(repr, c))) < len(c)]
    rows = list(zip(*kept, strict=True)) if kept else [()] * len(settings)
    n = len(rows)
    for p in range(1, n // 2 + 1):
        if all(rows[i] == rows[i + p] for i in range(n - p)):
            return p
    return None


def describe_extrapolation(stack: BlockStack, outcome_depths: tuple[int, int]) -> dict[str, Any]:
    """What a result records about its extrapolation (JSON-ready)."""
    return {
        "stack": stack.path,
        "depth": stack.depth,
        "period": stack.period,
        "compiled_depths": list(outcome_depths),
        "block_parameters": stack.block_parameters,
    }
