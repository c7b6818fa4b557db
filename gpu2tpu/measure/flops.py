"""What one step does: FLOPs, bytes moved and host syncs; and what this host's CPU can do.

FLOPs come from PyTorch's own `FlopCounterMode` (matmuls, convolutions, attention: the ops
that dominate a training step, forward and backward), with three corrections
(`conv_flops.py`, docs/profiler.md "FLOPs you can trust"): the weight gradient of a grouped or
depthwise convolution, which torch 2.1-2.12 counts `groups` times over; SDPA's CPU kernels,
which it does not count at all; and attention run through `bmm` inside a module named for
attention, which it counts as plain matmuls. Besides FLOPs, the step's precision (the dtype
its matmul FLOPs ran in), its kernel launches (non-view ops) and a guess at its model class
are read from the same ops: the expected time and the per-step floor need them. Bytes are a rough upper bound on
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .flop_formulas import corrections, is_attention_op
from .syncs import HostReads, op_info
from .workload import IntensityProfile, OpMix, guess_model_class, step_precision


@dataclass(frozen=True)
class StepCount:
    """Counts for one step: FLOPs, bytes moved (unfused upper bound), host syncs, top ops;
    how the FLOPs split by kind of op (`mix`), the step's precision and model class as read
    from them (measure/workload.py), and notes on what the count corrected or left out."""

    flops: float
    bytes_accessed: float
    host_syncs: int
    top_ops: tuple[tuple[str, float], ...] = ()
    sync_ops: tuple[tuple[str, int], ...] = ()
    source: str = "torch.utils.flop_counter.FlopCounterMode"
    # FLOPs of attention products (SDPA's kernels, counted over the full score matrix causal
    # or not, and bmm inside modules named for attention): the expected time needs its share.
    attention_flops: float = 0.0
    mix: OpMix = field(default_factory=OpMix)
    precision: str | None = None
    model_class: str | None = None
    model_class_reason: str = ""
    notes: tuple[str, ...] = ()

    @property
    def matmul_share(self) -> float | None:
        return self.mix.matmul_share

    @property
    def kernel_ops(self) -> int:
        return self.mix.kernel_ops

    def fit_inputs(self, chip_kind: str) -> dict[str, Any]:
        """What the utilisation fit needs of this step besides its FLOPs, for a chip of
        `chip_kind` (`StepFeatures` keywords): the shares of matrix and convolution FLOPs,
        the precision (an fp32 step runs TF32 on a GPU, as PyTorch's convolutions and
        NVIDIA's published fp32 runs do) and the model class its ops look like. (Its traffic
        op by op, which costs CNNs, encoders and U-Nets, is `traffic(chips)`.)"""
        if not self.flops:
            return {}
        mix = self.mix
        precision = self.precision if self.precision in ("bf16", "fp16", "fp32") else "fp32"
        if precision == "fp32" and chip_kind == "gpu":
            precision = "tf32"
        return {
            "matmul_share": mix.matmul_share,
            "conv_share": mix.conv_flops / mix.matrix_flops if mix.matrix_flops else None,
            "precision": precision,
            "model_class": self.model_class,
        }

    def traffic(self, chips: int = 1) -> Any:
        """The step's FLOPs and unfused bytes op by op, as `pricing.class_fit.OpTraffic`,
        split over `chips` (or None where the count did not record them)."""
        from ..pricing.op_traffic import OpTraffic

        mix = self.mix
        if not mix.matrix_intensity and not mix.other_bytes:
            return None
        return OpTraffic(
            mix.matrix_intensity,
            mix.other_bytes,
            mix.depthwise_bytes,
            mix.conv3d_flops,
            mix.channels_first_flops,
            mix.conv_flops,
        ).scaled(1.0 / chips)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "host_syncs": self.host_syncs,
            "top_ops": [list(op) for op in self.top_ops],
            "sync_ops": [list(op) for op in self.sync_ops],
            "source": self.source,
            "attention_flops": self.attention_flops,
            "mix": self.mix.to_dict(),
            "precision": self.precision,
            "model_class": self.model_class,
            "model_class_reason": self.model_class_reason,
            "notes": list(self.notes),
        }


# Ops that only allocate or relabel memory: no kernel runs for them.
_NO_KERNEL = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view",
     "set_", "resize_", "lift_fresh", "detach"}
)  # fmt: skip
_CONVOLUTIONS = frozenset({"convolution", "_convolution", "convolution_backward"})
_BATCHED_MATMULS = frozenset({"bmm", "baddbmm"})


def _names_attention(module_path: str) -> bool:
    """Whether a module path (FlopCounterMode's "Model.encoder.layer.0.attention.self") has a
    part named for attention ("attn", "attention", "MultiheadAttention")."""
    return any("attn" in part or "attention" in part for part in module_path.lower().split("."))


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """An op's argument by its schema name, passed positionally or by keyword."""
    if name in kwargs:
        return kwargs[name]
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == name:
            return args[i] if i < len(args) else arg.default_value
    return None


def _depthwise(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a convolution (forward or backward) is depthwise: one input channel a group,
    more than one group. Such convolutions do a few FLOPs per byte and run below the
    memory bandwidth on GPUs (docs/profiler.md), so their bytes are kept apart."""
    import torch

    weight = args[2] if func.overloadpacket.__name__ == "convolution_backward" else args[1]
    groups = _argument(func, args, kwargs, "groups")
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() > 2
        and weight.shape[1] == 1
        and (isinstance(groups, int) and groups > 1)
    )


def _channels_last(tensor: Any) -> bool:
    """Whether a convolution's input or weight (4-D or 5-D) is laid out channels-last and
    not also channels-first (a 1x1 kernel's weight, or a one-channel image, is both: it tells
    nothing). PyTorch runs a convolution channels-last when its input or its weight is."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() not in (4, 5):
        return False
    last = torch.channels_last if tensor.dim() == 4 else torch.channels_last_3d
    return tensor.is_contiguous(memory_format=last) and not tensor.is_contiguous()


class _OpTally:
    """What the traffic mode learns about each op besides bytes: `OpMix`'s fields."""

    def __init__(self, registry: Mapping[Any, Any], parents: Callable[[], Iterable[str]]) -> None:
        self.registry = registry
        self.parents = parents
        self.fields: dict[str, float] = dict.fromkeys(
            ("matmul_flops", "attention_flops", "conv_flops", "conv3d_flops",
             "transposed_conv_flops", "channels_first_flops", "other_elements"), 0.0
        )  # fmt: skip
        self.kernel_ops = 0
        self.causal = False
        self.upsampling = False
        self.by_dtype: dict[str, float] = {}
        self.plain_bmm_flops = 0.0
        self.other_bytes = 0.0
        self.depthwise_bytes = 0.0
        self.intensity = IntensityProfile()
        # a convolution seen channels-last: the meta device's convolutions return their
        # outputs channels-first whatever came in, so one convolution's input cannot be read
        # there; a model converted with `.to(memory_format=torch.channels_last)` shows it in
        # its weights, and then every convolution of the step runs so
        self.channels_last = False

    def op(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, nbytes: float
    ) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        packet = func.overloadpacket
        name = packet.__name__
        if name not in _NO_KERNEL:
            self.kernel_ops += 1
        formula = self.registry.get(packet)
        if formula is None:
            if name.startswith("upsample"):
                self.upsampling = True
            if name not in _NO_KERNEL:
                self.other_bytes += nbytes
            # One FLOP per element of its largest tensor: elementwise ops and reductions alike.
            self.fields["other_elements"] += max(
                (
                    leaf.numel()
                    for leaf in tree_leaves((args, out))
                    if isinstance(leaf, torch.Tensor)
                ),
                default=0,
            )
            return
        flops = float(formula(*args, **kwargs, out_val=out))
        if name in _CONVOLUTIONS and _depthwise(func, args, kwargs):
            self.depthwise_bytes += nbytes
        else:
            self.intensity.add(flops, nbytes)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is not None:
            dtype = str(first.dtype)
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0.0) + flops
        if name in _CONVOLUTIONS:
            self.fields["conv_flops"] += flops
            weight = args[2] if name == "convolution_backward" else args[1]
            if isinstance(weight, torch.Tensor) and weight.dim() == 5:
                self.fields["conv3d_flops"] += flops
            image = args[1] if name == "convolution_backward" else args[0]
            if _channels_last(image) or _channels_last(weight):
                self.channels_last = True
            elif isinstance(image, torch.Tensor) and image.dim() in (4, 5):
                self.fields["channels_first_flops"] += flops
            if _argument(func, args, kwargs, "transposed"):
                self.fields["transposed_conv_flops"] += flops
        elif is_attention_op(name):
            self.fields["attention_flops"] += flops
            self.causal = self.causal or bool(_argument(func, args, kwargs, "is_causal"))
        elif name in _BATCHED_MATMULS and any(_names_attention(p) for p in self.parents()):
            self.fields["attention_flops"] += flops
        else:
            self.fields["matmul_flops"] += flops
            if name in _BATCHED_MATMULS:
                self.plain_bmm_flops += flops

    def mix(self) -> OpMix:
        fields = dict(self.fields)
        if self.channels_last:
            fields["channels_first_flops"] = 0.0
        return OpMix(
            kernel_ops=self.kernel_ops,
            causal_attention=self.causal,
            upsampling=self.upsampling,
            flops_by_dtype=dict(self.by_dtype),
            other_bytes=self.other_bytes,
            depthwise_bytes=self.depthwise_bytes,
            matrix_intensity=self.intensity.frozen(),
            **fields,
        )


def _make_traffic_mode(reads: HostReads, tally: _OpTally | None = None) -> Any:
    """A dispatch mode counting bytes in and out of every non-view op, and host reads;
    with a `tally`, also what each op is (`_OpTally`)."""
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
                moved = sum(
                    leaf.numel() * leaf.element_size()
                    for leaf in tree_leaves((args, kwargs, out))
                    if isinstance(leaf, torch.Tensor)
                )
                self.bytes += moved
                if tally is not None:
                    tally.op(func, args, kwargs, out, float(moved))
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
    _ops: Any = field(default=None, init=False)
    _watch: Any = field(default=None, init=False)
    _done: bool = field(default=False, init=False)

    def __enter__(self) -> StepCounter:
        from torch.utils.flop_counter import FlopCounterMode

        self._tally = _ReadTally(self.emulated)
        self._flop_mode = FlopCounterMode(display=False, custom_mapping=corrections())
        mode = self._flop_mode
        self._ops = _OpTally(mode.flop_registry, lambda: mode.mod_tracker.parents)
        self._traffic = _make_traffic_mode(self._tally.reads, self._ops)
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
        mix = self._ops.mix()
        flops = float(self._flop_mode.get_total_flops())
        model_class, why = guess_model_class(mix, flops)
        notes = []
        if self._ops.plain_bmm_flops:
            notes.append(
                f"{self._ops.plain_bmm_flops / flops:.0%} of the FLOPs are batched matmuls "
                "outside any module named for attention: counted as plain matmuls, not attention"
            )
        return StepCount(
            flops=flops,
            bytes_accessed=float(self._traffic.bytes),
            host_syncs=sum(syncs.values()),
            top_ops=tuple(ranked[: self.top]),
            sync_ops=tuple(sorted(syncs.items(), key=lambda t: -t[1])),
            attention_flops=mix.attention_flops,
            mix=mix,
            precision=step_precision(mix),
            model_class=model_class,
            model_class_reason=why,
            notes=tuple(notes),
        )


def count_step(step: Callable[[], Any], *, emulated: bool = True) -> StepCount:
    """Run `step()` once under the counters and return what it did."""
    counter = StepCounter(emulated=emulated)
    with counter:
        step()
    return counter.result()


def count_meta_step(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    dtype: Any = None,
) -> StepCount:
    """One training step (forward `model(*args, **kwargs)`, `loss_fn(output, targets)`,
    backward) counted on the meta device, as `count_step` counts a real one: nothing is
    allocated or computed, so a model of any size is counted in the time its ops take to
    dispatch. The weights and the batch's floating tensors are taken in `dtype` when given
    (their own otherwise); factory calls in the model land on the meta device too."""
    import torch
    from torch.func import functional_call
    from torch.utils._pytree import tree_map

    def meta(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        # empty_like keeps the layout (a channels-last model's weights stay channels-last)
        return torch.empty_like(value, dtype=cast, device="meta")

    state = {name: meta(p).requires_grad_(p.requires_grad) for name, p in model.named_parameters()}
    state.update({name: meta(b) for name, b in model.named_buffers()})
    meta_args, meta_kwargs, meta_targets = tree_map(meta, (tuple(args), dict(kwargs), targets))

    def step() -> None:
        with torch.device("meta"):
            output = functional_call(model, state, meta_args, meta_kwargs)
            loss_fn(output, meta_targets).backward()

    return count_step(step, emulated=False)


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
