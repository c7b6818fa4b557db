"""The dry run: run PyTorch code on the CPU and record what would hurt on a TPU.

A `TorchDispatchMode` sees every ATen op the code runs. It records, against the line of the
user's code that caused it:

- host synchronisations: `.item()` and Python scalars from tensors (`_local_scalar_dense`),
  and (through small wrappers on `torch.Tensor`, because on the CPU they run no ATen op)
  `.cpu()`, `.tolist()`, `.numpy()` and printing a tensor. Reads that stay on the host on a
  TPU too are left out: an optimizer's step counter (a CPU tensor unless `capturable` or
  `fused`) and the DataLoader sampler's indices. The rules are the profiler's too
  (measure/syncs.py);
- float64 work (TPUs have no fast float64); a float64 scalar (0-d) is left out;
- ops whose output shape depends on the data (`nonzero`, boolean-mask indexing `x[mask]`,
  `unique`, `masked_select`, ...): PyTorch/XLA runs them on the CPU, reading the data;
- recompilations: the same line running an op on new shapes after its first run, within one
  run or between repeated runs of the same code; a line whose op count changes from one run
  to the next (a Python loop whose count changes unrolls into a new graph); and a changing
  Python exponent in a differentiated `x ** p` (pow's backward bakes it into the graph). A
  line's "run" is decided by the code that drives the model: a loop that comes round after
  a backward pass or an optimizer step starts new runs, the layers of one forward pass do
  not (`DryRunDetector`);
- a GradScaler under bfloat16 autocast, which bfloat16 does not need.

Calls into the user's other code (functions defined in earlier notebook cells, local
modules: `user_code.UserCode`) are followed, so a hazard there is reported at its own line,
with the line that called it.

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
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..measure.syncs import DYNAMIC_SHAPE, HOST_READ, MASK_INDEX, OP_INFO, HostReads, op_info
from .user_code import UserCode

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
# Ops that make a tensor from host data (`torch.from_numpy`, `torch.tensor(array)`): a float64
# one only hurts once an op computes with it; converted first (`.float()`) it never does.
_FROM_HOST_OPS = frozenset({"aten.lift_fresh", "aten.lift_fresh_copy", "aten.lift"})
_CONVERT_OPS = frozenset({"aten._to_copy"})
_DYNAMIC_CAUSES = {"aten.nonzero": "nonzero / torch.where(mask)"}
_MASK_DTYPES = (torch.bool, torch.uint8)
_DATA_PATH = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
# Frames that say a training step ran: autograd's backward and the optimizers.
_STEP_PATHS = (f"{os.sep}torch{os.sep}autograd{os.sep}", f"{os.sep}torch{os.sep}optim{os.sep}")
# The frame of an nn.Module call: user code below it is the model, above it the driver loop.
_MODULE_FILE = f"{os.sep}torch{os.sep}nn{os.sep}modules{os.sep}module.py"
# GradScaler's own ops; under bfloat16 autocast the advice is to drop the scaler instead.
_SCALER_OPS = ("aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_")
# Ops whose Python-number arguments PyTorch/XLA bakes into the graph when they are
# differentiated (measured on torch_xla 2.9: a changing `x ** p` recompiles every step in
# training, while changing scalars in mul, add, clamp, leaky_relu, elu or softplus do not).
_BAKED_SCALAR_OPS = frozenset({"aten.pow.Tensor_Scalar"})

# What a frame's file is to the walk up the stack: the code being dry-run, the user's other
# code, nn.Module's call machinery, the DataLoader, autograd or an optimizer, anything else.
_F_OTHER, _F_PRIMARY, _F_USER, _F_MODULE, _F_DATA, _F_STEP = range(6)

# A place in the user's code: (file name, line); the code being dry-run is `_PRIMARY`, so
# that a cell's shape history carries over to its next run (IPython names each run anew).
Site = tuple[str, int]
_PRIMARY = ""


@dataclass
class Hazard:
    """One kind of hazard at one line: how often, and what caused it.

    `line` is a line of the code being dry-run (a cell, a function's file). When the hazard
    is in code that line called (a function defined in an earlier cell, a local module),
    `source` names that code ("In[3]", "helper_functions.py"), `source_line` is the line
    there and `code` its text; `line` is then the call that led there.
    """

    kind: HazardKind
    line: int | None
    count: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    detail: str = ""
    code: str = ""
    source: str | None = None
    source_line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "line": self.line,
            "source": self.source,
            "source_line": self.source_line,
            "count": self.count,
            "causes": dict(self.causes),
            "detail": self.detail,
            "code": self.code,
            "fix": FIX[self.kind],
        }

    def where(self) -> str:
        """ "line 4", "In[3] line 6 (from line 2)", or "outside your code"."""
        here = f"line {self.line}" if self.line is not None else ""
        if self.source is not None:
            called = f" (from {here})" if here else ""
            return f"{self.source} line {self.source_line}{called}"
        return here or "outside your code"

    def cause_text(self, most: int = 3) -> str:
        """The most frequent causes, and the detail, in one phrase."""
        ranked = [name for name, _ in self.causes.most_common()]
        text = ", ".join(ranked[:most])
        if len(ranked) > most:
            text += f" and {len(ranked) - most} more"
        return text + (f" ({self.detail})" if self.detail else "")


class ShapeHistory:
    """Input shapes seen per (site, op) across runs of the same code.

    Kept by the caller between runs (the magic keeps one per cell, `dry_run` one per
    function), so that the second run of a cell with a new batch size shows up as the
    recompilation it would be on XLA. A site is a (file, line) of the user's code.
    """

    def __init__(self) -> None:
        # (site, op name) -> input shape signatures seen, and those first seen after the
        # site's first run: each of those is a new graph on XLA
        self.shapes: dict[tuple[Site, str], set[tuple[Any, ...]]] = {}
        self.new_shapes: dict[tuple[Site, str], list[tuple[Any, ...]]] = {}
        # (site, op) -> the run of the site in which the op first ran there
        self.first_run: dict[tuple[Site, str], int] = {}
        # site -> how many times it has been entered (a run of ops from that site)
        self.entries: Counter[Site] = Counter()
        # site -> the op counts of its latest run, and (before, after) totals of runs that differed
        self.op_counts: dict[Site, Counter[str]] = {}
        self.count_changes: dict[Site, list[tuple[int, int]]] = {}
        # (site, op) -> Python scalars seen, and those first seen after the site's first run
        self.scalars: dict[tuple[Site, str], set[Any]] = {}
        self.new_scalars: dict[tuple[Site, str], list[Any]] = {}
        # site -> the line of the code being dry-run that called it (None: outside it)
        self.call_lines: dict[Site, int | None] = {}

    def changed(self) -> dict[tuple[Site, str], set[tuple[Any, ...]]]:
        """(site, op) -> every signature seen, for the pairs that met a new one later."""
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
        """Every ATen op the run used, marked against PyTorch/XLA's lowerings (what torch_xla
        runs on the device and what it hands to the CPU), from the table shipped with gpu2tpu.

        PyTorch/XLA's table decides, not torchax's: it is the backend `%%tpu` takes on a TPU
        VM without TorchTPU, and the CPU's own choices follow from it (`clip_grad_norm_` runs
        foreach ops on CPU tensors, XLA tensors take the per-tensor path)."""
        from .op_coverage import coverage_of_dry_run, shipped_torch_xla_table

        return coverage_of_dry_run(self, table=shipped_torch_xla_table())

    @functools.cached_property
    def torchax_coverage(self) -> Any:
        """The same ops marked against torchax's registry (torchax on JAX), from the installed
        torchax or the table shipped with gpu2tpu."""
        from .op_coverage import coverage_of_dry_run

        return coverage_of_dry_run(self)

    @property
    def distinct_ops(self) -> int:
        """Distinct ops by overload ("aten.mul.Tensor"), as the coverage counts them."""
        return len(self.overloads) if self.overloads else len(self.ops)

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

    @property
    def empty(self) -> bool:
        """Nothing to say: the code ran no ATen op, found nothing and raised nothing (a cell
        that only defines functions or imports)."""
        return not self.ops and not self.hazards and self.error is None

    def __str__(self) -> str:
        head = (
            f"Dry run of {self.label} on the CPU: {self.total_ops:,} ATen ops "
            f"({self.distinct_ops} distinct) in {self.seconds * 1e3:.1f} ms"
        )
        coverage = self._coverage_text()
        if not self.hazards:
            if self.coverage.fully_covered:  # one line, as %%time says its time
                return f"{head}. No TPU hazards found. Op coverage: every op has an XLA lowering."
            return "\n".join([head, "No TPU hazards found.", coverage])
        out = [head]
        where = {id(h): h.where() for h in self.hazards}
        width = max(9, *(len(w) for w in where.values()))
        for kind in HazardKind:
            found = self.by_kind(kind)
            if not found:
                continue
            total = sum(h.count for h in found)
            out.append(f"{kind} ({total}): {WHY[kind]}")
            for h in found:
                out.append(f"  {where[id(h)]:<{width}} x{h.count:<4} {h.code}  <- {h.cause_text()}")
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

    `filenames` are the files of the code being dry-run (a cell's compile-cache name, a
    script): its lines are the report's. Calls into other code of the user's (`user_code`:
    functions defined in earlier cells, local modules; by default the running shell's cells
    and the Python files under the working directory) are followed: an op is attributed to
    the innermost frame of the user's code, and to the line of `filenames` that called it.

    Ops run in "runs", decided by the code that drives the model (the user's frames outside
    any nn.Module call): a run ends when another driving line runs ops, when the outermost
    driving frame is a new call (a step function called again), or when a driving frame goes
    round a loop after a backward pass or an optimizer step. The ops of a model belong to the
    run of the line that called it. A site's first run is its warm-up; shapes, op counts and
    exponents new in a later run are new graphs.
    """

    def __init__(
        self,
        filenames: set[str],
        label: str = "the code",
        history: ShapeHistory | None = None,
        user_code: UserCode | None = None,
    ) -> None:
        super().__init__()
        self.filenames = filenames
        self.label = label
        self.history = history if history is not None else ShapeHistory()
        self.user_code = user_code if user_code is not None else UserCode()
        self.ops: dict[str, Counter[int | None]] = {}
        self.overloads: dict[str, int] = {}
        self.calls = 0  # ops run so far, read by the live status line while the code runs
        self.found: dict[tuple[HazardKind, Site | None], Hazard] = {}
        self._started = 0.0
        self.seconds = 0.0
        self._anchor: Site | None = None  # the driving line of the current run
        self._run_counts: dict[Site, Counter[str]] = {}  # op counts per site in the current run
        self._bf16_autocast = False
        self._scaler_syncs: dict[int | None, int] = {}
        self._reads = HostReads(self._on_read, emulated=True, user_files=_UserFiles(self))
        self._stop: Any = None  # the frame that entered the detector: the walk ends there
        self._kinds: dict[str, int] = {}  # file name -> what it is to `_locate` (_F_*)
        self._outer: Any = None  # the outermost driving frame of the last op
        # where the driving frames were (outer first) when a backward pass or an optimizer
        # step first ran in this run; None until one does
        self._stepped_at: list[tuple[Any, int]] | None = None
        self._new_run = False
        # float64 tensors made from host data, by id, not yet used: (the tensor, its site and
        # line); reported at that site once an op other than a conversion uses one
        self._host_f64: dict[int, tuple[weakref.ref[torch.Tensor], Site | None, int | None]] = {}

    # -- attribution -----------------------------------------------------------------------------

    def _locate(self, frame: Any) -> tuple[Site | None, int | None, bool, Site | None]:
        """Walk up from `frame`: the user's site of the op, the line of the code being dry-run
        that led there, whether the DataLoader ran it (its collate and sampler work on the
        host, on a TPU too: no graph, no shape), and the driving line (the innermost user
        line outside any nn.Module call: the op's site, or the line that called the model).
        Notes run boundaries on the way."""
        kinds = self._kinds
        stop = self._stop
        site: Site | None = None
        line: int | None = None
        loader = stepping = False
        drivers: list[Any] = []  # user frames above the outermost nn.Module call, inner first
        while frame is not None and frame is not stop:
            filename = frame.f_code.co_filename
            kind = kinds.get(filename)
            if kind is None:
                kind = self._kind_of(filename)
            if kind == _F_PRIMARY:
                if site is None:
                    site = (_PRIMARY, frame.f_lineno)
                if line is None:
                    line = frame.f_lineno
                drivers.append(frame)
            elif kind == _F_USER:
                if site is None:
                    site = (filename, frame.f_lineno)
                drivers.append(frame)
            elif kind == _F_MODULE:
                drivers.clear()
            elif kind == _F_DATA:
                loader = True  # the DataLoader ran it, the user's Dataset too: host-side work
            elif site is None and kind == _F_STEP:
                stepping = True
            frame = frame.f_back
        if site is None:
            return None, line, loader, None
        if drivers:
            if stepping or drivers[-1] is not self._outer or self._stepped_at is not None:
                self._note_drivers(drivers, stepping)
            return site, line, loader, (drivers[0].f_code.co_filename, drivers[0].f_lineno)
        return site, line, loader, site

    def _kind_of(self, filename: str) -> int:
        """What a frame's file is to the walk in `_locate` (decided once per file)."""
        if filename in self.filenames:
            kind = _F_PRIMARY
        elif self.user_code.label(filename) is not None:
            kind = _F_USER
        elif filename.endswith(_MODULE_FILE):
            kind = _F_MODULE
        elif _DATA_PATH in filename:
            kind = _F_DATA
        elif any(part in filename for part in _STEP_PATHS):
            kind = _F_STEP
        else:
            kind = _F_OTHER
        self._kinds[filename] = kind
        return kind

    def _note_drivers(self, drivers: list[Any], stepping: bool) -> None:
        """A new run starts when the outermost driving frame is a new call (a step function
        called again), or when a driving frame is back before where it was when a backward
        pass or an optimizer step ran (a loop that has come round). `drivers` are inner first.
        """
        outer = drivers[-1]
        if outer is not self._outer:
            if self._outer is not None:
                self._new_run = True
            self._outer, self._stepped_at = outer, None
        else:
            at = self._stepped_at
            if at is not None:
                count = len(drivers)
                for i, (frame, lasti) in enumerate(at):
                    if i >= count or drivers[count - 1 - i] is not frame:
                        break
                    if frame.f_lasti < lasti:
                        self._new_run = True
                        self._stepped_at = None
                        break
        if stepping and self._stepped_at is None:
            self._stepped_at = [(f, f.f_lasti) for f in reversed(drivers)]

    def _on_read(self, cause: str, frame: Any, origin: str | None) -> None:
        site, line, _, _ = self._locate(frame)
        if origin == "scaler":
            self._scaler_syncs[line] = self._scaler_syncs.get(line, 0) + 1
            cause = "GradScaler reads found_inf on the host"
        self._record(HazardKind.HOST_SYNC, site, line, cause)

    def _record(
        self, kind: HazardKind, site: Site | None, line: int | None, cause: str, detail: str = ""
    ) -> None:
        hazard = self.found.get((kind, site))
        if hazard is None:
            hazard = self.found[(kind, site)] = self._hazard(kind, site, line)
        hazard.count += 1
        hazard.causes[cause] += 1
        if detail:
            hazard.detail = detail

    def _hazard(self, kind: HazardKind, site: Site | None, line: int | None, **kw: Any) -> Hazard:
        """A hazard at `site`, placed for the report: a line of the code being dry-run, or
        another file of the user's with the line that called it."""
        if site is None:
            return Hazard(kind, line, **kw)
        if site[0] == _PRIMARY:
            return Hazard(kind, site[1], **kw)  # its code comes from the file in `report()`
        code = linecache.getline(site[0], site[1]).strip()
        source = self.user_code.label(site[0])
        return Hazard(kind, line, code=code, source=source, source_line=site[1], **kw)

    # -- the dispatch hook -----------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        reads = self._reads
        if reads.quiet:
            return out
        info = OP_INFO.get(func) or op_info(func)
        name, overload, kind = info
        self.calls += 1
        overloads = self.overloads
        overloads[overload] = overloads.get(overload, 0) + 1
        if kind == HOST_READ:
            reads.op_read(info, args, kwargs or {})
        site, line, host_side, anchor = self._locate(sys._getframe(1))
        lines = self.ops.get(name)
        if lines is None:
            lines = self.ops[name] = Counter()
        lines[line] += 1

        if kind == DYNAMIC_SHAPE:
            self._record(HazardKind.DYNAMIC_SHAPE, site, line, _DYNAMIC_CAUSES.get(name, name))
        elif kind == MASK_INDEX and _has_mask_index(args):
            self._record(HazardKind.DYNAMIC_SHAPE, site, line, "boolean-mask indexing x[mask]")
        made_at = self._use_host_f64(name, args, out) if self._host_f64 else None
        if isinstance(out, torch.Tensor):
            if out.dtype in _F64 and out.dim():
                if name in _FROM_HOST_OPS:
                    self._host_f64[id(out)] = (weakref.ref(out), site, line)
                elif made_at is not None:  # copied elsewhere as float64: still not computed on
                    self._host_f64[id(out)] = (weakref.ref(out), *made_at)
                else:
                    self._record(HazardKind.FLOAT64, site, line, name)
        elif isinstance(out, tuple | list):
            for item in out:
                if isinstance(item, torch.Tensor) and item.dtype in _F64 and item.dim():
                    self._record(HazardKind.FLOAT64, site, line, name)
                    break
        if (
            not self._bf16_autocast
            and isinstance(out, torch.Tensor)
            and out.dtype is torch.bfloat16
        ):
            # bfloat16 compute (autocast casts inputs with _to_copy; inside a dispatch mode
            # autocast's own flag reads False, so the dtypes are the evidence).
            self._bf16_autocast = True

        if site is not None and not host_side:
            if anchor != self._anchor or self._new_run:
                self._start_run(anchor)
            counts = self._run_counts.get(site)
            if counts is None:
                counts = self._run_counts[site] = Counter()
                self.history.entries[site] += 1
                self.history.call_lines.setdefault(site, line)
            counts[name] += 1
            sig = tuple([a.shape for a in args if isinstance(a, torch.Tensor)])
            if not sig and isinstance(out, torch.Tensor):
                sig = (out.shape,)  # a factory (randn, zeros, arange): its output's shape
            if sig:
                self._note_shapes(site, name, sig)
            if overload in _BAKED_SCALAR_OPS and args and getattr(args[0], "requires_grad", False):
                self._note_scalars(site, name, tuple(a for a in args[1:] if _is_number(a)))
        return out

    def _use_host_f64(
        self, name: str, args: tuple[Any, ...], out: Any
    ) -> tuple[Site | None, int | None] | None:
        """A float64 tensor made from host data meets its first op. A conversion
        (`.float()`, `.to(torch.float32)`) ends its story: no float64 work reaches the TPU; a
        copy that stays float64 (`.to(device)`) passes it on (returns where it was made); any
        other op computes with it: a hazard at the line that made it, where the fix goes."""
        for arg in args:
            if not isinstance(arg, torch.Tensor):
                continue
            entry = self._host_f64.pop(id(arg), None)
            if entry is None or entry[0]() is not arg:
                continue
            _, site, line = entry
            if name in _CONVERT_OPS and isinstance(out, torch.Tensor):
                if out.dtype in _F64:
                    return site, line
                continue
            self._record(HazardKind.FLOAT64, site, line, f"float64 from the host, used by {name}")
        return None

    def _start_run(self, anchor: Site | None) -> None:
        """A new run starts at the driving line `anchor`: close the previous run first.

        Ops of the model that line calls belong to the line's run, so that the layers of a
        model (of different widths, called in a loop in `forward`) are one run; a driving
        line that another follows, or that a loop comes back to after a step, starts another.
        """
        self._close_run()
        self._new_run = False
        self._anchor = anchor

    def _close_run(self) -> None:
        """Compare each site's op counts in the run that ends with its previous run's, from
        its second run on.

        A site's first run is its warm-up (an optimizer creates its state there, XLA compiles
        the first steps anyway); after that, a run with other op counts is a new graph.
        """
        history = self.history
        for site, counts in self._run_counts.items():
            before = history.op_counts.get(site)
            history.op_counts[site] = counts
            if before is not None and history.entries[site] > 2 and before != counts:
                changes = history.count_changes.setdefault(site, [])
                changes.append((sum(before.values()), sum(counts.values())))
        self._run_counts = {}

    def _note_shapes(self, site: Site, name: str, sig: tuple[Any, ...]) -> None:
        """Remember the input shapes `name` ran on from `site`.

        Shapes seen in the site's first run are its set (two layers of different widths on
        one line are no change); a shape first seen in a later run (a loop iteration, or a
        run of the cell) is a new graph, as the DataLoader's short last batch is. An op the
        site first runs later (an optimizer's state updates after its first step) starts
        its own set.
        """
        key = (site, name)
        history = self.history
        seen = history.shapes.get(key)
        if seen is None:
            history.shapes[key] = {sig}
            history.first_run[key] = history.entries[site]
        elif sig not in seen:
            seen.add(sig)
            if history.entries[site] > history.first_run[key]:
                history.new_shapes.setdefault(key, []).append(sig)

    def _note_scalars(self, site: Site, name: str, values: tuple[Any, ...]) -> None:
        key = (site, "scalars of " + name)
        history = self.history
        seen = history.scalars.get(key)
        if seen is None:
            history.scalars[key] = {values}
            history.first_run[key] = history.entries[site]
        elif values not in seen:
            seen.add(values)
            if history.entries[site] > history.first_run[key]:
                history.new_scalars.setdefault(key, []).append(values)

    def __enter__(self) -> DryRunDetector:
        self._stop = sys._getframe(1)
        self._hooks = self._reads.watching()
        self._hooks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._hooks.__exit__(*sys.exc_info())
            raise
        # The first dispatch in a process imports torch machinery; keep it out of the timing.
        self._reads.quiet += 1
        try:
            torch.zeros(()).add_(0)
        finally:
            self._reads.quiet -= 1
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds += time.perf_counter() - self._started
        try:
            super().__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)
            self._stop = None
            self._outer = self._stepped_at = None  # frames keep their locals alive

    # -- results -----------------------------------------------------------------------------------

    def report(self, error: BaseException | None = None) -> DryRunReport:
        self._close_run()
        self._anchor = None
        hazards = list(self.found.values())
        filename = next(iter(self.filenames), None)
        history = self.history
        calls = history.call_lines
        for (site, name), seen in history.changed().items():
            fresh = history.new_shapes[(site, name)]
            before = _closest(history.shapes[(site, name)] - set(fresh), fresh[0])
            hazards.append(
                self._hazard(
                    HazardKind.SHAPE_CHANGE,
                    site,
                    calls.get(site),
                    count=len(set(fresh)),
                    causes=Counter({name: len(set(fresh))}),
                    detail=f"{len(seen)} input shapes, e.g. {_fmt(before)} and then "
                    f"{_fmt(fresh[0])}",
                )
            )
        for site, changes in history.count_changes.items():
            sizes = sorted({n for pair in changes for n in pair})
            hazards.append(
                self._hazard(
                    HazardKind.SHAPE_CHANGE,
                    site,
                    calls.get(site),
                    count=len(changes),
                    causes=Counter({"the number of ops changes from run to run": len(changes)}),
                    detail=f"runs of {', '.join(map(str, sizes))} ops: a Python loop count or "
                    "branch that changes unrolls into a new graph",
                )
            )
        for (site, label), values in history.new_scalars.items():
            name = label.removeprefix("scalars of ")
            shown = ", ".join(str(v[0] if len(v) == 1 else v) for v in values[:3])
            hazards.append(
                self._hazard(
                    HazardKind.SHAPE_CHANGE,
                    site,
                    calls.get(site),
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
            if not hazard.code and hazard.line is not None and filename is not None:
                hazard.code = linecache.getline(filename, hazard.line).strip()
        hazards.sort(key=_order)
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


class _UserFiles:
    """The files whose frames end the walk for library code that reads on the host: the code
    being dry-run and the user's other code (a container, for `host_side_origin`)."""

    def __init__(self, detector: DryRunDetector) -> None:
        self.detector = detector

    def __contains__(self, filename: object) -> bool:
        return filename in self.detector.filenames or filename in self.detector.user_code


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


def _place(hazard: Hazard) -> tuple[int | None, str | None, int | None]:
    return hazard.line, hazard.source, hazard.source_line


def _order(hazard: Hazard) -> tuple[int, int, str, int]:
    """Kinds in HazardKind's order, then by line (outside the code first), then by source."""
    line = -1 if hazard.line is None else hazard.line
    return (list(HazardKind).index(hazard.kind), line, hazard.source or "", hazard.source_line or 0)


def _merge_shape_changes(hazards: list[Hazard]) -> list[Hazard]:
    """One shape-change entry per place: the op with the most shapes speaks for the line."""
    keep: list[Hazard] = []
    best: dict[tuple[int | None, str | None, int | None], Hazard] = {}
    for hazard in hazards:
        if hazard.kind is not HazardKind.SHAPE_CHANGE:
            keep.append(hazard)
            continue
        current = best.get(_place(hazard))
        if current is None:
            best[_place(hazard)] = hazard
            continue
        winner, other = (hazard, current) if hazard.count > current.count else (current, hazard)
        for cause in other.causes:
            winner.causes.setdefault(cause, other.causes[cause])
        best[_place(hazard)] = winner
    return keep + list(best.values())


_FUNCTION_HISTORY: dict[Any, ShapeHistory] = {}


def dry_run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DryRunReport:
    """Run `fn(*args, **kwargs)` on the CPU and report what would hurt on a TPU.

    The report's `result` holds what `fn` returned. Lines are those of the file that defines
    `fn`; calls into local modules (Python files under the working directory) and, in
    IPython, into functions of earlier cells are followed. Calling `dry_run` again on the same
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
        err.dry_run_report = detector.report(err)  # type: ignore[attr-defined]  # the report rides on the user's exception
        raise
    report = detector.report()
    report.result = result
    return report
