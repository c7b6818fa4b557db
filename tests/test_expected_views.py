"""Expected step times in costs, in the profiler's comparison and in every view (issue 25,
sections 3 and 4): costs come from the expected time, the roofline bound stays beside it,
a measured step scales the other devices' figures, and every view says in one line where the
expected figure comes from and how sure it is."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpu2tpu.forecasting import forecast as fc
from gpu2tpu.measure.records import Costing, RunRecord, summarize
from gpu2tpu.measure.result import BaselineRecord, RunContext, cost_run
from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.compare import Comparison, ComparisonRow
from gpu2tpu.pricing.utilisation import default_fit
from gpu2tpu.views.html import static_html

CATALOGUE = HardwareCatalogue.load()
LINE = default_fit().source_line()


def expected_row(key: str = "v5e", **extra) -> ComparisonRow:
    return ComparisonRow.build(
        CATALOGUE.get(key),
        2.0,
        "compiled",
        tokens_per_step=8192,
        time_kind="expected",
        step_low=1.8,
        step_high=2.4,
        bound_seconds=1.1,
        **extra,
    )


def test_costs_come_from_the_expected_time_with_its_range():
    row = expected_row(token_budget=1e9)
    price = CATALOGUE.get("v5e").price_on_demand
    assert row.cost_per_step == pytest.approx(price * 2.0 / 3600)
    assert (row.cost_per_step_low, row.cost_per_step_high) == pytest.approx(
        (price * 1.8 / 3600, price * 2.4 / 3600)
    )
    assert row.cost_per_1m_tokens == pytest.approx(price * 2.0 / 3600 / 8192 * 1e6)
    assert row.cost_per_1m_tokens_low < row.cost_per_1m_tokens < row.cost_per_1m_tokens_high
    assert row.time_to_budget_seconds == pytest.approx(1e9 / 8192 * 2.0)
    assert row.cost_to_budget == pytest.approx(row.cost_per_1m_tokens * 1e3)
    assert row.bound_seconds == 1.1  # shown beside, never costed
    # Rows nobody timed default to the roofline bound; timed rows to measured.
    assert ComparisonRow.build(CATALOGUE.get("h100"), 1.0, "estimated").time_kind == "bound"
    assert ComparisonRow.build(CATALOGUE.get("h100"), 1.0, "measured").time_kind == "measured"
    with pytest.raises(ValueError, match="time_kind"):
        ComparisonRow.build(CATALOGUE.get("h100"), 1.0, "estimated", time_kind="guessed")


def test_repricing_keeps_the_expected_figures():
    comparison = Comparison.from_rows([expected_row()], catalogue=CATALOGUE)
    spot = comparison.repriced("spot")
    row = spot.rows[0]
    assert (row.time_kind, row.step_low, row.step_high, row.bound_seconds) == (
        "expected",
        1.8,
        2.4,
        1.1,
    )
    assert row.cost_per_step == pytest.approx(CATALOGUE.get("v5e").price_spot * 2.0 / 3600)
    assert spot.expected_source == comparison.expected_source == LINE


def test_every_view_of_a_comparison_carries_the_provenance_line():
    comparison = Comparison.from_rows(
        [expected_row(), ComparisonRow.build(CATALOGUE.get("h100"), 3.0, "measured")],
        catalogue=CATALOGUE,
    )
    assert comparison.expected_source == LINE
    text = repr(comparison)
    assert LINE in text and "Roofline bound" in text and "expected" in text
    assert "2 s (1.8 s–2.4 s)" in text  # the expected time with its range
    from rich.console import Console

    console = Console(record=True, width=400)
    console.print(comparison)
    assert "predicting each source from the others" in console.export_text()
    html = static_html(comparison)
    assert (
        "g2t-expected" in html
        and "predicting each source from the others" in html
        and "range" in html
    )
    widget = comparison.widget()
    assert "predicting each source from the others" in widget.parts["header"].children[0].value
    data = json.loads(comparison.to_json())
    assert data["expected_source"] == LINE
    assert data["rows"][0]["time_kind"] == "expected" and data["rows"][0]["bound_seconds"] == 1.1
    assert "step_low" in comparison.to_csv().splitlines()[0]
    # A comparison with nothing expected says nothing about it.
    plain = Comparison.from_rows(
        [ComparisonRow.build(CATALOGUE.get("h100"), 3.0, "measured")], catalogue=CATALOGUE
    )
    assert plain.expected_source == "" and "each source from the others" not in repr(plain)


def compiled_target() -> fc.TargetForecast:
    target = fc.TargetForecast(
        target="v5p", name="TPU v5p", topology="v5p:2x2x1", chips=4, devices_per_chip=1,
        status="compiled", batch=8, flops=4 * 3e15, bytes_accessed=4 * 2e11,
        memory_per_chip=40e9, available_per_chip=95e9, fits=True,
    )  # fmt: skip
    fc._price(target, CATALOGUE.get("v5p"), 8 * 4096, "on_demand")
    return target


def test_a_compiled_target_gets_an_expected_time_and_costs_from_it():
    target = compiled_target()
    chip = CATALOGUE.get("v5p")
    utilisation = target.expected_utilisation
    assert target.expected_seconds == pytest.approx(3e15 / (chip.peak_bf16_flops * utilisation))
    assert target.step_seconds == pytest.approx(3e15 / chip.peak_bf16_flops)  # the bound
    assert target.cost_per_step == pytest.approx(
        4 * chip.price_on_demand * target.expected_seconds / 3600
    )
    assert target.bound_cost_per_step == pytest.approx(
        4 * chip.price_on_demand * target.step_seconds / 3600
    )
    assert "expected" in target.summary() and "roofline bound" in target.summary()
    # attention FLOPs from the compile (full score matrix) lower the expected utilisation
    with_attention = compiled_target()
    with_attention.attention_flops = 4 * 1e15  # the fields fig25b's compile adds
    with_attention.attention_kind = "full"
    fc._price(with_attention, chip, 8 * 4096, "on_demand")
    assert with_attention.expected_utilisation < utilisation


def test_forecast_views_carry_the_provenance_line_and_gpu_rows_use_their_own_utilisation():
    target = compiled_target()
    rows = [
        fc._tpu_row(target, CATALOGUE.get("v5p"), 8, 8 * 4096, "on_demand"),
        fc._gpu_row(target, CATALOGUE.get("h100"), 8, 8 * 4096, "on_demand"),
    ]
    comparison = Comparison.from_rows(rows, catalogue=CATALOGUE, title="gpu2tpu forecast: M")
    tpu, gpu = comparison.rows
    assert (tpu.time_kind, gpu.time_kind) == ("expected", "expected")
    h100 = CATALOGUE.get("h100")
    assert gpu.step_seconds == pytest.approx(
        3e15 / (h100.peak_bf16_flops * default_fit().utilisation(h100, None))
    )
    assert gpu.bound_seconds == pytest.approx(
        max(3e15 / h100.peak_bf16_flops, 2e11 / h100.hbm_bandwidth)
    )
    result = fc.Forecast(
        model="M", parameters=1, trainable_parameters=1, optimizer="AdamW", dtype="bfloat16",
        batch=8, tokens_per_step=8 * 4096, targets=[target], comparison=comparison,
        reference=target.label, versions={}, wall_seconds=1.0, cache_dir=None,
    )  # fmt: skip
    assert LINE in repr(result) and "Expected step (range)" in repr(result)
    assert (
        "predicting each source from the others" in result.to_html()
        and "Roofline bound" in result.to_html()
    )
    assert result.details()["Expected"] == LINE
    assert (
        "predicting each source from the others"
        in result.widget().parts["header"].children[0].value
    )
    assert json.loads(result.to_json())["targets"][0]["expected_seconds"] == target.expected_seconds


def record(step: float) -> RunRecord:
    return RunRecord(
        backend=SimpleNamespace(name="fake"), warmup_times=[2 * step], step_times=[step] * 5,
        group_size=1, timed_wall_seconds=5 * step, timer_floor=1e-6, count=None,
        compilations_warmup=None, compilations_timed=None, memory_peak_bytes=None,
        memory_kind="unknown", notes=[],
    )  # fmt: skip


def context(chip: str, baselines: list | None = None) -> RunContext:
    return RunContext(
        catalogue=CATALOGUE, runtime_name=chip, chip=CATALOGUE.get(chip), chips=1,
        baselines=baselines or [], host_peak=None, created="2026-12-02T00:00:00+00:00",
    )  # fmt: skip


def test_a_measured_step_is_the_truth_and_scales_the_other_devices():
    """Measured on an H100 at some utilisation: the v5e's expected figure is that
    utilisation times the published runs' v5e/H100 ratio (section 4)."""
    flops = 4e14
    costing = Costing(targets=["v5e"], flops_per_step=flops, bytes_per_step=1e9).validated()
    result = cost_run(record(1.0), costing, context("h100"))
    measured = result.measured_row
    assert (measured.time_kind, measured.step_seconds) == ("measured", 1.0)
    h100, v5e = CATALOGUE.get("h100"), CATALOGUE.get("v5e")
    fit = default_fit()
    here = flops / h100.peak_bf16_flops  # measured utilisation (one second per step)
    scaled = here * fit.utilisation(v5e, 0.0) / fit.utilisation(h100, 0.0)
    row = result.row("v5e")
    assert (row.source, row.time_kind) == ("estimated", "expected")
    assert row.step_seconds == pytest.approx(flops / (v5e.peak_bf16_flops * scaled))
    assert "this run on NVIDIA H100" in row.note and f"{here:.0%}" in row.note
    assert result.details()["Expected"] == LINE
    # a measurement twice as slow: an expected v5e twice as slow
    slower = cost_run(record(2.0), costing, context("h100")).row("v5e")
    assert slower.step_seconds == pytest.approx(row.step_seconds * 2)


def test_a_cpu_run_uses_a_matching_gpu_baseline_or_else_the_fit():
    flops = 4e14
    costing = Costing(targets=["v5e"], flops_per_step=flops, bytes_per_step=1e9).validated()
    fit, v5e = default_fit(), CATALOGUE.get("v5e")
    alone = cost_run(record(30.0), costing, context("cpu")).row("v5e")
    assert alone.step_seconds == pytest.approx(
        flops / (v5e.peak_bf16_flops * fit.utilisation(v5e, 0.0))
    )
    assert "no accelerator measurement" in alone.note

    def baseline(flops_per_step: float) -> BaselineRecord:
        stats = record(1.0)
        return BaselineRecord(
            device_key="h100", device_name="NVIDIA H100", chips=1, backend="cuda",
            stats=summarize(stats.step_times), samples_per_step=None, tokens_per_step=None,
            flops_per_step=flops_per_step, memory_peak_bytes=None, memory_kind="device",
            created="2026-11-30", host="gpu-box",
        )  # fmt: skip

    matched = cost_run(record(30.0), costing, context("cpu", [baseline(flops)])).row("v5e")
    assert "the baseline timed on NVIDIA H100" in matched.note
    assert matched.step_seconds != pytest.approx(alone.step_seconds)
    other = cost_run(record(30.0), costing, context("cpu", [baseline(2 * flops)])).row("v5e")
    assert other.step_seconds == pytest.approx(alone.step_seconds)  # not the same workload
