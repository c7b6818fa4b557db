"""What a measurement produced and how to cost it: plain records shared by the timer, which
fills them, and `result.py`, which turns them into a `ProfileResult`.

Kept apart from both so that neither imports the other's module to name a record.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu2tpu.backends import Backend

    from ..pricing.catalogue import HardwareCatalogue
    from .flops import StepCount

DEFAULT_TARGETS = ("v5e", "v6e", "v5p", "tpu7x", "a100-80gb", "h100")


class ProfileError(ValueError):
    """Arguments the profiler cannot work with; the message names the argument."""


@dataclass(frozen=True)
class StepStats:
    """Summary of steady step times in seconds; `spread` is (p90 - p10) / median."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float

    @property
    def spread(self) -> float:
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "n": self.n,
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "spread": self.spread,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default."""
    if not values:
        raise ValueError("percentile of no values.")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times: Sequence[float]) -> StepStats:
    """Median, p10, p90, mean, min and max of step times."""
    if not times:
        raise ValueError("no step times to summarize.")
    return StepStats(
        n=len(times),
        median=statistics.median(times),
        p10=percentile(times, 10),
        p90=percentile(times, 90),
        mean=statistics.fmean(times),
        min=min(times),
        max=max(times),
    )


def check_count(value: Any, name: str, minimum: int) -> int:
    """`value` as a whole number of at least `minimum`, or a ProfileError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{name} must be a whole number, not {value!r}.")
    if value < minimum:
        raise ProfileError(f"{name} must be at least {minimum}, got {value}.")
    return value


def check_optional_positive(value: Any, name: str) -> float | None:
    """None, or `value` as a positive float; a ProfileError naming `name` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ProfileError(f"{name} must be a positive number, not {value!r}.")
    return float(value)


@dataclass
class RunRecord:
    """What a measurement produced, before it is costed and compared (`result.build_result` does)."""

    backend: Backend
    warmup_times: list[float]
    step_times: list[float]
    group_size: int
    timed_wall_seconds: float
    timer_floor: float
    count: StepCount | None
    compilations_warmup: int | None
    compilations_timed: int | None
    memory_peak_bytes: int | None
    memory_kind: str
    notes: list[str]
    host_syncs_timed: int | None = None
    # Seconds the runtime itself reports compiling (XLA's CompileTime), None where unknown.
    compile_seconds_warmup: float | None = None
    compile_seconds_timed: float | None = None


@dataclass(frozen=True)
class Costing:
    """How to cost and compare a run: everything `profile()` takes besides the step itself."""

    tokens_per_step: float | None = None
    samples_per_step: float | None = None
    compare_to: Any = None
    targets: Iterable[str | tuple[str, int]] = DEFAULT_TARGETS
    baseline: str | None = None
    dataset_size: int | None = None
    prices: Mapping[str, Mapping[str, Any]] | str | Path | None = None
    price: str = "on_demand"
    chips: int | None = None
    catalogue: HardwareCatalogue | None = None
    flops_per_step: float | None = None
    bytes_per_step: float | None = None
    token_budget: float | None = None

    def validated(self) -> Costing:
        check_optional_positive(self.tokens_per_step, "tokens_per_step")
        check_optional_positive(self.samples_per_step, "samples_per_step")
        check_optional_positive(self.token_budget, "token_budget")
        if self.dataset_size is not None:
            check_count(self.dataset_size, "dataset_size", 1)
        if self.chips is not None:
            check_count(self.chips, "chips", 1)
        if self.price not in ("on_demand", "spot"):
            raise ProfileError(f"price must be 'on_demand' or 'spot', not {self.price!r}.")
        for name in ("flops_per_step", "bytes_per_step"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise ProfileError(f"{name} must be a non-negative number, not {value!r}.")
        if isinstance(self.targets, str):
            raise ProfileError(
                f"targets must be a list of chip keys such as ['v5e', 'h100'], not the string "
                f"{self.targets!r}."
            )
        return self
