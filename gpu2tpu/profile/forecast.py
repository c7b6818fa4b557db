"""Forecast a PyTorch training step on TPUs, on a machine that has none.

```
from gpu2tpu.profile.forecast import forecast
result = forecast(model, (inputs, targets), loss_fn=F.cross_entropy, optimizer=opt)
result            # a widget in a notebook, a table in a terminal
result.to_json()
```
The whole step (forward, loss, gradients, optimizer update) is compiled by libtpu's own
compiler for each target topology (`aot.py`), and the compiled program's FLOPs, bytes and
memory become a fit verdict, the largest batch that fits, a roofline step time and a cost,
beside GPUs costed from the same FLOPs and bytes. Needs the `forecast` extra; without it the
call raises `ForecastUnavailable` with the command that installs it, and nothing else in
gpu2tpu is affected (this module imports no JAX at import time).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .aot import (
    CompileOutcome,
    FigureCache,
    ForecastError,
    ForecastUnavailable,
    Topology,
    TrainingStep,
    compile_lowered,
    default_cache_dir,
    devices_per_chip,
    forecast_versions,
    split_batch,
    topology_devices,
    topology_for,
    usable_hbm,
)
from .compare import ComparisonExports
from .isolate import can_fork, run_in_child
from .optimizers import UnsupportedOptimizer, plan_optimizer, to_optax

if TYPE_CHECKING:
    import torch

    from .catalogue import Chip, HardwareCatalogue
    from .compare import Comparison

__all__ = [
    "DEFAULT_FORECAST_GPUS",
    "DEFAULT_FORECAST_TARGETS",
    "Forecast",
    "ForecastError",
    "ForecastUnavailable",
    "TargetForecast",
    "UnsupportedOptimizer",
    "default_loss",
    "forecast",
    "forecast_cell",
]

DEFAULT_FORECAST_TARGETS = ("v5e", "v6e", "v5p", "tpu7x")
DEFAULT_FORECAST_GPUS = ("a100-80gb", "h100")
# The batch search stops after this many extra compiles even with time left...
MAX_SEARCH_COMPILES = 8
# ...and never tries more than this many times the given batch (a lower bound is enough there).
MAX_BATCH_FACTOR = 256
# Without a compiler figure for usable HBM, predict the largest batch against this share of it.
_HBM_USABLE = 0.98


def default_loss(output: Any, targets: Any) -> Any:
    """Cross-entropy for integer targets (class ids or token ids), mean squared error otherwise.

    Logits of shape (..., classes) are flattened against targets of shape (...), so a
    language model's (batch, sequence, vocab) output works as it is.
    """
    import torch
    import torch.nn.functional as F

    if isinstance(output, tuple | list):
        output = output[0]
    if not isinstance(output, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ForecastError(
            "the default loss needs the model to return a tensor and targets to be a tensor; "
            "pass loss_fn=... for other shapes."
        )
    if targets.dtype.is_floating_point:
        return F.mse_loss(output, targets)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


# -- results ------------------------------------------------------------------------------------


@dataclass
class TargetForecast:
    """One TPU target: did the step compile, does it fit, how fast and how dear would it be.

    `status` is "compiled" (fits at the given batch), "does not fit", "unsupported" (ops
    without a lowering, listed in `unsupported_ops`) or "error" (`message` says why).
    FLOPs and bytes are for one step of the whole slice; memory is per chip, as libtpu
    placed it: arguments + outputs - donated buffers + temporaries. `step_seconds` is the
    roofline on the catalogue's peaks; `compiler_seconds` is libtpu's own estimate, kept only
    when it is valid (it can be negative). `max_batch` is the largest batch found to fit, and
    `max_batch_exact` says whether the next size up was shown not to fit (False: a lower bound,
    the search ran out of time or compiles).
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
    compile_seconds: float = 0.0
    search_seconds: float = 0.0
    cached: bool = False
    unsupported_ops: list[str] = field(default_factory=list)
    message: str = ""
    search: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.topology if self.chips > 1 else self.target

    @property
    def capacity_per_chip(self) -> float | None:
        """HBM a step may use per chip: libtpu's usable figure, else the catalogue's."""
        return self.available_per_chip or self.hbm_per_chip

    @property
    def bound(self) -> str | None:
        """ "compute" or "memory": which roofline term sets the step time."""
        if self.compute_seconds is None or self.memory_seconds is None:
            return None
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    def summary(self) -> str:
        """One line for progress output and notes."""
        from .compare import format_bytes, format_money, format_seconds

        if self.status == "unsupported":
            return f"does not compile: no TPU lowering for {', '.join(self.unsupported_ops)}"
        if self.status == "error":
            return f"error: {self.message}"
        memory = f"{format_bytes(self.memory_per_chip)} of {format_bytes(self.capacity_per_chip)} per chip"
        if self.status == "does not fit":
            text = f"does not fit at batch {self.batch}: needs {memory}"
        else:
            text = (
                f"fits at batch {self.batch} ({memory}), {format_seconds(self.step_seconds)}/step"
                f" ({self.bound}-bound)"
            )
            if self.cost_per_step is not None:
                text += f", {format_money(self.cost_per_step)}/step"
        if self.max_batch is not None:
            text += f"; largest batch that fits: {self.max_batch}" + (
                "" if self.max_batch_exact else "+"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bound"] = self.bound
        return data


@dataclass
class Forecast(ComparisonExports):
    """What the forecast found for each target, and the comparison table built from it.

    `comparison` is the profiler's `Comparison` (rows with source "compiled" for TPUs and
    "estimated" for GPUs), so it renders and exports the same way as a profile.
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
        from .compare import format_flops

        d = {
            "Model": f"{self.model}: {self.parameters:,} parameters ({self.trainable_parameters:,} trainable), {self.dtype}",
            "Optimizer": self.optimizer,
            "Batch": f"{self.batch}"
            + (f" ({self.tokens_per_step:,.0f} tokens)" if self.tokens_per_step else ""),
        }
        for t in self.targets:
            extra = ""
            if t.flops is not None:
                extra = f" [{format_flops(t.flops)}, {t.bytes_accessed / 1e9:.3g} GB accessed]"
            d[t.label] = t.summary() + extra
        d["Method"] = (
            "compiled with libtpu for each topology on this CPU; step time is the roofline "
            "max(FLOPs / peak, bytes / HBM bandwidth) on the catalogue's figures"
        )
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
            "comparison": self.comparison.to_dict(),
        }

    def to_html(self) -> str:
        return self.comparison.to_html(details=self.details())

    def widget(self) -> Any:
        """The notebook view: the profiler's comparison view with the forecast's details."""
        from gpu2tpu.widgets import comparison_view

        return comparison_view(self.comparison, details=self.details())

    def table_cells(self) -> tuple[list[str], list[list[str]]]:
        """Per-target figures as text: headers and one row per target."""
        from .compare import format_bytes, format_flops, format_money, format_seconds

        headers = [
            "Target", "Status", "FLOPs/step", "Memory/chip", "Usable HBM", "Fits",
            "Max batch", "Step (roofline)", "Bound", "Compiler est.", "$/step", "$/1M tokens",
            "Compile",
        ]  # fmt: skip
        rows = []
        for t in self.targets:
            max_batch = (
                "—" if t.max_batch is None else f"{t.max_batch}{'' if t.max_batch_exact else '+'}"
            )
            compile_text = "cached" if t.cached else f"{t.compile_seconds:.1f} s"
            rows.append(
                [
                    t.label,
                    t.status,
                    format_flops(t.flops),
                    format_bytes(t.memory_per_chip),
                    format_bytes(t.capacity_per_chip),
                    "—" if t.fits is None else ("yes" if t.fits else "no"),
                    max_batch,
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
        headers, body = self.table_cells()
        widths = [
            max(len(h), *(len(r[i]) for r in body)) if body else len(h)
            for i, h in enumerate(headers)
        ]
        lines = [f"Forecast: {self.model}, batch {self.batch}, {self.optimizer}"]
        lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
        problems = [
            f"  {t.label}: {t.summary()}"
            for t in self.targets
            if t.status in ("unsupported", "error")
        ]
        lines += problems
        lines.append("")
        lines.append(repr(self.comparison))
        return "\n".join(lines)

    __str__ = __repr__

    def __rich__(self) -> Any:
        from rich.console import Group
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
        }
        for t, cells in zip(self.targets, body, strict=True):
            table.add_row(*cells, style=styles.get(t.status))
        parts: list[Any] = [table]
        for t in self.targets:
            if t.status in ("unsupported", "error"):
                parts.append(f"[red]{t.label}[/red]: {t.summary()}")
        parts.append(self.comparison.__rich__())
        return Group(*parts)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from .compare import mimebundle

        return mimebundle(self, repr(self), self.to_html, self.widget)


# -- progress -----------------------------------------------------------------------------------


class _Progress:
    """Per-target progress: a live rich display in a terminal, one plain line per target otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live = enabled and _is_terminal()
        self._rich: Any = None
        self._tasks: dict[str, Any] = {}

    @contextmanager
    def running(self) -> Iterator[_Progress]:
        if not self.live:
            yield self
            return
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._rich = Progress(
            SpinnerColumn(finished_text="[green]✓[/green]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        with self._rich:
            yield self

    def update(self, label: str, text: str) -> None:
        if self._rich is None:
            return
        from rich.markup import escape

        text = f"[bold]{escape(label)}[/bold] {escape(text)}"
        task = self._tasks.get(label)
        if task is None:
            self._tasks[label] = self._rich.add_task(text, total=1)
        else:
            self._rich.update(task, description=text)

    def done(self, result: TargetForecast, seconds: float) -> None:
        if not self.enabled:
            return
        text = result.summary() + (" (cached)" if result.cached else "")
        if self._rich is not None:
            self.update(result.label, text)
            self._rich.update(self._tasks[result.label], completed=1)
        else:
            print(f"forecast {result.label}: {text} [{seconds:.1f} s]", file=sys.stderr, flush=True)


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# -- the search for the largest batch -------------------------------------------------------


@dataclass
class _Search:
    """Compiles at several batch sizes to find the largest that fits in HBM.

    A safeguarded secant search on memory against batch size: predict where memory meets
    the capacity from the points compiled so far, and bisect (or double, with no upper
    bound yet) whenever two predictions in a row land on the same side, or once a batch
    the line said would not fit does fit: near the capacity XLA rematerialises activations
    to fit, memory stops growing with the batch, and the secant would only creep. Batch
    sizes are multiples of `granularity` (the devices the batch is split over); the search
    stops when the bracket is one granularity wide, or within `rel_tol` of the largest
    fitting batch, or at `ceiling`, or out of compiles or time.
    """

    compile_at: Callable[[int], CompileOutcome]
    granularity: int
    capacity: float  # usable HBM per device, bytes
    deadline: float
    max_compiles: int = MAX_SEARCH_COMPILES
    ceiling: int | None = None
    rel_tol: float = 1 / 64
    points: dict[int, CompileOutcome] = field(default_factory=dict)
    _sides: list[bool] = field(default_factory=list)  # fits? for each search compile
    _creeping: bool = False  # a batch the line said would not fit did fit
    _pinned: bool = False  # the line said the last candidate would not fit

    def run(self, first: CompileOutcome) -> tuple[int | None, int | None]:
        """(largest batch that fits, smallest that does not), either None when not found."""
        self.points[first.batch] = first
        compiles = 0
        while compiles < self.max_compiles and time.perf_counter() < self.deadline:
            candidate = self._next()
            if candidate is None:
                break
            outcome = self.compile_at(candidate)
            compiles += 1
            self.points[candidate] = outcome
            if outcome.status == "error":
                break
            self._sides.append(outcome.status == "compiled")
            self._creeping |= self._pinned and outcome.status == "compiled"
            if outcome.status == "oom" and outcome.available_bytes:
                self.capacity = outcome.available_bytes
        return self.bounds()

    def bounds(self) -> tuple[int | None, int | None]:
        fitting = [b for b, o in self.points.items() if o.status == "compiled"]
        failing = [b for b, o in self.points.items() if o.status == "oom"]
        return (max(fitting) if fitting else None), (min(failing) if failing else None)

    def _round(self, batch: float) -> int:
        g = self.granularity
        return max(g, int(batch // g) * g)

    def _predict(self, lo: int | None, hi: int | None) -> float | None:
        """The batch at which memory reaches capacity, on a line through compiled points."""
        memory = {b: o.memory_bytes for b, o in self.points.items() if o.memory_bytes}
        if lo in memory and hi in memory:
            line = [(lo, memory[lo]), (hi, memory[hi])]  # regula falsi inside the bracket
        else:
            line = sorted(memory.items())[-2:]
        if len(line) == 2:
            (b1, m1), (b2, m2) = line
            slope = (m2 - m1) / (b2 - b1)
            return None if slope <= 0 else b2 + (self.capacity - m2) / slope
        if not line:
            return None
        batch, _ = line[0]
        outcome = self.points[batch]
        if outcome.status != "compiled" or not outcome.temp_bytes:
            return None
        # One point: the state (arguments, outputs) stays, the temporaries grow with the batch.
        fixed = outcome.memory_bytes - outcome.temp_bytes  # type: ignore[operator]
        return batch * (self.capacity - fixed) / outcome.temp_bytes

    def _next(self) -> int | None:
        lo, hi = self.bounds()
        g = self.granularity
        if lo is None:  # nothing fits yet: at least halve, towards the smallest batch
            assert hi is not None
            guess = self._predict(lo, hi)
            candidate = self._round(min(hi / 2, guess) if guess and guess > 0 else hi / 2)
            return candidate if candidate < hi and candidate not in self.points else None
        if hi is not None and hi - lo <= max(g, self._round(lo * self.rel_tol)):
            return None
        guess = self._predict(lo, hi)
        stalled = len(self._sides) >= 2 and self._sides[-1] == self._sides[-2]
        if hi is not None and (guess is None or stalled or self._creeping):
            guess = (lo + hi) / 2
        elif guess is None or self._creeping:
            guess = lo * 2
        if hi is None and self.ceiling is not None:
            if lo >= self.ceiling:
                return None
            upper = min(lo * 64, self._round(self.ceiling))
        else:
            upper = hi - g if hi is not None else lo * 64
        candidate = self._round(min(max(guess, lo + g), upper))
        if candidate <= lo or candidate in self.points:
            return None
        self._pinned = guess < lo + g  # the line says even one step up would not fit
        return candidate


# -- the forecast ----------------------------------------------------------------------------


def _torch_dtype(dtype: Any) -> torch.dtype | None:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
             "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}  # fmt: skip
    if isinstance(dtype, str) and dtype.lower() in names:
        return names[dtype.lower()]
    raise ValueError(f"dtype must be a torch dtype or one of {', '.join(names)}, not {dtype!r}.")


def _split_targets(
    targets: str | Sequence[str], chips: int, catalogue: HardwareCatalogue
) -> tuple[list[tuple[Topology, Chip]], list[Chip]]:
    """TPU targets become topologies; GPU names in `targets` become roofline rows."""
    from .aot import family_key

    if isinstance(targets, str):
        targets = [t for t in targets.replace(" ", ",").split(",") if t]
    tpus: list[tuple[Topology, Chip]] = []
    gpus: list[Chip] = []
    for target in targets:
        chip = catalogue.find(target.split(":", 1)[0])
        if chip is not None and chip.kind != "tpu":
            gpus.append(chip)
            continue
        topology = topology_for(target, chips)
        tpus.append((topology, catalogue.get(chip.key if chip else family_key(target))))
    if not tpus:
        raise ValueError("targets must name at least one TPU generation, such as 'v5e'.")
    return tpus, gpus


def forecast(
    model: torch.nn.Module,
    example_batch: Any,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    optimizer: Any = "adamw",
    targets: str | Sequence[str] = DEFAULT_FORECAST_TARGETS,
    chips: int = 1,
    dtype: Any = None,
    tokens_per_step: float | None = None,
    batch_search: bool = True,
    time_budget_s: float = 90.0,
    *,
    isolate: bool = True,
    **options: Any,
) -> Forecast:
    """Compile the training step for each TPU target here, on the CPU, and cost it.

    The compiling happens in a forked child process (`isolate=True`, where the platform can
    fork): it needs torchax, and importing torchax makes "jax" torch's accelerator for the
    rest of the process, which would move the user's device-agnostic code onto torchax. The
    user's session stays as it was; the result comes back. `isolate=False` compiles here.
    Keyword `options`: `gpus`, `price`, `catalogue`, `cache`, `progress` (see below).

    `example_batch` is `(inputs, targets)`: the model is called as `model(inputs)` (a tuple
    is unpacked into positional arguments, a dict into keyword arguments) and the loss as
    `loss_fn(output, targets)` (default: `default_loss`). Only shapes and dtypes are used,
    so tensors may live on the meta device, like the model's weights.

    `optimizer` is the torch optimizer instance, its class, or a name ("sgd", "adam",
    "adamw", "rmsprop"); it is mapped to the matching optax update. `targets` are TPU
    generations ("v5e", "v6e", "v5p", "tpu7x", "v4") or explicit slices ("v5e:2x4"), and may
    name GPUs too; `chips` is the number of chips per TPU target (a power of two): the batch
    is split across them (data parallel) and figures are per step of the whole slice.
    `dtype` (e.g. torch.bfloat16) casts floating weights and inputs; None keeps the model's.
    `tokens_per_step` defaults to the number of token ids in the batch when the first input
    is an integer tensor. `batch_search` compiles further batch sizes, for at most
    `time_budget_s` seconds per target, to find the largest batch that fits. GPU rows in
    `gpus` are rooflines on the FLOPs and bytes of the first compiled target (one with one
    device per chip first), for as many GPUs as that slice has chips. Compile figures are
    cached on disk (`cache`: True for the user cache directory, a path, or False), so the
    same forecast again returns in seconds.
    """
    forecast_versions(import_torchax=False)  # a missing extra: one sentence, from here
    arguments = (model, example_batch, loss_fn, optimizer, targets, chips, dtype,
                 tokens_per_step, batch_search, time_budget_s)  # fmt: skip
    if isolate and can_fork() and "torchax" not in sys.modules:
        if not _jax_started():
            return run_in_child(_forecast_here, *arguments, **options)
        # A fork after JAX started its thread pools deadlocks in the child.
        warnings.warn(
            "gpu2tpu.forecast: JAX is already running in this process, so the forecast compiles "
            "here; torchax then makes 'jax' torch's accelerator for the rest of this session "
            "(restart the kernel before training on another device).",
            stacklevel=2,
        )
    return _forecast_here(*arguments, **options)


def _jax_started() -> bool:
    """Whether JAX has started its backends (and their threads) in this process."""
    if "jax" not in sys.modules:
        return False
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    return True if backends is None else bool(backends)


def _forecast_here(
    model: torch.nn.Module,
    example_batch: Any,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    optimizer: Any = "adamw",
    targets: str | Sequence[str] = DEFAULT_FORECAST_TARGETS,
    chips: int = 1,
    dtype: Any = None,
    tokens_per_step: float | None = None,
    batch_search: bool = True,
    time_budget_s: float = 90.0,
    *,
    gpus: Sequence[str] = DEFAULT_FORECAST_GPUS,
    price: str = "on_demand",
    catalogue: HardwareCatalogue | None = None,
    cache: bool | str | Path = True,
    progress: bool = True,
) -> Forecast:
    """The compiling and costing of `forecast`, in this process."""
    started = time.perf_counter()
    versions = forecast_versions()
    import torch

    from .catalogue import HardwareCatalogue
    from .compare import Comparison

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}.")
    catalogue = catalogue or HardwareCatalogue.load()
    torch_dtype = _torch_dtype(dtype)
    tpu_targets, gpu_targets = _split_targets(targets, chips, catalogue)
    gpu_targets += [catalogue.get(g) for g in gpus if catalogue.get(g) not in gpu_targets]

    named = list(model.named_parameters())
    plan = plan_optimizer(optimizer, named)
    tx = to_optax(plan)
    layout = split_batch(example_batch)
    step = TrainingStep(model, loss_fn or default_loss, plan, layout, torch_dtype)
    if tokens_per_step is None and layout.per_sample_tokens:
        tokens_per_step = layout.per_sample_tokens * layout.batch_size
    cache_dir = None if cache is False else (default_cache_dir() if cache is True else Path(cache))
    figure_cache = FigureCache(cache_dir, versions)

    results: list[TargetForecast] = []
    reporter = _Progress(progress)
    failure: TargetForecast | None = None  # trace failures are the same on every target
    with reporter.running():
        for topology, chip in tpu_targets:
            t0 = time.perf_counter()
            if failure is not None:
                result = _copy_failure(failure, topology, chip)
            else:
                result, traced = _forecast_target(
                    step, tx, topology, chip, layout.batch_size, tokens_per_step,
                    batch_search, time_budget_s, figure_cache, price, reporter,
                )  # fmt: skip
                if not traced:
                    failure = result
            results.append(result)
            reporter.done(result, time.perf_counter() - t0)

    parameters = sum(p.numel() for _, p in named)
    trainable = sum(p.numel() for n, p in named if n in plan.labels)
    reference = _reference(results)
    rows = [
        _tpu_row(r, chip, layout.batch_size, tokens_per_step, price)
        for r, (_, chip) in zip(results, tpu_targets, strict=True)
    ]
    notes: list[str] = []
    if reference is not None:
        for gpu in gpu_targets:
            rows.append(_gpu_row(reference, gpu, layout.batch_size, tokens_per_step, price))
        notes.append(
            f"GPU rows are rooflines on the FLOPs and bytes libtpu compiled for {reference.label} "
            "(XLA's TPU fusion), so TPUs and GPUs compare on one basis; they are not CUDA measurements."
        )
    if tokens_per_step is None:
        notes.append(
            "No tokens per step (the first input is not token ids): pass tokens_per_step for $/1M tokens."
        )
    comparison = Comparison.from_rows(
        rows,
        catalogue=catalogue,
        price=price,
        workload={"samples_per_step": layout.batch_size, "tokens_per_step": tokens_per_step},
        title=f"gpu2tpu forecast: {type(model).__name__}, batch {layout.batch_size}",
    )
    return Forecast(
        model=type(model).__name__,
        parameters=parameters,
        trainable_parameters=trainable,
        optimizer=plan.describe(),
        dtype=str(torch_dtype or _model_dtype(model)).replace("torch.", ""),
        batch=layout.batch_size,
        tokens_per_step=tokens_per_step,
        targets=results,
        comparison=comparison,
        reference=reference.label if reference else None,
        versions=versions,
        wall_seconds=time.perf_counter() - started,
        cache_dir=str(cache_dir) if cache_dir else None,
        notes=notes,
    )


def _model_dtype(model: torch.nn.Module) -> Any:
    dtypes = {p.dtype for p in model.parameters()}
    return next(iter(dtypes)) if len(dtypes) == 1 else "mixed dtypes"


def _forecast_target(
    step: TrainingStep,
    tx: Any,
    topology: Topology,
    chip: Chip,
    batch: int,
    tokens_per_step: float | None,
    batch_search: bool,
    time_budget_s: float,
    cache: FigureCache,
    price: str,
    reporter: _Progress,
) -> tuple[TargetForecast, bool]:
    """One target's forecast, and whether the step traced (a failed trace fails every target)."""
    label = topology.name if topology.chips > 1 else topology.target
    reporter.update(label, "describing the topology…")
    devices = topology_devices(topology)
    per_chip = devices_per_chip(devices)
    usable = usable_hbm(topology)
    result = TargetForecast(
        target=topology.target,
        name=chip.name,
        topology=topology.name,
        chips=topology.chips,
        devices_per_chip=per_chip,
        status="error",
        batch=batch,
        hbm_per_chip=float(chip.hbm_bytes),
        available_per_chip=_scale(usable, per_chip),
    )
    if batch % len(devices):
        result.message = (
            f"batch {batch} does not split evenly over the {len(devices)} TensorCores of "
            f"{topology.name}; use a multiple of {len(devices)}."
        )
        return result, True

    def compile_at(size: int) -> CompileOutcome:
        reporter.update(label, f"compiling the step at batch {size}…")
        t0 = time.perf_counter()
        lowered = step.lower(tx, devices, size)
        if step.missing_ops:
            raise _Unsupported()
        outcome = compile_lowered(lowered, topology, size, cache)
        outcome.compile_seconds = time.perf_counter() - t0  # tracing and lowering included
        return outcome

    try:
        first = compile_at(batch)
    except Exception as exc:
        result.status = "unsupported" if step.missing_ops else "error"
        result.unsupported_ops = list(step.missing_ops)
        if not isinstance(exc, _Unsupported):
            result.message = f"tracing the step failed: {type(exc).__name__}: {exc}"
        return result, False
    result.compile_seconds = first.compile_seconds
    result.cached = first.cached
    search = _Search(
        lambda size: _safe(compile_at, size),
        granularity=len(devices),
        capacity=(first.available_bytes or usable or chip.hbm_bytes / per_chip * _HBM_USABLE),
        deadline=time.perf_counter() + time_budget_s,
        ceiling=batch * MAX_BATCH_FACTOR,
    )
    if first.status == "error":
        result.message = first.message
        return result, True
    if batch_search:
        t0 = time.perf_counter()
        reporter.update(label, "searching for the largest batch that fits…")
        lo, hi = search.run(first)
        result.search_seconds = time.perf_counter() - t0
        result.max_batch = (
            lo if lo is not None else (0 if hi is not None and hi <= len(devices) else None)
        )
        result.max_batch_exact = hi is not None and (lo or 0) + len(devices) >= hi
        result.first_oom_batch = hi
        result.cached = result.cached and all(o.cached for o in search.points.values())
        result.search = [
            {
                "batch": b,
                "status": o.status,
                "memory_per_chip": _scale(o.memory_bytes, per_chip),
                "cached": o.cached,
            }
            for b, o in sorted(search.points.items())
        ]
    _fill(result, first, chip, per_chip, len(devices), tokens_per_step, price)
    return result, True


class _Unsupported(Exception):
    """The trace recorded ops without a lowering: there is nothing valid to compile."""


def _safe(compile_at: Callable[[int], CompileOutcome], size: int) -> CompileOutcome:
    """A search compile that fails to trace ends the search rather than the forecast."""
    try:
        return compile_at(size)
    except Exception as exc:
        return CompileOutcome("error", size, message=f"{type(exc).__name__}: {exc}")


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _fill(
    result: TargetForecast,
    outcome: CompileOutcome,
    chip: Chip,
    per_chip: int,
    devices: int,
    tokens_per_step: float | None,
    price: str,
) -> None:
    """Turn one compile's per-device figures into per-chip and per-slice figures and costs."""
    from .cost import cost_per_million_tokens, cost_per_step, roofline_seconds

    if outcome.available_bytes:
        result.available_per_chip = outcome.available_bytes * per_chip
    result.memory_per_chip = _scale(outcome.memory_bytes, per_chip)
    if outcome.status == "oom":
        result.status = "does not fit"
        result.fits = False
        result.message = outcome.message
        return
    result.status = "compiled"
    result.fits = True
    result.memory_breakdown = {
        name: float(getattr(outcome, f"{name}_bytes")) * per_chip
        for name in ("argument", "output", "alias", "temp", "code")
        if getattr(outcome, f"{name}_bytes") is not None
    }
    result.flops = _scale(outcome.flops, devices)
    result.bytes_accessed = _scale(outcome.bytes_accessed, devices)
    result.transcendentals = _scale(outcome.transcendentals, devices)
    if outcome.optimal_seconds is not None and outcome.optimal_seconds > 0:
        result.compiler_seconds = outcome.optimal_seconds
    if result.flops is None or result.bytes_accessed is None or result.flops < 0:
        result.message = "the compiler gave no FLOP or byte count, so no step time"
        return
    flops_chip = max(0.0, result.flops / result.chips)
    bytes_chip = max(0.0, result.bytes_accessed / result.chips)
    result.compute_seconds = flops_chip / chip.peak_bf16_flops
    result.memory_seconds = bytes_chip / chip.hbm_bandwidth
    result.step_seconds = roofline_seconds(flops_chip, bytes_chip, chip)
    result.cost_per_step = cost_per_step(result.step_seconds, chip, result.chips, price)
    if tokens_per_step:
        result.cost_per_1m_tokens = cost_per_million_tokens(
            result.step_seconds, tokens_per_step, chip, result.chips, price
        )


def _copy_failure(failure: TargetForecast, topology: Topology, chip: Chip) -> TargetForecast:
    return TargetForecast(
        target=topology.target,
        name=chip.name,
        topology=topology.name,
        chips=topology.chips,
        devices_per_chip=devices_per_chip(topology_devices(topology)),
        status=failure.status,
        batch=failure.batch,
        hbm_per_chip=float(chip.hbm_bytes),
        unsupported_ops=list(failure.unsupported_ops),
        message=failure.message,
    )


def _reference(results: list[TargetForecast]) -> TargetForecast | None:
    """The compiled target whose FLOPs and bytes cost the GPU rows (one device per chip first)."""
    compiled = [r for r in results if r.step_seconds is not None]
    single = [r for r in compiled if r.devices_per_chip == 1]
    return (single or compiled or [None])[0]


def _tpu_row(
    result: TargetForecast, chip: Chip, batch: int, tokens_per_step: float | None, price: str
) -> Any:
    from .compare import ComparisonRow, format_bytes

    note = ""
    if result.status == "does not fit":
        note = (
            f"does not fit: needs {format_bytes(result.memory_per_chip)} per chip, "
            f"{format_bytes(result.capacity_per_chip)} usable"
        )
    elif result.status != "compiled":
        note = result.summary()
    elif result.bound:
        note = (
            f"{result.bound}-bound roofline; {format_bytes(result.memory_per_chip)} of "
            f"{format_bytes(result.capacity_per_chip)} usable HBM per chip"
        )
    if result.max_batch is not None:
        note += (
            f"; largest batch that fits: {result.max_batch}{'' if result.max_batch_exact else '+'}"
        )
    memory = None if result.memory_per_chip is None else int(result.memory_per_chip * result.chips)
    return ComparisonRow.build(
        chip,
        result.step_seconds,
        "compiled",
        chips=result.chips,
        price=price,
        samples_per_step=batch,
        tokens_per_step=tokens_per_step,
        memory_bytes=memory,
        fits=result.fits,
        note=note,
    )


def _gpu_row(
    reference: TargetForecast, gpu: Chip, batch: int, tokens_per_step: float | None, price: str
) -> Any:
    """As many GPUs as the reference slice has chips, each doing its share of its FLOPs and bytes."""
    from .compare import ComparisonRow
    from .cost import roofline_seconds

    assert reference.flops is not None and reference.bytes_accessed is not None
    chips = reference.chips
    seconds = roofline_seconds(
        max(0.0, reference.flops / chips), max(0.0, reference.bytes_accessed / chips), gpu
    )
    memory = None
    fits = None
    if reference.devices_per_chip == 1 and reference.memory_per_chip:
        memory = int(reference.memory_per_chip * chips)
        fits = reference.memory_per_chip <= gpu.hbm_bytes
    return ComparisonRow.build(
        gpu,
        seconds,
        "estimated",
        chips=chips,
        price=price,
        samples_per_step=batch,
        tokens_per_step=tokens_per_step,
        memory_bytes=memory,
        fits=fits,
        note=f"roofline on {reference.label}'s compiled FLOPs and bytes",
    )


# -- notebooks -----------------------------------------------------------------------------------


def forecast_cell(
    cell: Mapping[str, Any] | Callable[[], Any],
    targets: str | Sequence[str] = DEFAULT_FORECAST_TARGETS,
    *,
    namespace: Mapping[str, Any] | None = None,
    backend: Any = None,
    source: str | None = None,
    **options: Any,
) -> Forecast:
    """The `%%tpu --forecast v5e,v6e` hook: forecast the training step a cell defines.

    `cell` is the namespace the cell ran in, or a callable that runs the cell once (the
    magic's runner); the variables are then read from `namespace`, or from IPython's user
    namespace when none is given. The cell must define `model` (a torch.nn.Module) and
    `batch` or `example_batch` (a pair `(inputs, targets)`, the model called as
    `model(inputs)`); it may define `loss_fn`, `optimizer` (a torch optimizer or a name;
    default AdamW), `tokens_per_step` and `dtype`. `targets` is a list or a comma-separated
    string ("v5e,v6e"). `backend` and `source` are what the magic knows about the cell; the
    forecast compiles for TPUs with libtpu whatever backend ran the cell, and names neither.
    `options` go to `forecast` (chips=, batch_search=, time_budget_s=, ...) and win over
    the namespace. Returns the `Forecast`; the magic displays it.
    """
    if callable(cell) and not isinstance(cell, Mapping):
        cell()
        if namespace is None:
            from IPython import get_ipython

            shell = get_ipython()
            namespace = shell.user_ns if shell is not None else {}
    else:
        namespace = cell
    assert namespace is not None
    if "model" not in namespace:
        raise ForecastError(
            "%%tpu --forecast needs the cell to define `model` (a torch.nn.Module) and `batch` "
            "(a pair (inputs, targets)); optional: `loss_fn`, `optimizer`, `tokens_per_step`."
        )
    batch = namespace.get("batch", namespace.get("example_batch"))
    if batch is None:
        raise ForecastError(
            "%%tpu --forecast needs the cell to define `batch` (or `example_batch`): a pair "
            "(inputs, targets) with the model called as model(inputs)."
        )
    kwargs: dict[str, Any] = {
        name: namespace[name]
        for name in ("loss_fn", "optimizer", "tokens_per_step", "dtype")
        if namespace.get(name) is not None
    }
    kwargs.update(options)
    return forecast(namespace["model"], batch, targets=targets, **kwargs)
