"""The notebook views, at the model level (no browser): structure, numbers, toggles, escaping."""

from __future__ import annotations

import re

import ipywidgets
import pytest

from gpu2tpu.profile.catalogue import HardwareCatalogue
from gpu2tpu.profile.compare import Comparison, ComparisonRow
from gpu2tpu.widgets import comparison_view, static_html
from gpu2tpu.widgets.render import bars_svg, series_svg

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


def test_view_is_core_widgets_with_the_expected_parts():
    series = {"warmup": [0.9, 0.06], "steps": [0.05, 0.051, 0.049]}
    details = {
        "FLOPs per step": "1.2 TFLOP",
        "MFU": "41%",
        "Compilations": "warm-up 2, timed steps 0",
    }
    view = comparison_view(make_comparison(), series=series, details=details)
    assert isinstance(view, ipywidgets.VBox)
    for part in view.parts.values():  # nothing beyond the core widget set
        assert type(part).__module__.startswith("ipywidgets.")
    assert view.parts["tabs"].titles == ("Comparison", "Step times", "Details")
    table = view.parts["table"].value
    assert table.count('<tr class="g2t-row') == 4
    for text in ("NVIDIA H100 80GB", "TPU v5e", "TPU v6e (Trillium) x4", "compiled", "estimated"):
        assert text in table
    assert "1.2 TFLOP" in view.parts["details"].value and "41%" in view.parts["details"].value
    assert "Prices used" in view.parts["details"].value
    assert "Recompilation" not in view.parts["warnings"].value


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


def test_spot_toggle_reprices_every_part():
    view = comparison_view(make_comparison())
    assert "$10.98/chip-hour" in view.parts["details"].value
    view.parts["toggle"].value = "spot"
    shown = view.shown["comparison"]
    assert shown.prices_used["column"] == "spot"
    assert {r.device_key: r.price_per_hour for r in shown.rows}["h100"] == CAT.get(
        "h100"
    ).price_spot
    assert "Prices: spot" in view.parts["header"].value
    assert "$6.57/chip-hour" in view.parts["details"].value
    assert shown.rows[0].step_seconds == 0.050  # times are unchanged


def test_header_says_which_prices_and_how_old():
    cheap = CAT.with_overrides({"v5e": {"price_on_demand": 0.5}})
    rows = [
        ComparisonRow.build(cheap.get("v5e"), 0.1, "measured"),
        ComparisonRow.build(cheap.get("h100"), 0.1, "estimated"),
    ]
    comparison = Comparison.from_rows(rows, baseline_key="h100", catalogue=cheap)
    header = comparison_view(comparison).parts["header"].value
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
    from nbclient import NotebookClient

    code = (
        "import torch\n"
        "from gpu2tpu.profile import profile\n"
        "layer = torch.nn.Linear(32, 32)\n"
        "x = torch.randn(8, 32)\n"
        "profile(lambda: layer(x), steps=3, warmup=1, backend='cpu', targets=['v5e'])"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["execute_result"]
    data = outputs[0].data
    assert "application/vnd.jupyter.widget-view+json" in data
    assert 'class="g2t-table"' in data["text/html"] and "TPU v5e" in data["text/plain"]
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert any("g2t-table" in str(m["state"].get("value", "")) for m in state.values())
