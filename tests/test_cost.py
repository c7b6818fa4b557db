"""The cost model: roofline time, money per step, per 1M tokens, per epoch."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.cost import (
    cost_per_million_tokens,
    cost_per_step,
    efficiency_from_run,
    price_per_hour,
    roofline_seconds,
    steps_per_epoch,
)

CAT = HardwareCatalogue.load()
V5E = CAT.get("v5e")
H100 = CAT.get("h100")


def test_roofline_compute_bound():
    # one second of peak FLOPs, a trivial number of bytes
    assert roofline_seconds(V5E.peak_bf16_flops, 1e6, V5E) == pytest.approx(1.0)


def test_roofline_memory_bound():
    assert roofline_seconds(1e6, V5E.hbm_bandwidth * 2, V5E) == pytest.approx(2.0)


def test_roofline_efficiency_scales_time():
    full = roofline_seconds(1e15, 1e9, H100)
    assert roofline_seconds(1e15, 1e9, H100, efficiency=0.25) == pytest.approx(4 * full)


@pytest.mark.parametrize("eff", [0.0, -0.1, 1.5])
def test_roofline_rejects_bad_efficiency(eff):
    with pytest.raises(ValueError, match="efficiency"):
        roofline_seconds(1e12, 0, V5E, efficiency=eff)


def test_roofline_rejects_negative_work_and_chips_without_a_peak():
    with pytest.raises(ValueError, match="flops"):
        roofline_seconds(-1, 0, V5E)
    with pytest.raises(ValueError, match="no peak"):
        roofline_seconds(1e9, 0, CAT.get("cpu"))


def test_cost_per_step_is_price_times_time():
    # an hour on one v5e costs the hourly price; on eight, eight times it
    assert cost_per_step(3600, V5E) == pytest.approx(1.20)
    assert cost_per_step(3600, V5E, chips=8) == pytest.approx(9.60)
    assert cost_per_step(1800, V5E, price="spot") == pytest.approx(0.213 / 2)
    assert cost_per_step(1.0, CAT.get("tpu7x")) is None
    with pytest.raises(ValueError, match="price column"):
        cost_per_step(1.0, V5E, price="reserved")
    with pytest.raises(ValueError, match="chips"):
        cost_per_step(1.0, V5E, chips=0)


def test_cost_per_million_tokens_follows_the_convention():
    step, tokens = 0.25, 8192
    tokens_per_s = tokens / step
    expected = (H100.price_on_demand * 1) / (tokens_per_s * 3600) * 1e6
    assert cost_per_million_tokens(step, tokens, H100) == pytest.approx(expected)
    assert cost_per_million_tokens(step, 0, H100) is None
    assert price_per_hour(H100, 2) == pytest.approx(2 * 10.98)


def test_steps_per_epoch_counts_the_partial_batch():
    assert steps_per_epoch(1000, 32) == 32
    assert steps_per_epoch(1024, 32) == 32
    with pytest.raises(ValueError):
        steps_per_epoch(10, 0)


def test_efficiency_from_run():
    # a step that needs 1 ms at peak and took 4 ms ran at 25%
    assert efficiency_from_run(4e-3, 1e9, 0, 1e12, 1e12) == pytest.approx(0.25)
    # memory-bound: 2 ms of traffic in a 4 ms step
    assert efficiency_from_run(4e-3, 0, 2e9, 1e12, 1e12) == pytest.approx(0.5)
    # faster than the roofline means the peaks were too low: capped
    assert efficiency_from_run(1e-4, 1e9, 0, 1e12, 1e12) == 1.0
    with pytest.raises(ValueError):
        efficiency_from_run(0.0, 1e9, 0, 1e12, 1e12)


@settings(max_examples=60, deadline=None)
@given(
    step=st.floats(1e-6, 1e3, allow_nan=False),
    tokens=st.integers(1, 10**7),
    chips=st.integers(1, 256),
    key=st.sampled_from([c.key for c in CAT if c.price_on_demand is not None]),
)
def test_per_token_cost_and_per_step_cost_agree(step, tokens, chips, key):
    chip = CAT.get(key)
    per_step = cost_per_step(step, chip, chips)
    per_m = cost_per_million_tokens(step, tokens, chip, chips)
    assert math.isclose(per_m * tokens / 1e6, per_step, rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    flops=st.floats(0, 1e18, allow_nan=False),
    nbytes=st.floats(0, 1e13, allow_nan=False),
    eff=st.floats(0.01, 1.0),
)
def test_a_faster_chip_never_takes_longer(flops, nbytes, eff):
    # v6e beats v5e on both peak and bandwidth, so its roofline is never slower
    v6e = CAT.get("v6e")
    assert roofline_seconds(flops, nbytes, v6e, eff) <= roofline_seconds(flops, nbytes, V5E, eff)
