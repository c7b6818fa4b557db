"""What a forecast found, and how it shows: `Forecast` (every target, the GPUs beside them)
and `TargetForecast` (one TPU topology). Plain records; forecast.py makes them.

The model and its views are apart, as in `measure/` (records.py, result.py): loading a
forecast (from the figure cache, in a notebook's next cell) needs neither JAX nor the code
that compiles, and every view is imported inside the method that draws it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..pricing.compare import ComparisonExports
from .fit_verdict import FitVerdict

if TYPE_CHECKING:
    from ..pricing.compare import Comparison

__all__ = ["Forecast", "TargetForecast"]


@dataclass
class TargetForecast:
    """One TPU target: did the step compile, does it fit, how fast and how dear would it be.

    `status` is "compiled" (fits at the given batch), "does not fit", "unsupported" (ops
    without a lowering, listed in `unsupported_ops`), "error" (`message` says why) or
    "interrupted" (Ctrl-C came first).
    FLOPs and bytes are for one step of the whole slice; memory is per chip, as libtpu
    placed it: arguments + outputs - donated buffers + temporaries. FLOPs and bytes are the
    compiler's cost analysis with while-loop bodies counted as often as they run
    (`compiler_flops` keeps its raw figure); `matmul_flops` and `attention_flops` (matrix
    products, and those traced from attention) come from the optimized HLO.
    `collective_bytes_per_chip` is what one chip sends over ICI per step (the HLO's
    all-gathers, reduce-scatters, all-reduces, permutes), `collective_seconds` that over the
    chip's ICI bandwidth (all links, one direction). `step_seconds` is the roofline bound on
    the catalogue's peaks (100% of peak), max(compute, HBM, ICI); `expected_seconds` the
    expected step time (`pricing/utilisation.py`: the utilisation published runs reach), with
    its range `expected_low`-`expected_high`; costs come from the expected time
    (`bound_cost_per_step` is the bound's). `compiler_seconds` is libtpu's own estimate, kept
    only when it is valid (it can be negative). `max_batch` is the largest batch found to
    fit, and
    `max_batch_exact` says whether the next size up was shown not to fit (False: a lower bound,
    the search ran out of time or compiles); `search_compiles` and `search_seconds` are what
    the search cost, `search_method` how it ended ("line": the affine prediction confirmed;
    "bisection": the fall-back). `extrapolation` is None for a full compile, else where the
    figures came from (the block stack, its depth and the depths compiled). `derived_from`
    names the slice whose whole compile gave the FLOPs and bytes when this slice's own
    program was only partitioned (`forecasting/slices.py`; memory and collectives are this
    slice's), else None. `phases` splits
    the target's wall time: describing the topology, tracing and lowering, compiling, search.
    """

    target: str
    name: str
    topology: str
    chips: int
    devices_per_chip: int
    status: str
    batch: int
    flops: float | None = None
    bytes_accessed: float | None = None
    transcendentals: float | None = None
    memory_per_chip: float | None = None
    memory_breakdown: dict[str, float] = field(default_factory=dict)
    hbm_per_chip: float | None = None
    available_per_chip: float | None = None
    fits: bool | None = None
    max_batch: int | None = None
    max_batch_exact: bool = False
    first_oom_batch: int | None = None
    step_seconds: float | None = None
    compute_seconds: float | None = None
    memory_seconds: float | None = None
    compiler_seconds: float | None = None
    cost_per_step: float | None = None
    cost_per_1m_tokens: float | None = None
    expected_seconds: float | None = None
    expected_low: float | None = None
    expected_high: float | None = None
    expected_utilisation: float | None = None
    expected_limited_by: str | None = None
    expected_notes: list[str] = field(default_factory=list)
    expected_framework: str | None = None
    expected_ceiling_seconds: float | None = None
    # What made the expected figure and how sure it is (the fit's own line: the LLM fit's,
    # or for a CNN, encoder or U-Net the op-by-op model's error on publishers it never saw).
    expected_source: str | None = None
    # The per-step floor or libtpu's estimate, where longer than the expected compute: the
    # row is then that bound (pricing/step_floor.py).
    floor_seconds: float | None = None
    bound_cost_per_step: float | None = None
    compile_seconds: float = 0.0
    search_seconds: float = 0.0
    cached: bool = False
    unsupported_ops: list[str] = field(default_factory=list)
    message: str = ""
    search: list[dict[str, Any]] = field(default_factory=list)
    search_compiles: int = 0
    search_method: str = ""
    sharding: str = "data"
    extrapolation: dict[str, Any] | None = None
    derived_from: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    compiler_flops: float | None = None
    matmul_flops: float | None = None
    attention_flops: float | None = None
    attention_kind: str | None = None
    collective_bytes_per_chip: float | None = None
    collective_async_bytes_per_chip: float | None = None
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    collective_seconds: float | None = None
    custom_calls: dict[str, float] = field(default_factory=dict)
    attention_fallbacks: list[str] = field(default_factory=list)
    remat_regions: int = 0
    checkpointed: TargetForecast | None = None
    # For a step that does not fit: what it is made of and what would fit (fit_verdict.py).
    fit: FitVerdict | None = None

    @property
    def label(self) -> str:
        return self.topology if self.chips > 1 else self.target

    @property
    def capacity_per_chip(self) -> float | None:
        """HBM a step may use per chip: libtpu's usable figure, else the catalogue's."""
        return self.available_per_chip or self.hbm_per_chip

    @property
    def extrapolated(self) -> bool:
        return self.extrapolation is not None

    @property
    def memory_fraction(self) -> float | None:
        """Memory per chip as a share of the usable HBM (above 1: does not fit)."""
        capacity = self.capacity_per_chip
        if self.memory_per_chip is None or not capacity:
            return None
        return self.memory_per_chip / capacity

    @property
    def bound(self) -> str | None:
        """ "compute", "memory" or "interconnect": which term sets the roofline bound."""
        if self.compute_seconds is None or self.memory_seconds is None:
            return None
        terms = {"compute": self.compute_seconds, "memory": self.memory_seconds}
        if self.collective_seconds is not None:
            terms["interconnect"] = self.collective_seconds
        return max(terms, key=lambda k: terms[k])

    @property
    def flops_per_chip(self) -> float | None:
        """FLOPs one chip executes in one step (the slice's FLOPs over its chips)."""
        return None if self.flops is None else self.flops / self.chips

    @property
    def bytes_per_chip(self) -> float | None:
        """HBM bytes one chip reads and writes in one step."""
        return None if self.bytes_accessed is None else self.bytes_accessed / self.chips

    @property
    def matmul_share(self) -> float | None:
        """Matrix-product FLOPs (dot, convolution, attention kernels) over all FLOPs."""
        if not self.matmul_flops or not self.flops:
            return None
        return min(1.0, self.matmul_flops / self.flops)

    def summary(self) -> str:
        """One line for progress output and notes."""
        from ..views.format import format_bytes, format_money, format_seconds

        if self.status == "unsupported":
            return f"does not compile: no TPU lowering for {', '.join(self.unsupported_ops)}"
        if self.status == "error":
            return f"error: {self.message}"
        if self.status == "interrupted":
            return "interrupted before it finished"
        memory = f"{format_bytes(self.memory_per_chip)} of {format_bytes(self.capacity_per_chip)} per chip"
        if self.status == "does not fit":
            text = f"does not fit at batch {self.batch}: needs {memory}"
            text += self.checkpointing_text()
            if self.fit is not None:
                text += self.fit.short(shown=("checkpoint every block",))
        elif self.expected_seconds is not None:
            text = (
                f"fits at batch {self.batch} ({memory}), expected "
                f"{format_seconds(self.expected_seconds)}/step ({format_seconds(self.expected_low)}"
                f"–{format_seconds(self.expected_high)}; roofline bound "
                f"{format_seconds(self.step_seconds)}, {self.bound}-bound)"
            )
        else:
            text = (
                f"fits at batch {self.batch} ({memory}), roofline bound "
                f"{format_seconds(self.step_seconds)}/step ({self.bound}-bound)"
            )
            if self.cost_per_step is not None:
                text += f", {format_money(self.cost_per_step)}/step"
        if self.max_batch is not None:
            text += f"; largest batch that fits: {self.max_batch}" + (
                "" if self.max_batch_exact else "+"
            )
        if self.extrapolation:
            k, k2 = self.extrapolation["compiled_depths"]
            text += f" (extrapolated from {k} and {k2} of {self.extrapolation['depth']} blocks)"
        if self.derived_from:
            text += f" (FLOPs and bytes from the whole compile on {self.derived_from})"
        return text

    def checkpointing_text(self) -> str:
        """What checkpointing every block would do for a step that does not fit."""
        from ..views.format import format_bytes, format_seconds

        variant = self.checkpointed
        if variant is None:
            return ""
        if variant.status == "compiled":
            expected = ""
            if variant.expected_seconds is not None:
                expected = (
                    f"expected {format_seconds(variant.expected_seconds)}/step "
                    f"({format_seconds(variant.expected_low)}–"
                    f"{format_seconds(variant.expected_high)}), "
                )
            text = (
                f"; with activation checkpointing per block it fits "
                f"({format_bytes(variant.memory_per_chip)} per chip, {expected}roofline bound "
                f"{format_seconds(variant.step_seconds)}/step)"
            )
        elif variant.status == "does not fit":
            text = (
                "; it does not fit with activation checkpointing per block either "
                f"({format_bytes(variant.memory_per_chip)} per chip)"
            )
        else:
            return f"; checkpointing every block could not be compiled ({variant.message})"
        if variant.max_batch is not None:
            text += f"; largest batch with checkpointing: {variant.max_batch}" + (
                "" if variant.max_batch_exact else "+"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bound"] = self.bound
        data["extrapolated"] = self.extrapolated
        data["memory_fraction"] = self.memory_fraction
        data["flops_per_chip"] = self.flops_per_chip
        data["bytes_per_chip"] = self.bytes_per_chip
        data["matmul_share"] = self.matmul_share
        if self.checkpointed is not None:
            data["checkpointed"] = self.checkpointed.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetForecast:
        """The inverse of `to_dict` (derived entries are dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        if isinstance(fields.get("checkpointed"), Mapping):
            fields["checkpointed"] = cls.from_dict(fields["checkpointed"])
        if isinstance(fields.get("fit"), Mapping):
            fields["fit"] = FitVerdict.from_dict(fields["fit"])
        return cls(**fields)


def interruption_note(targets: list[TargetForecast]) -> str:
    """What Ctrl-C cost: the targets it stopped, or none when it landed after the last one."""
    stopped = [t.label for t in targets if t.status == "interrupted"]
    if not stopped:
        return "Forecast interrupted (Ctrl-C) after every target had finished: nothing was lost."
    return (
        f"Forecast interrupted (Ctrl-C): {', '.join(stopped)} not forecast (marked 'interrupted')."
    )


@dataclass
class Forecast(ComparisonExports):
    """What the forecast found for each target, and the comparison table built from it.

    `comparison` is the profiler's `Comparison` (rows with source "compiled" for TPUs and
    "estimated" for GPUs), so it renders and exports the same way as a profile.
    `interrupted` is True when Ctrl-C stopped the forecast: the targets finished before it
    are complete, the others have status "interrupted". `phases` splits the wall time
    (preparing, starting the child and importing JAX, the targets).
    """

    model: str
    parameters: int
    trainable_parameters: int
    optimizer: str
    dtype: str
    batch: int
    tokens_per_step: float | None
    targets: list[TargetForecast]
    comparison: Comparison
    reference: str | None
    versions: dict[str, str]
    wall_seconds: float
    cache_dir: str | None
    notes: list[str] = field(default_factory=list)
    sharding: str = "data"
    interrupted: bool = False
    phases: dict[str, float] = field(default_factory=dict)

    def target(self, key: str) -> TargetForecast:
        """The result for a target key ("v5e") or topology ("v5e:2x2")."""
        for t in self.targets:
            if key in (t.target, t.topology):
                return t
        raise KeyError(
            f"no forecast for {key!r}; targets are {', '.join(t.label for t in self.targets)}."
        )

    def details(self) -> dict[str, str]:
        """Label -> text for the widget's details tab and the terminal summary."""
        from ..views.format import format_flops

        d = {
            "Model": f"{self.model}: {self.parameters:,} parameters ({self.trainable_parameters:,} trainable), {self.dtype}",
            "Optimizer": self.optimizer,
            "Batch": f"{self.batch}"
            + (f" ({self.tokens_per_step:,.0f} tokens)" if self.tokens_per_step else ""),
        }
        for t in self.targets:
            extra = ""
            if t.flops is not None:
                accessed = t.bytes_accessed / 1e9  # type: ignore[operator]  # set with flops
                extra = f" [{format_flops(t.flops)}, {accessed:.3g} GB accessed]"
            d[t.label] = t.summary() + extra
        d["Method"] = (
            "compiled with libtpu for each topology on this CPU; the roofline bound is "
            "max(FLOPs / peak, bytes / HBM bandwidth) on the catalogue's figures; the expected "
            "step time (and every cost) divides the FLOPs by the utilisation published runs reach"
        )
        if self.comparison.expected_source:
            d["Expected"] = self.comparison.expected_source
        extrapolated = next((t.extrapolation for t in self.targets if t.extrapolation), None)
        if extrapolated:
            k, k2 = extrapolated["compiled_depths"]
            d["Extrapolated"] = (
                f"compiled with {k} and {k2} of the {extrapolated['depth']} blocks in "
                f"`{extrapolated['stack']}`; FLOPs, bytes and memory extended linearly to the "
                "full depth (forecast(..., extrapolate=False) compiles the whole model)"
            )
        if self.sharding != "data":
            d["Sharding"] = "FSDP: weights, gradients and optimizer state sharded over the chips"
        d["Prices"] = self.comparison.prices_summary()
        for i, note in enumerate(self.notes, 1):
            d[f"Note {i}"] = note
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "optimizer": self.optimizer,
            "dtype": self.dtype,
            "batch": self.batch,
            "tokens_per_step": self.tokens_per_step,
            "targets": [t.to_dict() for t in self.targets],
            "reference": self.reference,
            "versions": self.versions,
            "wall_seconds": self.wall_seconds,
            "cache_dir": self.cache_dir,
            "notes": self.notes,
            "sharding": self.sharding,
            "interrupted": self.interrupted,
            "phases": self.phases,
            "comparison": self.comparison.to_dict(),
        }

    def summary_rows(self) -> list[dict[str, Any]]:
        """Per target, what a view shows: memory against usable HBM, the largest batch, the
        bound, the compile time, and whether the figures were extrapolated or searched."""
        return [
            {
                "label": t.label,
                "target": t.target,
                "name": t.name,
                "status": t.status,
                "fits": t.fits,
                "memory_per_chip": t.memory_per_chip,
                "usable_hbm_per_chip": t.capacity_per_chip,
                "memory_fraction": t.memory_fraction,
                "max_batch": t.max_batch,
                "max_batch_exact": t.max_batch_exact,
                "bound": t.bound,
                "step_seconds": t.step_seconds,
                "expected_seconds": t.expected_seconds,
                "expected_low": t.expected_low,
                "expected_high": t.expected_high,
                "compile_seconds": t.compile_seconds,
                "cached": t.cached,
                "extrapolated": t.extrapolated,
                "extrapolation": t.extrapolation,
                "search_compiles": t.search_compiles,
                "search_seconds": t.search_seconds,
                "sharding": t.sharding,
            }
            for t in self.targets
        ]

    def to_html(self) -> str:
        from gpu2tpu.views.widgets import forecast_html

        return forecast_html(self)

    def widget(self) -> Any:
        """The notebook view: per target memory, fit, largest batch, bound, compile time; costs."""
        from gpu2tpu.views.widgets import forecast_view

        return forecast_view(self)

    def table_cells(self) -> tuple[list[str], list[list[str]]]:
        """Per-target figures as text: headers and one row per target."""
        from ..views.format import format_bytes, format_flops, format_money, format_seconds

        headers = [
            "Target", "Status", "FLOPs/step", "Memory/chip", "Usable HBM", "Fits",
            "Max batch", "Expected step (range)", "Roofline bound", "Bound", "Compiler est.",
            "$/step", "$/1M tokens", "Compile",
        ]  # fmt: skip
        rows = []
        for t in self.targets:
            max_batch = (
                "—" if t.max_batch is None else f"{t.max_batch}{'' if t.max_batch_exact else '+'}"
            )
            compile_text = "cached" if t.cached else f"{t.compile_seconds:.1f} s"
            if t.extrapolated and not t.cached:
                compile_text += " (extrapolated)"
            rows.append(
                [
                    t.label,
                    t.status,
                    format_flops(t.flops),
                    format_bytes(t.memory_per_chip),
                    format_bytes(t.capacity_per_chip),
                    "—" if t.fits is None else ("yes" if t.fits else "no"),
                    max_batch,
                    _expected_text(t),
                    format_seconds(t.step_seconds),
                    t.bound or "—",
                    format_seconds(t.compiler_seconds),
                    format_money(t.cost_per_step),
                    format_money(t.cost_per_1m_tokens),
                    compile_text,
                ]
            )
        return headers, rows

    def __repr__(self) -> str:
        from ..views.table import padded_lines

        lines = [f"Forecast: {self.model}, batch {self.batch}, {self.optimizer}"]
        lines += padded_lines(*self.table_cells())
        problems = [
            f"  {t.label}: {t.summary()}"
            for t in self.targets
            if t.status in ("unsupported", "error")
        ]
        lines += problems
        if self.interrupted:
            lines.append(f"  {interruption_note(self.targets)}")
        for t in self.targets:
            if t.fit is not None:
                lines.append(f"  {t.label} does not fit at batch {t.batch}:")
                lines += [f"    {line}" for line in t.fit.lines()]
        lines.append("")
        lines.append(repr(self.comparison))
        return "\n".join(lines)

    __str__ = __repr__

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.markup import escape
        from rich.table import Table

        headers, body = self.table_cells()
        table = Table(title=f"Forecast: {self.model}, batch {self.batch}, {self.optimizer}")
        for h in headers:
            table.add_column(h, justify="left" if h in ("Target", "Status", "Bound") else "right")
        styles = {
            "compiled": "green",
            "does not fit": "yellow",
            "unsupported": "red",
            "error": "red",
            "interrupted": "dim",
        }
        for t, cells in zip(self.targets, body, strict=True):
            table.add_row(*cells, style=styles.get(t.status))
        parts: list[Any] = [table]
        for t in self.targets:
            if t.status in ("unsupported", "error"):
                parts.append(f"[red]{t.label}[/red]: {t.summary()}")
            if t.fit is not None:
                lines = "\n".join(f"  {escape(line)}" for line in t.fit.lines())
                parts.append(
                    f"[yellow]{t.label}[/yellow] does not fit at batch {t.batch}:\n{lines}"
                )
        if self.interrupted:
            parts.append(escape(interruption_note(self.targets)))
        parts.append(self.comparison.__rich__())
        return Group(*parts)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from ..views.display import mimebundle

        return mimebundle(repr(self), self.to_html, self.widget)


def _expected_text(t: TargetForecast) -> str:
    from ..views.format import format_seconds

    if t.expected_seconds is None:
        return "—"
    return (
        f"{format_seconds(t.expected_seconds)} ({format_seconds(t.expected_low)}–"
        f"{format_seconds(t.expected_high)})"
    )
