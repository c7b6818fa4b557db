"""A profile's result: the measurement, its costs beside other chips, and baseline files.

`build_result` turns a timed run into a `ProfileResult` in two steps. `gather_context`
reads what costing needs from outside the run: the catalogue, the backend's chip, baseline
files, a host benchmark, the clock. `cost_run` then decides, with no I/O: step statistics,
throughput, FLOPs and MFU, memory, compilations and host syncs, and a `Comparison` with the
measured device, any loaded GPU baseline and estimated targets. The measured step is the
truth; each target's row is an expected time: the step's FLOPs at the utilisation this run
(or a baseline of the same workload) reached, scaled to the target by the published-runs
fit, or at the fit's own utilisation when no accelerator measured the step; the roofline
bound stands beside it (docs/profiler.md explains the method and its error).

A baseline file (`result.save_baseline(path)` on a GPU machine, `compare_to=path` elsewhere)
is small JSON: the step-time statistics, the workload (FLOPs, tokens and samples per step)
and where and when it was measured.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..pricing.catalogue import Chip, HardwareCatalogue
from ..pricing.class_fit import CLASSES, expected_step_by_op
from ..pricing.compare import Comparison, ComparisonExports, ComparisonRow
from ..pricing.cost import efficiency_from_run, roofline_seconds
from ..pricing.step_floor import StepFloor, apply_floor, step_floor
from ..pricing.utilisation import (
    StepFeatures,
    default_framework,
    scaled_utilisation,
)
from .records import Costing, ProfileError, StepStats, summarize

if TYPE_CHECKING:
    from .flops import HostPeak, StepCount
    from .records import RunRecord

BASELINE_FORMAT = 1
# A baseline whose step did a different amount of work than this one is flagged.
WORKLOAD_TOLERANCE = 0.05
# Below this, an estimated step without a counted op list is flagged as a lower bound:
# per-step launch and dispatch costs (tens of microseconds on any accelerator) are not in
# the roofline, and without the ops no per-step floor (pricing/step_floor.py) is known.
FIXED_COST_SECONDS = 100e-6


@dataclass(frozen=True)
class BaselineRecord:
    """A step time measured earlier on another machine, read from a baseline file."""

    device_key: str
    device_name: str
    chips: int
    backend: str
    stats: StepStats
    samples_per_step: float | None
    tokens_per_step: float | None
    flops_per_step: float | None
    memory_peak_bytes: int | None
    memory_kind: str
    created: str
    host: str
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu2tpu_baseline": BASELINE_FORMAT,
            "device_key": self.device_key,
            "device_name": self.device_name,
            "chips": self.chips,
            "backend": self.backend,
            "step_seconds": self.stats.median,
            "stats": self.stats.to_dict(),
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "flops_per_step": self.flops_per_step,
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_kind": self.memory_kind,
            "created": self.created,
            "host": self.host,
        }


def load_baseline(path: str | Path) -> BaselineRecord:
    """Read a baseline file written by `ProfileResult.save_baseline`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(
            f"baseline file {path} does not exist; save one with result.save_baseline(path)."
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"baseline file {path} cannot be read as JSON ({exc}).") from None
    if not isinstance(data, dict) or "gpu2tpu_baseline" not in data:
        raise ProfileError(
            f"{path} is not a gpu2tpu baseline file (it has no 'gpu2tpu_baseline' key)."
        )
    if data["gpu2tpu_baseline"] != BASELINE_FORMAT:
        raise ProfileError(
            f"baseline file {path} has format {data['gpu2tpu_baseline']!r}; this gpu2tpu reads "
            f"format {BASELINE_FORMAT}: save the baseline again."
        )
    try:
        raw = data["stats"]
        stats = StepStats(
            n=int(raw["n"]),
            median=float(raw["median"]),
            p10=float(raw["p10"]),
            p90=float(raw["p90"]),
            mean=float(raw["mean"]),
            min=float(raw["min"]),
            max=float(raw["max"]),
        )
        if not stats.median > 0:
            raise ValueError("step time must be positive")
        return BaselineRecord(
            device_key=str(data["device_key"]),
            device_name=str(data["device_name"]),
            chips=int(data.get("chips", 1)),
            backend=str(data.get("backend", "")),
            stats=stats,
            samples_per_step=data.get("samples_per_step"),
            tokens_per_step=data.get("tokens_per_step"),
            flops_per_step=data.get("flops_per_step"),
            memory_peak_bytes=data.get("memory_peak_bytes"),
            memory_kind=str(data.get("memory_kind", "unknown")),
            created=str(data.get("created", "")),
            host=str(data.get("host", "")),
            path=str(path),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(
            f"baseline file {path} is malformed ({type(exc).__name__}: {exc})."
        ) from None


@dataclass
class ProfileResult(ComparisonExports):
    """What `profile()` measured, and the comparison built from it.

    Times are seconds; `step_times` are the steady steps only (each the mean of
    `group_size` steps when the step was too short to time alone); `warmup_times` are the
    warm-up steps, where compilation happens. `mfu` is against the chip's catalogue peak, or
    on the CPU against this host's measured matmul rate (`peak_source` says which).
    """

    device_key: str
    device_name: str
    backend: str
    chips: int
    steps: int
    warmup: int
    warmup_times: list[float]
    step_times: list[float]
    group_size: int
    stats: StepStats
    timed_wall_seconds: float
    timer_floor: float
    samples_per_step: float | None
    tokens_per_step: float | None
    flops_per_step: float | None
    bytes_per_step: float | None
    flops_source: str | None
    top_ops: list[tuple[str, float]]
    peak_flops: float | None
    peak_bandwidth: float | None
    peak_source: str | None
    efficiency: float | None
    memory_peak_bytes: int | None
    memory_kind: str
    compilations_warmup: int | None
    compilations_timed: int | None
    host_syncs_per_step: int | None
    host_syncs_timed: int | None
    sync_ops: list[tuple[str, int]]
    comparison: Comparison
    notes: list[str] = field(default_factory=list)
    created: str = ""
    # What the runtime reports compiling (XLA's CompileTime), None where it keeps no record.
    compile_seconds_warmup: float | None = None
    compile_seconds_timed: float | None = None
    # One more step op by op (`profile(trace=...)`): a measure.trace.OpTrace, or None.
    trace: Any = None
    # What the counted step was: its op mix, precision, model class and kernel launches.
    step_count: StepCount | None = None

    @property
    def precision(self) -> str | None:
        """ "bf16", "fp16" or "fp32": what the step's matrix FLOPs ran in (None: uncounted)."""
        return self.step_count.precision if self.step_count else None

    @property
    def model_class(self) -> str | None:
        """The model class the counted ops look like (measure/workload.py)."""
        return self.step_count.model_class if self.step_count else None

    # -- numbers --------------------------------------------------------------------------

    @property
    def median(self) -> float:
        return self.stats.median

    @property
    def p10(self) -> float:
        return self.stats.p10

    @property
    def p90(self) -> float:
        return self.stats.p90

    @property
    def spread(self) -> float:
        return self.stats.spread

    @property
    def samples_per_s(self) -> float | None:
        return self.samples_per_step / self.median if self.samples_per_step else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens_per_step / self.median if self.tokens_per_step else None

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s reached in a median step (all chips together)."""
        return self.flops_per_step / self.median if self.flops_per_step else None

    @property
    def mfu(self) -> float | None:
        achieved = self.achieved_flops
        return achieved / self.peak_flops if achieved and self.peak_flops else None

    @property
    def compile_seconds_measured(self) -> bool:
        """Whether compile time comes from the runtime's own compile events (XLA)."""
        return self.compile_seconds_warmup is not None

    @property
    def compile_seconds(self) -> float | None:
        """Seconds spent compiling in warm-up: the runtime's own figure where it keeps one
        (XLA's CompileTime), else the warm-up's time beyond steady steps (compilation and
        first-touch costs together)."""
        if self.compile_seconds_warmup is not None:
            return self.compile_seconds_warmup
        if not self.warmup_times:
            return None
        return max(0.0, sum(self.warmup_times) - len(self.warmup_times) * self.median)

    @property
    def measured_row(self) -> ComparisonRow:
        return next(r for r in self.comparison.rows if r.source == "measured")

    def row(self, device_key: str) -> ComparisonRow:
        """The comparison row for a chip key (the measured one first if there are two)."""
        for source in ("measured", "baseline", "compiled", "estimated"):
            for r in self.comparison.rows:
                if r.device_key == device_key and r.source == source:
                    return r
        raise KeyError(
            f"no row for {device_key!r}; rows are {', '.join(r.device_key for r in self.comparison.rows)}."
        )

    # -- baselines ------------------------------------------------------------------------

    def to_baseline(self) -> BaselineRecord:
        return BaselineRecord(
            device_key=self.device_key,
            device_name=self.device_name,
            chips=self.chips,
            backend=self.backend,
            stats=self.stats,
            samples_per_step=self.samples_per_step,
            tokens_per_step=self.tokens_per_step,
            flops_per_step=self.flops_per_step,
            memory_peak_bytes=self.memory_peak_bytes,
            memory_kind=self.memory_kind,
            created=self.created,
            host=platform.node(),
        )

    def save_baseline(self, path: str | Path) -> Path:
        """Write this run as a baseline file for `profile(..., compare_to=path)` elsewhere."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_baseline().to_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    # -- views ----------------------------------------------------------------------------

    def series(self) -> dict[str, Any]:
        """The step-time series for the views: warm-up steps, then steady steps."""
        return {
            "warmup": list(self.warmup_times),
            "steps": list(self.step_times),
            "group_size": self.group_size,
        }

    def details(self) -> dict[str, str]:
        """Label -> text for the details tab and the terminal summary."""
        from ..views.format import format_bytes, format_flops, format_percent, format_seconds

        d: dict[str, str] = {}
        d["Device"] = f"{self.device_name} ({self.device_key}) x{self.chips} via {self.backend}"
        d["Steps"] = f"{self.warmup} warm-up + {self.stats.n} timed" + (
            f" (each the mean of {self.group_size} steps)" if self.group_size > 1 else ""
        )
        d["Step time"] = (
            f"median {format_seconds(self.median)}, p10 {format_seconds(self.p10)}, "
            f"p90 {format_seconds(self.p90)}, spread {self.spread:.1%}"
        )
        if self.warmup_times and self.compile_seconds_measured:
            d["Warm-up"] = (
                f"first step {format_seconds(self.warmup_times[0])}; "
                f"compiling {format_seconds(self.compile_seconds)} (the runtime's compile events)"
            )
        elif self.warmup_times:
            d["Warm-up"] = (
                f"first step {format_seconds(self.warmup_times[0])}; "
                f"compile and first-touch time about {format_seconds(self.compile_seconds)}"
            )
        if self.samples_per_s is not None:
            d["Samples/s"] = f"{self.samples_per_s:,.1f}"
        if self.tokens_per_s is not None:
            d["Tokens/s"] = f"{self.tokens_per_s:,.1f}"
        if self.flops_per_step is not None:
            d["FLOPs per step"] = f"{format_flops(self.flops_per_step)} ({self.flops_source})"
        if self.bytes_per_step is not None:
            d["Bytes per step"] = f"{format_bytes(self.bytes_per_step)} (unfused upper bound)"
        if self.achieved_flops is not None:
            d["Achieved"] = f"{self.achieved_flops / 1e12:.3g} TFLOP/s"
        if self.mfu is not None:
            d["MFU"] = f"{format_percent(self.mfu)} of {self.peak_source}"
        if self.efficiency is not None:
            d["Roofline efficiency"] = (
                f"{format_percent(self.efficiency)} of this run's own roofline"
            )
        if self.memory_peak_bytes is not None:
            d["Peak memory"] = f"{format_bytes(self.memory_peak_bytes)} ({self.memory_kind})"
        d["Compilations"] = (
            f"warm-up {_or_unknown(self.compilations_warmup)}, "
            f"timed steps {_or_unknown(self.compilations_timed)}"
        )
        if self.compilations_timed:
            spent = (
                f", {format_seconds(self.compile_seconds_timed)} of compiling"
                if self.compile_seconds_timed is not None
                else ""
            )
            d["Recompiled in timed steps"] = (
                f"{self.compilations_timed} new graph(s){spent}: the step's shapes or Python "
                "values changed after warm-up, so its step times include compilation "
                "(run %%tpu --dry-run to see which line)"
            )
        if self.host_syncs_per_step is not None:
            ops = ", ".join(f"{n} {op}" for op, n in self.sync_ops) or "none"
            d["Host syncs per step"] = f"{self.host_syncs_per_step} ({ops})"
        if self.host_syncs_timed is not None:
            d["Host syncs in timed steps"] = str(self.host_syncs_timed)
        if self.top_ops:
            d["Top ops by FLOPs"] = ", ".join(f"{op} {format_flops(n)}" for op, n in self.top_ops)
        if self.trace is not None:
            slowest = ", ".join(
                f"{op.name} {format_seconds(op.self_seconds)}" for op in self.trace.ops[:5]
            )
            d["Slowest ops (one step, torch.profiler)"] = slowest or "none"
            if self.trace.path is not None:
                d["Chrome trace"] = f"{self.trace.path} (https://ui.perfetto.dev)"
        d["Timer"] = f"{self.timer_floor * 1e6:.2f} µs per synchronize + clock reading"
        d["Prices"] = self.comparison.prices_summary()
        if self.comparison.expected_source:
            d["Expected"] = self.comparison.expected_source
        for i, note in enumerate(self.notes, 1):
            d[f"Note {i}"] = note
        return d

    def summary_line(self) -> str:
        """The run in one line, as `%%time` prints one: the measured step, the cheapest TPU
        row per 1k steps (its figure's kind said), and what makes a TPU comparison misleading."""
        from ..views.format import format_money, format_seconds

        line = (
            f"step {format_seconds(self.median)} measured on {self.device_name} via "
            f"{self.backend} (p10–p90 {format_seconds(self.p10)}–{format_seconds(self.p90)}, "
            f"{self.stats.n} steps after {self.warmup} warm-up)"
        )
        catalogue = self.comparison.catalogue
        tpus = [
            r
            for r in self.comparison.rows
            if r.source != "measured"
            and r.cost_per_1k_steps is not None
            and catalogue is not None
            and (chip := catalogue.find(r.device_key)) is not None
            and chip.kind == "tpu"
        ]
        if tpus:
            best = min(tpus, key=lambda r: r.cost_per_1k_steps or 0.0)
            kind = best.time_kind or best.source
            if kind == "expected" and best.step_low is not None and best.step_high is not None:
                kind += f", {format_seconds(best.step_low)}–{format_seconds(best.step_high)}"
            line += (
                f"; cheapest TPU: {best.label} {format_seconds(best.step_seconds)} a step "
                f"({kind}), {format_money(best.cost_per_1k_steps)} per 1k steps"
            )
            if best.cost_per_1m_tokens is not None:
                line += f", {format_money(best.cost_per_1m_tokens)} per 1M tokens"
        warnings = []
        if self.host_syncs_per_step:
            warnings.append(f"{self.host_syncs_per_step} host syncs a step")
        if self.compilations_timed:
            warnings.append(f"{self.compilations_timed} recompiles in timed steps")
        if warnings:
            line += f"; {', '.join(warnings)}"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_key": self.device_key,
            "device_name": self.device_name,
            "backend": self.backend,
            "chips": self.chips,
            "steps": self.steps,
            "warmup": self.warmup,
            "group_size": self.group_size,
            "stats": self.stats.to_dict(),
            "warmup_times": self.warmup_times,
            "step_times": self.step_times,
            "compile_seconds": self.compile_seconds,
            "compile_seconds_measured": self.compile_seconds_measured,
            "compile_seconds_timed": self.compile_seconds_timed,
            "timed_wall_seconds": self.timed_wall_seconds,
            "timer_floor": self.timer_floor,
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "flops_per_step": self.flops_per_step,
            "bytes_per_step": self.bytes_per_step,
            "flops_source": self.flops_source,
            "achieved_flops": self.achieved_flops,
            "mfu": self.mfu,
            "peak_flops": self.peak_flops,
            "peak_bandwidth": self.peak_bandwidth,
            "peak_source": self.peak_source,
            "efficiency": self.efficiency,
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_kind": self.memory_kind,
            "compilations_warmup": self.compilations_warmup,
            "compilations_timed": self.compilations_timed,
            "host_syncs_per_step": self.host_syncs_per_step,
            "host_syncs_timed": self.host_syncs_timed,
            "sync_ops": [list(s) for s in self.sync_ops],
            "top_ops": [list(t) for t in self.top_ops],
            "step_count": self.step_count.to_dict() if self.step_count else None,
            "notes": self.notes,
            "created": self.created,
            "comparison": self.comparison.to_dict(),
            "trace": None if self.trace is None else self.trace.to_dict(),
        }

    def to_html(self) -> str:
        return self.comparison.to_html(series=self.series(), details=self.details())

    def widget(self) -> Any:
        """The notebook view: table, bars, step-time series, details."""
        from gpu2tpu.views.widgets import comparison_view

        return comparison_view(self.comparison, series=self.series(), details=self.details())

    def __repr__(self) -> str:
        lines = [f"ProfileResult: {self.device_name} x{self.chips} via {self.backend}"]
        lines += [f"  {k}: {v}" for k, v in self.details().items() if k != "Prices"]
        lines.append("")
        lines.append(repr(self.comparison))
        return "\n".join(lines)

    __str__ = __repr__

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        summary = Table(
            title=f"{self.device_name} x{self.chips} ({self.backend})", show_header=False
        )
        summary.add_column(style="bold")
        summary.add_column()
        for key, value in self.details().items():
            if key != "Prices":
                summary.add_row(key, value)
        return Group(summary, self.comparison.__rich__())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from ..views.display import mimebundle

        return mimebundle(repr(self), self.to_html, self.widget)


def _or_unknown(value: int | None) -> str:
    return "unknown" if value is None else str(value)


# -- building ---------------------------------------------------------------------------------


def parse_target(target: str | tuple[str, int]) -> tuple[str, int]:
    """ "v5e" -> ("v5e", 1); "v5e:8" or ("v5e", 8) -> ("v5e", 8)."""
    if isinstance(target, tuple):
        if len(target) != 2:
            raise ProfileError(f"a target is 'key', 'key:chips' or (key, chips), not {target!r}.")
        name, chips = target
    else:
        name, _, count = str(target).partition(":")
        chips = 1
        if count:
            if not count.strip().isdigit():
                raise ProfileError(
                    f"target {target!r}: the chip count after ':' must be a whole number."
                )
            chips = int(count)
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ProfileError(f"target {target!r}: the chip count must be at least 1.")
    return str(name).strip(), chips


def _unknown_chip(key: str, name: str, kind: str) -> Chip:
    """A chip the catalogue lacks (TPU v3, say): no peak, no price, still shown."""
    return Chip(
        key=key,
        name=name,
        vendor="unknown",
        kind=kind if kind in ("tpu", "gpu", "trainium", "cpu") else "gpu",
        peak_bf16_flops=0.0,
        hbm_bytes=0,
        hbm_bandwidth=0.0,
        price_on_demand=None,
        price_spot=None,
        sources={},
        as_of="",
        notes="not in the hardware catalogue",
    )


def _baseline_records(compare_to: Any) -> list[BaselineRecord]:
    if compare_to is None:
        return []
    items = compare_to if isinstance(compare_to, list | tuple) else [compare_to]
    records = []
    for item in items:
        if isinstance(item, BaselineRecord):
            records.append(item)
        elif isinstance(item, ProfileResult):
            records.append(item.to_baseline())
        elif isinstance(item, str | Path):
            records.append(load_baseline(item))
        else:
            raise ProfileError(
                f"compare_to takes a baseline file path or a ProfileResult, not {type(item).__name__}."
            )
    return records


def _peak(
    chip: Chip, chips: int, host: HostPeak | None
) -> tuple[float | None, float | None, str | None]:
    """The peak FLOP rate and bandwidth MFU and the estimates rest on, and where they came
    from: the catalogue's, or (a CPU has none) this host's measured rate."""
    if chip.has_peak:
        return (
            chip.peak_bf16_flops * chips,
            chip.hbm_bandwidth * chips,
            f"{chip.name} x{chips} catalogue peak ({chip.peak_bf16_flops / 1e12:g} TFLOP/s BF16 each)",
        )
    if host is not None:
        return (
            host.flops_per_s,
            host.bytes_per_s,
            f"this host's measured matmul rate ({host.flops_per_s / 1e9:.3g} GFLOP/s; {host.method})",
        )
    return None, None, None


@dataclass(frozen=True)
class RunContext:
    """What costing a run needs from outside it, read once at the edge (`gather_context`):
    the catalogue with the user's prices, the chip the backend names, the baselines from
    their files, this host's peak where the chip has no catalogue peak, and the time."""

    catalogue: HardwareCatalogue
    runtime_name: str
    chip: Chip
    chips: int
    baselines: list[BaselineRecord]
    host_peak: HostPeak | None
    created: str


def gather_context(record: RunRecord, costing: Costing) -> RunContext:
    """The I/O of costing a run: files, the backend, a host benchmark, the clock."""
    catalogue = costing.catalogue or HardwareCatalogue.load()
    if costing.prices is not None:
        catalogue = catalogue.with_overrides(costing.prices)
    backend = record.backend
    try:
        info = backend.chip()
        runtime_name, kind_key, count = info.name, info.kind, info.count
    except Exception:  # a runtime that cannot name its chip is still timed
        runtime_name, kind_key, count = backend.name, backend.name, 1
    chip = catalogue.find(kind_key) or catalogue.find(runtime_name)
    if chip is None:
        chip = _unknown_chip(
            kind_key, runtime_name, "tpu" if "tpu" in runtime_name.lower() else "gpu"
        )
    host = None
    if not chip.has_peak and chip.kind == "cpu":
        from .flops import measure_host_peak

        host = measure_host_peak()
    return RunContext(
        catalogue=catalogue,
        runtime_name=runtime_name,
        chip=chip,
        chips=costing.chips or max(1, int(count or 1)),
        baselines=_baseline_records(costing.compare_to),
        host_peak=host,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def build_result(record: RunRecord, costing: Costing) -> ProfileResult:
    """Cost a timed run and compare it with the baseline and target chips."""
    return cost_run(record, costing, gather_context(record, costing))


def cost_run(record: RunRecord, costing: Costing, context: RunContext) -> ProfileResult:
    """The decisions of costing a run, pure: the measured row, the baselines' rows, which
    chip the ratios are against, and the estimated rows for the targets."""
    from ..views.format import format_flops

    catalogue, chip, chips = context.catalogue, context.chip, context.chips
    runtime_name, backend = context.runtime_name, record.backend
    stats = summarize(record.step_times)
    notes = list(record.notes)
    if stats.spread > 0.25 and stats.n >= 5:
        notes.append(
            f"Step times vary by {stats.spread:.0%} between p10 and p90: something else is "
            "competing for the device or the host; time more steps or a quieter machine."
        )

    count_: StepCount | None = record.count
    flops = (
        costing.flops_per_step
        if costing.flops_per_step is not None
        else (count_.flops if count_ else None)
    )
    bytes_ = (
        costing.bytes_per_step
        if costing.bytes_per_step is not None
        else (count_.bytes_accessed if count_ else None)
    )
    flops_source = (
        "given" if costing.flops_per_step is not None else (count_.source if count_ else None)
    )
    if count_ is not None and count_.flops == 0 and costing.flops_per_step is None:
        notes.append(
            "FlopCounterMode saw no matmul, convolution or attention FLOPs in the step: MFU "
            "is not reported, and the TPU and GPU rows rest on the per-step floor alone "
            "(dispatching its ops, feeding its batch): bounds (>=), since no published run "
            "calibrates a figure from the bytes it moves."
        )

    peak, bandwidth, peak_source = _peak(chip, chips, context.host_peak)
    efficiency = None
    if peak and bandwidth and ((flops or 0) > 0 or (bytes_ or 0) > 0):
        efficiency = efficiency_from_run(stats.median, flops or 0.0, bytes_ or 0.0, peak, bandwidth)
        if efficiency >= 1.0:
            notes.append(
                "The step ran at or above its roofline on the peak figures used, so the "
                "efficiency was capped at 100%: the FLOP or byte count is probably too high."
            )

    device_memory = record.memory_peak_bytes if record.memory_kind == "device" else None
    workload = {
        "token_budget": costing.token_budget,
        "samples_per_step": costing.samples_per_step,
        "tokens_per_step": costing.tokens_per_step,
        "dataset_size": costing.dataset_size,
        "flops_per_step": flops,
        "bytes_per_step": bytes_,
        "efficiency": efficiency,
        "measured_device": chip.key,
    }
    common: dict[str, Any] = {
        "token_budget": costing.token_budget,
        "price": costing.price,
        "samples_per_step": costing.samples_per_step,
        "tokens_per_step": costing.tokens_per_step,
        "dataset_size": costing.dataset_size,
    }
    measured_mfu = flops / (stats.median * peak) if flops and peak else None
    rows = [
        ComparisonRow.build(
            chip,
            stats.median,
            "measured",
            chips=chips,
            flops_per_step=flops,
            memory_bytes=device_memory,
            step_p10=stats.p10,
            step_p90=stats.p90,
            mfu=measured_mfu,
            device_name=chip.name if chip.kind != "cpu" else f"CPU ({runtime_name})",
            note=f"timed here, {stats.n} steps via {backend.name}",
            **common,
        )
    ]
    present = {(chip.key, chips)}

    for base in context.baselines:
        base_chip = catalogue.find(base.device_key) or _unknown_chip(
            base.device_key, base.device_name, "gpu"
        )
        note = f"timed on {base.device_name} ({base.created or 'date unknown'})"
        if base.path:
            note += f", loaded from {base.path}"
        if (
            flops
            and base.flops_per_step
            and abs(base.flops_per_step - flops) > WORKLOAD_TOLERANCE * flops
        ):
            note += (
                f"; its step did {format_flops(base.flops_per_step)}, this one "
                f"{format_flops(flops)}: not the same workload"
            )
        rows.append(
            ComparisonRow.build(
                base_chip,
                base.stats.median,
                "baseline",
                chips=base.chips,
                flops_per_step=base.flops_per_step,
                memory_bytes=base.memory_peak_bytes if base.memory_kind == "device" else None,
                step_p10=base.stats.p10,
                step_p90=base.stats.p90,
                device_name=base_chip.name if base_chip.sources else base.device_name,
                note=note,
                **common,
            )
        )
        present.add((base_chip.key, base.chips))

    if costing.baseline is not None:
        baseline_key: str | None = catalogue.get(costing.baseline).key
    elif chip.kind == "gpu":
        baseline_key = chip.key
    elif len(rows) > 1:
        baseline_key = rows[1].device_key
    else:
        baseline_key = "h100" if "h100" in catalogue else None

    reference = _reference_utilisation(
        chip, chips, stats.median, flops, context.baselines, catalogue
    )
    attention = count_.attention_flops if count_ is not None and count_.flops else None
    wanted = [(catalogue.get(name), n) for name, n in map(parse_target, costing.targets)]
    shown = {r.device_key for r in rows} | {c.key for c, _ in wanted}
    if baseline_key is not None and baseline_key not in shown:
        wanted.append((catalogue.get(baseline_key), 1))
    sources: list[str] = []
    for target, n in wanted:
        if (target.key, n) in present:
            continue
        present.add((target.key, n))
        rows.append(
            _estimate(
                target,
                n,
                flops,
                bytes_,
                attention,
                reference,
                device_memory,
                common,
                _floor(target, n, count_),
                count_,
                sources,
            )  # fmt: skip
        )

    comparison = Comparison.from_rows(
        rows,
        baseline_key=baseline_key,
        catalogue=catalogue,
        price=costing.price,
        workload=workload,
        # The accuracy stated beside the expected rows is that of the fit that made them
        # (a CNN's is the op-by-op model's error on publishers it never saw, not the LLMs').
        expected_source="; ".join(sources) if sources else None,
    )
    return ProfileResult(
        device_key=chip.key,
        device_name=runtime_name if chip.kind == "cpu" else chip.name,
        backend=backend.name,
        chips=chips,
        steps=len(record.step_times) * record.group_size,
        warmup=len(record.warmup_times),
        warmup_times=record.warmup_times,
        step_times=record.step_times,
        group_size=record.group_size,
        stats=stats,
        timed_wall_seconds=record.timed_wall_seconds,
        timer_floor=record.timer_floor,
        samples_per_step=costing.samples_per_step,
        tokens_per_step=costing.tokens_per_step,
        flops_per_step=flops,
        bytes_per_step=bytes_,
        flops_source=flops_source,
        top_ops=list(count_.top_ops) if count_ else [],
        step_count=count_,
        peak_flops=peak,
        peak_bandwidth=bandwidth,
        peak_source=peak_source,
        efficiency=efficiency,
        memory_peak_bytes=record.memory_peak_bytes,
        memory_kind=record.memory_kind,
        compilations_warmup=record.compilations_warmup,
        compilations_timed=record.compilations_timed,
        host_syncs_per_step=count_.host_syncs if count_ else None,
        host_syncs_timed=record.host_syncs_timed,
        sync_ops=list(count_.sync_ops) if count_ else [],
        comparison=comparison,
        notes=notes,
        created=context.created,
        compile_seconds_warmup=record.compile_seconds_warmup,
        compile_seconds_timed=record.compile_seconds_timed,
    )


@dataclass(frozen=True)
class _Reference:
    """A measured utilisation to scale the expected rows from (section 4 of docs/profiler.md)."""

    chip: Chip
    utilisation: float
    what: str  # "this run on TPU v5e", "the baseline timed on H100"


def _reference_utilisation(
    chip: Chip,
    chips: int,
    median: float,
    flops: float | None,
    baselines: list[BaselineRecord],
    catalogue: HardwareCatalogue,
) -> _Reference | None:
    """The measured step to scale from: this run when it ran on an accelerator the fit
    knows, else a baseline of the same workload (FLOPs within 5%), else none (the fit alone)."""
    if not flops:
        return None
    if chip.has_peak and chip.kind in ("tpu", "gpu"):
        return _Reference(
            chip, flops / (median * chip.peak_bf16_flops * chips), f"this run on {chip.name}"
        )
    for base in baselines:
        base_chip = catalogue.find(base.device_key)
        if base_chip is None or not base_chip.has_peak or not base.flops_per_step:
            continue
        if abs(base.flops_per_step - flops) > WORKLOAD_TOLERANCE * flops:
            continue
        measured = base.flops_per_step / (
            base.stats.median * base_chip.peak_bf16_flops * base.chips
        )
        return _Reference(base_chip, measured, f"the baseline timed on {base_chip.name}")
    return None


def _floor(target: Chip, chips: int, count: StepCount | None) -> StepFloor | None:
    """The per-step floor of the counted step on `target`: its ops dispatched one by one by
    the framework a PyTorch user runs there (None without a count or for the host CPU)."""
    if count is None or target.kind not in ("tpu", "gpu") or not count.kernel_ops:
        return None
    framework = default_framework(target.kind)
    return step_floor(framework, target.key, ops=count.kernel_ops, chips=chips)


def _estimate(
    target: Chip,
    chips: int,
    flops: float | None,
    bytes_: float | None,
    attention: float | None,
    reference: _Reference | None,
    device_memory: int | None,
    common: Mapping[str, Any],
    floor: StepFloor | None = None,
    count: StepCount | None = None,
    sources: list[str] | None = None,
) -> ComparisonRow:
    """An expected row: the step's FLOPs split over `chips` of `target`, at the utilisation
    measured here scaled to the target (or, with no accelerator measurement, the fit's),
    never below the step's per-step floor (where the floor is longer, the row is that floor,
    labelled a bound)."""
    from ..views.format import format_seconds

    if not flops and target.has_peak and floor is not None and floor.seconds > 0:
        # No matrix FLOPs (an embedding lookup, a gather): no published run calibrates a
        # figure from bytes alone, so the row is what holds whatever the chip: the floor.
        return ComparisonRow.build(
            target,
            floor.seconds,
            "estimated",
            chips=chips,
            memory_bytes=device_memory,
            note=(
                f"bound only: at least {format_seconds(floor.seconds)}, the {floor.describe()}; "
                "the step does no matmul, convolution or attention FLOPs and no published run "
                "calibrates a figure from its bytes, so nothing more is expected"
            ),
            time_kind="bound",
            bound_seconds=floor.seconds,
            **common,
        )
    if not flops or not target.has_peak:
        why = (
            f"{target.name} has no peak figure in the catalogue"
            if not target.has_peak
            else "no estimate: the step's FLOPs were not counted"
        )
        return ComparisonRow.build(target, None, "estimated", chips=chips, note=why, **common)
    features = StepFeatures(
        chip=target.key,
        chips=chips,
        flops_per_chip=flops / chips,
        attention_flops_per_chip=None if attention is None else attention / chips,
        attention="full",
        bytes_per_chip=(bytes_ or 0.0) / chips,
        bytes_kind="unfused",  # the profiler's per-op bytes: never a floor
        **(
            count.fit_inputs(target.kind) | {"traffic": count.traffic(chips)}
            if count is not None
            else {}
        ),
    )
    utilisation = None
    if reference is not None:
        utilisation = scaled_utilisation(
            reference.utilisation, reference.chip, target, features.attention_share
        )
    expected = expected_step_by_op(features, target, utilisation=utilisation)
    # The profiler's bytes are per op, unfused: neither a floor nor a ceiling on a compiled
    # step's HBM traffic, so the bound is the compute term alone.
    bound = roofline_seconds(flops / chips, 0.0, target)
    compute_only = expected
    if expected is not None:
        expected = apply_floor(expected, floor)
    floored = floor is not None and expected is not None and expected.limited_by == floor.kind
    if expected is not None and expected.kind == "bound":
        if floored and floor is not None and compute_only is not None:
            note = (
                f"at least {format_seconds(expected.seconds)}, the {floor.describe()}; its "
                f"FLOPs alone would take {format_seconds(compute_only.seconds)}"
                + (
                    f" at {compute_only.utilisation:.0%} of peak"
                    if compute_only.kind == "expected"
                    else " (a bound)"
                )
            )
        else:
            note = "bound only: " + "; ".join(expected.notes)
        return ComparisonRow.build(
            target,
            max(bound, expected.seconds),
            "estimated",
            chips=chips,
            flops_per_step=flops,
            memory_bytes=device_memory,
            note=note,
            bound_seconds=bound,
            **common,
        )
    if expected is None:
        return ComparisonRow.build(
            target,
            bound,
            "estimated",
            chips=chips,
            flops_per_step=flops,
            memory_bytes=device_memory,
            note=f"roofline bound only: no published run on a {target.kind.upper()} to expect from",
            bound_seconds=bound,
            **common,
        )
    if utilisation is not None and reference is not None:
        note = (
            f"expected at {expected.utilisation:.0%} of peak: {reference.what} reached "
            f"{reference.utilisation:.0%}, scaled to {target.name} by the published runs' ratio"
        )
    elif expected.model_class in CLASSES:
        # no CNN, encoder or U-Net ran on most targets: its rate is the op-by-op model's
        note = (
            f"expected at {expected.utilisation:.0%} of peak: each op at the slower of its "
            f"compute and memory rate on {target.name}, as published {expected.model_class} "
            "runs reach them (no accelerator measurement of this step to scale from)"
        )
    else:
        note = (
            f"expected at {expected.utilisation:.0%} of peak, what published runs reach on "
            f"{target.name} (no accelerator measurement of this step to scale from)"
        )
    note += "".join(f"; {n}" for n in expected.notes)
    if floor is not None:
        note += f"; {floor.describe()}"
    elif expected.seconds < FIXED_COST_SECONDS:
        note += (
            f"; under {format_seconds(FIXED_COST_SECONDS)} a step's fixed launch and "
            "dispatch costs, which this leaves out, dominate: read it as a lower bound"
        )
    if chips > 1:
        note += f"; split over {chips} chips with no communication cost"
    if sources is not None and expected.source and expected.source not in sources:
        sources.append(expected.source)  # the fit that made it, and its measured error
    return ComparisonRow.build(
        target,
        expected.seconds,
        "estimated",
        chips=chips,
        flops_per_step=flops,
        memory_bytes=device_memory,
        note=note,
        time_kind="expected",
        step_low=expected.low,
        step_high=expected.high,
        bound_seconds=bound,
        framework=expected.framework,
        ceiling_seconds=expected.ceiling_seconds,
        **common,
    )
