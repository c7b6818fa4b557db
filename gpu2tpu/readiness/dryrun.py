"""The dry run: run PyTorch code on the CPU and record what would hurt on a TPU.

A `TorchDispatchMode` sees every ATen op the code runs. It records, against the line of the
user's code that caused it:

- host synchronisations: `.item()` and Python scalars from tensors (`_local_scalar_dense`),
  and (through small wrappers on `torch.Tensor`, because on the CPU they run no ATen op)
  `.cpu()`, `.tolist()`, `.numpy()` and printing a tensor. Reads that stay on the host on a
  TPU too are left out: an optimizer's step counter (a CPU tensor unless `capturable` or
  `fused`) and the DataLoader sampler's indices;
- float64 work (TPUs have no fast float64); a float64 scalar (0-d) is left out;
- ops whose output shape depends on the data (`nonzero`, boolean-mask indexing `x[mask]`,
  `unique`, `masked_select`, ...): PyTorch/XLA runs them on the CPU, reading the data;
- recompilations: the same line running an op on new shapes after its first run, within one
  run or between repeated runs of the same code; a line whose op count changes from one run
  to the next (a Python loop whose count changes unrolls into a new graph); and a changing
  Python exponent in a differentiated `x ** p` (pow's backward bakes it into the graph);
- a GradScaler under bfloat16 autocast, which bfloat16 does not need.

What PyTorch/XLA does with the same steps is the yardstick: benchmarks/dryrun_accuracy.py
scores these predictions against torch_xla's own metrics on the CPU.

It also counts every ATen op with the lines that ran it, so a report can later say which ops
have no XLA lowering. `dry_run(fn, *args, **kwargs)` runs a function this way and returns a
`DryRunReport`; the `%%tpu --dry-run` magic uses `DryRunDetector` around a cell.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "DryRunDetector",
    "DryRunReport",
    "Hazard",
    "HazardKind",
    "ShapeHistory",
    "dry_run",
]


class HazardKind(StrEnum):
    HOST_SYNC = "host sync"
    FLOAT64 = "float64"
    DYNAMIC_SHAPE = "data-dependent shape"
    SHAPE_CHANGE = "shape change"
    GRAD_SCALER = "unneeded GradScaler"

    @property
    def why(self) -> str:
        """Why this kind hurts on a TPU."""
        return WHY[self]

    @property
    def fix(self) -> str:
        """The one-line fix."""
        return FIX[self]


# Why each kind hurts on a TPU, and the one-line fix.
WHY: dict[HazardKind, str] = {
    HazardKind.HOST_SYNC: "stops the TPU and waits for a copy to the host",
    HazardKind.FLOAT64: "TPUs have no fast float64: it is emulated, many times slower",
    HazardKind.DYNAMIC_SHAPE: "the output shape depends on the data, so XLA cannot compile it ahead",
    HazardKind.SHAPE_CHANGE: "each new input shape is a new XLA compilation",
    HazardKind.GRAD_SCALER: (
        "bfloat16 has float32's range, so loss scaling protects nothing; the scaler only adds "
        "a host sync (found_inf is read every step) and its own ops"
    ),
}
FIX: dict[HazardKind, str] = {
    HazardKind.HOST_SYNC: (
        "keep values on the device: accumulate losses as tensors and call .item(), .cpu() "
        "or print once after the loop, or every N steps"
    ),
    HazardKind.FLOAT64: (
        "use float32 or bfloat16: pass dtype=torch.float32, and convert numpy float64 "
        "arrays with .float()"
    ),
    HazardKind.DYNAMIC_SHAPE: (
        "keep shapes static: torch.where(mask, x, 0) instead of x[mask], fixed-size "
        "padding instead of unique/masked_select"
    ),
    HazardKind.SHAPE_CHANGE: (
        "pad or bucket inputs to a few fixed shapes (DataLoader(drop_last=True), pad the "
        "last batch, fixed sequence lengths); keep Python loop counts fixed"
    ),
    HazardKind.GRAD_SCALER: (
        "drop the GradScaler with bfloat16 autocast: call loss.backward() and "
        "optimizer.step() directly, without scaler.scale/step/update"
    ),
}

_F64 = (torch.float64, torch.complex128)
_DYNAMIC = torch.Tag.dynamic_output_shape
_DATA_DEPENDENT = torch.Tag.data_dependent_output
# Ops that read tensor data on the host, named as a user wrote them.
_SYNC_OPS = {
    "aten._local_scalar_dense": ".item() / Python scalar from a tensor",
}
_DYNAMIC_CAUSES = {"aten.nonzero": "nonzero / torch.where(mask)"}
_MASK_DTYPES = (torch.bool, torch.uint8)
# Library code whose host reads stay on the host on a TPU too: optimizers keep their step
# counter on the CPU (unless capturable/fused), and the DataLoader's sampler draws indices there.
_HOST_SIDE_PATHS = (
    f"{os.sep}torch{os.sep}optim{os.sep}",
    f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}",
)
_DATA_PATH = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
_GRAD_SCALER_FILE = f"{os.sep}torch{os.sep}amp{os.sep}grad_scaler.py"
# GradScaler's own ops; under bfloat16 autocast the advice is to drop the scaler instead.
_SCALER_OPS = ("aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_")
# Ops whose Python-number arguments PyTorch/XLA bakes into the graph when they are
# differentiated (measured on torch_xla 2.9: a changing `x ** p` recompiles every step in
# training, while changing scalars in mul, add, clamp, leaky_relu, elu or softplus do not).
_BAKED_SCALAR_OPS = frozenset({"aten.pow.Tensor_Scalar"})

# What an op is, decided once per op overload for the whole process: its packet name
# ("aten.mul"), its full name ("aten.mul.Tensor") and a hazard class from its tags.
_K_NONE, _K_SYNC, _K_DYNAMIC, _K_INDEX = 0, 1, 2, 3
_OP_INFO: dict[Any, tuple[str, str, int]] = {}


def _op_info(func: Any) -> tuple[str, str, int]:
    name = f"{func.namespace}.{func._opname}"
    tags = func.tags
    if name in _SYNC_OPS or _DATA_DEPENDENT in tags:
        kind = _K_SYNC
    elif _DYNAMIC in tags:
        # Indexing is dynamic only with a boolean mask; integer indices keep their shape.
        kind = _K_INDEX if name == "aten.index" else _K_DYNAMIC
    else:
        kind = _K_NONE
    info = _OP_INFO[func] = (name, str(func), kind)
    return info


@dataclass
class Hazard:
    """One kind of hazard at one line: how often, and what caused it."""

    kind: HazardKind
    line: int | None
    count: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    detail: str = ""
    code: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "line": self.line,
            "count": self.count,
            "causes": dict(self.causes),
            "detail": self.detail,
            "code": self.code,
            "fix": FIX[self.kind],
        }

    def cause_text(self, most: int = 3) -> str:
        """The most frequent causes, and the detail, in one phrase."""
        ranked = [name for name, _ in self.causes.most_common()]
        text = ", ".join(ranked[:most])
        if len(ranked) > most:
            text += f" and {len(ranked) - most} more"
        return text + (f" ({self.detail})" if self.detail else "")


class ShapeHistory:
    """Input shapes seen per (line, op) across runs of the same code.

    Kept by the caller between runs (the magic keeps one per cell, `dry_run` one per
    function), so that the second run of a cell with a new batch size shows up as the
    recompilation it would be on XLA.
    """

    def __init__(self) -> None:
        # (line, op name) -> input shape signatures seen, and those first seen after the
        # line's first run: each of those is a new graph on XLA
        self.shapes: dict[tuple[int, str], set[tuple[Any, ...]]] = {}
        self.new_shapes: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
        # (line, op) -> the run of the line in which the op first ran there
        self.first_run: dict[tuple[int, str], int] = {}
        # line -> how many times it has been entered (a run of ops from that line)
        self.entries: Counter[int] = Counter()
        # line -> the op counts of its latest run, and (before, after) totals of runs that differed
        self.op_counts: dict[int, Counter[str]] = {}
        self.count_changes: dict[int, list[tuple[int, int]]] = {}
        # (line, op) -> Python scalars seen, and those first seen after the line's first run
        self.scalars: dict[tuple[int, str], set[Any]] = {}
        self.new_scalars: dict[tuple[int, str], list[Any]] = {}

    def changed(self) -> dict[tuple[int, str], set[tuple[Any, ...]]]:
        """(line, op) -> every signature seen, for the pairs that met a new one later."""
        return {key: self.shapes[key] | set(new) for key, new in self.new_shapes.items() if new}


@dataclass
class DryRunReport:
    """What a dry run found, by kind and line, and every ATen op it ran.

    `ops` maps an op's name ("aten.addmm") to a Counter of the user lines that ran it (None
    for ops outside the user's code): the raw material for an op-coverage section.
    """

    label: str
    filename: str | None
    seconds: float
    hazards: list[Hazard]
    ops: dict[str, Counter[int | None]]
    error: str | None = None
    # Runs per full overload name ("aten.mul.Tensor"), for coverage checks that need it.
    overloads: Counter[str] = field(default_factory=Counter)
    result: Any = field(default=None, repr=False, compare=False)  # what the function returned

    @property
    def total_ops(self) -> int:
        return sum(sum(lines.values()) for lines in self.ops.values())

    def counts(self) -> dict[str, int]:
        """Occurrences per hazard kind (kinds with none are absent)."""
        out: Counter[str] = Counter()
        for hazard in self.hazards:
            out[str(hazard.kind)] += hazard.count
        return dict(out)

    def by_kind(self, kind: HazardKind | str) -> list[Hazard]:
        return [h for h in self.hazards if h.kind == HazardKind(kind)]

    def kinds_found(self) -> list[HazardKind]:
        """The kinds of hazard this run found, in HazardKind's order."""
        return [kind for kind in HazardKind if self.by_kind(kind)]

    def lines(self, kind: HazardKind | str) -> list[int | None]:
        return [h.line for h in self.by_kind(kind)]

    def op_counts(self) -> dict[str, int]:
        return {name: sum(lines.values()) for name, lines in self.ops.items()}

    @functools.cached_property
    def coverage(self) -> Any:
        """Every ATen op the run used, marked lowered or not for XLA (a CPU fallback or a
        failure on a TPU), from torchax's registry or the table shipped with gpu2tpu."""
        from .op_coverage import coverage_of_dry_run

        return coverage_of_dry_run(self)

    @functools.cached_property
    def xla_coverage(self) -> Any:
        """The same ops marked against PyTorch/XLA's lowerings (what torch_xla runs on the
        device and what it hands to the CPU), from the table shipped with gpu2tpu."""
        from .op_coverage import coverage_of_dry_run, shipped_torch_xla_table

        return coverage_of_dry_run(self, table=shipped_torch_xla_table())

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "seconds": self.seconds,
            "counts": self.counts(),
            "hazards": [h.to_dict() for h in self.hazards],
            "ops": {
                name: {"count": sum(lines.values()), "lines": _line_dict(lines)}
                for name, lines in sorted(self.ops.items())
            },
            "overloads": dict(sorted(self.overloads.items())),
            "coverage": self.coverage.to_dict(),
            "error": self.error,
        }

    def _where(self, line: int | None) -> str:
        return f"line {line}" if line is not None else "outside your code"

    def __str__(self) -> str:
        head = (
            f"Dry run of {self.label} on the CPU: {self.total_ops:,} ATen ops "
            f"({len(self.ops)} distinct) in {self.seconds * 1e3:.1f} ms"
        )
        coverage = self._coverage_text()
        if not self.hazards:
            return "\n".join([head, "No TPU hazards found.", coverage])
        out = [head]
        for kind in HazardKind:
            found = self.by_kind(kind)
            if not found:
                continue
            total = sum(h.count for h in found)
            out.append(f"{kind} ({total}): {WHY[kind]}")
            for h in found:
                out.append(
                    f"  {self._where(h.line):<9} x{h.count:<4} {h.code}  <- {h.cause_text()}"
                )
            out.append(f"  fix: {FIX[kind]}")
        out.append(coverage)
        return "\n".join(out)

    def _coverage_text(self) -> str:
        report = self.coverage
        if report.fully_covered:
            return f"Op coverage: {report.summary()}"
        return str(report)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        from ..views.html import dry_run_html

        return dry_run_html(self)


def _line_dict(lines: Counter[int | None]) -> dict[str, int]:
    return {("outside" if k is None else str(k)): v for k, v in sorted(lines.items(), key=_key)}


def _key(item: tuple[int | None, int]) -> int:
    return -1 if item[0] is None else item[0]


class DryRunDetector(TorchDispatchMode):
    """Records TPU hazards while active; use as a context manager, then call `report()`.

    `filenames` are the files whose lines count as the user's (a cell's compile-cache name,
    a script); an op is attributed to the innermost frame from one of them.
    """

    def __init__(
        self,
        filenames: set[str],
        label: str = "the code",
        history: ShapeHistory | None = None,
    ) -> None:
        super().__init__()
        self.filenames = filenames
        self.label = label
        self.history = history if history is not None else ShapeHistory()
        self.ops: dict[str, Counter[int | None]] = {}
        self.overloads: dict[str, int] = {}
        self.found: dict[tuple[HazardKind, int | None], Hazard] = {}
        self._quiet = 0
        self._started = 0.0
        self.seconds = 0.0
        self._last_line: int | None = None
        self._entry: Counter[str] = Counter()  # op counts of the current run of _last_line
        self._bf16_autocast = False
        self._scaler_syncs: dict[int | None, int] = {}

    # -- attribution -----------------------------------------------------------------------------

    def _user_line(self) -> int | None:
        frame = sys._getframe(2)
        names = self.filenames
        while frame is not None:
            if frame.f_code.co_filename in names:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def _attribute(self) -> tuple[int | None, bool]:
        """The user's line for the op being dispatched, and whether the DataLoader ran it
        (its collate and sampler work on the host, on a TPU too: no graph, no shape)."""
        frame = sys._getframe(2)
        names = self.filenames
        loader = False
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename in names:
                return frame.f_lineno, loader
            if not loader and _DATA_PATH in filename:
                loader = True
            frame = frame.f_back
        return None, loader

    def _host_read_origin(self) -> str | None:
        """Where a host read comes from, if not from a device tensor: "host" for library code
        whose tensors live on the CPU on a TPU too, "scaler" for GradScaler's found_inf."""
        frame = sys._getframe(2)
        names = self.filenames
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename in names:
                return None
            if any(part in filename for part in _HOST_SIDE_PATHS):
                return "host"
            if filename.endswith(_GRAD_SCALER_FILE):
                return "scaler"
            frame = frame.f_back
        return None

    def _record_sync(self, line: int | None, cause: str) -> None:
        origin = self._host_read_origin()
        if origin == "host":
            return
        if origin == "scaler":
            self._scaler_syncs[line] = self._scaler_syncs.get(line, 0) + 1
            cause = "GradScaler reads found_inf on the host"
        self._record(HazardKind.HOST_SYNC, line, cause)

    def _record(self, kind: HazardKind, line: int | None, cause: str, detail: str = "") -> None:
        hazard = self.found.get((kind, line))
        if hazard is None:
            hazard = self.found[(kind, line)] = Hazard(kind, line)
        hazard.count += 1
        hazard.causes[cause] += 1
        if detail:
            hazard.detail = detail

    # -- the dispatch hook -----------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if self._quiet:
            return out
        info = _OP_INFO.get(func)
        if info is None:
            info = _op_info(func)
        name, overload, kind = info
        overloads = self.overloads
        overloads[overload] = overloads.get(overload, 0) + 1
        line, host_side = self._attribute()
        lines = self.ops.get(name)
        if lines is None:
            lines = self.ops[name] = Counter()
        lines[line] += 1

        if kind:
            if kind == _K_SYNC:
                self._record_sync(line, _SYNC_OPS.get(name, name))
            elif kind == _K_DYNAMIC:
                self._record(HazardKind.DYNAMIC_SHAPE, line, _DYNAMIC_CAUSES.get(name, name))
            elif _has_mask_index(args):
                self._record(HazardKind.DYNAMIC_SHAPE, line, "boolean-mask indexing x[mask]")
        if isinstance(out, torch.Tensor):
            if out.dtype in _F64 and out.dim():
                self._record(HazardKind.FLOAT64, line, name)
        elif isinstance(out, tuple | list):
            for item in out:
                if isinstance(item, torch.Tensor) and item.dtype in _F64 and item.dim():
                    self._record(HazardKind.FLOAT64, line, name)
                    break
        if (
            not self._bf16_autocast
            and isinstance(out, torch.Tensor)
            and out.dtype is torch.bfloat16
        ):
            # bfloat16 compute (autocast casts inputs with _to_copy; inside a dispatch mode
            # autocast's own flag reads False, so the dtypes are the evidence).
            self._bf16_autocast = True

        if line is not None and not host_side:
            if line != self._last_line:
                self._enter(line)
            self._entry[name] += 1
            sig = tuple([a.shape for a in args if isinstance(a, torch.Tensor)])
            if not sig and isinstance(out, torch.Tensor):
                sig = (out.shape,)  # a factory (randn, zeros, arange): its output's shape
            if sig:
                self._note_shapes(line, name, sig)
            if overload in _BAKED_SCALAR_OPS and args and getattr(args[0], "requires_grad", False):
                self._note_scalars(line, name, tuple(a for a in args[1:] if _is_number(a)))
        return out

    def _enter(self, line: int) -> None:
        """A new run of ops from `line` starts: close the previous line's run first."""
        self._close_entry()
        self._last_line = line
        self.history.entries[line] += 1

    def _close_entry(self) -> None:
        """Compare the run that ends with the line's previous run, from its second run on.

        A line's first run is its warm-up (an optimizer creates its state there, XLA compiles
        the first steps anyway); after that, a run with other op counts is a new graph.
        """
        line, counts = self._last_line, self._entry
        self._entry = Counter()
        if line is None or not counts:
            return
        history = self.history
        before = history.op_counts.get(line)
        history.op_counts[line] = counts
        if before is not None and history.entries[line] > 2 and before != counts:
            changes = history.count_changes.setdefault(line, [])
            changes.append((sum(before.values()), sum(counts.values())))

    def _note_shapes(self, line: int, name: str, sig: tuple[Any, ...]) -> None:
        """Remember the input shapes `name` ran on from `line`.

        Shapes seen in the line's first run are its set (two layers of different widths on
        one line are no change); a shape first seen in a later run (a loop iteration, or a
        run of the cell) is a new graph, as the DataLoader's short last batch is. An op the
        line first runs later (an optimizer's state updates after its first step) starts
        its own set.
        """
        key = (line, name)
        history = self.history
        seen = history.shapes.get(key)
        if seen is None:
            history.shapes[key] = {sig}
            history.first_run[key] = history.entries[line]
        elif sig not in seen:
            seen.add(sig)
            if history.entries[line] > history.first_run[key]:
                history.new_shapes.setdefault(key, []).append(sig)

    def _note_scalars(self, line: int, name: str, values: tuple[Any, ...]) -> None:
        key = (line, "scalars of " + name)
        history = self.history
        seen = history.scalars.get(key)
        if seen is None:
            history.scalars[key] = {values}
            history.first_run[key] = history.entries[line]
        elif values not in seen:
            seen.add(values)
            if history.entries[line] > history.first_run[key]:
                history.new_scalars.setdefault(key, []).append(values)

    # -- host transfers that run no ATen op on the CPU -------------------------------------------

    @contextmanager
    def _tensor_method_hooks(self) -> Iterator[None]:
        """Wrap `.cpu()`, `.tolist()`, `.numpy()` and printing so they count as host syncs."""
        cls = torch.Tensor
        originals = {
            n: getattr(cls, n) for n in ("cpu", "tolist", "numpy", "__repr__", "__format__")
        }
        labels = {
            "cpu": ".cpu()",
            "tolist": ".tolist()",
            "numpy": ".numpy()",
            "__repr__": "printing a tensor",
            "__format__": "formatting a tensor (f-string)",
        }
        detector = self

        def wrap(method_name: str) -> Callable[..., Any]:
            original = originals[method_name]
            label = labels[method_name]

            def hooked(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if detector._quiet:
                    return original(self, *args, **kwargs)
                detector._record_sync(detector._user_line(), label)
                detector._quiet += 1
                try:
                    return original(self, *args, **kwargs)
                finally:
                    detector._quiet -= 1

            hooked.__name__ = getattr(original, "__name__", method_name)
            hooked.__doc__ = getattr(original, "__doc__", None)
            return hooked

        for method_name in originals:
            setattr(cls, method_name, wrap(method_name))
        try:
            yield
        finally:
            for method_name, original in originals.items():
                setattr(cls, method_name, original)

    def __enter__(self) -> DryRunDetector:
        self._hooks = self._tensor_method_hooks()
        self._hooks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._hooks.__exit__(*sys.exc_info())
            raise
        # The first dispatch in a process imports torch machinery; keep it out of the timing.
        self._quiet += 1
        try:
            torch.zeros(()).add_(0)
        finally:
            self._quiet -= 1
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds += time.perf_counter() - self._started
        try:
            super().__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)

    # -- results -----------------------------------------------------------------------------------

    def report(self, error: BaseException | None = None) -> DryRunReport:
        self._close_entry()
        self._last_line = None
        hazards = list(self.found.values())
        filename = next(iter(self.filenames), None)
        history = self.history
        for (line, name), seen in history.changed().items():
            fresh = history.new_shapes[(line, name)]
            before = _closest(history.shapes[(line, name)] - set(fresh), fresh[0])
            hazards.append(
                Hazard(
                    HazardKind.SHAPE_CHANGE,
                    line,
                    count=len(set(fresh)),
                    causes=Counter({name: len(set(fresh))}),
                    detail=f"{len(seen)} input shapes, e.g. {_fmt(before)} and then "
                    f"{_fmt(fresh[0])}",
                )
            )
        for line, changes in history.count_changes.items():
            sizes = sorted({n for pair in changes for n in pair})
            hazards.append(
                Hazard(
                    HazardKind.SHAPE_CHANGE,
                    line,
                    count=len(changes),
                    causes=Counter({"the number of ops changes from run to run": len(changes)}),
                    detail=f"runs of {', '.join(map(str, sizes))} ops: a Python loop count or "
                    "branch that changes unrolls into a new graph",
                )
            )
        for (line, label), values in history.new_scalars.items():
            name = label.removeprefix("scalars of ")
            shown = ", ".join(str(v[0] if len(v) == 1 else v) for v in values[:3])
            hazards.append(
                Hazard(
                    HazardKind.SHAPE_CHANGE,
                    line,
                    count=len(values),
                    causes=Counter({f"{name} with a changing Python exponent": len(values)}),
                    detail=f"new exponents {shown}: pass the exponent as a tensor",
                )
            )
        hazards = _merge_shape_changes(hazards)
        ops, overloads = self.ops, Counter(self.overloads)
        if self._bf16_autocast:
            hazards, ops, overloads = self._drop_scaler(hazards, ops, overloads)
        for hazard in hazards:
            if hazard.line is not None and filename is not None:
                hazard.code = linecache.getline(filename, hazard.line).strip()
        hazards.sort(key=lambda h: (list(HazardKind).index(h.kind), _key((h.line, 0))))
        return DryRunReport(
            label=self.label,
            filename=filename,
            seconds=self.seconds,
            hazards=hazards,
            ops=ops,
            overloads=overloads,
            error=f"{type(error).__name__}: {error}" if error is not None else None,
        )

    def _drop_scaler(
        self,
        hazards: list[Hazard],
        ops: dict[str, Counter[int | None]],
        overloads: Counter[str],
    ) -> tuple[list[Hazard], dict[str, Counter[int | None]], Counter[str]]:
        """Under bfloat16 autocast a GradScaler is advice to drop, not a list of its ops.

        Its found_inf reads leave the host syncs, its own ops the op list (and so the
        coverage's "not lowered"), and one "unneeded GradScaler" entry for the lines that ran
        them, at the first of its lines, says to drop it.
        """
        lines: Counter[int | None] = Counter()
        for name in _SCALER_OPS:
            lines.update(ops.get(name, Counter()))
        for line, n in self._scaler_syncs.items():
            lines[line] += n
        if not lines:
            return hazards, ops, overloads
        kept = []
        cause = "GradScaler reads found_inf on the host"
        for hazard in hazards:
            if hazard.kind is HazardKind.HOST_SYNC and cause in hazard.causes:
                hazard.count -= hazard.causes.pop(cause)
                if hazard.count <= 0:
                    continue
            kept.append(hazard)
        where = sorted(lines, key=lambda n: -1 if n is None else n)
        first = next((n for n in where if n is not None), None)
        others = [str(n) for n in where if n is not None and n != first]
        kept.append(
            Hazard(
                HazardKind.GRAD_SCALER,
                first,
                count=sum(lines.values()),
                causes=Counter({"GradScaler with bfloat16": sum(lines.values())}),
                detail=f"also line {', '.join(others)}" if others else "",
            )
        )
        ops = {name: c for name, c in ops.items() if name not in _SCALER_OPS}
        overloads = Counter({k: v for k, v in overloads.items() if not k.startswith(_SCALER_OPS)})
        return kept, ops, overloads


def _closest(seen: set[tuple[Any, ...]], sig: tuple[Any, ...]) -> tuple[Any, ...]:
    """The signature in `seen` most like `sig` (fewest differing sizes), to show beside it."""

    def distance(other: tuple[Any, ...]) -> tuple[int, str]:
        if len(other) != len(sig):
            return (10**6, str(other))
        diff = sum(
            len(a) != len(b) or sum(x != y for x, y in zip(a, b, strict=False))
            for a, b in zip(other, sig, strict=True)
        )
        return (diff, str(other))

    return min(seen, key=distance) if seen else sig


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _has_mask_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in indices or ())


def _fmt(sig: tuple[Any, ...]) -> str:
    return " ".join(str(list(s)) for s in sig)


def _merge_shape_changes(hazards: list[Hazard]) -> list[Hazard]:
    """One shape-change entry per line: the op with the most shapes speaks for the line."""
    keep: list[Hazard] = []
    best: dict[int | None, Hazard] = {}
    for hazard in hazards:
        if hazard.kind is not HazardKind.SHAPE_CHANGE:
            keep.append(hazard)
            continue
        current = best.get(hazard.line)
        if current is None:
            best[hazard.line] = hazard
            continue
        winner, other = (hazard, current) if hazard.count > current.count else (current, hazard)
        for cause in other.causes:
            winner.causes.setdefault(cause, other.causes[cause])
        best[hazard.line] = winner
    return keep + list(best.values())


_FUNCTION_HISTORY: dict[Any, ShapeHistory] = {}


def dry_run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DryRunReport:
    """Run `fn(*args, **kwargs)` on the CPU and report what would hurt on a TPU.

    The report's `result` holds what `fn` returned. Lines are those of the file that defines `fn`. Calling `dry_run` again on the same
    function with inputs of new shapes reports the change, as XLA would recompile. An error
    raised by `fn` propagates; the report so far is attached to it as `error.dry_run_report`.
    """
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "forward", None), "__code__", None)
    if code is None and callable(fn):
        code = getattr(type(fn).__call__, "__code__", None)
    filename = code.co_filename if code is not None else "<unknown>"
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    history = _FUNCTION_HISTORY.setdefault(code, ShapeHistory())
    detector = DryRunDetector({filename}, label=f"{label}()", history=history)
    try:
        with detector:
            result = fn(*args, **kwargs)
    except BaseException as err:
        err.dry_run_report = detector.report(err)  # type: ignore[attr-defined]
        raise
    report = detector.report()
    report.result = result
    return report
