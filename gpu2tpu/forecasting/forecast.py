"""Forecast a PyTorch training step on TPUs, on a machine that has none.

```
from gpu2tpu import forecast
result = forecast(model, (inputs, targets), loss_fn=F.cross_entropy, optimizer=opt)
result            # a widget in a notebook, a table in a terminal
result.to_json()
```
The whole step (forward, loss, gradients, optimizer update) is compiled by libtpu's own
compiler for each target topology (`aot.py`), and the compiled program's FLOPs, bytes and
memory become a fit verdict, the largest batch that fits (`batchsearch.py`), a roofline step
time and a cost, beside GPUs costed from the same FLOPs and bytes. Deep models are compiled
at one and two periods of their block stack and extended to the full depth
(`extrapolate.py`). The compiling runs in a forked child (`isolate.py`) that reports
progress as it goes (`progress.py`); Ctrl-C stops it and keeps the targets already done.
A forecast asked again is answered from a key of the model's structure and code
(`fingerprint.py`) without starting JAX.

Needs the `forecast` extra; without it the call raises `ForecastUnavailable` with the
command that installs it, and nothing else in gpu2tpu is affected (this module imports no
JAX at import time).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .aot import (
    SHARDINGS,
    BatchLayout,
    CompileOutcome,
    FigureCache,
    ForecastError,
    ForecastUnavailable,
    Topology,
    TrainingStep,
    apply_trace,
    compile_lowered,
    default_cache_dir,
    devices_per_chip,
    forecast_versions,
    split_batch,
    topology_devices,
    topology_for,
    usable_hbm,
)
from .batchsearch import MAX_BATCH_FACTOR, MAX_SEARCH_COMPILES, BatchSearch
from .extrapolate import (
    AUTO_MIN_DEPTH,
    BlockStack,
    describe_extrapolation,
    exceeds,
    extrapolate_outcome,
    find_block_stack,
    with_checkpointed_blocks,
    with_depth,
)
from .isolate import PoolJob, can_fork, jax_started, run_pool, wait_for
from .lowering import ATTENTION_MODES
from .optimizers import OptimizerPlan, UnsupportedOptimizer, plan_optimizer, to_optax
from .progress import ForecastProgress, format_clock
from .result import Forecast, TargetForecast, interruption_note
from .slices import anchored, basis_batch, basis_topology

if TYPE_CHECKING:
    import torch

    from ..measure.flops import StepCount
    from ..pricing.catalogue import Chip, HardwareCatalogue
    from ..pricing.step_floor import StepFloor

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
# Without a compiler figure for usable HBM, predict the largest batch against this share of it.
_HBM_USABLE = 0.98
# Bumped when what a cached target holds changes.
_RESULT_FORMAT = 2  # 2: FLOPs count loop bodies as often as they run; collectives
# Above this share of usable HBM XLA trims memory (GPT-2 small on v5e: 12 layers need 13.9 GB
# where the line through 1-6 layers, exact there, says 15.6 GB): extrapolation overstates.
_PRESSURE = 0.8


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


def _label(topology: Topology) -> str:
    return topology.name if topology.chips > 1 else topology.target


def forecast(
    model: torch.nn.Module,
    example_batch: Any,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    optimizer: Any = "adamw",
    targets: str | Sequence[str] = DEFAULT_FORECAST_TARGETS,
    chips: int = 1,
    dtype: Any = None,
    tokens_per_step: float | None = None,
    batch_search: bool = False,
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
    Keyword `options`: `gpus`, `price`, `catalogue`, `cache`, `progress`, `sharding`,
    `extrapolate`, `attention` (see below).

    `example_batch` is `(inputs, targets)`: the model is called as `model(inputs)` (a tuple
    is unpacked into positional arguments, a dict into keyword arguments) and the loss as
    `loss_fn(output, targets)` (default: `default_loss`). Only shapes and dtypes are used,
    so tensors may live on the meta device, like the model's weights.

    `optimizer` is the torch optimizer instance, its class, or a name ("sgd", "adam",
    "adamw", "rmsprop"); it is mapped to the matching optax update. `targets` are TPU
    generations ("v5e", "v6e", "v5p", "tpu7x", "v4") or explicit slices ("v5e:2x4"), and may
    name GPUs too; `chips` is the number of chips per TPU target (a power of two): the batch
    is split across them and figures are per step of the whole slice. `sharding="data"`
    (default) replicates weights and optimizer state on every chip; `"fsdp"` shards them
    over the chips. `dtype` (e.g. torch.bfloat16) casts floating weights and inputs; None
    keeps the model's. `tokens_per_step` defaults to the number of token ids in the batch
    when the first input is an integer tensor.

    `batch_search=True` also finds the largest batch that fits: two compiles give memory's
    line in the batch size, a third and fourth confirm the predicted batch and the one above
    it (a bisection takes over when they disagree), for at most `time_budget_s` seconds per
    target. `extrapolate` (None: automatic for stacks of 16 blocks or more; True; False)
    compiles a model with a stack of identical blocks at one and two periods of the stack
    and extends FLOPs, bytes and memory linearly to the full depth. `attention` ("flash",
    default, or "full") says how `F.scaled_dot_product_attention` is compiled: as the
    Pallas flash-attention kernel TPU training runs, or as the reference formula that holds
    the scores; `torch.utils.checkpoint` regions become `jax.checkpoint` either way. GPU rows in `gpus` are
    rooflines on the FLOPs and bytes of the first compiled target (one with one device per
    chip first), for as many GPUs as that slice has chips. Figures are cached on disk
    (`cache`: True for the user cache directory, a path, or False), so the same forecast
    again returns at once. `progress` (default True) shows a live line per target: a
    display in a notebook, rich's live view in a terminal, a line per target elsewhere.
    Ctrl-C stops the compiling, prints one line and returns the targets finished so far.
    """
    started = time.perf_counter()
    versions = forecast_versions(import_torchax=False)  # a missing extra: one sentence, here
    job = _prepare(
        model, example_batch, loss_fn, optimizer, targets, chips, dtype, tokens_per_step,
        batch_search, time_budget_s, versions, **options,
    )  # fmt: skip
    in_child = isolate and can_fork() and "torchax" not in sys.modules
    if in_child and jax_started():
        in_child = False  # a fork after JAX started its thread pools deadlocks in the child
        warnings.warn(
            "gpu2tpu.forecast: JAX is already running in this process, so the forecast compiles "
            "here; torchax then makes 'jax' torch's accelerator for the rest of this session "
            "(restart the kernel before training on another device).",
            stacklevel=2,
        )
    return _run(job, in_child, started)


@dataclass
class _Job:
    """Everything a forecast needs, checked in the user's process before any compile."""

    model: torch.nn.Module
    example_batch: Any
    loss_fn: Callable[[Any, Any], Any] | None
    plan: OptimizerPlan
    layout: BatchLayout
    dtype: torch.dtype | None
    tpu_targets: list[tuple[Topology, Chip]]
    gpu_targets: list[Chip]
    catalogue: HardwareCatalogue
    price: str
    tokens_per_step: float | None
    batch_search: bool
    time_budget_s: float
    sharding: str
    stack: BlockStack | None
    cache_dir: Path | None
    versions: dict[str, str]
    progress: bool | str
    keys: dict[str, str] = field(default_factory=dict)  # label -> quick cache key
    attention: str = "flash"
    remat_stack: BlockStack | None = None  # the blocks to checkpoint when a step does not fit
    step_count: Any = None  # the step counted on the meta device, for its floor (`_floor`)
    counted: bool = False
    scratch: Path | None = None  # where the children share compiles when nothing is cached

    @property
    def figure_dir(self) -> Path | None:
        """Where compiles are kept: the cache, else the scratch directory of this forecast."""
        return self.cache_dir if self.cache_dir is not None else self.scratch

    @property
    def labels(self) -> list[str]:
        return [_label(t) for t, _ in self.tpu_targets]


def _prepare(
    model: torch.nn.Module,
    example_batch: Any,
    loss_fn: Callable[[Any, Any], Any] | None,
    optimizer: Any,
    targets: str | Sequence[str],
    chips: int,
    dtype: Any,
    tokens_per_step: float | None,
    batch_search: bool,
    time_budget_s: float,
    versions: dict[str, str],
    *,
    gpus: Sequence[str] = DEFAULT_FORECAST_GPUS,
    price: str = "on_demand",
    catalogue: HardwareCatalogue | None = None,
    cache: bool | str | Path = True,
    progress: bool | str = True,
    sharding: str = "data",
    extrapolate: bool | None = None,
    attention: str = "flash",
) -> _Job:
    import torch

    from ..pricing.catalogue import HardwareCatalogue

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}.")
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, not {sharding!r}.")
    if attention not in ATTENTION_MODES:
        raise ValueError(
            f"attention must be one of {', '.join(ATTENTION_MODES)}, not {attention!r}."
        )
    catalogue = catalogue or HardwareCatalogue.load()
    torch_dtype = _torch_dtype(dtype)
    tpu_targets, gpu_targets = _split_targets(targets, chips, catalogue)
    gpu_targets += [catalogue.get(g) for g in gpus if catalogue.get(g) not in gpu_targets]
    plan = plan_optimizer(optimizer, list(model.named_parameters()))
    layout = split_batch(example_batch)
    if tokens_per_step is None and layout.per_sample_tokens:
        tokens_per_step = layout.per_sample_tokens * layout.batch_size
    stack = None
    if extrapolate is not False:
        stack = find_block_stack(model)
        if stack is not None and extrapolate is None and stack.depth < AUTO_MIN_DEPTH:
            stack = None
        if extrapolate and stack is None:
            raise ValueError(
                "extrapolate=True needs a stack of identical blocks (a ModuleList or Sequential "
                "of at least four modules with the same structure), and this model has none."
            )
    cache_dir = None if cache is False else (default_cache_dir() if cache is True else Path(cache))
    job = _Job(
        model, example_batch, loss_fn, plan, layout, torch_dtype, tpu_targets, gpu_targets,
        catalogue, price, tokens_per_step, batch_search, float(time_budget_s), sharding, stack,
        cache_dir, versions, progress, attention=attention,
        remat_stack=stack if stack is not None else find_block_stack(model),
    )  # fmt: skip
    if cache_dir is not None:
        job.keys = _quick_keys(job)
    return job


def _quick_keys(job: _Job) -> dict[str, str]:
    """One fingerprint key per target (see `fingerprint.py`): the warm path's lookup."""
    from .fingerprint import recipe_key

    common = {
        "format": _RESULT_FORMAT,
        "python": sys.version,
        "versions": job.versions,
        "optimizer": (job.plan.rules, sorted(job.plan.labels.items())),
        "dtype": str(job.dtype),
        "sharding": job.sharding,
        "attention": job.attention,
        "search": (
            job.batch_search,
            job.time_budget_s if job.batch_search else None,
            MAX_SEARCH_COMPILES,
        ),  # fmt: skip
        "stack": None if job.stack is None else asdict(job.stack),
    }
    base = recipe_key(job.model, job.example_batch, job.loss_fn, common)
    keys = {}
    for topology, _ in job.tpu_targets:
        import hashlib

        keys[_label(topology)] = hashlib.sha256(
            f"{base}|{sorted(asdict(topology).items())}".encode()
        ).hexdigest()
    return keys


def _run(job: _Job, in_child: bool, started: float) -> Forecast:
    """Answer cached targets at once, compile the others (in a child), assemble the result."""
    cache = FigureCache(job.cache_dir, job.versions)
    results: dict[str, TargetForecast] = {}
    for label, key in job.keys.items():
        data = cache.get_json(f"target-{key}")
        if isinstance(data, dict):
            try:
                hit = TargetForecast.from_dict(data)
            except TypeError:
                continue
            hit.cached = True
            hit.phases = {"cache": 0.0}
            results[label] = hit
    missing = [(t, c) for t, c in job.tpu_targets if _label(t) not in results]
    mode = job.progress if isinstance(job.progress, str) else None
    display = ForecastProgress(
        job.labels,
        mode=mode if job.progress else "off",
        title=f"gpu2tpu forecast: {type(job.model).__name__}, batch {job.layout.batch_size}",
    )
    phases = {"prepare": time.perf_counter() - started}
    partial: dict[str, TargetForecast] = {}
    interrupted = False

    def on_event(event: tuple) -> None:
        kind = event[0]
        if kind == "status":
            display.status(event[1], event[2])
        elif kind == "phase":
            phases[event[1]] = event[2]
        elif kind == "target":
            _, label, result, final = event
            if not final:
                partial[label] = result
                return
            results[label] = result
            partial.pop(label, None)
            _price_all(
                result, chips[label], job.tokens_per_step, job.price,
                _floor(job, chips[label], result.chips), _step_count(job),
            )  # fmt: skip
            display.finished(label, result.summary(), ok=result.status in _DONE_OK)
            key = job.keys.get(label)
            if key and result.status in ("compiled", "does not fit", "unsupported"):
                cache.put_json(f"target-{key}", result.to_dict())

    chips = {_label(t): c for t, c in job.tpu_targets}
    with display.shown():
        for label, result in results.items():
            _price_all(
                result, chips[label], job.tokens_per_step, job.price,
                _floor(job, chips[label], result.chips), _step_count(job),
            )  # fmt: skip
            display.finished(label, result.summary() + " (cached)", ok=result.status in _DONE_OK)
        if missing:
            t0 = time.perf_counter()
            try:
                if in_child:
                    with _Plan(job, missing) as plan:
                        run_pool(
                            plan.first_jobs(),
                            workers=plan.workers,
                            on_event=lambda event: plan.on_event(event, on_event),
                            on_idle=display.tick,
                        )
                else:
                    for result in _compile_targets(_Work(job, missing), on_event):
                        results.setdefault(result.label, result)
            except KeyboardInterrupt:
                interrupted = True
                display.interrupted(_interrupt_line(job, results, partial, display))
            phases["targets"] = time.perf_counter() - t0

    def assemble(interrupted: bool) -> Forecast:
        ordered = []
        for topology, chip in job.tpu_targets:
            label = _label(topology)
            done = results.get(label)
            if done is None:
                done = _unfinished(partial.get(label), topology, chip, job)
                _price_all(
                    done, chip, job.tokens_per_step, job.price, _floor(job, chip, done.chips),
                    _step_count(job),
                )  # fmt: skip
            ordered.append(done)
        return _assemble(job, ordered, time.perf_counter() - started, phases, interrupted)

    try:
        return assemble(interrupted)
    except KeyboardInterrupt:
        # Ctrl-C after the last compile ended (a terminal's signal can land there): what
        # was compiled is kept, said in the same one line, never a traceback.
        if not interrupted:
            display.interrupted(_interrupt_line(job, results, partial, display))
        return assemble(True)


_DONE_OK = ("compiled", "does not fit")


def _workers() -> int:
    """Children compiling at once: one per CPU (a libtpu compile is mostly one thread of its
    back end, so two compiles on two cores take the time of one), at most
    `GPU2TPU_FORECAST_WORKERS`."""
    workers = os.cpu_count() or 1
    cap = os.environ.get("GPU2TPU_FORECAST_WORKERS", "")
    if cap.isdigit() and int(cap) > 0:
        workers = min(workers, int(cap))
    return max(1, workers)


def _parallel_parts(
    targets: list[tuple[Topology, Chip]], workers: int, sharding: str
) -> list[list[tuple[Topology, Chip]]]:
    """Targets split over `workers` children; targets compiled on the same basis slice
    (`slices.py`) stay in one child, which compiles that basis once."""
    groups: dict[str, list[tuple[Topology, Chip]]] = {}
    for topology, chip in targets:
        basis = basis_topology(topology, sharding) or topology
        groups.setdefault(basis.name, []).append((topology, chip))
    ordered = list(groups.values())
    count = max(1, min(workers, len(ordered)))
    return [[t for group in ordered[i::count] for t in group] for i in range(count)]


# Which partitioned compile a target waits for: (target label, variant, depth); depth -1 is
# the whole model, the variants "plain" and "checkpointed" (every block checkpointed).
_UnitKey = tuple[str, str, int]
_WHOLE = -1
# Where a partitioned program's FLOPs and bytes come from (`slices.anchored`): ("basis",
# variant, depth), the whole compile of that step on the basis slice; or ("slice", variant,
# depth), that step on the target's own slice (itself compiled whole or anchored).
_Anchor = tuple[str, str, int]


@dataclass(frozen=True)
class _Unit:
    """A partitioned compile the parent runs: the lock its child holds while it works, and
    the anchor of its FLOPs and bytes."""

    lock: str
    anchor: _Anchor


class _Plan:
    """What the children do, side by side (`isolate.run_pool`), and what comes next.

    First the partitioned compiles of the slices compiled on a basis (short), then the
    targets, split over the workers. A target that does not fit asks for its checkpointed
    re-check (`("recheck", label, result)`): its partitioned compiles and the re-check job
    start before anything still waiting, beside whatever runs, and the target is final
    when the re-check reports. Compiles meet in a figure directory: the cache, or a
    scratch directory for `cache=False`, removed at the end; so do the lock files that say
    which partitioned compile is still running (`isolate.wait_for`).
    """

    def __init__(self, job: _Job, missing: list[tuple[Topology, Chip]]) -> None:
        import tempfile

        self.job = job
        self.missing = missing
        self.workers = _workers()
        self.scratch = None
        if job.cache_dir is None:
            self.scratch = Path(tempfile.mkdtemp(prefix="gpu2tpu-forecast-"))
            job.scratch = self.scratch
        self.locks = Path(tempfile.mkdtemp(prefix="gpu2tpu-units-"))
        self.units: dict[_UnitKey, _Unit] = {}

    def __enter__(self) -> _Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil

        shutil.rmtree(self.locks, ignore_errors=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.job.scratch = None

    def _anchors(self, topology: Topology, variant: str) -> dict[int, _Anchor]:
        """The depths of `topology`'s steps to read partitioned, each with its anchor."""
        stack = self.job.stack
        derived = basis_topology(topology, self.job.sharding) is not None
        if stack is None:
            if variant == "checkpointed":
                return {_WHOLE: ("slice", "plain", _WHOLE)}
            return {_WHOLE: ("basis", "plain", _WHOLE)} if derived else {}
        # Each depth on its own anchor: the deeper one anchored on the shallower would leave
        # a block's bytes to this package's count (docs/forecast.md, "A large model in minutes").
        if variant == "checkpointed":
            return {depth: ("slice", "plain", depth) for depth in stack.shallow_depths}
        if derived:
            return {depth: ("basis", "plain", depth) for depth in stack.shallow_depths}
        return {}

    def _unit_jobs(self, topology: Topology, variant: str) -> list[PoolJob]:
        """Partitioned compiles of `topology`'s steps (see `_anchors`), one job each."""
        jobs = []
        for depth, anchor in self._anchors(topology, variant).items():
            key = (_label(topology), variant, depth)
            unit = _Unit(str(self.locks / f"unit-{len(self.units)}.lock"), anchor)
            self.units[key] = unit
            args = (self.job, topology, variant, depth)
            jobs.append(PoolJob(_partitioned_unit, args, key=key, holds=unit.lock, optional=True))
        return jobs

    def first_jobs(self) -> list[PoolJob]:
        jobs: list[PoolJob] = []
        if not self.job.batch_search:  # a search compiles at sizes no plan knows beforehand
            for topology, _ in self.missing:
                jobs += self._unit_jobs(topology, "plain")
        for part in _parallel_parts(self.missing, self.workers, self.job.sharding):
            jobs.append(PoolJob(_compile_targets, (_Work(self.job, part, dict(self.units)), None)))
        return jobs

    def on_event(self, event: tuple, report: Callable[[tuple], None]) -> list[PoolJob]:
        if event[0] != "recheck":
            report(event)
            return []
        _, label, result = event
        report(("target", label, result, False))
        topology = next(t for t, _ in self.missing if _label(t) == label)
        jobs = [] if self.job.batch_search else self._unit_jobs(topology, "checkpointed")
        args = (_Work(self.job, [(topology, c) for t, c in self.missing if t == topology],
                      dict(self.units)), result)  # fmt: skip
        return [*jobs, PoolJob(_recheck_target, args)]


def _interrupt_line(
    job: _Job,
    results: Mapping[str, TargetForecast],
    partial: Mapping[str, TargetForecast],
    display: ForecastProgress,
) -> str:
    """One line: what was kept and what was stopped."""
    done = [label for label in job.labels if label in results]
    running = [
        f"{line.label} ({line.text}, {format_clock(line.elapsed(time.monotonic()))})"
        for line in display.lines.values()
        if line.state == "running"
    ]
    text = "gpu2tpu: forecast interrupted"
    text += f"; kept {', '.join(done)}" if done else "; no target had finished"
    if running:
        text += f"; stopped {', '.join(running)}"
    searched = [label for label in partial if label not in results]
    if searched:
        text += f"; {', '.join(searched)} kept without its full batch search"
    return text + "."


def _unfinished(
    partial: TargetForecast | None, topology: Topology, chip: Chip, job: _Job
) -> TargetForecast:
    """A target Ctrl-C stopped: its figures at the user's batch if it got that far."""
    if partial is not None:
        partial.message = (partial.message + " " if partial.message else "") + (
            "The batch search was interrupted: the largest batch is a lower bound."
        )
        partial.max_batch_exact = False
        return partial
    return TargetForecast(
        target=topology.target,
        name=chip.name,
        topology=topology.name,
        chips=topology.chips,
        devices_per_chip=1,
        status="interrupted",
        batch=job.layout.batch_size,
        hbm_per_chip=float(chip.hbm_bytes),
        sharding=job.sharding,
        message="interrupted (Ctrl-C) before this target finished",
    )


def _assemble(
    job: _Job,
    results: list[TargetForecast],
    wall_seconds: float,
    phases: dict[str, float],
    interrupted: bool,
) -> Forecast:
    """The Forecast: per-target figures, the comparison table, and notes."""
    from ..pricing.compare import Comparison

    model = job.model
    named = list(model.named_parameters())
    parameters = sum(p.numel() for _, p in named)
    trainable = sum(p.numel() for n, p in named if n in job.plan.labels)
    batch = job.layout.batch_size
    reference = _reference(results)
    rows = [
        _tpu_row(r, chip, batch, job.tokens_per_step, job.price)
        for r, (_, chip) in zip(results, job.tpu_targets, strict=True)
    ]
    notes: list[str] = []
    if reference is not None:
        for gpu in job.gpu_targets:
            rows.append(
                _gpu_row(
                    reference,
                    gpu,
                    batch,
                    job.tokens_per_step,
                    job.price,
                    _floor(job, gpu, reference.chips),
                )  # fmt: skip
            )
        notes.append(
            f"GPU rows use the FLOPs and bytes libtpu compiled for {reference.label} (XLA's TPU "
            "fusion), at the utilisation published GPU runs reach, so TPUs and GPUs compare on "
            "one basis; they are not CUDA measurements."
        )
    if job.tokens_per_step is None:
        notes.append(
            "No tokens per step (the first input is not token ids): pass tokens_per_step for $/1M tokens."
        )
    near = [
        r.label
        for r in results
        if r.extrapolated and r.memory_fraction and r.memory_fraction >= _PRESSURE
    ]
    if near:
        notes.append(
            f"{', '.join(near)}: the extrapolated memory is above {_PRESSURE:.0%} of the usable "
            "HBM, where XLA schedules and rematerialises to save memory, so the line overstates "
            "it (an upper bound); extrapolate=False compiles the whole model for the compiler's "
            "own verdict."
        )
    notes += _lowering_notes(results)
    notes += _fit_verdicts(job, results)
    if interrupted:
        notes.append(interruption_note(results))
    # the accuracy stated beside the expected rows is that of the fit that made them
    sources = list(dict.fromkeys(t.expected_source for t in results if t.expected_source))
    comparison = Comparison.from_rows(
        rows,
        catalogue=job.catalogue,
        price=job.price,
        workload={"samples_per_step": batch, "tokens_per_step": job.tokens_per_step},
        title=f"gpu2tpu forecast: {type(model).__name__}, batch {batch}",
        expected_source="; ".join(sources) if sources else None,
    )
    return Forecast(
        model=type(model).__name__,
        parameters=parameters,
        trainable_parameters=trainable,
        optimizer=job.plan.describe(),
        dtype=str(job.dtype or _model_dtype(model)).replace("torch.", ""),
        batch=batch,
        tokens_per_step=job.tokens_per_step,
        targets=results,
        comparison=comparison,
        reference=reference.label if reference else None,
        versions=job.versions,
        wall_seconds=wall_seconds,
        cache_dir=str(job.cache_dir) if job.cache_dir else None,
        notes=notes,
        sharding=job.sharding,
        interrupted=interrupted,
        phases=phases,
    )


def _lowering_notes(results: list[TargetForecast]) -> list[str]:
    """Say how attention and checkpoints were compiled, so the figures say what they assume."""
    notes = []
    kinds = {t.attention_kind for t in results if t.attention_kind}
    fallbacks = sorted({r for t in results for r in t.attention_fallbacks})
    if kinds & {"flash", "mixed"}:
        notes.append(
            "Attention: F.scaled_dot_product_attention compiled as the Pallas flash-attention "
            "kernel (jax.experimental.pallas.ops.tpu.flash_attention, the kernel PyTorch/XLA's "
            "flash_attention runs): no score matrix held, FLOPs as the kernel executes them "
            "(the backward recomputes the scores; a causal call skips the blocks above the "
            "diagonal). attention='full' compiles the reference formula instead."
            + (
                f" Kept the reference formula for calls with {', '.join(fallbacks)}."
                if fallbacks
                else ""
            )
        )
    elif "full" in kinds:
        notes.append(
            "Attention: the figures assume full attention, the (sequence x sequence) scores "
            "computed and held"
            + (f" ({', '.join(fallbacks)})" if fallbacks else "")
            + "; a TPU run with a flash-attention kernel needs less memory."
        )
    regions = max((t.remat_regions for t in results), default=0)
    if any(t.checkpointed is not None for t in results):
        notes.append(
            "Steps that do not fit were compiled again with every block of "
            "the stack checkpointed (jax.checkpoint per block), as a large-model recipe would "
            "train them; their figures are under `checkpointed`."
        )
    if regions:
        notes.append(
            f"Activation checkpointing: {regions} checkpointed region(s) compiled with "
            "jax.checkpoint: their activations are recomputed in the backward pass, not kept."
        )
    return notes


def _fit_verdicts(job: _Job, results: list[TargetForecast]) -> list[str]:
    """For each target that does not fit: its breakdown and what would fit (`fit_verdict.py`),
    set on the target, and a note each."""
    from ..pricing.published_setups import load_published_setups
    from .fit_verdict import fit_verdict
    from .step_memory import attention_dropout_elements, step_memory

    failing = [r for r in results if r.status == "does not fit" and r.memory_per_chip]
    if not failing:
        return []
    (args, kwargs), _ = _batch_parts(job.layout)
    dropout = attention_dropout_elements(job.model, args, kwargs, job.dtype)
    count = _step_count(job)
    setups = load_published_setups()
    notes = []
    for result in failing:
        step = step_memory(
            job.model, job.plan, job.layout.tensors(), job.dtype,
            chips=result.chips, devices_per_chip=result.devices_per_chip, sharding=job.sharding,
            sequence=job.layout.per_sample_tokens,
            model_class=count.model_class if count is not None else None,
            dropout_elements=dropout,
        )  # fmt: skip
        result.fit = fit_verdict(result, step, setups)
        if result.fit is not None:
            notes.append(
                f"{result.label} does not fit at batch {result.batch}: "
                + "; ".join(result.fit.lines())
                + "."
            )
    return notes


def _model_dtype(model: torch.nn.Module) -> Any:
    dtypes = {p.dtype for p in model.parameters()}
    return next(iter(dtypes)) if len(dtypes) == 1 else "mixed dtypes"


# -- the compiling (in the child) ------------------------------------------------------------


@dataclass
class _Work:
    """What the child compiles: the job and the targets the cache did not answer, and the
    partitioned compiles the parent runs beside it (their lock files, by unit)."""

    job: _Job
    targets: list[tuple[Topology, Chip]]
    units: dict[_UnitKey, _Unit] | None = None  # None: compile everything here, in line
    launched: float = field(default_factory=time.time)  # when the parent started the work


def _compile_targets(work: _Work, emit: Callable[[tuple], Any] | None) -> list[TargetForecast]:
    """Forecast each target, reporting progress and results through `emit` as they come.

    In the child `emit` is None and events go to the parent through `isolate.emit`.
    """
    if emit is None:
        from .isolate import emit as send

        emit = send
    job = work.job
    emit(("phase", "start", max(0.0, time.time() - work.launched)))  # fork and start-up
    t0 = time.perf_counter()
    forecast_versions()  # imports JAX and torchax (the child's first seconds)
    emit(("phase", "imports", time.perf_counter() - t0))
    steps = _Steps(job)
    cache = FigureCache(job.figure_dir, job.versions)
    results = []
    failure: TargetForecast | None = None  # trace failures are the same on every target
    for topology, chip in work.targets:
        if failure is not None:
            result = _copy_failure(failure, topology, chip)
        else:
            compiler = _TargetCompiler(job, topology, cache, emit, work.units)
            result, traced = _forecast_target(job, steps, compiler, chip)
            if not traced:
                failure = result
        if work.units is not None and _wants_recheck(result, steps):
            emit(("recheck", _label(topology), result))  # the parent runs it, side by side
        else:
            emit(("target", _label(topology), result, True))
        results.append(result)
    return results


def _wants_recheck(result: TargetForecast, steps: _Steps) -> bool:
    """A step that does not fit, of a model with blocks to checkpoint that checkpoints none."""
    traces = [steps.full[0], *(step for step, _ in steps.shallow.values())]
    user_remat = any(step.trace is not None and step.trace.remat_calls for step in traces)
    return result.status == "does not fit" and steps.job.remat_stack is not None and not user_remat


def _recheck_target(work: _Work, result: TargetForecast) -> None:
    """The checkpointed re-check of a target that does not fit, in a child of its own."""
    from .isolate import emit

    forecast_versions()
    job = work.job
    ((topology, _),) = work.targets
    label = _label(topology)
    steps = _Steps(job)
    checkpointed = steps.checkpointed()
    assert checkpointed is not None  # the parent asks only where there is a stack
    compiler = _TargetCompiler(
        job, topology, FigureCache(job.figure_dir, job.versions), emit, work.units
    )
    variant = _checkpointed_target(
        job, result, lambda size, prefix="": compiler.compile_with(checkpointed, size, prefix),
        compiler.counts, compiler.capacity, len(compiler.devices), compiler.per_chip, label, emit,
    )  # fmt: skip
    if compiler.derived:
        variant.derived_from = (compiler.basis or topology).name
    result.checkpointed = variant
    emit(("target", label, result, True))


def _partitioned_unit(job: _Job, topology: Topology, variant: str, depth: int) -> None:
    """One partitioned compile (`slices.py`) into the figure directory, in a child of its
    own that ends right after: libtpu's code generation goes on in a thread nothing stops.
    A unit that fails leaves nothing, and the target compiles that slice whole instead."""
    try:
        forecast_versions()
        steps = _Steps(job)
        chosen = steps.checkpointed() if variant == "checkpointed" else steps
        assert chosen is not None
        step, tx = chosen.full if depth == _WHOLE else chosen.at_depth(depth)
        lowered = step.lower(tx, topology_devices(topology), job.layout.batch_size, job.sharding)
        if not step.missing_ops:
            cache = FigureCache(job.figure_dir, job.versions)
            compile_lowered(lowered, topology, job.layout.batch_size, cache, partitioned=True)
    except Exception:
        return


class _Steps:
    """The training steps a forecast compiles: the model's, and its shallow copies.

    `plain` is the steps without checkpoints these were made from (None for those), whose
    compiles anchor a checkpointed step's FLOPs and bytes (`slices.anchored`).
    """

    def __init__(
        self, job: _Job, model: torch.nn.Module | None = None, plain: _Steps | None = None
    ) -> None:
        self.job = job
        self.plain = plain
        self.variant = "plain" if plain is None else "checkpointed"
        self.model = job.model if model is None else model
        self.loss_fn = job.loss_fn or default_loss
        self.full = self._step(self.model, job.plan)
        self.stack = job.stack
        self.depths = job.stack.shallow_depths if job.stack is not None else (1, 2)
        self.shallow: dict[int, tuple[TrainingStep, Any]] = {}
        self.fallback_note = ""
        self._checkpointed: _Steps | None = None

    def checkpointed(self) -> _Steps | None:
        """The same steps with every block of the stack checkpointed, or None (no stack)."""
        stack = self.job.remat_stack
        if stack is None:
            return None
        if self._checkpointed is None:
            self._checkpointed = _Steps(
                self.job, with_checkpointed_blocks(self.model, stack), plain=self
            )
        return self._checkpointed

    def _step(self, model: torch.nn.Module, plan: OptimizerPlan) -> tuple[TrainingStep, Any]:
        step = TrainingStep(
            model, self.loss_fn, plan, self.job.layout, self.job.dtype, self.job.attention
        )
        return step, to_optax(plan)

    def at_depth(self, depth: int) -> tuple[TrainingStep, Any]:
        if depth not in self.shallow:
            assert self.stack is not None
            model = with_depth(self.model, self.stack, depth)
            names = {n for n, _ in model.named_parameters()}
            plan = OptimizerPlan(
                self.job.plan.rules,
                {n: i for n, i in self.job.plan.labels.items() if n in names},
            )
            self.shallow[depth] = self._step(model, plan)
        return self.shallow[depth]

    def give_up_extrapolating(self, reason: str) -> None:
        self.fallback_note = (
            f"Could not compile the model with fewer blocks ({reason}); compiled the whole model."
        )
        self.stack = None


class _TargetCompiler:
    """How one target's steps become figures: compiled whole on the target's slice, or
    (where the parent runs its partitioned compiles, `units`) compiled whole on the basis
    slice and read partitioned on the target's (`slices.py`)."""

    def __init__(
        self,
        job: _Job,
        topology: Topology,
        cache: FigureCache,
        emit: Callable[[tuple], Any],
        units: Mapping[_UnitKey, _Unit] | None,
    ) -> None:
        self.job, self.topology, self.cache, self.emit = job, topology, cache, emit
        self.side_by_side = units is not None  # the parent runs re-checks and units
        self.units = dict(units or {})
        self.label = _label(topology)
        emit(("status", self.label, "describing the topology"))
        self.devices = topology_devices(topology)
        self.per_chip = devices_per_chip(self.devices)
        self.usable = usable_hbm(topology, cache)
        chip_bytes = job.catalogue.get(topology.target).hbm_bytes
        self.capacity = self.usable or chip_bytes / self.per_chip * _HBM_USABLE
        self.basis = basis_topology(topology, job.sharding)
        self.counts: dict[str, Any] = {"compiles": 0, "lower": 0.0, "compile": 0.0, "cached": True}
        self.derived = False  # whether any figure came from a partitioned program
        self._outcomes: dict[tuple[str, int, int], CompileOutcome] = {}

    def _count(self, outcome: CompileOutcome, lowered_s: float) -> None:
        self.counts["compiles"] += 1
        self.counts["lower"] += lowered_s
        self.counts["compile"] += outcome.compile_seconds
        self.counts["cached"] = self.counts["cached"] and outcome.cached

    def _whole(self, step: TrainingStep, tx: Any, topology: Topology, size: int) -> CompileOutcome:
        """A whole compile (or the cached figures) of `step` on `topology`."""
        t0 = time.perf_counter()
        lowered = step.lower(tx, topology_devices(topology), size, self.job.sharding)
        lowered_s = time.perf_counter() - t0
        if step.missing_ops:
            raise _Unsupported()
        outcome = compile_lowered(lowered, topology, size, self.cache)
        outcome.lower_seconds = lowered_s
        self._count(outcome, lowered_s)
        return outcome

    def step_outcome(self, steps: _Steps, depth: int, size: int, what: str) -> CompileOutcome:
        """One step's figures on the target's slice: the model at `depth` blocks (`_WHOLE`:
        the model itself) at batch `size`."""
        self.emit(("status", self.label, f"{what} at batch {size}"))
        step, _ = steps.full if depth == _WHOLE else steps.at_depth(depth)
        outcome = dataclasses.replace(self._raw(steps, depth, size))
        apply_trace(outcome, step.trace)
        return outcome

    def _raw(self, steps: _Steps, depth: int, size: int) -> CompileOutcome:
        """The compiler's figures of a step on this slice, before the trace's corrections:
        a whole compile, or the parent's partitioned compile anchored (`slices.anchored`)."""
        memo = (steps.variant, depth, size)
        if memo in self._outcomes:
            return self._outcomes[memo]
        step, tx = steps.full if depth == _WHOLE else steps.at_depth(depth)
        unit = self.units.get((self.label, steps.variant, depth))
        anchor = None if unit is None else self._anchor(steps, unit.anchor, size)
        if unit is None or anchor is None or anchor.status != "compiled":
            outcome = self._whole(step, tx, self.topology, size)
        else:
            wait_for(unit.lock)
            t0 = time.perf_counter()
            lowered = step.lower(tx, self.devices, size, self.job.sharding)
            lowered_s = time.perf_counter() - t0
            if step.missing_ops:
                raise _Unsupported()
            key = self.cache.key(lowered.as_text(), self.topology)
            part = self.cache.lookup(key, partitioned=True)
            if part is None:  # the unit failed: compile the slice whole here
                outcome = compile_lowered(lowered, self.topology, size, self.cache)
            else:
                part.cached = True
                outcome = anchored(part, anchor)
                outcome.batch = size
                self.derived = self.derived or part.partitioned
            self._count(outcome, lowered_s)
        self._outcomes[memo] = outcome
        return outcome

    def _anchor(self, steps: _Steps, anchor: _Anchor, size: int) -> CompileOutcome | None:
        """The whole (or anchored) compile a partitioned program takes FLOPs and bytes from."""
        where, variant, depth = anchor
        chosen = steps if variant == steps.variant else (steps.plain or steps.checkpointed())
        if chosen is None:
            return None
        if where == "slice":
            return self._raw(chosen, depth, size)
        basis_size = basis_batch(size, self.topology, self.basis) if self.basis else None
        if self.basis is None or basis_size is None:
            return None
        step, tx = chosen.full if depth == _WHOLE else chosen.at_depth(depth)
        return self._whole(step, tx, self.basis, basis_size)

    def compile_with(self, steps: _Steps, size: int, prefix: str = "") -> CompileOutcome:
        """The step at batch `size`: compiled whole, or at one and two periods of the block
        stack and extended to the full depth."""
        stack = steps.stack
        if stack is None:
            return self.step_outcome(steps, _WHOLE, size, f"{prefix}compiling")
        k, k2 = steps.depths
        try:
            shallow = self.step_outcome(
                steps, k, size, f"{prefix}compiling {k} of {stack.depth} blocks"
            )
            deeper = self.step_outcome(
                steps, k2, size, f"{prefix}compiling {k2} of {stack.depth} blocks"
            )
        except _Unsupported:
            raise
        except Exception as exc:  # the forward cannot run shallower: compile the whole model
            steps.give_up_extrapolating(f"{type(exc).__name__}: {exc}")
            return self.compile_with(steps, size, prefix)
        outcome = extrapolate_outcome(shallow, deeper, (k, k2), stack.depth)
        if outcome.status == "compiled" and exceeds(outcome, self.capacity):
            outcome = CompileOutcome(
                "oom",
                size,
                required_bytes=outcome.memory_bytes,
                available_bytes=self.capacity,
                message=(
                    f"extrapolated: needs {outcome.memory_bytes / 2**30:.2f} GiB per device, "  # type: ignore[operator]  # a compiled outcome has it
                    f"{self.capacity / 2**30:.2f} GiB usable"
                ),
                attention_kind=outcome.attention_kind,
                attention_fallbacks=outcome.attention_fallbacks,
                remat_regions=outcome.remat_regions,
            )
        outcome.compile_seconds = shallow.compile_seconds + deeper.compile_seconds
        outcome.cached = shallow.cached and deeper.cached
        return outcome


def _forecast_target(
    job: _Job, steps: _Steps, compiler: _TargetCompiler, chip: Chip
) -> tuple[TargetForecast, bool]:
    """One target's forecast, and whether the step traced (a failed trace fails every target)."""
    topology, label = compiler.topology, compiler.label
    started = time.perf_counter()
    per_chip, devices = compiler.per_chip, compiler.devices
    result = TargetForecast(
        target=topology.target,
        name=chip.name,
        topology=topology.name,
        chips=topology.chips,
        devices_per_chip=per_chip,
        status="error",
        batch=job.layout.batch_size,
        hbm_per_chip=float(chip.hbm_bytes),
        available_per_chip=_scale(compiler.usable, per_chip),
        sharding=job.sharding,
    )
    result.phases["topology"] = time.perf_counter() - started
    batch = job.layout.batch_size
    if batch % len(devices):
        result.message = (
            f"batch {batch} does not split evenly over the {len(devices)} TensorCores of "
            f"{topology.name}; use a multiple of {len(devices)}."
        )
        return result, True
    counts = compiler.counts
    t0 = time.perf_counter()
    try:
        first = compiler.compile_with(steps, batch)
    except Exception as exc:
        missing = steps.full[0].missing_ops or [
            op for step, _ in steps.shallow.values() for op in step.missing_ops
        ]
        result.status = "unsupported" if missing else "error"
        result.unsupported_ops = list(dict.fromkeys(missing))
        if not isinstance(exc, _Unsupported):
            result.message = f"tracing the step failed: {type(exc).__name__}: {exc}"
        return result, False
    result.compile_seconds = time.perf_counter() - t0
    result.phases.update(lower=counts["lower"], compile=counts["compile"])
    result.cached = counts["cached"]
    if steps.stack is not None:
        result.extrapolation = describe_extrapolation(steps.stack, steps.depths)
    if compiler.derived:
        result.derived_from = (compiler.basis or topology).name
    if steps.fallback_note:
        result.message = steps.fallback_note
    if first.status == "error":
        result.message = first.message
        return result, True
    _fill_figures(result, first, per_chip, len(devices))
    if job.batch_search:
        compiler.emit(("target", label, dataclasses.replace(result), False))
        _search(
            job, result, first,
            lambda size, prefix="": compiler.compile_with(steps, size, prefix),
            counts, compiler.capacity, len(devices), per_chip, label, compiler.emit,
        )  # fmt: skip
    checkpointed = steps.checkpointed()
    if compiler.side_by_side and _wants_recheck(result, steps):
        return result, True  # the parent runs the re-check beside the other targets
    if first.status == "oom" and checkpointed is not None and _wants_recheck(result, steps):
        compiler.emit(("target", label, dataclasses.replace(result), False))
        result.checkpointed = _checkpointed_target(
            job, result, lambda size, prefix="": compiler.compile_with(checkpointed, size, prefix),
            counts, compiler.capacity, len(devices), per_chip, label, compiler.emit,
        )  # fmt: skip
    return result, True


def _checkpointed_target(
    job: _Job,
    result: TargetForecast,
    compile_at: Callable[..., CompileOutcome],
    counts: dict[str, Any],
    capacity: float,
    devices: int,
    per_chip: int,
    label: str,
    emit: Callable[[tuple], Any],
) -> TargetForecast:
    """A step that does not fit, compiled again with every block checkpointed (the stack's
    blocks under `jax.checkpoint`): does it fit then, at what cost, and the largest batch
    (`batch_search`)."""
    variant = TargetForecast(
        target=result.target,
        name=result.name,
        topology=result.topology,
        chips=result.chips,
        devices_per_chip=per_chip,
        status="error",
        batch=result.batch,
        hbm_per_chip=result.hbm_per_chip,
        available_per_chip=result.available_per_chip,
        sharding=result.sharding,
        extrapolation=result.extrapolation,
    )
    t0 = time.perf_counter()
    outcome = _safe(lambda size: compile_at(size, "checkpointing every block: "), result.batch)
    variant.compile_seconds = time.perf_counter() - t0
    variant.cached = outcome.cached
    if outcome.status == "error":
        variant.message = outcome.message
        return variant
    _fill_figures(variant, outcome, per_chip, devices)
    if job.batch_search:
        quiet = lambda event: None if event[0] == "target" else emit(event)  # noqa: E731
        _search(
            job, variant, outcome, compile_at, counts, capacity, devices, per_chip, label, quiet
        )
    return variant


def _search(
    job: _Job,
    result: TargetForecast,
    first: CompileOutcome,
    compile_at: Callable[..., CompileOutcome],
    counts: dict[str, Any],
    capacity: float,
    devices: int,
    per_chip: int,
    label: str,
    emit: Callable[[tuple], Any],
) -> None:
    """The largest batch that fits, recorded in `result` (and sent after each compile)."""
    t0 = time.perf_counter()
    before = counts["compiles"]

    prefix = {"text": ""}

    def announce(n: int, size: int) -> None:
        prefix["text"] = f"batch search {n}/{MAX_SEARCH_COMPILES}: "

    def record() -> None:
        lo, hi = search.bounds()
        result.max_batch = (
            lo if lo is not None else (0 if hi is not None and hi <= devices else None)
        )
        result.max_batch_exact = hi is not None and (lo or 0) + devices >= hi
        result.first_oom_batch = hi
        result.search_compiles = counts["compiles"] - before
        result.search_seconds = time.perf_counter() - t0
        result.search = [
            {
                "batch": b,
                "status": o.status,
                "memory_per_chip": _scale(o.memory_bytes, per_chip),
                "cached": o.cached,
            }
            for b, o in sorted(search.points.items())
        ]

    def report() -> None:
        record()
        emit(("target", label, dataclasses.replace(result), False))

    search = BatchSearch(
        lambda size: _safe(lambda b: compile_at(b, prefix["text"]), size),
        granularity=devices,
        capacity=first.available_bytes or capacity,
        deadline=time.perf_counter() + job.time_budget_s,
        ceiling=first.batch * MAX_BATCH_FACTOR,
        on_compile=announce,
        on_result=report,
    )
    search.run(first)
    record()
    result.search_method = search.method
    result.cached = result.cached and counts["cached"]
    result.phases["search"] = result.search_seconds


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


def _fill_figures(
    result: TargetForecast, outcome: CompileOutcome, per_chip: int, devices: int
) -> None:
    """One compile's per-device figures as per-chip memory and per-slice FLOPs and bytes."""
    if outcome.available_bytes:
        result.available_per_chip = outcome.available_bytes * per_chip
    result.memory_per_chip = _scale(outcome.memory_bytes, per_chip)
    result.attention_kind = _attention_kind(outcome)
    result.attention_fallbacks = list(outcome.attention_fallbacks)
    result.remat_regions = outcome.remat_regions
    if outcome.status == "oom":
        result.status = "does not fit"
        result.fits = False
        result.message = " ".join(filter(None, (outcome.message, result.message)))
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
    result.compiler_flops = _scale(outcome.compiler_flops, devices)
    result.matmul_flops = _scale(outcome.matmul_flops, devices)
    result.attention_flops = _scale(outcome.attention_flops, devices)
    result.collective_bytes_per_chip = _scale(outcome.ici_bytes, per_chip)
    result.collective_async_bytes_per_chip = _scale(outcome.async_ici_bytes, per_chip)
    result.collectives = {
        kind: {k: v * per_chip if k.endswith("bytes") else v for k, v in figures.items()}
        for kind, figures in outcome.collectives.items()
    }
    result.custom_calls = dict(outcome.custom_calls)
    if outcome.optimal_seconds is not None and outcome.optimal_seconds > 0:
        result.compiler_seconds = outcome.optimal_seconds


def _price_all(
    result: TargetForecast,
    chip: Chip,
    tokens_per_step: float | None,
    price: str,
    floor: StepFloor | None = None,
    step: StepCount | None = None,
) -> None:
    """Price a target and, for a step that does not fit, its checkpointed variant."""
    _price(result, chip, tokens_per_step, price, floor, step)
    if result.checkpointed is not None:
        _price(result.checkpointed, chip, tokens_per_step, price, floor, step)


def _step_count(job: _Job) -> Any:
    """The user's step counted once on the meta device (`count_meta_step`): its dispatched
    ops set the per-step floor. Best-effort: a model that cannot run on the meta device
    gets no per-op floor (None), and the forecast goes on."""
    if not job.counted:
        job.counted = True
        from ..measure.flops import count_meta_step

        (args, kwargs), targets = _batch_parts(job.layout)
        try:
            job.step_count = count_meta_step(
                job.model, args, kwargs, targets, job.loss_fn or default_loss, job.dtype
            )
        except Exception:  # an op without a meta kernel: no op count, no per-op floor
            job.step_count = None
    return job.step_count


def _batch_parts(layout: Any) -> tuple[tuple[tuple[Any, ...], dict[str, Any]], Any]:
    from torch.utils import _pytree as pytree

    (args, kwargs), targets = pytree.tree_unflatten(layout.leaves, layout.spec)
    return (tuple(args), dict(kwargs)), targets


def _floor(job: _Job, chip: Chip, chips: int) -> StepFloor | None:
    """The per-step floor on `chips` of `chip` for the framework a PyTorch user runs there
    (pricing/step_floor.py): the counted step's ops dispatched one by one, and the batch fed
    over the host link."""
    from ..pricing.step_floor import step_floor
    from ..pricing.utilisation import default_framework

    if chip.kind not in ("tpu", "gpu"):
        return None
    framework = default_framework(chip.kind)
    count = _step_count(job)
    dtype = job.dtype
    batch_bytes = sum(
        t.numel() * (dtype.itemsize if dtype is not None and t.is_floating_point() else t.itemsize)
        for t in job.layout.tensors()
    )
    return step_floor(
        framework,
        chip.key,
        ops=count.kernel_ops if count is not None else None,
        input_bytes=float(batch_bytes),
        chips=chips,
    )


def _attention_kind(outcome: CompileOutcome) -> str | None:
    """How the compiled step runs attention: "flash" (the Pallas kernel: no score matrix
    held, a causal call skips the blocks above the diagonal), "full" (the whole score
    matrix, as the reference formula or an attention written out by hand), "mixed", or
    None when the step has no attention."""
    if outcome.attention_kind:
        return outcome.attention_kind
    return "full" if outcome.attention_flops else None


def _collective_seconds(result: TargetForecast, chip: Chip) -> float | None:
    """The time one chip's collectives need on ICI: bytes sent over the outgoing half of
    the chip's bidirectional ICI bandwidth (every link busy, so a lower bound)."""
    if result.status != "compiled" or result.collective_bytes_per_chip is None:
        return None
    if not result.collective_bytes_per_chip:
        return 0.0
    if not chip.ici_bandwidth:
        return None
    return result.collective_bytes_per_chip / (chip.ici_bandwidth / 2)


def _price(
    result: TargetForecast,
    chip: Chip,
    tokens_per_step: float | None,
    price: str,
    floor: StepFloor | None = None,
    step: StepCount | None = None,
) -> None:
    """The roofline bound, the expected step time and the costs (from the expected time),
    on the catalogue's figures for `chip`. The expected time is never below libtpu's own
    estimate of the step nor below the per-step `floor` (pricing/step_floor.py)."""
    from ..pricing.class_fit import expected_step_by_op
    from ..pricing.cost import cost_per_million_tokens, cost_per_step, roofline_seconds
    from ..pricing.step_floor import apply_floor, compiler_floor

    result.step_seconds = result.compute_seconds = result.memory_seconds = None
    result.collective_seconds = None
    result.cost_per_step = result.cost_per_1m_tokens = result.bound_cost_per_step = None
    result.expected_seconds = result.expected_low = result.expected_high = None
    result.expected_utilisation = result.expected_limited_by = None
    result.expected_framework = result.expected_ceiling_seconds = None
    result.expected_source = None
    result.floor_seconds = None
    result.expected_notes = []
    if result.status != "compiled":
        return
    if result.flops is None or result.bytes_accessed is None or result.flops < 0:
        result.message = (
            result.message or "the compiler gave no FLOP or byte count, so no step time"
        )
        return
    flops_chip = max(0.0, result.flops / result.chips)
    bytes_chip = max(0.0, result.bytes_accessed / result.chips)
    result.compute_seconds = flops_chip / chip.peak_bf16_flops
    result.memory_seconds = bytes_chip / chip.hbm_bandwidth
    result.collective_seconds = _collective_seconds(result, chip)
    result.step_seconds = max(
        roofline_seconds(flops_chip, bytes_chip, chip), result.collective_seconds or 0.0
    )
    result.bound_cost_per_step = cost_per_step(result.step_seconds, chip, result.chips, price)
    # a CNN, encoder or U-Net whose step was counted is costed op by op, as the profiler
    # costs it (pricing/class_fit.py); any other step by the LLM fit
    features = _features(result, chip, result.chips, tokens_per_step, step)
    expected = expected_step_by_op(features, chip)
    seconds = result.step_seconds
    if expected is not None:
        expected = apply_floor(
            apply_floor(expected, floor), compiler_floor(result.compiler_seconds)
        )
    if expected is not None and expected.kind == "bound":
        # Nothing calibrates a figure, or a floor is longer: the row stays a bound, its
        # notes say why.
        seconds = max(seconds, expected.seconds)
        if expected.limited_by in ("per-step floor", "compiler estimate"):
            result.floor_seconds = expected.seconds
        result.expected_limited_by, result.expected_notes = (
            expected.limited_by,
            list(expected.notes),
        )
    elif expected is not None:
        seconds = expected.seconds
        result.expected_seconds, result.expected_low = expected.seconds, expected.low
        result.expected_high, result.expected_utilisation = expected.high, expected.utilisation
        result.expected_framework = expected.framework
        result.expected_ceiling_seconds = expected.ceiling_seconds
        result.expected_source = expected.source
        result.expected_limited_by, result.expected_notes = (
            expected.limited_by,
            list(expected.notes),
        )
    result.cost_per_step = cost_per_step(seconds, chip, result.chips, price)
    if tokens_per_step:
        result.cost_per_1m_tokens = cost_per_million_tokens(
            seconds, tokens_per_step, chip, result.chips, price
        )


def _features(
    reference: TargetForecast,
    chip: Chip,
    chips: int,
    tokens_per_step: float | None,
    step: StepCount | None = None,
) -> Any:
    """What the utilisation model needs from a compiled target, for `chips` of `chip`; the
    step counted on the meta device (`step`) adds its precision and model class."""
    from ..pricing.utilisation import StepFeatures

    attention = getattr(reference, "attention_flops", None)
    collective = getattr(reference, "collective_seconds", None)
    flops = max(0.0, (reference.flops or 0.0) / chips)
    attention_chip = None if attention is None else attention / chips
    kind = getattr(reference, "attention_kind", None) or "full"
    if kind in ("flash", "mixed") and attention_chip:
        # The flash kernels run 9 products per block pair where the causal count has 6
        # (their backward recomputes the scores): the model's FLOPs leave the third out.
        flops -= attention_chip / 3
        attention_chip -= attention_chip / 3
        kind = "causal"
    return StepFeatures(
        chip=chip.key,
        chips=chips,
        flops_per_chip=flops,
        tokens_per_chip=tokens_per_step / chips if tokens_per_step else None,
        attention_flops_per_chip=attention_chip,
        attention=kind,
        bytes_per_chip=max(0.0, (reference.bytes_accessed or 0.0) / chips),
        collective_seconds=collective if chip.key == reference.target else None,
        traffic=step.traffic(chips) if step is not None else None,
        **{
            **(step.fit_inputs(chip.kind) if step is not None else {}),
            "matmul_share": getattr(reference, "matmul_share", None),  # the compiler's
        },
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
        sharding=failure.sharding,
    )


def _reference(results: list[TargetForecast]) -> TargetForecast | None:
    """The compiled target whose FLOPs and bytes cost the GPU rows (one device per chip first)."""
    compiled = [r for r in results if r.step_seconds is not None]
    single = [r for r in compiled if r.devices_per_chip == 1]
    found = single or compiled
    return found[0] if found else None


def _tpu_row(
    result: TargetForecast, chip: Chip, batch: int, tokens_per_step: float | None, price: str
) -> Any:
    from ..pricing.compare import ComparisonRow
    from ..views.format import format_bytes, format_seconds

    note = ""
    if result.status == "does not fit":
        note = (
            f"does not fit: needs {format_bytes(result.memory_per_chip)} per chip, "
            f"{format_bytes(result.capacity_per_chip)} usable"
        ) + result.checkpointing_text()
    elif result.status != "compiled":
        note = result.summary()
    elif result.bound:
        note = (
            f"{result.bound}-bound roofline; {format_bytes(result.memory_per_chip)} of "
            f"{format_bytes(result.capacity_per_chip)} usable HBM per chip"
        )
        if result.floor_seconds is not None:
            note += f"; at least {format_seconds(result.floor_seconds)}" + "".join(
                f"; {n}" for n in result.expected_notes
            )
        elif result.expected_utilisation is not None:
            note += f"; expected at {result.expected_utilisation:.0%} of peak" + "".join(
                f"; {n}" for n in result.expected_notes
            )
    if result.max_batch is not None:
        note += (
            f"; largest batch that fits: {result.max_batch}{'' if result.max_batch_exact else '+'}"
        )
    memory = None if result.memory_per_chip is None else int(result.memory_per_chip * result.chips)
    expected = result.expected_seconds is not None
    shown = result.step_seconds
    if shown is not None and result.floor_seconds is not None:
        shown = max(shown, result.floor_seconds)
    return ComparisonRow.build(
        chip,
        result.expected_seconds if expected else shown,
        "compiled",
        chips=result.chips,
        price=price,
        samples_per_step=batch,
        tokens_per_step=tokens_per_step,
        memory_bytes=memory,
        fits=result.fits,
        note=note,
        time_kind="expected" if expected else "bound",
        step_low=result.expected_low,
        step_high=result.expected_high,
        bound_seconds=result.step_seconds,
        flops_per_step=result.flops,
        framework=(result.expected_framework or "") if expected else "",
        ceiling_seconds=result.expected_ceiling_seconds if expected else None,
    )


def _gpu_row(
    reference: TargetForecast,
    gpu: Chip,
    batch: int,
    tokens_per_step: float | None,
    price: str,
    floor: StepFloor | None = None,
    step: StepCount | None = None,
) -> Any:
    """As many GPUs as the reference slice has chips, each doing its share of its FLOPs and
    bytes: the roofline bound on the GPU's peaks, and the expected time at the utilisation
    published GPU runs reach (the GPU's own, not the TPU's), never below the per-step
    `floor` (then the row is that floor, a bound)."""
    from ..pricing.class_fit import expected_step_by_op
    from ..pricing.compare import ComparisonRow
    from ..pricing.cost import roofline_seconds
    from ..pricing.step_floor import apply_floor
    from ..views.format import format_seconds

    assert reference.flops is not None and reference.bytes_accessed is not None
    chips = reference.chips
    bound = roofline_seconds(
        max(0.0, reference.flops / chips), max(0.0, reference.bytes_accessed / chips), gpu
    )
    expected = expected_step_by_op(_features(reference, gpu, chips, tokens_per_step, step), gpu)
    if expected is not None:
        expected = apply_floor(expected, floor)
    floored = expected is not None and floor is not None and expected.limited_by == floor.kind
    floor_notes: list[str] = []
    if expected is not None and expected.kind == "bound":
        floor_notes = list(expected.notes) if floored else []
        bound, expected = max(bound, expected.seconds), None
    memory = None
    fits = None
    if reference.devices_per_chip == 1 and reference.memory_per_chip:
        memory = int(reference.memory_per_chip * chips)
        fits = reference.memory_per_chip <= gpu.hbm_bytes
    note = f"on {reference.label}'s compiled FLOPs and bytes"
    if floor_notes:
        note = f"at least {format_seconds(bound)} {note}" + "".join(f"; {n}" for n in floor_notes)
    elif expected is not None:
        note = f"expected at {expected.utilisation:.0%} of peak {note}" + "".join(
            f"; {n}" for n in expected.notes
        )
    else:
        note = f"roofline {note}"
    return ComparisonRow.build(
        gpu,
        expected.seconds if expected else bound,
        "estimated",
        chips=chips,
        price=price,
        samples_per_step=batch,
        tokens_per_step=tokens_per_step,
        memory_bytes=memory,
        fits=fits,
        note=note,
        time_kind="expected" if expected else "bound",
        step_low=expected.low if expected else None,
        step_high=expected.high if expected else None,
        bound_seconds=bound,
        flops_per_step=reference.flops,
        framework=expected.framework if expected else "",
        ceiling_seconds=expected.ceiling_seconds if expected else None,
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
