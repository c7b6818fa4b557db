"""Timing training steps: `StepTimer`, `profile(step_fn)`, the `Profiler` loop form, `cell_profile`.

Every lap is bracketed by the backend's synchronize, because accelerators run asynchronously
and a bare host clock would time the launch, not the work. Warm-up steps (where compilation
happens) are timed apart from steady steps. A step so short that the clock and the
synchronize themselves weigh on it is re-timed in groups of many steps, and the result says
so. Nothing is reported as measured for a run whose step raised: the error propagates with
its own traceback.

The hot loop does only `step(); synchronize(); perf_counter(); append` so that the profiler
costs the same as a hand-written loop with a synchronize per step (benchmarks/profiler_overhead.py).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .records import (
    DEFAULT_TARGETS,
    Costing,
    ProfileError,
    RunRecord,
    check_count,
)

if TYPE_CHECKING:
    from gpu2tpu.backends import Backend

    from ..pricing.catalogue import HardwareCatalogue
    from .flops import StepCount
    from .result import ProfileResult

# A step must be this many times longer than one timer reading (synchronize + clock) for a
# per-step time to be trusted to about 1%; shorter steps are timed in groups.
RESOLUTION_FACTOR = 100
# ...and never shorter than this, whatever the timer overhead (clock granularity, jitter).
MIN_TRUSTED_STEP_S = 20e-6
# A group of steps is sized to last at least this long.
GROUP_TARGET_S = 2e-3
# Re-timing a very fast step never takes longer than this.
MAX_RETIME_S = 2.0


class StepTimer:
    """Laps between synchronize points: `start()`, then `lap()` after every step.

    `synchronize` waits for queued device work (the backend's); `clock` is a monotonic
    clock in seconds. `lap()` returns the time since the previous lap and keeps it.
    """

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._sync = synchronize or _no_sync
        self._clock = clock
        self._last: float | None = None
        self.times: list[float] = []

    def start(self) -> None:
        """Synchronize, then mark the start of the next lap."""
        self._sync()
        self._last = self._clock()

    def lap(self) -> float:
        """Synchronize, record the time since the last mark, and mark again."""
        self._sync()
        now = self._clock()
        if self._last is None:
            raise RuntimeError("StepTimer.lap() was called before StepTimer.start().")
        elapsed = now - self._last
        self._last = now
        self.times.append(elapsed)
        return elapsed

    def reset(self) -> None:
        self._last = None
        self.times = []

    def reading_cost(self, samples: int = 64) -> float:
        """Median seconds one reading (synchronize + clock) costs: the timer's floor."""
        sync, clock = self._sync, self._clock
        costs = []
        for _ in range(samples):
            t0 = clock()
            sync()
            t1 = clock()
            costs.append(t1 - t0)
        resolution = (
            time.get_clock_info("perf_counter").resolution if clock is time.perf_counter else 0
        )
        return max(statistics.median(costs), resolution)


def _no_sync() -> None:
    return None


# -- backends -----------------------------------------------------------------------------


def resolve_backend(backend: str | Backend | None) -> Backend:
    """A backend object for a name, an object, or None (auto; the GPU when CUDA is here)."""
    from gpu2tpu.backends import Backend, get_backend

    if isinstance(backend, Backend):
        return backend
    if backend is None:
        chosen = get_backend("auto")
        if chosen.name == "cpu":
            import torch

            if torch.cuda.is_available():
                return get_backend("cuda")
        return chosen
    if not isinstance(backend, str):
        raise ProfileError(f"backend must be a name such as 'cpu' or a Backend, not {backend!r}.")
    return get_backend(backend)


def _count(backend: Backend) -> int | None:
    try:
        return backend.compilation_count()
    except Exception:  # a runtime that cannot count must not stop the measurement
        return None


def _compile_seconds(backend: Backend) -> float | None:
    """Seconds the runtime has spent compiling so far (XLA's CompileTime), if it keeps that."""
    try:
        return backend.compilation_seconds()
    except Exception:  # a runtime that cannot tell must not stop the measurement
        return None


def _emulated(backend: Backend) -> bool:
    """Whether the CPU runs the step in place of a TPU: every tensor read then counts as a
    host sync, as in the dry run (measure/syncs.py)."""
    return backend.name == "cpu"


def _diff(after: Any, before: Any) -> Any:
    return None if after is None or before is None else after - before


def _memory_peak(backend: Backend) -> tuple[int | None, str]:
    try:
        info = backend.memory()
    except Exception:  # a runtime that cannot report memory must not stop the measurement
        return None, "unknown"
    if info is None or info.peak_bytes is None:
        return None, "unknown"
    return int(info.peak_bytes), "host RSS" if backend.name == "cpu" else "device"


def _reset_peak(backend: Backend) -> None:
    # A runtime that cannot reset its peak still runs; the window then covers the process.
    with contextlib.suppress(Exception):
        backend.reset_peak_memory()


def _count_step(step: Callable[[], Any], backend: Backend) -> tuple[StepCount | None, str | None]:
    from .flops import count_step

    try:
        return count_step(step, emulated=_emulated(backend)), None
    except Exception as exc:  # counting is best-effort; the timed steps still run the step
        return None, f"FLOPs were not counted ({type(exc).__name__}: {exc})."


def profile(
    step_fn: Callable[..., Any],
    *args: Any,
    steps: int = 20,
    warmup: int = 3,
    backend: str | Backend | None = None,
    tokens_per_step: float | None = None,
    samples_per_step: float | None = None,
    compare_to: Any = None,
    targets: Iterable[str | tuple[str, int]] = DEFAULT_TARGETS,
    baseline: str | None = None,
    dataset_size: int | None = None,
    prices: Mapping[str, Mapping[str, Any]] | str | Path | None = None,
    price: str = "on_demand",
    chips: int | None = None,
    catalogue: HardwareCatalogue | None = None,
    count_flops: bool = True,
    count_syncs: bool = False,
    flops_per_step: float | None = None,
    bytes_per_step: float | None = None,
    progress: bool | None = None,
    trace: bool | str | Path | None = None,
) -> ProfileResult:
    """Time `step_fn(*args)` and set it beside other chips in time and money.

    Runs `warmup` steps (compilation lands here, timed apart), one untimed step under
    PyTorch's FlopCounterMode (FLOPs, bytes moved, host syncs; skipped with
    `count_flops=False` or when `flops_per_step` is given), then `steps` timed steps with
    the backend's synchronize after each. `count_syncs=True` also counts host syncs in the
    timed steps themselves, which slows them, so it is off by default.

    Costs use the catalogue's `price` column ("on_demand" or "spot") with `prices`
    overrides; `targets` are chip keys (or `(key, chips)` / "key:chips") estimated from the
    measured run; `compare_to` is a baseline file saved with `result.save_baseline(path)`
    (or a ProfileResult); `baseline` picks the chip the ratios are against.

    `progress`: a live bar with the steps done and the time left (in a notebook kernel and on
    a terminal; None shows it once a run has lasted half a second, False never). `trace`:
    one more step op by op under torch.profiler, its per-op table in `result.trace` and its
    Chrome trace written to the path given (True: a new file in the working directory).
    """
    steps = check_count(steps, "steps", 1)
    warmup = check_count(warmup, "warmup", 0)
    if not callable(step_fn):
        raise ProfileError(f"step_fn must be callable, not {type(step_fn).__name__}.")
    costing = Costing(
        tokens_per_step=tokens_per_step,
        samples_per_step=samples_per_step,
        compare_to=compare_to,
        targets=targets,
        baseline=baseline,
        dataset_size=dataset_size,
        prices=prices,
        price=price,
        chips=chips,
        catalogue=catalogue,
        flops_per_step=flops_per_step,
        bytes_per_step=bytes_per_step,
    ).validated()
    be = resolve_backend(backend)

    def step() -> Any:
        return step_fn(*args)

    counting = count_flops and flops_per_step is None
    tracing = trace is not None and trace is not False
    from .progress import StepProgress

    total = warmup + int(counting) + steps + int(tracing)
    bar = StepProgress(total, mode="off" if progress is False else None)
    if progress:
        bar.delay = 0.0
    with bar:
        record = measure(
            step,
            backend=be,
            steps=steps,
            warmup=warmup,
            count_flops=counting,
            count_syncs=count_syncs,
            progress=bar,
        )
        traced = _trace(step, be, trace, bar) if tracing else None
    from .result import build_result

    result = build_result(record, costing)
    result.trace = traced
    return result


def _trace(step: Callable[[], Any], backend: Backend, trace: Any, bar: Any) -> Any:
    """One more step under torch.profiler (`profile(trace=...)`): the per-op table and trace."""
    from .trace import default_trace_path, trace_step

    bar.start_phase("tracing")
    path = default_trace_path() if trace is True or trace == "" else Path(trace)
    traced = trace_step(
        step,
        synchronize=backend.synchronize,
        backend=backend.name,
        path=path,
        cuda=backend.name == "cuda",
    )
    bar.step()
    return traced


def measure(
    step: Callable[[], Any],
    *,
    backend: Backend,
    steps: int,
    warmup: int,
    count_flops: bool = True,
    count_syncs: bool = False,
    progress: Any = None,
) -> RunRecord:
    """Warm up, count one step, time `steps` steps; re-time in groups if they are too fast.

    `progress` (a `StepProgress`) is told each step done; the timed loop only appends to the
    list it watches."""
    from .progress import StepProgress

    bar = progress if progress is not None else StepProgress(0, mode="off")
    timer = StepTimer(backend.synchronize)
    notes: list[str] = []
    _reset_peak(backend)
    c0, s0 = _count(backend), _compile_seconds(backend)

    timer.start()
    for _ in range(warmup):
        step()
        timer.lap()
        bar.step()
    warmup_times = list(timer.times)

    count = None
    if count_flops:
        bar.start_phase("counting FLOPs")
        count, why = _count_step(step, backend)
        if why:
            notes.append(why)
        backend.synchronize()
        bar.step()
    c1, s1 = _count(backend), _compile_seconds(backend)

    floor = timer.reading_cost()
    sync_counter = None
    if count_syncs:
        from .flops import HostSyncCounter

        sync_counter = HostSyncCounter(emulated=_emulated(backend))
        sync_counter.__enter__()
    try:
        timer.reset()
        sync, clock = backend.synchronize, time.perf_counter
        times = timer.times
        bar.start_phase("timed")
        bar.watch(times)
        sync()
        wall0 = last = clock()
        for _ in range(steps):
            step()
            sync()
            now = clock()
            times.append(now - last)
            last = now
        wall = last - wall0
    finally:
        bar.unwatch()
        if sync_counter is not None:
            sync_counter.__exit__(None, None, None)
    step_times = list(times)
    group = 1

    median = statistics.median(step_times)
    threshold = max(RESOLUTION_FACTOR * floor, MIN_TRUSTED_STEP_S)
    if median < threshold:
        group = max(
            2, math.ceil(max(GROUP_TARGET_S, RESOLUTION_FACTOR * floor) / max(median, 1e-9))
        )
        samples = steps
        if group * samples * median > MAX_RETIME_S:
            samples = max(5, int(MAX_RETIME_S / (group * max(median, 1e-9))))
        bar.start_phase(f"re-timing in groups of {group}")
        step_times, wall = _grouped(step, sync, group, samples)
        notes.append(
            f"A step takes about {median * 1e6:.1f} µs, close to the timer's own cost "
            f"({floor * 1e6:.2f} µs per synchronize and clock reading), so each time is the mean "
            f"of a group of {group} steps ({samples} groups, {group * samples} steps timed)."
        )
    c2, s2 = _count(backend), _compile_seconds(backend)
    memory_peak, memory_kind = _memory_peak(backend)
    return RunRecord(
        backend=backend,
        warmup_times=warmup_times,
        step_times=step_times,
        group_size=group,
        timed_wall_seconds=wall,
        timer_floor=floor,
        count=count,
        compilations_warmup=_diff(c1, c0),
        compilations_timed=_diff(c2, c1),
        memory_peak_bytes=memory_peak,
        memory_kind=memory_kind,
        notes=notes,
        host_syncs_timed=None if sync_counter is None else sync_counter.count,
        compile_seconds_warmup=_diff(s1, s0),
        compile_seconds_timed=_diff(s2, s1),
    )


def _grouped(
    step: Callable[[], Any], sync: Callable[[], None], group: int, samples: int
) -> tuple[list[float], float]:
    clock = time.perf_counter
    times = []
    sync()
    wall0 = last = clock()
    for _ in range(samples):
        for _ in range(group):
            step()
        sync()
        now = clock()
        times.append((now - last) / group)
        last = now
    return times, last - wall0


def cell_profile(
    run_cell: Callable[[], object],
    *,
    backend: str | Backend | None,
    steps: int = 10,
    warmup: int = 2,
    **kw: Any,
) -> ProfileResult:
    """Profile a notebook cell for `%%tpu --profile`: the cell is run as the step.

    `run_cell()` runs the cell's (already rewritten) code once; it is called `warmup` times,
    once more to count FLOPs, then `steps` timed times, so the cell should hold one training
    step. `**kw` are `profile()`'s keywords (tokens_per_step, targets, prices, ...). An error
    in the cell propagates unchanged; nothing is reported for it.
    """
    return profile(run_cell, steps=steps, warmup=warmup, backend=backend, **kw)


class Profiler:
    """The loop form, for training loops that already exist.

    ```
    with Profiler(warmup=2, tokens_per_step=4096) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
    print(prof.result)
    ```
    The first `warmup` steps are warm-up; with `count_flops=True` the step after them runs
    under the FLOP counter and is left out of the timing; `steps`, if given, stops the
    timing after that many timed steps (later `prof.step()` calls cost nothing). If the loop
    raises, the error propagates and there is no result.
    """

    def __init__(
        self,
        *,
        warmup: int = 2,
        steps: int | None = None,
        backend: str | Backend | None = None,
        count_flops: bool = True,
        **costing: Any,
    ) -> None:
        self.warmup = check_count(warmup, "warmup", 0)
        self.steps = None if steps is None else check_count(steps, "steps", 1)
        self.count_flops = count_flops and costing.get("flops_per_step") is None
        try:
            self.costing = Costing(**costing).validated()
        except TypeError as exc:
            raise ProfileError(f"Profiler got an unknown keyword: {exc}.") from None
        self._backend_arg = backend
        self._result: ProfileResult | None = None
        self._failed: BaseException | None = None
        self._active = False

    def __enter__(self) -> Profiler:
        self.backend = resolve_backend(self._backend_arg)
        self._sync = self.backend.synchronize
        self._clock = time.perf_counter
        self._warm: list[float] = []
        self._times: list[float] = []
        self._counter: Any = None
        self._count: StepCount | None = None
        self._notes: list[str] = []
        self._n = 0
        self._result = None
        self._failed = None
        _reset_peak(self.backend)
        self._c0 = _count(self.backend)
        self._c1: int | None = None
        self._s0 = _compile_seconds(self.backend)
        self._s1: float | None = None
        self._floor = StepTimer(self._sync).reading_cost(32)
        self._active = True
        if self.warmup == 0:
            self._after_warmup()  # the first step is the counted one
        self._sync()
        self._last = self._clock()
        return self

    def step(self) -> None:
        """Mark the end of one step (synchronizes with the device)."""
        if not self._active:
            raise RuntimeError("Profiler.step() was called outside its `with` block.")
        n = self._n
        if self.steps is not None and len(self._times) >= self.steps:
            return
        self._sync()
        now = self._clock()
        elapsed = now - self._last
        self._n = n + 1
        if n < self.warmup:
            self._warm.append(elapsed)
            if n + 1 == self.warmup:
                self._after_warmup()
        elif self._counter is not None:
            self._finish_count()
            self._c1, self._s1 = _count(self.backend), _compile_seconds(self.backend)
        else:
            self._times.append(elapsed)
        self._last = self._clock()

    def _after_warmup(self) -> None:
        if self.count_flops:
            from .flops import StepCounter

            self._counter = StepCounter(emulated=_emulated(self.backend))
            self._counter.__enter__()
        else:
            self._c1, self._s1 = _count(self.backend), _compile_seconds(self.backend)

    def _finish_count(self) -> None:
        counter, self._counter = self._counter, None
        try:
            counter.__exit__(None, None, None)
            self._count = counter.result()
        except Exception as exc:  # counting is best-effort
            self._notes.append(f"FLOPs were not counted ({type(exc).__name__}: {exc}).")

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self._active = False
        if self._counter is not None:
            counter, self._counter = self._counter, None
            counter.__exit__(exc_type, exc, tb)
        if exc is not None:
            self._failed = exc
            return False
        if not self._times:
            self._failed = ProfileError(
                f"the Profiler saw {self._n} step() calls: {self.warmup} warm-up"
                f"{' + 1 counted' if self.count_flops else ''} and no timed step; "
                "call prof.step() after every step and run more steps."
            )
            raise self._failed
        if self._c1 is None:
            self._c1, self._s1 = _count(self.backend), _compile_seconds(self.backend)
        memory_peak, memory_kind = _memory_peak(self.backend)
        record = RunRecord(
            backend=self.backend,
            warmup_times=self._warm,
            step_times=self._times,
            group_size=1,
            timed_wall_seconds=sum(self._times),
            timer_floor=self._floor,
            count=self._count,
            compilations_warmup=_diff(self._c1, self._c0),
            compilations_timed=_diff(_count(self.backend), self._c1),
            memory_peak_bytes=memory_peak,
            memory_kind=memory_kind,
            notes=self._notes,
            compile_seconds_warmup=_diff(self._s1, self._s0),
            compile_seconds_timed=_diff(_compile_seconds(self.backend), self._s1),
        )
        median = statistics.median(self._times)
        if median < max(RESOLUTION_FACTOR * self._floor, MIN_TRUSTED_STEP_S):
            record.notes.append(
                f"A step takes about {median * 1e6:.1f} µs, close to the timer's own cost "
                f"({self._floor * 1e6:.2f} µs per reading): the loop form cannot group steps, "
                "so use profile(step_fn) to time a step this short."
            )
        from .result import build_result

        self._result = build_result(record, self.costing)
        return False

    @property
    def result(self) -> ProfileResult:
        """The measured result; raises if the block raised or has not finished."""
        if self._failed is not None:
            raise RuntimeError(
                "the profiled loop did not finish, so nothing was measured."
            ) from self._failed
        if self._result is None:
            raise RuntimeError("Profiler.result is ready only after the `with` block ends.")
        return self._result
