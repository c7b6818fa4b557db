"""Notebook views built from core ipywidgets, HTML and inline SVG only.

No custom front-end model, so they render in JupyterLab, classic Notebook, VS Code and Colab
(which shows only core widgets without extra set-up) and export to static HTML with
`ipywidgets.embed`. The strings come from `html.py`; this module only arranges them.

The on-demand/spot toggle needs no kernel: both price columns are rendered up front, each
in a page of a `Stack`, and the toggle's index is linked to the stacks in the front end
(`jslink`), so it also works in a saved notebook's widget state and in a page exported with
`ipywidgets.embed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .html import (
    FORECAST_MEANING,
    STYLE,
    charts_html,
    details_html,
    forecast_header_html,
    forecast_html,
    forecast_targets_html,
    header_html,
    legend_html,
    series_svg,
    static_html,
    table_html,
    warnings_html,
)

if TYPE_CHECKING:
    import ipywidgets

    from gpu2tpu.pricing.compare import Comparison

__all__ = [
    "comparison_view",
    "forecast_html",
    "forecast_view",
    "static_html",
]

PRICES = (("On-demand prices", "on_demand"), ("Spot prices", "spot"))


def _priced(comparison: Comparison) -> dict[str, Comparison]:
    """The comparison at each price column (the one it has, and the other repriced)."""
    column = (comparison.prices_used or {}).get("column", "on_demand")
    out: dict[str, Comparison] = {}
    for _, key in PRICES:
        out[key] = comparison if key == column else comparison.repriced(key)
    return out


def comparison_view(
    comparison: Comparison,
    *,
    series: Any = None,
    details: Mapping[str, Any] | None = None,
    meanings: Mapping[str, str] | None = None,
    intro: str = "",
    heading: Any = None,
) -> ipywidgets.Widget:
    """The profiler's (and the forecast's) notebook view of a `Comparison`.

    A header with the prices used and their age, warnings (recompiles, host syncs), `intro`
    (HTML above the tabs), then tabs: the comparison table with horizontal bars for step
    time and $/1M tokens and an on-demand/spot toggle; the step-time series with warm-up
    shaded, only when there is one (`series` is `{"warmup": [...], "steps": [...]}` or a
    plain list of step times); and the details (`details` maps labels to text: FLOPs, MFU,
    memory, compilations) with every price's source and date. `meanings` overrides what the
    legend says each row source is; `heading(comparison)` makes the header's HTML. The
    parts are kept in `view.parts` by name, each price's in `view.parts["prices"][column]`.
    """
    import ipywidgets as w

    make_heading = heading or header_html
    priced = _priced(comparison)
    column = (comparison.prices_used or {}).get("column", "on_demand")
    keys = [key for _, key in PRICES]
    panels: dict[str, dict[str, Any]] = {}
    for key, shown in priced.items():
        panels[key] = {
            "header": w.HTML(STYLE + make_heading(shown)),
            "table": w.HTML(table_html(shown, meanings) + legend_html(shown, meanings)),
            "charts": w.HTML(charts_html(shown)),
            "details": w.HTML(details_html(shown, details)),
        }

    def stack(part: str) -> w.Stack:
        return w.Stack(
            [panels[k][part] for k in keys],
            selected_index=keys.index(column) if column in keys else 0,
        )

    toggle = w.ToggleButtons(
        options=list(PRICES),
        value=column if column in keys else "on_demand",
        tooltips=["List price per chip-hour", "Pre-emptible price per chip-hour"],
        style={"button_width": "130px"},
    )
    header = stack("header")
    summary_stack = w.Stack(
        [w.VBox([panels[k]["table"], panels[k]["charts"]]) for k in keys],
        selected_index=header.selected_index,
    )
    detail = stack("details")
    stacks = (header, summary_stack, detail)
    # In the front end: the toggle switches every stack, with or without a kernel.
    links = [w.jslink((toggle, "index"), (s, "selected_index")) for s in stacks]
    current = {"comparison": priced.get(toggle.value, comparison)}

    def choose(change: Mapping[str, Any]) -> None:  # the same in the kernel's copy
        current["comparison"] = priced[change["new"]]
        for s in stacks:
            s.selected_index = keys.index(change["new"])

    toggle.observe(choose, names="value")
    warnings = w.HTML(warnings_html(details))
    children = [w.VBox([toggle, summary_stack])]
    titles = ["Comparison"]
    series_part = None
    if series is not None:
        series_part = w.HTML(series_svg(series))
        children.append(series_part)
        titles.append("Step times")
    children.append(detail)
    titles.append("Details")
    tabs = w.Tab(children=children)
    tabs.titles = tuple(titles)
    parts: list[Any] = [header, warnings]
    if intro:
        parts.append(w.HTML(intro))
    parts.append(tabs)
    view = w.VBox(parts)
    view.add_class("g2t-view")
    chosen = panels[toggle.value]
    view.parts = {
        "header": header,
        "warnings": warnings,
        "toggle": toggle,
        "table": chosen["table"],
        "charts": chosen["charts"],
        "details": chosen["details"],
        "series": series_part,
        "tabs": tabs,
        "stacks": stacks,
        "links": links,
        "prices": panels,
    }
    view.shown = current
    return view


def forecast_view(forecast: Any) -> ipywidgets.Widget:
    """The forecast's notebook view: per TPU target, memory against usable HBM, the fit,
    the largest batch, the bound, the roofline step and the compile time; then what a step
    costs on each target (and GPUs on the same compiled figures), and the details. No
    step-time series: nothing ran."""
    return comparison_view(
        forecast.comparison,
        details=forecast.details(),
        meanings=FORECAST_MEANING,
        intro=forecast_targets_html(forecast),
        heading=lambda shown: forecast_header_html(forecast, shown),
    )
