"""The cost model: roofline time on a chip, and money per step and per 1M tokens.

Pure arithmetic on catalogue figures, so every number in a comparison can be recomputed by
hand from the table and the formula in docs/profiler.md. Costs follow the common convention
(tgarg01/silybench-data; docs/profiler.md, "How the cost numbers are made"): `$ / 1M tokens =
price_per_chip_hour * chips / (tokens_per_s * 3600) * 1e6`.
"""

from __future__ import annotations

import math

from .catalogue import Chip

SECONDS_PER_HOUR = 3600.0


def _check_non_negative(value: float, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}.")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}.")
    return float(value)


def _check_chips(chips: int) -> int:
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips must be a whole number of at least 1, not {chips!r}.")
    return chips


def roofline_seconds(
    flops: float, bytes_accessed: float, chip: Chip, efficiency: float = 1.0
) -> float:
    """The time a step needs on `chip`: the larger of compute and memory time, / efficiency.

    `max(flops / peak_bf16_flops, bytes_accessed / hbm_bandwidth) / efficiency`. With
    efficiency 1.0 this is the roofline's lower bound; a measured run gives the efficiency
    (docs/profiler.md). A bound that the chip cannot give (no peak for the host CPU) raises.
    """
    flops = _check_non_negative(flops, "flops")
    bytes_accessed = _check_non_negative(bytes_accessed, "bytes_accessed")
    if not (0 < efficiency <= 1):
        raise ValueError(f"efficiency must be in (0, 1], not {efficiency!r}.")
    if flops > 0 and chip.peak_bf16_flops <= 0:
        raise ValueError(f"{chip.name} has no peak FLOP/s in the catalogue, so no roofline.")
    if bytes_accessed > 0 and chip.hbm_bandwidth <= 0:
        raise ValueError(f"{chip.name} has no memory bandwidth in the catalogue, so no roofline.")
    compute = flops / chip.peak_bf16_flops if flops else 0.0
    memory = bytes_accessed / chip.hbm_bandwidth if bytes_accessed else 0.0
    return max(compute, memory) / efficiency


def price_per_hour(chip: Chip, chips: int = 1, price: str = "on_demand") -> float | None:
    """USD per hour for `chips` chips in the price column, or None without a public price."""
    per_chip = chip.price(price)
    return None if per_chip is None else per_chip * _check_chips(chips)


def cost_per_step(
    step_seconds: float, chip: Chip, chips: int = 1, price: str = "on_demand"
) -> float | None:
    """USD for one step of `step_seconds` on `chips` chips; None where no price is known."""
    step_seconds = _check_non_negative(step_seconds, "step_seconds")
    hourly = price_per_hour(chip, chips, price)
    return None if hourly is None else hourly * step_seconds / SECONDS_PER_HOUR


def cost_per_million_tokens(
    step_seconds: float,
    tokens_per_step: float,
    chip: Chip,
    chips: int = 1,
    price: str = "on_demand",
) -> float | None:
    """USD per 1M tokens at `tokens_per_step` tokens a step; None without a price or tokens."""
    tokens_per_step = _check_non_negative(tokens_per_step, "tokens_per_step")
    step_cost = cost_per_step(step_seconds, chip, chips, price)
    if step_cost is None or tokens_per_step == 0:
        return None
    return step_cost / tokens_per_step * 1e6


def steps_per_epoch(dataset_size: int, samples_per_step: float) -> int:
    """Steps to see every sample once: the last, partial batch counts as a step."""
    if dataset_size < 0 or samples_per_step <= 0:
        raise ValueError(
            f"dataset_size must be >= 0 and samples_per_step > 0, got {dataset_size!r} "
            f"and {samples_per_step!r}."
        )
    return math.ceil(dataset_size / samples_per_step)


def efficiency_from_run(
    step_seconds: float, flops: float, bytes_accessed: float, peak_flops: float, bandwidth: float
) -> float:
    """How close a measured step came to its roofline: `roofline / measured`, in (0, 1].

    `peak_flops` and `bandwidth` are the measured device's (catalogue figures, or the host
    CPU's measured matmul rate and copy bandwidth). Clamped to 1 because a step cannot beat
    its own roofline; a value of 1 means the peaks given were too low.
    """
    step_seconds = _check_non_negative(step_seconds, "step_seconds")
    if step_seconds == 0:
        raise ValueError("step_seconds must be positive to derive an efficiency.")
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak_flops and bandwidth must be positive to derive an efficiency.")
    bound = max(flops / peak_flops, bytes_accessed / bandwidth)
    if bound <= 0:
        raise ValueError("a step with no FLOPs and no bytes has no roofline efficiency.")
    return min(1.0, bound / step_seconds)
