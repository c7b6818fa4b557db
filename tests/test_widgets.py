"""The notebook views, at the model level (no browser): structure, numbers, toggles, escaping."""

from __future__ import annotations

import re

import ipywidgets
import pytest

from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.compare import Comparison, ComparisonRow
from gpu2tpu.views.html import (
    bars_svg,
    charts_html,
    legend_html,
    seconds_format,
    series_svg,
    table_html,
)
from gpu2tpu.views.widgets import comparison_view, static_html

CAT = HardwareCatalogue.load()


def make_comparison(**overrides) -> Comparison:
    """Built by hand, as the forecast builds one from compiled TPU figures."""
    workload = {"tokens_per_step": 4096, "samples_per_step": 8}
    rows = [
        ComparisonRow.build(
            CAT.get("h100"), 0.050, "baseline", tokens_per_step=4096, samples_per_step=8
        ),
        ComparisonRow.build(
            CAT.get("v5e"), 0.120, "compiled", tokens_per_step=4096, samples_per_step=8
        ),
        ComparisonRow.build(
            CAT.get("v6e"), 0.040, "estimated", chips=4, tokens_per_step=4096, samples_per_step=8
        ),
        ComparisonRow.build(CAT.get("tpu7x"), 0.010, "estimated", tokens_per_step=4096),
    ]
    return Comparison.from_rows(
        rows, baseline_key="h100", catalogue=CAT, workload=workload, **overrides
    )


def bar_widths(svg: str) -> dict[str, float]:
    return {
        m.group(2): float(m.group(1))
        for m in re.finditer(
            r'<rect class="g2t-bar"[^>]*width="([0-9.]+)"[^>]*data-device="([^"]+)"', svg
        )
    }


def descendants(widget: ipywidgets.Widget) -> list[ipywidgets.Widget]:
    found = [widget]
    for child in getattr(widget, "children", ()):
        found += descendants(child)
    return found


def test_view_is_core_widgets_with_the_expected_parts():
    series = {"warmup": [0.9, 0.06], "steps": [0.05, 0.051, 0.049]}
    details = {
        "FLOPs per step": "1.2 TFLOP",
        "MFU": "41%",
        "Compilations": "warm-up 2, timed steps 0",
    }
    view = comparison_view(make_comparison(), series=series, details=details)
    assert isinstance(view, ipywidgets.VBox)
    for part in descendants(view):  # nothing beyond the core widget set
        assert type(part).__module__.startswith("ipywidgets."), type(part)
    assert view.parts["tabs"].titles == ("Comparison", "Step times", "Details")
    table = view.parts["table"].value
    assert table.count('<tr class="g2t-row') == 4
    for text in ("NVIDIA H100 80GB", "TPU v5e", "TPU v6e (Trillium) x4", "compiled", "estimated"):
        assert text in table
    assert "1.2 TFLOP" in view.parts["details"].value and "41%" in view.parts["details"].value
    assert "Prices used" in view.parts["details"].value
    assert "Recompilation" not in view.parts["warnings"].value


def test_no_step_times_tab_without_a_series():
    view = comparison_view(make_comparison())
    assert view.parts["tabs"].titles == ("Comparison", "Details")
    assert view.parts["series"] is None


def test_bars_are_proportional_to_the_values():
    comparison = make_comparison()
    view = comparison_view(comparison)
    charts = view.parts["charts"].value
    step_svg, money_svg = charts.split("</svg>")[:2]
    widths = bar_widths(step_svg)
    assert set(widths) == {"h100", "v5e", "v6e", "tpu7x"}
    assert widths["h100"] / widths["v5e"] == pytest.approx(0.050 / 0.120, rel=0.01)
    # $ per 1M tokens: TPU7x has no public price, so no bar
    money = bar_widths(money_svg)
    assert set(money) == {"h100", "v5e", "v6e"}
    rows = {r.device_key: r for r in comparison.rows}
    assert money["v6e"] / money["h100"] == pytest.approx(
        rows["v6e"].cost_per_1m_tokens / rows["h100"].cost_per_1m_tokens, rel=0.01
    )


def test_money_bars_fall_back_to_cost_per_1k_steps_without_tokens():
    rows = [
        ComparisonRow.build(CAT.get("v5e"), 0.1, "measured"),
        ComparisonRow.build(CAT.get("h100"), 0.05, "estimated"),
    ]
    comparison = Comparison.from_rows(rows, baseline_key="h100", catalogue=CAT)
    charts = comparison_view(comparison).parts["charts"].value
    assert 'data-metric="cost_per_1k_steps"' in charts
    assert "$ per 1,000 steps" in charts


def test_series_shades_warmup_and_switches_to_log_scale():
    svg = series_svg({"warmup": [2.0, 0.2], "steps": [0.01] * 5})
    assert 'class="g2t-warmup"' in svg and "log scale" in svg
    points = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
    assert len(points) == 7
    # compile step on top (smallest y), steady steps level
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[0] == min(ys) and len(set(ys[2:])) == 1
    flat = series_svg([0.010, 0.011, 0.012])
    assert "g2t-warmup" not in flat and "log scale" not in flat
    assert "No step-time series" in series_svg(None)


def test_spot_toggle_switches_every_part_without_a_kernel():
    view = comparison_view(make_comparison())
    toggle = view.parts["toggle"]
    # Both price columns are rendered, and the front end switches them (jslink), so the
    # toggle works in a saved notebook or an exported page, where no kernel answers.
    links = view.parts["links"]
    assert len(links) == len(view.parts["stacks"]) == 3
    for link, stack in zip(links, view.parts["stacks"], strict=True):
        assert isinstance(link, ipywidgets.widgets.widget_link.Link)
        assert link.source == (toggle, "index") and link.target == (stack, "selected_index")
        assert stack.selected_index == 0
    on_demand, spot = view.parts["prices"]["on_demand"], view.parts["prices"]["spot"]
    assert "$10.98/chip-hour" in on_demand["details"].value
    assert "$6.57/chip-hour" in spot["details"].value
    assert "Prices: on-demand" in on_demand["header"].value
    assert "Prices: spot" in spot["header"].value
    toggle.value = "spot"  # in the kernel, the shown comparison follows
    shown = view.shown["comparison"]
    assert shown.prices_used["column"] == "spot"
    assert {r.device_key: r.price_per_hour for r in shown.rows}["h100"] == CAT.get(
        "h100"
    ).price_spot
    assert shown.rows[0].step_seconds == 0.050  # times are unchanged
    assert all(stack.selected_index == 1 for stack in view.parts["stacks"])


def test_numbers_share_one_format_within_a_table_and_a_chart():
    rows = [
        ComparisonRow.build(CAT.get("cpu"), 1.52, "measured", tokens_per_step=4096),
        ComparisonRow.build(CAT.get("v5e"), 0.0123, "estimated", tokens_per_step=4096),
        ComparisonRow.build(CAT.get("h100"), 0.000812, "estimated", tokens_per_step=4096),
    ]
    comparison = Comparison.from_rows(rows, baseline_key="cpu", catalogue=CAT)
    table = table_html(comparison)
    steps = re.findall(r"<td(?: title=\"[^\"]*\")?>(?:≥ )?([0-9.,]+) (s|ms|µs)", table)
    assert [u for _, u in steps] == ["ms", "ms", "ms"], steps  # one unit, the median's
    assert [v for v, _ in steps] == ["1,520", "12.3", "0.812"]
    assert "e-0" not in table  # no scientific notation in money either
    # a CPU run beside TPU estimates: one unit still, and no six-digit numbers
    cpu_beside_tpus = seconds_format([0.443, 0.000857, 0.0000951])
    assert [cpu_beside_tpus(v) for v in (0.443, 0.000857, 0.0000951)] == [
        "443 ms",
        "0.857 ms",
        "0.0951 ms",
    ]
    charts = charts_html(comparison)
    labels = re.findall(r">([0-9.,]+ (?:s|ms|µs))</text>", charts.split("</svg>")[0])
    assert labels and all(label.endswith(" ms") for label in labels)


def test_estimated_rows_of_a_cpu_only_profile_are_for_sizing_only():
    rows = [
        ComparisonRow.build(CAT.get("cpu"), 0.2, "measured"),
        ComparisonRow.build(CAT.get("v5e"), 0.002, "estimated"),
    ]
    comparison = Comparison.from_rows(rows, baseline_key="cpu", catalogue=CAT)
    table, legend = table_html(comparison), legend_html(comparison)
    assert "sizing only" in table and "for sizing only" in legend
    assert "counted on the CPU" in legend
    gpu_run = Comparison.from_rows(
        [ComparisonRow.build(CAT.get("h100"), 0.01, "measured"), rows[1]], catalogue=CAT
    )
    assert "sizing only" not in table_html(gpu_run) + legend_html(gpu_run)


def test_bounds_are_marked_as_such_and_expected_times_are_not():
    rows = [
        ComparisonRow.build(CAT.get("v5e"), 0.000045, "compiled"),
        ComparisonRow.build(CAT.get("v6e"), 0.0005, "compiled"),
        ComparisonRow.build(
            CAT.get("h100"), 0.002, "estimated", time_kind="expected", step_low=0.0018,
            step_high=0.0024, framework="pytorch",
        ),
    ]  # fmt: skip
    comparison = Comparison.from_rows(rows, catalogue=CAT)
    table = table_html(comparison)
    assert table.count(">≥ ") == 2 and ">≥ 0.0450 ms" in table and ">≥ 0.500 ms" in table
    assert "expected for PyTorch" in table and ">≥ 2" not in table
    assert "a bound, not an expected time" in legend_html(comparison)


def test_header_says_which_prices_and_how_old():
    cheap = CAT.with_overrides({"v5e": {"price_on_demand": 0.5}})
    rows = [
        ComparisonRow.build(cheap.get("v5e"), 0.1, "measured"),
        ComparisonRow.build(cheap.get("h100"), 0.1, "estimated"),
    ]
    comparison = Comparison.from_rows(rows, baseline_key="h100", catalogue=cheap)
    header = comparison_view(comparison).parts["prices"]["on_demand"]["header"].value
    assert "Prices: on-demand" in header
    assert "2026-09-26" in header and "days old" in header  # the H100 price's date
    assert "your overrides: v5e price_on_demand=0.5" in header


def test_warnings_for_recompiles_and_host_syncs():
    details = {
        "Compilations": "warm-up 1, timed steps 3",
        "Host syncs per step": "2 (2 aten._local_scalar_dense)",
    }
    warnings = comparison_view(make_comparison(), details=details).parts["warnings"].value
    assert "Recompilation during timed steps" in warnings and "Host syncs in every step" in warnings


def test_text_is_escaped():
    row = ComparisonRow.build(
        CAT.get("v5e"), 0.1, "measured", device_name="<script>alert(1)</script>", note='"quoted"'
    )
    comparison = Comparison.from_rows([row], catalogue=CAT)
    html = static_html(comparison, details={"<b>": "<img src=x>"})
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "<img src=x>" not in html
    assert "<script" not in html  # the static export carries no script at all


def test_empty_bars_say_so():
    assert "no values to compare" in bars_svg([], "step_seconds", "Step time", str)


def test_comparison_renders_as_text_and_html_outside_a_kernel():
    comparison = make_comparison()
    bundle = comparison._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "TPU v5e" in bundle["text/plain"] and 'class="g2t-table"' in bundle["text/html"]
    assert "Ratios are against h100." in repr(comparison)


def test_no_ratio_base_is_named_where_no_ratio_is_shown():
    """issue 32: "Ratios are against h100." was printed under a table with no ratio column
    (the baseline had no figure: a step with 0 counted FLOPs)."""
    rows = [
        ComparisonRow.build(CAT.get("cpu"), 0.03, "measured"),
        ComparisonRow.build(CAT.get("h100"), None, "estimated", note="no estimate"),
        ComparisonRow.build(CAT.get("v5e"), None, "estimated", note="no estimate"),
    ]
    bare = Comparison.from_rows(rows, baseline_key="h100", catalogue=CAT)
    assert "Speed-up" not in repr(bare) and "Ratios are against" not in repr(bare)
    html = bare._repr_mimebundle_()["text/html"]
    assert "baseline for the ratios" not in html and "★" not in html
    shown = make_comparison()  # with a ratio column, its base is named in every view
    assert "Speed-up" in repr(shown)
    assert "baseline for the ratios" in shown._repr_mimebundle_()["text/html"]


def test_bars_switch_to_a_log_scale_for_wide_ranges():
    rows = [
        ComparisonRow.build(CAT.get("cpu"), 0.5, "measured"),
        ComparisonRow.build(CAT.get("v5e"), 0.0005, "estimated"),
        ComparisonRow.build(CAT.get("h100"), 0.0001, "estimated"),
    ]
    svg = bars_svg(rows, "step_seconds", "Step time", str)
    assert "log scale" in svg
    widths = bar_widths(svg)
    assert widths["cpu"] > widths["v5e"] > widths["h100"] > 10  # all readable, order kept
    assert "log scale" not in bars_svg(rows[1:], "step_seconds", "Step time", str)


@pytest.mark.slow
def test_in_a_kernel_the_result_displays_as_a_widget_with_an_html_fallback(tmp_path):
    """Run a notebook in a real kernel: the display carries the widget view and the HTML."""
    import nbformat
    from jupyter_kernels import NotebookClient

    code = (
        "import torch\n"
        "from gpu2tpu import profile\n"
        "layer = torch.nn.Linear(32, 32)\n"
        "x = torch.randn(8, 32)\n"
        "profile(lambda: layer(x), steps=3, warmup=1, backend='cpu', targets=['v5e'])"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = nb.cells[0].outputs
    # Before the result, at most the run's progress bar (shown once a run outlasts its delay).
    *before, result = outputs
    assert result.output_type == "execute_result"
    assert len(before) <= 1
    assert all("application/vnd.jupyter.widget-view+json" in o.data for o in before)
    data = result.data
    assert "application/vnd.jupyter.widget-view+json" in data
    assert 'class="g2t-table"' in data["text/html"] and "TPU v5e" in data["text/plain"]
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert any("g2t-table" in str(m["state"].get("value", "")) for m in state.values())


def make_forecast():  # type: ignore[no-untyped-def]
    """A forecast as `gpu2tpu.forecast` returns one: two TPU targets compiled, one too small."""
    from gpu2tpu.forecasting.forecast import Forecast, TargetForecast

    gib = 2**30
    targets = [
        TargetForecast(
            target="v5e", name="TPU v5e", topology="v5litepod-1", chips=1, devices_per_chip=1,
            status="compiled", batch=64, flops=2.4e12, bytes_accessed=3.1e9,
            memory_per_chip=3.2 * gib, available_per_chip=15.75 * gib, hbm_per_chip=16 * gib,
            fits=True, max_batch=512, max_batch_exact=True, step_seconds=0.0123,
            compute_seconds=0.0123, memory_seconds=0.0038, compile_seconds=41.5,
        ),
        TargetForecast(
            target="v6e", name="TPU v6e (Trillium)", topology="v6e:1x1", chips=1,
            devices_per_chip=1, status="compiled", batch=64, flops=2.4e12,
            bytes_accessed=3.1e9, memory_per_chip=3.2 * gib, available_per_chip=31.25 * gib,
            fits=True, step_seconds=0.000047, compute_seconds=0.000047,
            memory_seconds=0.00002, compile_seconds=0.0, cached=True,
        ),
    ]  # fmt: skip
    rows = [
        ComparisonRow.build(CAT.get("v5e"), 0.0123, "compiled", samples_per_step=64),
        ComparisonRow.build(CAT.get("v6e"), 0.000047, "compiled", samples_per_step=64),
        ComparisonRow.build(CAT.get("h100"), 0.0021, "estimated", samples_per_step=64),
    ]
    comparison = Comparison.from_rows(
        rows, catalogue=CAT, workload={"samples_per_step": 64}, title="gpu2tpu forecast: Net"
    )
    return Forecast(
        model="Net", parameters=1_000_000, trainable_parameters=1_000_000, optimizer="AdamW",
        dtype="bfloat16", batch=64, tokens_per_step=None, targets=targets, comparison=comparison,
        reference="v5e", versions={}, wall_seconds=42.0, cache_dir=None,
    )  # fmt: skip


def test_forecast_view_shows_memory_batch_bound_and_compile_time_and_no_series():
    from gpu2tpu.views.widgets import forecast_html, forecast_view

    forecast = make_forecast()
    view = forecast_view(forecast)
    assert view.parts["tabs"].titles == ("Comparison", "Details")  # nothing ran: no series
    intro = next(
        c.value
        for c in view.children
        if isinstance(c, ipywidgets.HTML) and "g2t-targets" in c.value
    )
    rows = re.findall(r'<tr class="g2t-target" data-target="(\w+)">(.*?)</tr>', intro)
    assert [t for t, _ in rows] == ["v5e", "v6e"]
    v5e, v6e = (cells for _, cells in rows)
    assert "3.2 GiB of 15.8 GiB (20%)" in v5e and 'data-fraction="0.2032"' in v5e
    assert ">512<" in v5e and ">compute<" in v5e and "41.5 s" in v5e
    assert "not searched" in v6e and "cached" in v6e and "≥ 0.0470 ms" in v6e
    legend = view.parts["table"].value
    assert "libtpu compiled the step" in legend and "not a CUDA measurement" in legend
    assert "from the measured run" not in legend  # the profiler's wording has no place here
    page = forecast_html(forecast)
    assert "g2t-targets" in page and "Step time per step" not in page and "<script" not in page


@pytest.mark.parametrize("stopped", [(), ("v6e",)])
def test_a_forecast_interrupted_says_so_in_every_view_even_when_nothing_was_lost(stopped):
    """Ctrl-C can land after the last target finished: the result is still marked interrupted,
    and the text, rich and HTML views all say what it cost (here: nothing, or v6e)."""
    import dataclasses

    from rich.console import Console

    from gpu2tpu.forecasting.result import interruption_note

    forecast = make_forecast()
    targets = [
        dataclasses.replace(t, status="interrupted") if t.label in stopped else t
        for t in forecast.targets
    ]
    forecast = dataclasses.replace(
        forecast, targets=targets, interrupted=True, notes=[interruption_note(targets)]
    )
    console = Console(width=400, record=True)
    console.print(forecast)
    rich_text = console.export_text()
    for text in (repr(forecast), rich_text, forecast.to_html()):
        assert "Forecast interrupted (Ctrl-C)" in text  # the word a reader (and grep) looks for
    expected = "v6e not forecast" if stopped else "nothing was lost"
    assert expected in repr(forecast) and expected in rich_text
    assert "interrupted" not in repr(make_forecast()).lower()


def test_dry_run_html_lists_ops_without_a_lowering_first_and_folds_the_rest():
    import torch

    from gpu2tpu.readiness.dryrun import dry_run

    def step():  # type: ignore[no-untyped-def]
        x = torch.randn(4, 4)
        q, tau = torch.geqrf(x @ x)  # geqrf has no XLA lowering
        return (q.relu() + 1).sum().item()

    page = dry_run(step)._repr_html_()
    attention, folded = page.split('<details class="g2t-ops-folded">')
    assert "aten::geqrf" in attention and "not lowered" in attention
    assert "aten::relu" not in attention and "aten::relu" in folded
    assert re.search(r"<summary>\d+ ops with an XLA lowering", folded)
    assert "host sync" in attention  # the hazards come first, as before
