"""Which ATen operators have an XLA lowering, and which ones a piece of code ran without one.

An op without a lowering falls back to the CPU or fails on a TPU (torchax raises
`OperatorNotFound: Operator with name aten::X has no lowering`), so one such op in a training
step can turn seconds into hours. The knowledge comes from torchax's operator registry,
`torchax.default_env()._ops` plus its decompositions `_decomps`, resolved the way torchax's
own `Environment._get_op_or_decomp` resolves an op (tensor.py in torchax 0.0.13):

1. the exact `OpOverload` (aten::mul.Tensor), else its `OpOverloadPacket` (aten::mul);
2. the same two lookups among the decompositions;
3. otherwise no lowering.

Only ops in the namespaces torchax's dispatch mode intercepts go through that lookup;
`aten::_to_copy` and `aten::lift_fresh` are handled by its dispatcher before it.

`lowering_table()` reads the registry when the shipped table `xla_ops.json` is stale (another
torchax or torch) or torchax is already imported, and otherwise the shipped table, which
`scripts/regenerate_op_table.py` writes from the registry and a test keeps equal to it.
Importing torchax is avoided when not needed: it makes "jax" torch's accelerator for the
whole process.

`coverage(op_counts, lines)` marks each op; `coverage_of_run(fn, *args)` runs `fn` on the CPU under
a small dispatch mode that records every op with the user's line and whether autograd's
backward pass ran it, and reports the coverage of what it saw.
"""

from __future__ import annotations

import json
import linecache
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "REPLACEMENTS",
    "SHIPPED_TABLE",
    "CoverageReport",
    "LoweringTable",
    "OpCoverage",
    "OpName",
    "OpRecorder",
    "Replacement",
    "Resolution",
    "Status",
    "coverage",
    "coverage_of_dry_run",
    "live_lowering_table",
    "lowering_table",
    "coverage_of_run",
    "shipped_lowering_table",
    "shipped_torch_xla_table",
    "TorchXLATable",
]

SHIPPED_TABLE = Path(__file__).with_name("xla_ops.json")
TABLE_FORMAT = 1
# The namespaces torchax's XLADispatchMode sends to its registry; others run as plain PyTorch.
INTERCEPTED_NAMESPACES = frozenset({"aten", "_c10d_functional", "torchvision", "xla"})
# Ops torchax's Environment.dispatch handles itself before looking anything up.
HANDLED_BY_DISPATCHER = frozenset({"aten::_to_copy", "aten::lift_fresh"})
# Namespaces whose ops carry no tensor data (profiler marks from optimizer.step).
HOST_NAMESPACES = frozenset({"profiler"})
# Ops torchax lowers only above ATen, at the torch function a user calls: other spellings of
# the same call reach the ATen op, which has no lowering. op -> (function name, spelled as).
FUNCTION_LEVEL: dict[str, tuple[str, str]] = {
    "aten::_linalg_det": ("linalg_det", "torch.linalg.det(A)"),
    "aten::angle": ("angle", "torch.angle(x)"),
    "aten::resize_": ("resize_", "x.resize_(shape)"),
}
_BACKWARD = re.compile(r"_backward(_|$)")
_CPU_ONLY = re.compile(r"^_?mkldnn_|_for_cpu(_|$)")


class Status(StrEnum):
    LOWERED = "lowered"
    NOT_NEEDED = "not needed"  # never runs on the TPU path (CPU-only kernels, backward, host)
    NOT_LOWERED = "not lowered"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class OpName:
    """An operator name in any of the spellings PyTorch uses, split into its parts.

    'aten::mul.Tensor', 'aten.mul.Tensor', 'torch.ops.aten.mul.Tensor' name an overload;
    'aten::mul', 'aten.mul' and 'mul' name the packet (all overloads), as the dry run
    records them. A default overload is spelled 'aten::relu.default'.
    """

    namespace: str
    name: str
    overload: str | None = None

    @classmethod
    def parse(cls, text: str) -> OpName:
        raw = text.strip()
        raw = raw.removeprefix("torch.ops.")
        if "::" in raw:
            namespace, rest = raw.split("::", 1)
            name, _, overload = rest.partition(".")
        else:
            parts = raw.split(".")
            if len(parts) == 1:
                namespace, name, overload = "aten", parts[0], ""
            else:
                namespace, name, overload = parts[0], parts[1], ".".join(parts[2:])
        if not namespace or not name:
            raise ValueError(f"{text!r} is not an operator name such as 'aten::mul.Tensor'")
        return cls(namespace, name, overload or None)

    @property
    def packet(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def qualified(self) -> str:
        return f"{self.packet}.{self.overload}" if self.overload else self.packet

    def __str__(self) -> str:
        return self.qualified


@dataclass(frozen=True)
class Replacement:
    """A known way around an op without a lowering; `uses` are the ops the replacement runs,
    each of which must itself be lowered (the tests check that against the registry)."""

    text: str
    uses: tuple[str, ...] = ()


_CTC = Replacement(
    "no lowering; compute the CTC loss on the CPU (move log-probs and targets with .cpu()), or "
    "use a JAX CTC such as optax.ctc_loss through torchax.interop.call_jax"
)
_QR = Replacement(
    "use torch.linalg.qr(A), which returns Q and R directly, instead of geqrf/ormqr's "
    "Householder form",
    uses=("aten::linalg_qr",),
)
_HISTOGRAM = Replacement(
    "use torch.histc for evenly spaced bins, or torch.bucketize against the bin edges and "
    "scatter_add to count",
    uses=("aten::histc", "aten::bucketize.Tensor", "aten::scatter_add"),
)
_INDEX_REDUCE = Replacement(
    "use Tensor.scatter_reduce(dim, index expanded to the source's shape, source, reduce, "
    "include_self=...), which computes the same reduction",
    uses=("aten::scatter_reduce.two",),
)
# Curated: ops torchax has no lowering for (its test skip list and docs/backends.md, "torchax
# on JAX") and what to use instead. Keys are packets; an entry applies to all overloads.
REPLACEMENTS: dict[str, Replacement] = {
    "aten::_ctc_loss": _CTC,
    "aten::ctc_loss": _CTC,
    "aten::geqrf": _QR,
    "aten::ormqr": _QR,
    "aten::fractional_max_pool2d": Replacement(
        "use F.max_pool2d with a fixed kernel_size and stride; fractional pooling's random "
        "windows have no lowering",
        uses=("aten::max_pool2d_with_indices",),
    ),
    "aten::fractional_max_pool3d": Replacement(
        "use F.max_pool3d with a fixed kernel_size and stride; fractional pooling's random "
        "windows have no lowering",
        uses=("aten::max_pool3d_with_indices",),
    ),
    "aten::adaptive_max_pool2d": Replacement(
        "when the input size is a multiple of the output size use F.max_pool2d(x, "
        "kernel_size=size // output_size) (the same windows), or F.adaptive_avg_pool2d",
        uses=("aten::max_pool2d_with_indices", "aten::_adaptive_avg_pool2d"),
    ),
    "aten::adaptive_max_pool3d": Replacement(
        "when the input size is a multiple of the output size use F.max_pool3d(x, "
        "kernel_size=size // output_size) (the same windows), or F.adaptive_avg_pool3d",
        uses=("aten::max_pool3d_with_indices", "aten::_adaptive_avg_pool3d"),
    ),
    "aten::index_reduce": _INDEX_REDUCE,
    "aten::index_reduce_": _INDEX_REDUCE,
    "aten::segment_reduce": Replacement(
        "turn the lengths into segment ids with torch.repeat_interleave and reduce with "
        "Tensor.scatter_reduce",
        uses=("aten::repeat_interleave.Tensor", "aten::scatter_reduce.two"),
    ),
    "aten::histogram": _HISTOGRAM,
    "aten::histogramdd": _HISTOGRAM,
    "aten::_histogramdd_bin_edges": _HISTOGRAM,
    "aten::_histogramdd_from_bin_cts": _HISTOGRAM,
    "aten::_histogramdd_from_bin_tensors": _HISTOGRAM,
    "aten::linalg_ldl_factor": Replacement(
        "solve with torch.linalg.solve (or torch.linalg.cholesky for positive-definite "
        "matrices) instead of an LDL factorisation",
        uses=("aten::_linalg_solve_ex", "aten::linalg_cholesky_ex"),
    ),
    "aten::linalg_ldl_solve": Replacement(
        "solve with torch.linalg.solve instead of an LDL factorisation",
        uses=("aten::_linalg_solve_ex",),
    ),
    "aten::rrelu_with_noise": Replacement(
        "use F.leaky_relu with a fixed negative_slope; rrelu draws a random slope per element "
        "in training",
        uses=("aten::leaky_relu",),
    ),
    "aten::_pack_padded_sequence": Replacement(
        "pad the sequences to a fixed length and pass a mask instead of packing them; packed "
        "sequences have no lowering and their shapes change with the data"
    ),
    "aten::_nested_tensor_from_mask_left_aligned": Replacement(
        "build the encoder with nn.TransformerEncoder(..., enable_nested_tensor=False); its "
        "inference fast path turns padded batches into nested tensors"
    ),
    "aten::_native_multi_head_attention": Replacement(
        "call torch.backends.mha.set_fastpath_enabled(False) so nn.MultiheadAttention takes "
        "its regular path through scaled_dot_product_attention (torchax does this on import)",
        uses=("aten::scaled_dot_product_attention",),
    ),
}


@dataclass(frozen=True)
class Resolution:
    """How the table resolves one op: its status and, in words, why."""

    status: Status
    via: str


@dataclass(frozen=True)
class LoweringTable:
    """The ops torchax lowers, by packet, by overload and through decompositions.

    `torch_functions` are the torch functions torchax intercepts above ATen (by name).
    `origin` says where the table came from ("torchax registry" or "shipped table").
    """

    origin: str
    torchax_version: str | None
    torch_version: str | None
    generated: str | None
    packets: frozenset[str]
    overloads: frozenset[str]
    decompositions: frozenset[str]
    torch_functions: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        made = f", {self.generated}" if self.generated else ""
        return (
            f"{self.origin} (torchax {self.torchax_version or '?'}, "
            f"torch {self.torch_version or '?'}{made})"
        )

    # -- building and storing ------------------------------------------------------------------

    @classmethod
    def from_torchax_environment(
        cls, env: Any, torchax_version: str | None, torch_version: str | None
    ) -> LoweringTable:
        """Read a live `torchax.tensor.Environment`'s `_ops` and `_decomps` (private: read
        defensively; a missing attribute is an error that names torchax's version)."""
        ops = getattr(env, "_ops", None)
        decomps = getattr(env, "_decomps", None)
        if not isinstance(ops, Mapping) or not isinstance(decomps, Mapping):
            raise RuntimeError(
                f"torchax {torchax_version} keeps no `_ops`/`_decomps` registry on its "
                "environment; gpu2tpu reads that private registry and needs updating for it"
            )
        packets, overloads, functions = set(), set(), set()
        for key in ops:
            if isinstance(key, torch._ops.OpOverloadPacket):
                packets.add(key._qualified_op_name)
            elif isinstance(key, torch._ops.OpOverload):
                overloads.add(_overload_name(key))
            else:
                name = getattr(key, "__name__", None)
                if name:
                    functions.add(name)
        decompositions = set()
        for key in decomps:
            if isinstance(key, torch._ops.OpOverload):
                decompositions.add(_overload_name(key))
            elif isinstance(key, torch._ops.OpOverloadPacket):
                decompositions.add(key._qualified_op_name)
        return cls(
            origin="torchax registry",
            torchax_version=torchax_version,
            torch_version=torch_version,
            generated=None,
            packets=frozenset(packets),
            overloads=frozenset(overloads),
            decompositions=frozenset(decompositions),
            torch_functions=frozenset(functions),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "source": "torchax.default_env()._ops and ._decomps",
            "generator": "scripts/regenerate_op_table.py",
            "torchax_version": self.torchax_version,
            "torch_version": self.torch_version,
            "generated": self.generated,
            "packets": sorted(self.packets),
            "overloads": sorted(self.overloads),
            "decompositions": sorted(self.decompositions),
            "torch_functions": sorted(self.torch_functions),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "shipped table") -> LoweringTable:
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(
                f"the op table has format {data.get('format')!r}; this gpu2tpu reads format "
                f"{TABLE_FORMAT}: regenerate it with scripts/regenerate_op_table.py"
            )
        return cls(
            origin=origin,
            torchax_version=data.get("torchax_version"),
            torch_version=data.get("torch_version"),
            generated=data.get("generated"),
            packets=frozenset(data["packets"]),
            overloads=frozenset(data["overloads"]),
            decompositions=frozenset(data["decompositions"]),
            torch_functions=frozenset(data.get("torch_functions", ())),
        )

    def same_registry(self, other: LoweringTable) -> bool:
        """Whether both tables list the same lowerings (origin and date aside)."""
        return (
            self.packets == other.packets
            and self.overloads == other.overloads
            and self.decompositions == other.decompositions
            and self.torch_functions == other.torch_functions
        )

    # -- resolving -----------------------------------------------------------------------------

    def _lookup(self, op: OpName) -> str | None:
        """torchax's `_get_op_or_decomp` on names: which entry lowers `op`, if any."""
        if op.overload is not None:
            if op.qualified in self.overloads:
                return "lowered by torchax for this overload"
            if op.packet in self.packets:
                return "lowered by torchax for all overloads"
            if op.qualified in self.decompositions:
                return "lowered through a torchax decomposition"
            if op.packet in self.decompositions:
                return "lowered through a torchax decomposition"
            return None
        if op.packet in self.packets:
            return "lowered by torchax for all overloads"
        if op.packet in self.decompositions:
            return "lowered through a torchax decomposition"
        return None

    def _covered_overloads(self, op: OpName) -> set[str]:
        prefix = op.packet + "."
        names = self.overloads | self.decompositions
        return {n[len(prefix) :] for n in names if n.startswith(prefix)}

    def resolve(self, op: str | OpName, backward: bool = False) -> Resolution:
        """The status of one op. `backward`: autograd's backward pass ran it."""
        name = op if isinstance(op, OpName) else OpName.parse(op)
        if name.namespace in HOST_NAMESPACES:
            return Resolution(Status.NOT_NEEDED, "runs on the host and touches no tensor data")
        if name.namespace not in INTERCEPTED_NAMESPACES:
            return Resolution(
                Status.UNKNOWN,
                f"torchax passes {name.namespace}:: ops to PyTorch unchanged; they fail on "
                "TPU tensors unless the op has its own TPU kernel",
            )
        if name.packet in HANDLED_BY_DISPATCHER:
            return Resolution(Status.LOWERED, "handled by torchax's dispatcher itself")
        via = self._lookup(name)
        if via is not None:
            return Resolution(Status.LOWERED, via)
        if name.overload is None:
            partial = self._packet_coverage(name)
            if partial is not None:
                return partial
        if _CPU_ONLY.search(name.name):
            return Resolution(
                Status.NOT_NEEDED,
                "a CPU-only kernel (oneDNN) that torch picks for CPU tensors; on a TPU torch "
                "runs the op's generic form instead",
            )
        if backward or _BACKWARD.search(name.name):
            return Resolution(
                Status.NOT_NEEDED,
                "a backward kernel with no torchax lowering; torchax takes gradients with JAX "
                "autodiff of the forward ops (jax.value_and_grad), which does not run it",
            )
        function = FUNCTION_LEVEL.get(name.packet)
        if function is not None and function[0] in self.torch_functions:
            return Resolution(
                Status.UNKNOWN,
                f"torchax lowers {function[1]} above ATen, but other spellings reach "
                f"{name.packet}, which has no lowering; call it as {function[1]}",
            )
        return Resolution(Status.NOT_LOWERED, "no torchax lowering or decomposition")

    def _packet_coverage(self, op: OpName) -> Resolution | None:
        """A packet-level name whose packet is not registered but some overloads are."""
        covered = self._covered_overloads(op)
        if not covered:
            return None
        relevant = _tensor_overloads(op)
        if relevant is None:
            return Resolution(
                Status.UNKNOWN,
                f"torchax lowers only some overloads ({', '.join(sorted(covered))}); the "
                "recording does not say which one ran",
            )
        missing = sorted(relevant - covered)
        if not missing:
            through = {o for o in relevant if f"{op.packet}.{o}" in self.decompositions}
            how = "through torchax decompositions" if through == relevant else "by torchax"
            return Resolution(Status.LOWERED, f"every tensor overload is lowered {how}")
        return Resolution(
            Status.UNKNOWN,
            f"torchax lowers {', '.join(sorted(covered & relevant)) or 'none'} but not "
            f"{', '.join(missing)}; the recording does not say which overload ran",
        )


def _overload_name(op: Any) -> str:
    return f"{op.namespace}::{op._opname}.{op._overloadname}"


def _tensor_overloads(op: OpName) -> set[str] | None:
    """Overloads of a packet that a tensor program can dispatch (tensor inputs, no out=)."""
    try:
        packet = getattr(getattr(torch.ops, op.namespace), op.name)
        names = packet.overloads()
    except (AttributeError, RuntimeError):
        return None
    out = set()
    for overload in names:
        args = getattr(packet, overload)._schema.arguments
        if any(a.is_out for a in args):
            continue
        if any("Tensor" in str(a.type) for a in args):
            out.add(overload)
    return out


# -- the tables --------------------------------------------------------------------------------

_CACHE: dict[str, Any] = {}


def shipped_lowering_table(path: Path = SHIPPED_TABLE) -> LoweringTable:
    """The table shipped with gpu2tpu (generated from torchax's registry)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise RuntimeError(
            f"cannot read the op table {path} ({err}); regenerate it with "
            "scripts/regenerate_op_table.py"
        ) from err
    return LoweringTable.from_dict(data)


def live_lowering_table() -> LoweringTable:
    """Read the installed torchax's registry (imports torchax; JAX on the CPU without a TPU)."""
    if "live" in _CACHE:
        return _CACHE["live"]
    from ..backends.base import package_version
    from ..backends.jax import JAXBackend, configure_jax_platform

    reason = JAXBackend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot read torchax's operator registry: {reason}")
    configure_jax_platform()
    from ..backends.torchax_compat import import_torchax

    table = LoweringTable.from_torchax_environment(
        import_torchax().default_env(), package_version("torchax"), torch.__version__.split("+")[0]
    )
    _CACHE["live"] = table
    return table


def _minor(version: str | None) -> tuple[str, ...]:
    return tuple((version or "").split("+")[0].split(".")[:2])


def lowering_table(live: bool | None = None) -> LoweringTable:
    """The lowering table to use here.

    `live=None` reads torchax's registry when torchax is already imported or the shipped
    table came from another torchax or torch minor; otherwise the shipped table, which equals
    the registry for its versions. `live=True` insists on the registry, `False` on the table.
    """
    if live is False:
        return shipped_lowering_table()
    if live is True:
        return live_lowering_table()
    from ..backends.base import package_version
    from ..backends.jax import JAXBackend

    try:
        shipped = shipped_lowering_table()
    except (RuntimeError, ValueError, KeyError):
        if JAXBackend.unavailable_reason() is None:
            return live_lowering_table()
        raise

    installed = package_version("torchax")
    stale = installed is not None and (
        installed != shipped.torchax_version
        or _minor(torch.__version__) != _minor(shipped.torch_version)
    )
    if ("torchax" in sys.modules or stale) and JAXBackend.unavailable_reason() is None:
        try:
            if "torchax" in sys.modules:
                return live_lowering_table()
            # Importing torchax here would make "jax" torch's accelerator for the rest of the
            # user's process: read the registry in a forked child instead, when that is safe.
            from ..forecasting.isolate import can_fork, jax_started, run_in_child

            if can_fork() and not jax_started():
                return run_in_child(live_lowering_table)
        except Exception:  # the registry moved or torchax fails to import: keep the table
            return shipped
    return shipped


# -- PyTorch/XLA -------------------------------------------------------------------------------

TORCH_XLA_TABLE = Path(__file__).with_name("torch_xla_ops.json")
TORCH_XLA_TABLE_FORMAT = 1
# Dispatch keys whose kernel serves an op on an XLA tensor without a CPU fallback: torch_xla's
# own lowering, or a composite kernel that decomposes into ops that have one. Not
# CompositeExplicitAutogradNonFunctional: a structured op's functional form there calls its
# out= kernel, which falls back (fractional_max_pool2d has only that one, and falls back).
TORCH_XLA_KEYS = ("XLA", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
# Ops with a kernel in the dispatcher that torch_xla still runs on the CPU (measured with
# torch_xla 2.9 on the CPU through its `aten::<op>` fallback counters; tests/xla checks each):
# the data-dependent shapes, embedding_bag's forward-only variant, and rrelu's training form
# (its composite kernel calls an in-place variant that has no lowering).
TORCH_XLA_KERNEL_FALLS_BACK = frozenset(
    {
        "aten::nonzero",
        "aten::masked_select",
        "aten::_embedding_bag_forward_only",
        "aten::rrelu_with_noise",
    }
)


@dataclass(frozen=True)
class TorchXLATable:
    """Which ATen ops PyTorch/XLA runs on the device and which it hands to the CPU.

    An op with a torch_xla kernel or a composite kernel (`TORCH_XLA_KEYS`) in torch's
    dispatcher runs on the device; any other ATen op goes through torch_xla's CPU fallback
    (a counter `aten::<op>` in torch_xla's metrics), as do `TORCH_XLA_KERNEL_FALLS_BACK`.
    `scripts/regenerate_op_table.py --torch-xla`, run where torch_xla is installed
    (.venv-xla), writes it from the dispatcher; tests/xla checks it against real runs.
    """

    torch_xla_version: str | None
    torch_version: str | None
    lowered: frozenset[str]
    not_lowered: frozenset[str]
    falls_back: frozenset[str] = TORCH_XLA_KERNEL_FALLS_BACK

    @property
    def label(self) -> str:
        return f"PyTorch/XLA {self.torch_xla_version or '?'} (torch {self.torch_version or '?'})"

    @classmethod
    def from_dispatcher(cls) -> TorchXLATable:
        """Read torch's dispatcher with torch_xla imported (registers its XLA kernels)."""
        import torch_xla  # noqa: F401  (importing registers the XLA kernels)

        from ..backends.base import package_version

        has = torch._C._dispatch_has_kernel_for_dispatch_key
        lowered: set[str] = set()
        missing: set[str] = set()
        for name in torch._C._dispatch_get_all_op_names():
            if not name.startswith("aten::"):
                continue
            (lowered if any(has(name, key) for key in TORCH_XLA_KEYS) else missing).add(name)
        return cls(
            package_version("torch-xla"),
            torch.__version__.split("+")[0],
            frozenset(lowered),
            frozenset(missing),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TORCH_XLA_TABLE_FORMAT,
            "source": "torch's dispatcher with torch_xla imported: kernels for "
            + ", ".join(TORCH_XLA_KEYS),
            "generator": "scripts/regenerate_op_table.py --torch-xla",
            "torch_xla_version": self.torch_xla_version,
            "torch_version": self.torch_version,
            "kernel_falls_back": sorted(self.falls_back),
            "lowered": sorted(self.lowered),
            "not_lowered": sorted(self.not_lowered),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TorchXLATable:
        if data.get("format") != TORCH_XLA_TABLE_FORMAT:
            raise ValueError(
                f"the PyTorch/XLA op table has format {data.get('format')!r}; this gpu2tpu "
                f"reads format {TORCH_XLA_TABLE_FORMAT}: regenerate it with "
                "scripts/regenerate_op_table.py --torch-xla"
            )
        return cls(
            data.get("torch_xla_version"),
            data.get("torch_version"),
            frozenset(data["lowered"]),
            frozenset(data["not_lowered"]),
            frozenset(data.get("kernel_falls_back", TORCH_XLA_KERNEL_FALLS_BACK)),
        )

    def resolve(self, op: str | OpName, backward: bool = False) -> Resolution:
        """The status of one op on PyTorch/XLA (backward ops run on the device too)."""
        name = op if isinstance(op, OpName) else OpName.parse(op)
        if name.namespace in HOST_NAMESPACES:
            return Resolution(Status.NOT_NEEDED, "runs on the host and touches no tensor data")
        if name.namespace != "aten":
            return Resolution(
                Status.UNKNOWN, f"PyTorch/XLA lowers aten:: ops; {name.packet} is not one"
            )
        if _CPU_ONLY.search(name.name):
            return Resolution(
                Status.NOT_NEEDED,
                "a CPU-only kernel that torch picks for CPU tensors; on XLA torch runs the "
                "op's generic form instead",
            )
        if name.packet in self.falls_back or name.qualified in self.falls_back:
            return Resolution(
                Status.NOT_LOWERED, "PyTorch/XLA has a kernel but runs it on the CPU (fallback)"
            )
        candidates = (
            [f"{name.packet}.{name.overload}" if name.overload != "default" else name.packet]
            if name.overload
            else [n for n in self.lowered | self.not_lowered if n.split(".")[0] == name.packet]
        )
        if any(c in self.lowered for c in candidates):
            if all(c in self.lowered for c in candidates):
                return Resolution(
                    Status.LOWERED, "lowered by PyTorch/XLA (or a composite of lowered ops)"
                )
            return Resolution(
                Status.UNKNOWN,
                "PyTorch/XLA lowers some overloads of this op; the recording does not say which ran",
            )
        if any(c in self.not_lowered for c in candidates):
            return Resolution(
                Status.NOT_LOWERED, "no PyTorch/XLA lowering: runs on the CPU (fallback)"
            )
        return Resolution(Status.UNKNOWN, f"not in the PyTorch/XLA table ({self.label})")


def shipped_torch_xla_table(path: Path = TORCH_XLA_TABLE) -> TorchXLATable:
    """The PyTorch/XLA table shipped with gpu2tpu (generated from torch_xla's dispatcher)."""
    if "torch_xla" in _CACHE:
        return _CACHE["torch_xla"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise RuntimeError(
            f"cannot read the PyTorch/XLA op table {path} ({err}); regenerate it with "
            "scripts/regenerate_op_table.py --torch-xla"
        ) from err
    table = TorchXLATable.from_dict(data)
    _CACHE["torch_xla"] = table
    return table


# -- coverage ------------------------------------------------------------------------------------


@dataclass
class OpCoverage:
    """One op the code ran: how often, from which lines, and whether a TPU can run it."""

    op: str
    count: int
    status: Status
    via: str
    lines: list[int] = field(default_factory=list)
    hint: str | None = None
    code: str = ""  # the first line's source, when the file is known

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "count": self.count,
            "status": str(self.status),
            "via": self.via,
            "lines": list(self.lines),
            "hint": self.hint,
            "code": self.code,
        }

    @property
    def where(self) -> str:
        """The lines that ran the op, for a person: "lines 3, 7", "outside your code"."""
        return _where(self.lines)


_ORDER = (Status.NOT_LOWERED, Status.UNKNOWN, Status.LOWERED, Status.NOT_NEEDED)


@dataclass
class CoverageReport:
    """Every op, worst first; `fully_covered` when nothing is unlowered or unknown."""

    ops: list[OpCoverage]
    table: str
    filename: str | None = None
    result: Any = field(default=None, repr=False, compare=False)

    def by_status(self, status: Status | str) -> list[OpCoverage]:
        return [o for o in self.ops if o.status == Status(status)]

    @property
    def not_lowered(self) -> list[OpCoverage]:
        return self.by_status(Status.NOT_LOWERED)

    @property
    def unknown(self) -> list[OpCoverage]:
        return self.by_status(Status.UNKNOWN)

    @property
    def fully_covered(self) -> bool:
        return not self.not_lowered and not self.unknown

    def get(self, op: str) -> OpCoverage | None:
        """The entry for an op by any spelling ('aten::geqrf', 'aten.geqrf.default')."""
        wanted = OpName.parse(op)
        for entry in self.ops:
            have = OpName.parse(entry.op)
            if have.packet == wanted.packet and (
                wanted.overload is None or have.overload in (None, wanted.overload)
            ):
                return entry
        return None

    def counts(self) -> dict[str, int]:
        return dict(Counter(str(o.status) for o in self.ops))

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "filename": self.filename,
            "fully_covered": self.fully_covered,
            "counts": self.counts(),
            "ops": [o.to_dict() for o in self.ops],
        }

    def summary(self) -> str:
        total = sum(o.count for o in self.ops)
        head = f"{len(self.ops)} distinct ATen ops ({total:,} calls)"
        if self.fully_covered:
            return f"{head}: every op has an XLA lowering."
        bad = len(self.not_lowered)
        unsure = len(self.unknown)
        parts = []
        if bad:
            parts.append(f"{bad} with no XLA lowering (CPU fallback or failure on a TPU)")
        if unsure:
            parts.append(f"{unsure} unknown")
        return f"{head}: {', '.join(parts)}."

    def __str__(self) -> str:
        out = [f"Op coverage against {self.table}", self.summary()]
        for entry in self.ops:
            if entry.status not in (Status.NOT_LOWERED, Status.UNKNOWN):
                continue
            where = _where(entry.lines)
            out.append(f"  {entry.status:<11} {entry.op:<40} x{entry.count:<5} {where}")
            if entry.code:
                out.append(f"              {entry.code}")
            out.append(f"              {entry.hint or entry.via}")
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        from ..views.html import coverage_page

        return coverage_page(self)


def _where(lines: list[int]) -> str:
    if not lines:
        return "outside your code"
    shown = ", ".join(str(n) for n in lines[:5])
    more = f" (+{len(lines) - 5} more)" if len(lines) > 5 else ""
    return f"line{'s' if len(lines) > 1 else ''} {shown}{more}"


def coverage(
    op_counts: Mapping[str, int],
    lines: Mapping[str, Iterable[int | None]] | None = None,
    *,
    backward: Iterable[str] = (),
    table: LoweringTable | TorchXLATable | None = None,
    filename: str | None = None,
) -> CoverageReport:
    """Mark each op lowered, not needed, not lowered or unknown, with a replacement if known.

    `op_counts` maps op names (any spelling: 'aten::mul.Tensor', 'aten.mul') to how often
    they ran; `lines` maps the same names to the user's lines that ran them; `backward`
    names ops only autograd's backward pass ran; `filename` lets the report quote lines.
    """
    use = table if table is not None else lowering_table()
    backward_ops = {OpName.parse(n).qualified for n in backward}
    merged: dict[str, tuple[OpName, int, set[int]]] = {}
    for raw, count in op_counts.items():
        name = OpName.parse(raw)
        key = name.qualified
        seen = {n for n in (lines or {}).get(raw, ()) if n is not None}
        if key in merged:
            _, old_count, old_lines = merged[key]
            merged[key] = (name, old_count + count, old_lines | seen)
        else:
            merged[key] = (name, count, seen)
    entries = []
    for key, (name, count, seen) in merged.items():
        resolution = use.resolve(name, backward=key in backward_ops)
        hint = None
        if resolution.status in (Status.NOT_LOWERED, Status.UNKNOWN):
            replacement = REPLACEMENTS.get(name.packet)
            hint = replacement.text if replacement else None
        ordered = sorted(seen)
        code = linecache.getline(filename, ordered[0]).strip() if filename and ordered else ""
        entries.append(
            OpCoverage(key, count, resolution.status, resolution.via, ordered, hint, code)
        )
    entries.sort(key=lambda o: (_ORDER.index(o.status), -o.count, o.op))
    return CoverageReport(entries, use.label, filename)


def coverage_of_dry_run(
    report: Any, table: LoweringTable | TorchXLATable | None = None
) -> CoverageReport:
    """Coverage of the ops a `gpu2tpu.readiness.dryrun.DryRunReport` recorded.

    The dry run records ops by packet ('aten.mul'), so an op lowered for only some of its
    overloads can come out unknown here where `op_coverage` would know which overload ran.
    """
    ops: Mapping[str, Counter[int | None]] = report.ops
    lines = {name: [n for n in by_line if n is not None] for name, by_line in ops.items()}
    overloads: Mapping[str, int] = getattr(report, "overloads", None) or {}
    if overloads:
        # Overload names ("aten.mul.Tensor") are exact; their lines come from their packet.
        by_overload = {name: lines.get(".".join(name.split(".")[:2]), []) for name in overloads}
        return coverage(
            dict(overloads), by_overload, table=table, filename=getattr(report, "filename", None)
        )
    counts = {name: sum(by_line.values()) for name, by_line in ops.items()}
    return coverage(counts, lines, table=table, filename=getattr(report, "filename", None))


# -- recording ---------------------------------------------------------------------------------


class OpRecorder(TorchDispatchMode):
    """Counts every op by overload, with the user's lines and whether only backward ran it.

    `filenames` are the files whose lines count as the user's; an op is attributed to the
    innermost frame from one of them.
    """

    def __init__(self, filenames: Iterable[str]) -> None:
        super().__init__()
        self.filenames = frozenset(filenames)
        self.counts: Counter[str] = Counter()
        self.lines: dict[str, set[int]] = {}
        self.in_backward: set[str] = set()
        self.in_forward: set[str] = set()
        self._names: dict[Any, str] = {}

    @property
    def backward_only(self) -> set[str]:
        """Ops that only autograd's backward pass ran."""
        return self.in_backward - self.in_forward

    def _user_line(self) -> int | None:
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename in self.filenames:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = _overload_name(func)
        self.counts[name] += 1
        if torch._C._current_autograd_node() is not None:
            self.in_backward.add(name)
        else:
            self.in_forward.add(name)
        line = self._user_line()
        if line is not None:
            self.lines.setdefault(name, set()).add(line)
        return func(*args, **(kwargs or {}))


def _source_file(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "forward", None), "__code__", None)
    if code is None and callable(fn):
        code = getattr(type(fn).__call__, "__code__", None)
    return code.co_filename if code is not None else "<unknown>"


def coverage_of_run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CoverageReport:
    """Run `fn(*args, **kwargs)` on the CPU and report the coverage of every ATen op it ran.

    Lines are those of the file that defines `fn` (for a module, its `forward`). The
    report's `result` holds what `fn` returned. An error raised by `fn` propagates with the
    coverage so far attached as `error.op_coverage_report`.
    """
    filename = _source_file(fn)
    recorder = OpRecorder({filename})
    try:
        with recorder:
            result = fn(*args, **kwargs)
    except BaseException as err:
        err.op_coverage_report = _report(recorder, filename)  # type: ignore[attr-defined]  # the report rides on the user's exception
        raise
    report = _report(recorder, filename)
    report.result = result
    return report


def _report(recorder: OpRecorder, filename: str) -> CoverageReport:
    return coverage(
        recorder.counts,
        {name: sorted(lines) for name, lines in recorder.lines.items()},
        backward=recorder.backward_only,
        filename=filename,
    )
