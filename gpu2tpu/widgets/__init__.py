"""Notebook views built from core ipywidgets, HTML and inline SVG only.

No custom front-end model, so they render in JupyterLab, classic Notebook, VS Code and Colab
(which shows only core widgets without extra set-up) and export to static HTML with
`ipywidgets.embed`. The strings come from `render.py`; this module only arranges them and
wires the on-demand/spot toggle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .render import (
    STYLE,
    charts_html,
    details_html,
    header_html,
    legend_html,
    series_svg,
    static_html,
    table_html,
    warnings_html,
)

if TYPE_CHECKING:
    import ipywidgets

    from gpu2tpu.profile.compare import Comparison

__all__ = ["comparison_view", "display_with_fallbacks", "static_html"]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def display_with_fallbacks(widget: Any, html: str, text: str) -> None:
    """Display a widget together with an HTML and a text version of the same content.

    A live front end shows the widget; a saved notebook opened without the kernel's widget
    state (GitHub, VS Code's viewer, nbconvert) shows the HTML table, a terminal the text,
    instead of a widget's repr. `widget` is the widget or a function that builds it; when
    it cannot be built here (no ipywidgets), the HTML and the text are displayed alone.
    """
    from IPython.display import display

    bundle: dict[str, Any] = {"text/html": html, "text/plain": text}
    try:
        view = widget() if callable(widget) else widget
        data = view._repr_mimebundle_() or {}
    except Exception:  # no widget support here: the fallbacks are already in the bundle
        data = {}
    if WIDGET_MIME in data:
        bundle[WIDGET_MIME] = data[WIDGET_MIME]
    display(bundle, raw=True)


TAB_TITLES = ("Comparison", "Step times", "Details")


def comparison_view(
    comparison: Comparison,
    *,
    series: Any = None,
    details: Mapping[str, Any] | None = None,
) -> ipywidgets.Widget:
    """The profiler's notebook view of a `Comparison`.

    A header with the prices used and their age, warnings (recompiles, host syncs), then
    tabs: the comparison table with horizontal bars for step time and $/1M tokens and an
    on-demand/spot toggle; the step-time series with warm-up shaded (`series` is
    `{"warmup": [...], "steps": [...]}` or a plain list of step times); and the details
    (`details` maps labels to text: FLOPs, MFU, memory, compilations) with every price's
    source and date. The parts are kept in `view.parts` by name.
    """
    import ipywidgets as w

    column = (comparison.prices_used or {}).get("column", "on_demand")
    header = w.HTML(STYLE + header_html(comparison))
    warnings = w.HTML(warnings_html(details))
    table = w.HTML(table_html(comparison) + legend_html(comparison))
    charts = w.HTML(charts_html(comparison))
    detail = w.HTML(details_html(comparison, details))
    toggle = w.ToggleButtons(
        options=[("On-demand prices", "on_demand"), ("Spot prices", "spot")],
        value=column if column in ("on_demand", "spot") else "on_demand",
        tooltips=["List price per chip-hour", "Pre-emptible price per chip-hour"],
        style={"button_width": "130px"},
    )
    current = {"comparison": comparison}

    def reprice(change: Mapping[str, Any]) -> None:
        shown = comparison.repriced(change["new"])
        current["comparison"] = shown
        header.value = STYLE + header_html(shown)
        table.value = table_html(shown) + legend_html(shown)
        charts.value = charts_html(shown)
        detail.value = details_html(shown, details)

    toggle.observe(reprice, names="value")
    summary = w.VBox([toggle, table, charts])
    series_part = w.HTML(series_svg(series))
    tabs = w.Tab(children=[summary, series_part, detail])
    tabs.titles = TAB_TITLES
    view = w.VBox([header, warnings, tabs])
    view.add_class("g2t-view")
    view.parts = {
        "header": header,
        "warnings": warnings,
        "toggle": toggle,
        "table": table,
        "charts": charts,
        "series": series_part,
        "details": detail,
        "tabs": tabs,
    }
    view.shown = current
    return view
