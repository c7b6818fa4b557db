"""The per-step floor: what a training step costs however little it computes.

A FLOP count says nothing about a step's fixed costs, and a small step is made of them: the
bundled demo's CIFAR CNN dispatches about 110 aten ops a step, and `Linear(4, 2)` a dozen.
Whatever the chip, a step cannot be faster than

- the host dispatching its ops, where the framework runs the user's Python every step
  (eager PyTorch on a GPU; PyTorch/XLA, which traces every op into its graph each step;
  TorchTPU's eager modes): ops x the per-op dispatch cost below; a framework that traced
  the step once (`jax.jit`, torchax's jitted step, `torch.compile`) pays it only at compile
  time;
- feeding the chip its batch: input bytes over the host link, where its bandwidth is
  published (one direction of the PCIe link of NVIDIA's SXM modules).

These overlap (the host dispatches while the device runs and the link copies), so the floor
is the larger of them, not their sum: a lower bound, never an estimate. The expected step
time is never below it (`apply_floor`, called where the profiler and the forecast produce an
expected time), and the row says so when the floor is what it shows.

Each figure below carries its source; a framework or a link with no published figure has
none, and the floor says what it left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .utilisation import ExpectedStep


@dataclass(frozen=True)
class DispatchCost:
    """A framework's per-step host costs: per op it dispatches each step, and per step."""

    framework: str
    name: str
    per_op_seconds: float
    per_step_seconds: float
    source: str


# PyTorch's own operator micro-benchmark (benchmarks/operator_benchmark) gives 3.33 µs a call
# for `split` of an 8 x 8 tensor on CUDA: Python, the dispatcher and the kernel launch, no
# autograd (the output quoted in pytorch/pytorch PR #32194, commit bab87e4, 2020-01). A
# training op adds autograd's bookkeeping, so this is a lower bound per op.
_EAGER_OP_SECONDS = 3.33e-6
_EAGER_SOURCE = "PyTorch's operator micro-benchmark, pytorch/pytorch PR #32194"

DISPATCH_COSTS: dict[str, DispatchCost] = {
    cost.framework: cost
    for cost in (
        DispatchCost(
            "pytorch",
            "eager PyTorch",
            _EAGER_OP_SECONDS,
            0.0,
            _EAGER_SOURCE,
        ),
        DispatchCost(
            "pytorch_xla",
            "PyTorch/XLA (lazy tensors: every op traced again each step)",
            _EAGER_OP_SECONDS,
            0.0,
            _EAGER_SOURCE + "; PyTorch/XLA traces every op through the same dispatch",
        ),
        DispatchCost(
            "torchtpu",
            "TorchTPU (eager: every op dispatched each step)",
            _EAGER_OP_SECONDS,
            0.0,
            _EAGER_SOURCE + "; TorchTPU's eager modes dispatch every op the same way",
        ),
        DispatchCost(
            "torchax",
            "torchax (eager: every op dispatched to JAX each step)",
            _EAGER_OP_SECONDS,
            0.0,
            _EAGER_SOURCE + "; torchax's eager mode dispatches every op the same way",
        ),
        DispatchCost(
            "megatron",
            "Megatron/NeMo (PyTorch, op by op)",
            _EAGER_OP_SECONDS,
            0.0,
            _EAGER_SOURCE,
        ),
        DispatchCost(
            "jax",
            "a step traced once (jax.jit, TensorFlow or MXNet graphs, torch.compile)",
            0.0,
            0.0,
            "traced once: no per-op cost a step (no published per-step dispatch figure found)",
        ),
    )
}
# Other names for the frameworks above (gpu2tpu's backend names among them).
FRAMEWORK_ALIASES = {
    "cuda": "pytorch",
    "cpu": "pytorch",
    "eager": "pytorch",
    "xla": "pytorch_xla",
    "pytorch-xla": "pytorch_xla",
    "torch_xla": "pytorch_xla",
    "tpu": "torchtpu",
    "torch-tpu": "torchtpu",
    "torch_tpu": "torchtpu",
    "maxtext": "jax",
    "torch.compile": "jax",
    "tensorflow": "jax",
    "mxnet": "jax",
    "paddle": "jax",
}

# Host-to-device bandwidth, one direction, bytes/s: half of the bidirectional PCIe figure of
# NVIDIA's datasheets (A100 SXM: PCIe Gen4, 64 GB/s; H100/H200 SXM: PCIe Gen5, 128 GB/s).
HOST_LINK_BYTES_PER_S: dict[str, tuple[float, str]] = {
    "a100-40gb": (32e9, "PCIe Gen4, NVIDIA A100 datasheet"),
    "a100-80gb": (32e9, "PCIe Gen4, NVIDIA A100 datasheet"),
    "h100": (64e9, "PCIe Gen5, NVIDIA H100 SXM datasheet"),
    "h200": (64e9, "PCIe Gen5, NVIDIA H200 SXM datasheet"),
}


@dataclass(frozen=True)
class StepFloor:
    """The least a step can take, what sets it, and where its figure comes from.

    `kind` is "per-step floor" (dispatch and feeding, `step_floor`) or "compiler estimate"
    (libtpu's own estimate of the step, `compiler_floor`); `dispatch_seconds` is ops x the
    per-op cost plus the per-step cost; `feed_seconds` the batch over the host link (None: no
    published bandwidth); `seconds` the larger; `what` says what set it.
    """

    seconds: float
    kind: str
    what: str
    source: str
    framework: str = ""
    dispatch_seconds: float = 0.0
    feed_seconds: float | None = None
    ops: int | None = None
    input_bytes: float | None = None

    def describe(self) -> str:
        """One line: the floor, what sets it, and where its figure comes from."""
        return f"{self.kind} {_seconds(self.seconds)} ({self.what}; {self.source})"

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "kind": self.kind,
            "what": self.what,
            "source": self.source,
            "framework": self.framework,
            "dispatch_seconds": self.dispatch_seconds,
            "feed_seconds": self.feed_seconds,
            "ops": self.ops,
            "input_bytes": self.input_bytes,
        }


def framework_key(name: str) -> str:
    """The dispatch table's key for a framework or backend name ("xla" -> "pytorch_xla")."""
    key = name.strip().lower()
    key = FRAMEWORK_ALIASES.get(key, key)
    if key not in DISPATCH_COSTS:
        known = ", ".join(sorted({*DISPATCH_COSTS, *FRAMEWORK_ALIASES}))
        raise ValueError(f"unknown framework {name!r} for the per-step floor; known: {known}.")
    return key


def step_floor(
    framework: str,
    chip_key: str,
    *,
    ops: int | None = None,
    input_bytes: float | None = None,
    chips: int = 1,
) -> StepFloor:
    """The per-step floor of a step of `ops` dispatched ops reading `input_bytes` of batch
    from the host, split over `chips` chips (each is fed its share; the host dispatches for
    each chip's process in parallel)."""
    key = framework_key(framework)
    cost = DISPATCH_COSTS[key]
    dispatch = (ops or 0) * cost.per_op_seconds + cost.per_step_seconds
    sources = [cost.source]
    feed = None
    link = HOST_LINK_BYTES_PER_S.get(chip_key)
    if link is not None and input_bytes:
        feed = input_bytes / max(1, chips) / link[0]
        sources.append(link[1])
    if feed is not None and feed > dispatch:
        what = f"{_bytes(input_bytes or 0.0)} of input over the host link"
    elif ops and cost.per_op_seconds:
        what = (
            f"{ops} op{'s' * (ops != 1)} x {_seconds(cost.per_op_seconds)} of {cost.name} dispatch"
        )
    else:
        what = f"{cost.name}: no per-op cost"
    return StepFloor(
        seconds=max(dispatch, feed or 0.0),
        kind="per-step floor",
        what=what,
        source="; ".join(sources),
        framework=key,
        dispatch_seconds=dispatch,
        feed_seconds=feed,
        ops=ops,
        input_bytes=input_bytes,
    )


def compiler_floor(seconds: float | None) -> StepFloor | None:
    """libtpu's own estimate of the compiled step (`optimal_seconds`, kept when positive) as a
    floor: the expected time is never below what the compiler itself expects."""
    if seconds is None or seconds <= 0:
        return None
    return StepFloor(
        seconds=seconds,
        kind="compiler estimate",
        what="libtpu's own estimate of this compiled step",
        source="the compiled program's cost analysis, optimal_seconds",
    )


def apply_floor(expected: ExpectedStep, floor: StepFloor | None) -> ExpectedStep:
    """`expected` with nothing below `floor`: where the floor is longer, the figure is the
    floor, a bound (`kind` "bound", limited by the floor's kind, not calibrated, shown as
    ">= floor"); where it only cuts the range, the range starts at it."""
    if floor is None or floor.seconds <= 0 or floor.seconds <= expected.low:
        return expected
    if floor.seconds < expected.seconds:
        return replace(expected, low=floor.seconds)
    return replace(
        expected,
        seconds=floor.seconds,
        low=floor.seconds,
        high=floor.seconds,
        kind="bound",
        limited_by=floor.kind,
        calibrated=False,
        notes=(
            *expected.notes,
            f"{floor.describe()}: longer than the step's compute, so the figure is that "
            "floor, a lower bound",
        ),
    )


def _seconds(value: float) -> str:
    from gpu2tpu.views.format import format_seconds  # views import pricing: not at the top

    return format_seconds(value)


def _bytes(value: float) -> str:
    return f"{value / 1e6:.3g} MB"
