"""The profiler's overhead on a 10 ms step, as a ratio to a bare loop (goal: under 2%).

The bare loop is what a careful person writes by hand: `step(); synchronize()` per step,
one clock reading around the loop. Against it, in the same run and interleaved round by
round (so machine load hits both alike):

- `profile()`'s timed loop (its own wall time for the timed steps), and
- the `Profiler` loop form (`prof.step()` after every step), timed around the loop.

The fixed costs outside the loop (warm-up steps, the one counted step, costing) are printed
apart: they do not grow with the number of steps. On a loaded machine the 10 ms loops jitter
by a percent or two either way, so the script also times the bookkeeping alone: an empty
step with `prof.step()` against an empty step with `synchronize()`, many thousand times,
which gives the profiler's own cost per step however busy the machine is.

    python benchmarks/profiler_overhead.py [--steps 50] [--rounds 5] [--step spin|sleep|matmul]

`spin` (default) busy-waits 10 ms, so the step itself has no jitter and any difference is the
profiler's; `sleep` and `matmul` are closer to real work and noisier.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def make_step(kind: str, seconds: float) -> Callable[[], object]:
    if kind == "spin":

        def spin() -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

        return spin
    if kind == "sleep":
        return lambda: time.sleep(seconds)
    import torch

    n = 256
    a, b = torch.randn(n, n), torch.randn(n, n)
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    per = (time.perf_counter() - t0) / 20
    reps = max(1, round(seconds / per))

    def matmul() -> None:
        for _ in range(reps):
            a @ b

    return matmul


def bare_loop(step: Callable[[], object], sync: Callable[[], None], n: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
        sync()
    return time.perf_counter() - t0


def bookkeeping_per_step(backend: object, n: int = 20000) -> float:
    """Seconds `prof.step()` costs beyond a bare `synchronize()`, on an empty step (best of 5)."""
    from gpu2tpu.measure import Profiler

    sync = backend.synchronize  # type: ignore[attr-defined]
    extra = []
    for _ in range(5):
        bare = bare_loop(lambda: None, sync, n)
        with Profiler(warmup=0, backend=backend, count_flops=False) as prof:
            t0 = time.perf_counter()
            for _ in range(n):
                prof.step()
            looped = time.perf_counter() - t0
        extra.append((looped - bare) / n)
    return max(0.0, min(extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--step", choices=("spin", "sleep", "matmul"), default="spin")
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()

    from gpu2tpu.measure import Profiler, profile
    from gpu2tpu.measure.timer import resolve_backend

    backend = resolve_backend(args.backend)
    sync = backend.synchronize
    step = make_step(args.step, args.step_ms / 1e3)
    n = args.steps
    # one untimed round first: imports, the catalogue, the host peak measurement
    profile(step, steps=2, warmup=0, backend=backend, count_flops=False)

    bare, timed, loop, call_fixed, form_fixed = [], [], [], [], []
    for _ in range(args.rounds):
        bare.append(bare_loop(step, sync, n))

        t0 = time.perf_counter()
        result = profile(step, steps=n, warmup=1, backend=backend, count_flops=False)
        call = time.perf_counter() - t0
        timed.append(result.timed_wall_seconds)
        call_fixed.append(call - result.timed_wall_seconds - sum(result.warmup_times))

        t0 = time.perf_counter()
        with Profiler(warmup=0, backend=backend, count_flops=False) as prof:
            t1 = time.perf_counter()
            for _ in range(n):
                step()
                prof.step()
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        loop.append(t2 - t1)
        form_fixed.append((t1 - t0) + (t3 - t2))

    ratios_call = [t / b for t, b in zip(timed, bare, strict=True)]
    ratios_loop = [t / b for t, b in zip(loop, bare, strict=True)]
    r_call, r_loop = statistics.median(ratios_call), statistics.median(ratios_loop)
    print(
        f"step: {args.step} {args.step_ms:g} ms, {n} steps x {args.rounds} rounds, "
        f"backend {backend.name}"
    )
    print(
        f"bare loop (step + synchronize):  {statistics.median(bare) * 1e3:9.2f} ms (median round)"
    )
    print(
        f"profile() timed loop:            {statistics.median(timed) * 1e3:9.2f} ms  "
        f"ratio {r_call:.5f} ({(r_call - 1) * 100:+.3f}%)"
    )
    print(
        f"Profiler loop form:              {statistics.median(loop) * 1e3:9.2f} ms  "
        f"ratio {r_loop:.5f} ({(r_loop - 1) * 100:+.3f}%)"
    )
    print(
        f"fixed costs outside the loop: profile() {statistics.median(call_fixed) * 1e3:.1f} ms "
        f"per call (besides its warm-up step), Profiler enter+exit "
        f"{statistics.median(form_fixed) * 1e3:.1f} ms"
    )
    best_call = min(timed) / min(bare)
    best_loop = min(loop) / min(bare)
    print(f"least-disturbed rounds: profile() {best_call:.5f}, Profiler {best_loop:.5f}")
    per_step = bookkeeping_per_step(backend)
    print(
        f"bookkeeping per step (empty step, prof.step() vs synchronize()): "
        f"{per_step * 1e6:.3f} µs = {per_step / (args.step_ms / 1e3) * 100:.4f}% of a "
        f"{args.step_ms:g} ms step"
    )
    worst = max(r_call, r_loop)
    print(
        f"goal: under 2% per step -> {'met' if worst < 1.02 else 'NOT met'} (worst ratio {worst:.5f})"
    )


if __name__ == "__main__":
    main()
