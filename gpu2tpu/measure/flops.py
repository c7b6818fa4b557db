"""What one step does: FLOPs, bytes moved and host syncs; and what this host's CPU can do.

FLOPs come from PyTorch's own `FlopCounterMode` (matmuls, convolutions, attention: the ops
that dominate a training step, forward and backward). Bytes are a rough upper bound on
memory traffic: the sizes of every non-view op's inputs and outputs, as if nothing were
fused; XLA fuses, so a TPU moves fewer bytes than this (docs/profiler.md). Host syncs are the
reads of device data by the host (`.item()`, `bool(t)`, `.tolist()`, printing, copies to the
CPU), which stall a TPU's pipeline on every step: counted by the rules the dry run uses
(measure/syncs.py), so an optimizer's step counters, which stay on the host, are not.

Counting runs on one extra, untimed step: a dispatch mode slows every op it sees.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .syncs import HostReads, op_info


@dataclass(frozen=True)
class StepCount:
    """Counts for one step: FLOPs, bytes moved (unfused upper bound), host syncs, top ops."""

    flops: float
    bytes_accessed: float
    host_syncs: int
    top_ops: tuple[tuple[str, float], ...] = ()
    sync_ops: tuple[tuple[str, int], ...] = ()
    source: str = "torch.utils.flop_counter.FlopCounterMode"
    # FLOPs of scaled_dot_product_attention's kernels (FlopCounterMode counts the full
    # score matrix, causal or not): the expected time needs attention's share.
    attention_flops: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "host_syncs": self.host_syncs,
            "top_ops": [list(op) for op in self.top_ops],
            "sync_ops": [list(op) for op in self.sync_ops],
            "source": self.source,
            "attention_flops": self.attention_flops,
        }


def is_attention_op(name: str) -> bool:
    """Whether an op is one of SDPA's attention kernels (forward or backward)."""
    return (
        "scaled_dot_product" in name or "flash_attention" in name or ("efficient_attention" in name)
    )


def _make_traffic_mode(reads: HostReads) -> Any:
    """A dispatch mode counting bytes in and out of every non-view op, and host reads."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class TrafficMode(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            reads.op_read(op_info(func), args, kwargs)
            if not getattr(func, "is_view", False):
                for leaf in tree_leaves((args, kwargs, out)):
                    if isinstance(leaf, torch.Tensor):
                        self.bytes += leaf.numel() * leaf.element_size()
            return out

    return TrafficMode()


def _make_sync_mode(reads: HostReads) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class SyncMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            reads.op_read(op_info(func), args, kwargs)
            return out

    return SyncMode()


class _ReadTally:
    """Host reads by cause, as `HostReads` reports them (measure/syncs.py: the dry run's rules)."""

    def __init__(self, emulated: bool) -> None:
        self.causes: dict[str, int] = {}
        self.reads = HostReads(self._on_read, emulated=emulated)

    def _on_read(self, cause: str, frame: Any, origin: str | None) -> None:
        self.causes[cause] = self.causes.get(cause, 0) + 1

    @property
    def count(self) -> int:
        return sum(self.causes.values())


@dataclass
class StepCounter:
    """Context manager: count FLOPs, bytes and host syncs of the code run inside it.

    `emulated`: the step runs on the CPU in place of a TPU, so every tensor read counts as a
    device read (except those that stay on the host on a TPU too); on an accelerator only
    reads of its tensors count (measure/syncs.py).
    """

    top: int = 8
    emulated: bool = True
    _flop_mode: Any = field(default=None, init=False)
    _traffic: Any = field(default=None, init=False)
    _tally: Any = field(default=None, init=False)
    _watch: Any = field(default=None, init=False)
    _done: bool = field(default=False, init=False)

    def __enter__(self) -> StepCounter:
        from torch.utils.flop_counter import FlopCounterMode

        self._tally = _ReadTally(self.emulated)
        self._flop_mode = FlopCounterMode(display=False)
        self._traffic = _make_traffic_mode(self._tally.reads)
        self._watch = self._tally.reads.watching()
        self._watch.__enter__()
        try:
            self._flop_mode.__enter__()
            try:
                self._traffic.__enter__()
            except BaseException:
                self._flop_mode.__exit__(None, None, None)
                raise
        except BaseException:
            self._watch.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._done:
            return
        self._done = True
        try:
            try:
                self._traffic.__exit__(exc_type, exc, tb)
            finally:
                self._flop_mode.__exit__(exc_type, exc, tb)
        finally:
            self._watch.__exit__(exc_type, exc, tb)

    def result(self) -> StepCount:
        """The counts, once the block has ended."""
        if not self._done:
            raise RuntimeError("StepCounter.result() is ready only after the block ends.")
        per_op = self._flop_mode.get_flop_counts().get("Global", {})
        ranked = sorted(((str(op), float(n)) for op, n in per_op.items()), key=lambda t: -t[1])
        syncs = self._tally.causes
        return StepCount(
            flops=float(self._flop_mode.get_total_flops()),
            bytes_accessed=float(self._traffic.bytes),
            host_syncs=sum(syncs.values()),
            top_ops=tuple(ranked[: self.top]),
            sync_ops=tuple(sorted(syncs.items(), key=lambda t: -t[1])),
            attention_flops=sum(n for op, n in ranked if is_attention_op(op)),
        )


def count_step(step: Callable[[], Any], *, emulated: bool = True) -> StepCount:
    """Run `step()` once under the counters and return what it did."""
    counter = StepCounter(emulated=emulated)
    with counter:
        step()
    return counter.result()


class HostSyncCounter:
    """Context manager counting host syncs only (`profile(count_syncs=True)`).

    Lighter than `StepCounter`, but still a Python call per op: the steps it watches run
    slower, which the result notes. `emulated` as for `StepCounter`.
    """

    def __init__(self, emulated: bool = True) -> None:
        self._tally = _ReadTally(emulated)
        self._mode: Any = None
        self._watch: Any = None
        self.count = 0

    def __enter__(self) -> HostSyncCounter:
        self._watch = self._tally.reads.watching()
        self._watch.__enter__()
        self._mode = _make_sync_mode(self._tally.reads)
        try:
            self._mode.__enter__()
        except BaseException:
            self._watch.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._watch.__exit__(exc_type, exc, tb)
        self.count = self._tally.count


@dataclass(frozen=True)
class HostPeak:
    """This host's measured dense matmul rate (FLOP/s) and copy bandwidth (bytes/s)."""

    flops_per_s: float
    bytes_per_s: float
    threads: int
    dtype: str
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops_per_s": self.flops_per_s,
            "bytes_per_s": self.bytes_per_s,
            "threads": self.threads,
            "dtype": self.dtype,
            "method": self.method,
        }


def measure_host_peak(size: int = 1024, copy_mib: int = 64, repeats: int = 5) -> HostPeak:
    """The CPU's best-of-`repeats` float32 matmul rate and memory copy bandwidth.

    The host CPU has no catalogue peak, so the profiler measures one to derive how
    efficiently a CPU step ran (the estimate method in docs/profiler.md). Cached per
    thread count: it costs a few hundred milliseconds.
    """
    import torch

    return _measure_host_peak(size, copy_mib, repeats, torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _measure_host_peak(size: int, copy_mib: int, repeats: int, threads: int) -> HostPeak:
    import torch

    with torch.no_grad():
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        out = torch.empty(size, size)
        torch.mm(a, b, out=out)  # first call pays for allocation and thread start-up
        best_mm = min(_timed(lambda: torch.mm(a, b, out=out)) for _ in range(repeats))
        n = copy_mib * 2**20 // 4
        src = torch.ones(n)
        dst = torch.empty(n)
        dst.copy_(src)
        best_copy = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return HostPeak(
        flops_per_s=2.0 * size**3 / best_mm,
        bytes_per_s=2.0 * n * 4 / best_copy,  # read + write
        threads=threads,
        dtype="float32",
        method=(
            f"best of {repeats}: {size}x{size} float32 matmul and a {copy_mib} MiB copy, "
            f"{threads} threads"
        ),
    )


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
