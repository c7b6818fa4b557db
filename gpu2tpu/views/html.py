"""HTML and inline SVG for the profiler's views, as plain strings.

The notebook widget wraps these strings in core `ipywidgets.HTML`, and `to_html()` joins
them into one static page, so the two never disagree and neither needs a front-end
extension or a CDN (Colab, VS Code, nbconvert and GitHub all render them). Every value is
escaped; colours fall back to fixed ones outside JupyterLab's theme variables.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .format import format_bytes, format_seconds
from .table import columns, ratio_line, step_range

if TYPE_CHECKING:
    from gpu2tpu.pricing.compare import Comparison, ComparisonRow

# One colour per row source, and a legend sentence for each.
SOURCE_COLOURS = {
    "measured": "#1f77b4",
    "baseline": "#2ca02c",
    "compiled": "#9467bd",
    "estimated": "#ff7f0e",
}
SOURCE_MEANING = {
    "measured": "timed here",
    "baseline": "timed earlier on another machine (baseline file)",
    "compiled": "compiler figures for the chip (forecast)",
    "estimated": "expected from the measured run and the published-runs fit",
}
# What an estimated row is when the only measurement is a CPU run, and why it says little.
SIZING_ONLY = (
    "for sizing only: the step's FLOPs counted on the CPU, at the utilisation published runs "
    "reach on the chip (the CPU run's own speed says nothing about a TPU); a TPU compile "
    "fuses and schedules differently, so this says what the step needs, not how fast a TPU "
    "runs it (gpu2tpu.forecast compiles it for the TPU)"
)
# Below this, a roofline step time is a lower bound: per-step launch and dispatch costs
# (tens of microseconds on any accelerator) are not in it.
LOWER_BOUND_SECONDS = 100e-6
LOWER_BOUND_NOTE = (
    "≥: a bound, not an expected time: no published run calibrates a figure for this row "
    "(it is the roofline at 100% of peak, or its memory or interconnect term), and under "
    "100 µs a step's fixed launch and dispatch costs, which a roofline leaves out, dominate"
)

# The table puts p10-p90 (or the expected range) on a second line, so its header is shorter.
HTML_HEADERS = {"step_seconds": "Step"}
# Bars switch to a log scale when the longest is this many times the shortest (a CPU dry
# run next to TPU estimates), so that every bar stays readable.
LOG_BARS_ABOVE = 100

STYLE = """
<style>
.g2t-view{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;
color:var(--jp-ui-font-color1,#222)}
.g2t-view h3{font-size:15px;margin:4px 0 6px}
.g2t-table{border-collapse:collapse;margin:4px 0 8px}
.g2t-table th,.g2t-table td{padding:3px 6px;border-bottom:1px solid var(--jp-border-color2,#ddd);
text-align:right;white-space:nowrap}
.g2t-table th{background:var(--jp-layout-color2,#f3f3f3);font-weight:600}
.g2t-table td.g2t-left,.g2t-table th.g2t-left{text-align:left}
.g2t-table tr.g2t-estimated td{font-style:italic;opacity:.85}
.g2t-badge{display:inline-block;border-radius:3px;padding:0 5px;color:#fff;font-size:11px}
.g2t-note{color:var(--jp-ui-font-color2,#666);font-size:12px;margin:2px 0}
.g2t-warn{background:#fff4e5;border-left:3px solid #ff7f0e;padding:4px 8px;margin:4px 0;color:#5a3b00}
.g2t-details td{padding:2px 10px 2px 0;vertical-align:top;text-align:left;white-space:normal}
.g2t-details td:first-child{font-weight:600;white-space:nowrap}
.g2t-charts{display:flex;flex-wrap:wrap;gap:16px}
.g2t-scroll{overflow-x:auto;max-width:100%}
.g2t-small{font-size:11px;color:var(--jp-ui-font-color2,#666)}
.g2t-table td.g2t-wrap{white-space:normal;max-width:38em;vertical-align:top}
.g2t-table td.g2t-wrap code{white-space:pre-wrap;word-break:break-word}
.g2t-view,.g2t-view .widget-html,.g2t-view .widget-html-content{max-width:100%;min-width:0}
.g2t-view .widget-html-content{white-space:normal;overflow:visible}
.g2t-charts svg,.g2t-series{max-width:100%;height:auto}
.g2t-ops-folded summary{cursor:pointer;margin:4px 0}
</style>
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# -- numbers, formatted alike within a column or a chart ------------------------------------

_SECOND_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def _significant(value: float, digits: int = 3) -> str:
    """`value` with about `digits` significant digits, thousands separated, never in
    scientific notation ("0.00812", "12.3", "1,520")."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def seconds_format(values: Sequence[float | None]) -> Any:
    """One unit for a whole column or chart of step times: the unit of their median, or a
    larger one where the largest value would need five digits (a CPU run beside TPUs)."""
    known = sorted(v for v in values if v is not None and v > 0 and math.isfinite(v))
    middle = known[len(known) // 2] if known else 1.0
    index = next((i for i, (s, _) in enumerate(_SECOND_UNITS) if middle >= s), 2)
    while index > 0 and known and known[-1] / _SECOND_UNITS[index][0] >= 10_000:
        index -= 1
    scale, unit = _SECOND_UNITS[index]

    def fmt(value: float | None) -> str:
        return "—" if value is None else f"{_significant(value / scale)} {unit}"

    return fmt


def money_format(values: Sequence[float | None]) -> Any:
    """Dollars alike in a column or chart: three significant digits, no exponent."""

    def fmt(value: float | None) -> str:
        return "—" if value is None else f"${_significant(value)}"

    return fmt


def _lower_bound(row: ComparisonRow) -> bool:
    """A row whose time is a bound (shown as >=): nothing calibrates a figure for it."""
    return (
        row.source in ("compiled", "estimated")
        and row.time_kind == "bound"
        and row.step_seconds is not None
    )


def sizing_only(comparison: Comparison) -> bool:
    """Whether the estimated rows come from a CPU run (the only measurement is the CPU's)."""
    measured = [r for r in comparison.rows if r.source in ("measured", "baseline")]
    return bool(measured) and all(r.device_key == "cpu" for r in measured)


def badge(source: str, meanings: Mapping[str, str] | None = None) -> str:
    colour = SOURCE_COLOURS.get(source, "#777")
    title = {**SOURCE_MEANING, **(meanings or {})}.get(source, source)
    return f'<span class="g2t-badge" style="background:{colour}" title="{_e(title)}">{_e(source)}</span>'


def table_html(comparison: Comparison, meanings: Mapping[str, str] | None = None) -> str:
    """The comparison table: one row per device, the columns that have values.

    Step times share one unit and money columns one format per column; estimated rows from
    a CPU-only run say they are for sizing only; rooflines under 100 µs are marked ≥.
    """
    cols = columns(comparison, compact=True)
    head = "".join(
        f'<th class="{"g2t-left" if c.key in ("device", "source") else ""}">{_e(HTML_HEADERS.get(c.key, c.header))}</th>'
        for c in cols
    )
    rows = comparison.rows
    step = seconds_format(
        [r.step_seconds for r in rows]
        + [v for r in rows for v in step_range(r)]
        + [r.bound_seconds for r in rows]
    )
    sizing = sizing_only(comparison)
    body = []
    base = comparison.baseline_row()
    for row in rows:
        cells = []
        for c in cols:
            if c.key == "source":
                extra = (
                    f' <span class="g2t-small" title="{_e(SIZING_ONLY)}">sizing only</span>'
                    if sizing and row.source == "estimated"
                    else ""
                )
                cells.append(f'<td class="g2t-left">{badge(row.source, meanings)}{extra}</td>')
            elif c.key == "device":
                mark = " ★" if row is base and ratio_line(comparison) else ""
                title = f' title="{_e(row.note)}"' if row.note else ""
                cells.append(f'<td class="g2t-left"{title}>{_e(row.label)}{mark}</td>')
            elif c.key == "step_seconds":
                bound = _lower_bound(row)
                shown = ("≥ " if bound else "") + step(row.step_seconds)
                title = f' title="{_e(LOWER_BOUND_NOTE)}"' if bound else ""
                spread = ""
                low, high = step_range(row)
                if low is not None and high is not None:
                    label = "range" if row.time_kind == "expected" else "p10–p90"
                    spread = (
                        f'<br><span class="g2t-small">{label} {_e(step(low))}–'
                        f"{_e(step(high))}</span>"
                    )
                cells.append(f"<td{title}>{_e(shown)}{spread}</td>")
            elif c.key == "bound_seconds":
                cells.append(f"<td>{_e(step(row.bound_seconds))}</td>")
            elif c.key.startswith("cost_per") or c.key == "price_per_hour":
                money = money_format([c.value(r) for r in rows])
                cells.append(f"<td>{_e(money(c.value(row)))}</td>")
            else:
                cells.append(f"<td>{_e(c.text(row))}</td>")
        body.append(f'<tr class="g2t-row g2t-{_e(row.source)}">{"".join(cells)}</tr>')
    caption = ""
    if base is not None and ratio_line(comparison) is not None:
        caption = f'<p class="g2t-note">★ baseline for the ratios: {_e(base.label)} ({_e(base.source)}).</p>'
    return (
        f'<div class="g2t-scroll"><table class="g2t-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{caption}"
    )


def bars_svg(
    rows: Sequence[ComparisonRow],
    attribute: str,
    title: str,
    formatter: Any,
    *,
    width: int = 460,
) -> str:
    """Horizontal bars, one per row with a value, labelled with the device and the value."""
    items = [(r, getattr(r, attribute)) for r in rows]
    items = [(r, v) for r, v in items if v is not None and v > 0 and math.isfinite(v)]
    label_w, value_w, bar_h, gap, top = 150, 90, 18, 6, 24
    height = top + max(1, len(items)) * (bar_h + gap) + 4
    parts = [
        f'<svg class="g2t-bars" data-metric="{_e(attribute)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
        f'<text x="0" y="15" font-size="13" font-weight="600" fill="currentColor">{_e(title)}</text>',
    ]
    if not items:
        parts.append(
            f'<text x="0" y="{top + 13}" font-size="12" fill="#777">no values to compare</text>'
        )
    longest = max((v for _, v in items), default=1.0)
    shortest = min((v for _, v in items), default=1.0)
    log = longest / shortest > LOG_BARS_ABOVE
    span = width - label_w - value_w

    def length(value: float) -> float:
        if not log:
            return span * value / longest
        # a decade of headroom below the shortest bar keeps it visible
        return span * (math.log10(value / shortest) + 1) / (math.log10(longest / shortest) + 1)

    if log:
        parts[1] = parts[1].replace("</text>", " — log scale</text>")
    for i, (row, value) in enumerate(items):
        y = top + i * (bar_h + gap)
        w = max(1.0, length(value))
        colour = SOURCE_COLOURS.get(row.source, "#777")
        opacity = "0.65" if row.source == "estimated" else "1"
        label = row.label if len(row.label) <= 22 else row.label[:21] + "…"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" font-size="12" text-anchor="end" '
            f'fill="currentColor">{_e(label)}</text>'
        )
        parts.append(
            f'<rect class="g2t-bar" x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" '
            f'fill="{colour}" fill-opacity="{opacity}" data-device="{_e(row.device_key)}" '
            f'data-source="{_e(row.source)}"><title>{_e(row.label)} ({_e(row.source)}): '
            f"{_e(formatter(value))}</title></rect>"
        )
        mark = "≥ " if attribute == "step_seconds" and _lower_bound(row) else ""
        parts.append(
            f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" font-size="12" '
            f'fill="currentColor">{_e(mark + formatter(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def legend_html(comparison: Comparison, meanings: Mapping[str, str] | None = None) -> str:
    """What each row source means here (`meanings` overrides the profiler's wording), and
    the marks the table uses."""
    meaning = {**SOURCE_MEANING, **(meanings or {})}
    if sizing_only(comparison) and "estimated" not in (meanings or {}):
        meaning["estimated"] = f"expected from the CPU run's counted FLOPs, {SIZING_ONLY}"
    sources = list(dict.fromkeys(r.source for r in comparison.rows))
    parts = [f"{badge(s, meaning)} {_e(meaning.get(s, s))}" for s in sources]
    if any(_lower_bound(r) for r in comparison.rows):
        parts.append(_e(LOWER_BOUND_NOTE))
    if comparison.expected_source:
        parts.append(_e(comparison.expected_source))
    return '<p class="g2t-note">' + "<br>".join(parts) + "</p>"


def charts_html(comparison: Comparison) -> str:
    """Bars for step time, and for $/1M tokens (or $/1k steps when tokens are unknown)."""
    rows = comparison.rows
    step = bars_svg(
        rows,
        "step_seconds",
        "Step time (lower is better)",
        seconds_format([r.step_seconds for r in rows]),
    )
    metric = "cost_per_1m_tokens"
    title = "$ per 1M tokens (lower is better)"
    if all(r.cost_per_1m_tokens is None for r in rows):
        metric, title = "cost_per_1k_steps", "$ per 1,000 steps (lower is better)"
    money = bars_svg(rows, metric, title, money_format([getattr(r, metric) for r in rows]))
    return f'<div class="g2t-charts">{step}{money}</div>'


def _series(series: Any) -> tuple[list[float], list[float], int]:
    if series is None:
        return [], [], 1
    if isinstance(series, Mapping):
        warm = [float(x) for x in series.get("warmup", ())]
        steps = [float(x) for x in series.get("steps", ())]
        return warm, steps, int(series.get("group_size", 1) or 1)
    return [], [float(x) for x in series], 1


def series_svg(series: Any, *, width: int = 640, height: int = 220) -> str:
    """Step time per step, warm-up steps shaded; a log axis when compile dwarfs the rest."""
    warm, steps, group = _series(series)
    values = warm + steps
    if not values:
        return '<p class="g2t-note">No step-time series was recorded.</p>'
    left, right, top, bottom = 64, 12, 26, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    lo, hi = min(values), max(values)
    log = lo > 0 and hi / lo > 20
    if log:
        y_lo, y_hi = math.log10(lo), math.log10(hi)
    else:
        y_lo, y_hi = 0.0, hi
    if y_hi - y_lo <= 0:
        y_hi = y_lo + (abs(y_lo) or 1.0)

    def y_of(v: float) -> float:
        t = (math.log10(v) if log else v) - y_lo
        return top + plot_h - plot_h * t / (y_hi - y_lo)

    n = len(values)
    fmt = seconds_format(values)

    def x_of(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    parts = [
        f'<svg class="g2t-series" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="Step time per step">',
        f'<text x="0" y="15" font-size="13" font-weight="600" fill="currentColor">'
        f"Step time per step{' (log scale)' if log else ''}"
        f"{f', each point the mean of {group} steps' if group > 1 else ''}</text>",
    ]
    if warm:
        x_end = (x_of(len(warm) - 1) + x_of(len(warm))) / 2 if len(warm) < n else left + plot_w
        parts.append(
            f'<rect class="g2t-warmup" x="{left}" y="{top}" width="{max(2.0, x_end - left):.1f}" '
            f'height="{plot_h}" fill="#999" fill-opacity="0.18"><title>warm-up and compilation'
            f"</title></rect>"
        )
        parts.append(
            f'<text x="{left + 4}" y="{top + 12}" font-size="11" fill="#666">warm-up / compile</text>'
        )
    # axes and three y ticks
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#999"/>'
    )
    for frac in (0.0, 0.5, 1.0):
        raw = y_lo + (y_hi - y_lo) * frac
        value = 10**raw if log else raw
        y = top + plot_h - plot_h * frac
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="currentColor">{_e(fmt(value))}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" font-size="11" text-anchor="middle" '
        f'fill="currentColor">step ({len(warm)} warm-up, {len(steps)} timed)</text>'
    )
    points = " ".join(f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(values))
    parts.append(
        f'<polyline points="{points}" fill="none" stroke="{SOURCE_COLOURS["measured"]}" '
        f'stroke-width="1.5"/>'
    )
    for i, v in enumerate(values):
        colour = "#999" if i < len(warm) else SOURCE_COLOURS["measured"]
        parts.append(
            f'<circle cx="{x_of(i):.1f}" cy="{y_of(v):.1f}" r="2.5" fill="{colour}">'
            f"<title>step {i + 1}: {_e(fmt(v))}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def details_html(comparison: Comparison, details: Mapping[str, Any] | None) -> str:
    """Key facts of the run, then every price used with its source and date."""
    rows = [
        f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>"
        for k, v in (details or {}).items()
        if k != "Prices"
    ]
    used = comparison.prices_used or {}
    price_rows = []
    for key, value in (used.get("prices") or {}).items():
        as_of = (used.get("as_of") or {}).get(key, "")
        source = (used.get("sources") or {}).get(key, "")
        shown = "no public price" if value is None else f"${value:g}/chip-hour"
        override = key in (used.get("overrides") or {})
        price_rows.append(
            f"<tr><td>{_e(key)}</td><td>{_e(shown)}{' (your override)' if override else ''}"
            f" — {_e(source)} (as of {_e(as_of)})</td></tr>"
        )
    notes = [
        f"<tr><td>{_e(r.label)} ({_e(r.source)})</td><td>{_e(r.note)}</td></tr>"
        for r in comparison.rows
        if r.note
    ]
    out = ['<div class="g2t-details-box">']
    if rows:
        out.append(f'<h3>Run</h3><table class="g2t-details">{"".join(rows)}</table>')
    out.append(f"<h3>Prices used</h3><p>{_e(comparison.prices_summary())}</p>")
    if price_rows:
        out.append(f'<table class="g2t-details">{"".join(price_rows)}</table>')
    if notes:
        out.append(
            f'<h3>Where each row comes from</h3><table class="g2t-details">{"".join(notes)}</table>'
        )
    out.append("</div>")
    return "".join(out)


def warnings_html(details: Mapping[str, Any] | None) -> str:
    """Recompiles during timed steps and host syncs: what makes a TPU comparison misleading."""
    if not details:
        return ""
    boxes = []
    compiles = str(details.get("Compilations", ""))
    timed = re.search(r"timed steps (\d+)", compiles)
    if timed and int(timed.group(1)) > 0:
        boxes.append(
            f"Recompilation during timed steps ({compiles}): shapes or code change per step."
        )
    syncs = str(details.get("Host syncs per step", ""))
    count = re.match(r"(\d+)", syncs)
    if count and int(count.group(1)) > 0:
        boxes.append(f"Host syncs in every step: {syncs}. Each one stalls a TPU's pipeline.")
    return "".join(f'<div class="g2t-warn">{_e(b)}</div>' for b in boxes)


def expected_html(comparison: Comparison) -> str:
    """The one line about expected figures (where from, how sure), or nothing."""
    if not comparison.expected_source:
        return ""
    return f'<p class="g2t-note g2t-expected">{_e(comparison.expected_source)}</p>'


def header_html(comparison: Comparison) -> str:
    return (
        f"<h3>{_e(comparison.title)}</h3>"
        f'<p class="g2t-note g2t-prices">{_e(comparison.prices_summary())}</p>'
        f"{expected_html(comparison)}"
    )


def static_html(
    comparison: Comparison, *, series: Any = None, details: Mapping[str, Any] | None = None
) -> str:
    """Everything the widget shows, on one page, with no script."""
    return (
        f'{STYLE}<div class="g2t-view">{header_html(comparison)}{warnings_html(details)}'
        f"{table_html(comparison)}{legend_html(comparison)}{charts_html(comparison)}"
        f"{series_svg(series) if series is not None else ''}"
        f"{details_html(comparison, details)}</div>"
    )


# -- the forecast ----------------------------------------------------------------------------

FORECAST_MEANING = {
    "compiled": (
        "libtpu compiled the step for this chip here (no TPU ran): the expected time on the "
        "compiler's FLOPs, with the roofline bound beside it"
    ),
    "estimated": (
        "the FLOPs and bytes compiled for a TPU target, at the utilisation published runs reach "
        "on this GPU; not a CUDA measurement"
    ),
}
STATUS_COLOURS = {
    "compiled": "#1b7f3b",
    "does not fit": "#b36b00",
    "unsupported": "#a33",
    "error": "#a33",
    "interrupted": "#777",
}


def memory_bar(used: float | None, usable: float | None, *, width: int = 120) -> str:
    """A small inline bar: memory per chip against the usable HBM (red past full)."""
    if used is None or not usable:
        return ""
    share = used / usable
    filled = min(1.0, share) * width
    colour = "#1b7f3b" if share <= 0.8 else ("#b36b00" if share <= 1.0 else "#a33")
    return (
        f'<svg class="g2t-memory" width="{width}" height="10" role="img" '
        f'aria-label="{share:.0%} of usable HBM" data-fraction="{share:.4f}">'
        f'<rect x="0" y="0" width="{width}" height="10" fill="#ddd"/>'
        f'<rect x="0" y="0" width="{filled:.1f}" height="10" fill="{colour}"/></svg>'
    )


def forecast_targets_html(forecast: Any) -> str:
    """Per TPU target: status, memory against usable HBM, fit, largest batch, bound, the
    roofline step and the compile time (from `Forecast.summary_rows()`)."""
    rows = forecast.summary_rows()
    step = seconds_format(
        [r.get(k) for r in rows for k in ("step_seconds", "expected_seconds", "expected_low")]
    )
    head = (
        '<tr><th class="g2t-left">Target</th><th class="g2t-left">Status</th>'
        '<th class="g2t-left">Memory per chip / usable HBM</th><th>Fits</th>'
        "<th>Largest batch</th><th>Bound</th><th>Expected step</th><th>Roofline bound</th>"
        "<th>Compile</th></tr>"
    )
    body = []
    for r in rows:
        status = str(r.get("status", ""))
        colour = STATUS_COLOURS.get(status, "#777")
        used, usable = r.get("memory_per_chip"), r.get("usable_hbm_per_chip")
        memory = "—"
        if used is not None:
            fraction = f" ({used / usable:.0%})" if usable else ""
            memory = (
                f"{_e(format_bytes(used))} of {_e(format_bytes(usable))}{_e(fraction)}"
                f"<br>{memory_bar(used, usable)}"
            )
        fits = r.get("fits")
        largest = r.get("max_batch")
        if largest is None:
            batch = '<span title="the largest-batch search was off (batch_search=True, or %%tpu --search)">not searched</span>'
        else:
            batch = _e(f"{largest}{'' if r.get('max_batch_exact') else '+'}")
        seconds = r.get("step_seconds")
        bound_mark = seconds is not None and seconds < LOWER_BOUND_SECONDS
        step_text = ("≥ " if bound_mark else "") + step(seconds)
        title = f' title="{_e(LOWER_BOUND_NOTE)}"' if bound_mark else ""
        compile_text = "cached" if r.get("cached") else step_like(r.get("compile_seconds"))
        if r.get("extrapolated"):
            compile_text += " (extrapolated)"
        body.append(
            f'<tr class="g2t-target" data-target="{_e(r.get("target", ""))}">'
            f'<td class="g2t-left">{_e(r.get("label", ""))}</td>'
            f'<td class="g2t-left" style="color:{colour}">{_e(status)}</td>'
            f'<td class="g2t-left">{memory}</td>'
            f"<td>{'—' if fits is None else ('yes' if fits else 'no')}</td>"
            f"<td>{batch}</td><td>{_e(r.get('bound') or '—')}</td>"
            f"<td>{_e(_expected_cell(r, step))}</td>"
            f"<td{title}>{_e(step_text)}</td><td>{_e(compile_text)}</td></tr>"
        )
    note = ""
    if any((r.get("step_seconds") or 1) < LOWER_BOUND_SECONDS for r in rows):
        note = f'<p class="g2t-note">{_e(LOWER_BOUND_NOTE)}</p>'
    if getattr(forecast, "interrupted", False):
        note += (
            '<p class="g2t-note">Interrupted: the targets finished before Ctrl-C are '
            "complete; the others say so.</p>"
        )
    return (
        '<h3>TPU targets</h3><div class="g2t-scroll"><table class="g2t-table g2t-targets">'
        f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table></div>{note}"
    )


def _expected_cell(row: Mapping[str, Any], step: Any) -> str:
    if row.get("expected_seconds") is None:
        return "—"
    return (
        f"{step(row['expected_seconds'])} ({step(row.get('expected_low'))}–"
        f"{step(row.get('expected_high'))})"
    )


def step_like(seconds: float | None) -> str:
    """A duration such as a compile time: "12.3 s", "850 ms"."""
    return "—" if seconds is None else format_seconds(seconds)


def forecast_header_html(forecast: Any, comparison: Comparison) -> str:
    model = _e(getattr(forecast, "model", ""))
    batch = _e(getattr(forecast, "batch", ""))
    return (
        f"<h3>{_e(comparison.title)}</h3>"
        f'<p class="g2t-note">{model}, batch {batch}, {_e(getattr(forecast, "optimizer", ""))}, '
        f"{_e(getattr(forecast, 'dtype', ''))}: compiled for each TPU target with libtpu on "
        "this machine; no TPU ran.</p>"
        f'<p class="g2t-note g2t-prices">{_e(comparison.prices_summary())}</p>'
        f"{expected_html(comparison)}"
    )


def forecast_html(forecast: Any) -> str:
    """The forecast on one static page (no script): targets, costs, details."""
    comparison = forecast.comparison
    return (
        f'{STYLE}<div class="g2t-view g2t-forecast">{forecast_header_html(forecast, comparison)}'
        f"{forecast_targets_html(forecast)}<h3>Cost per step</h3>"
        f"{table_html(comparison, FORECAST_MEANING)}"
        f"{legend_html(comparison, FORECAST_MEANING)}{charts_html(comparison)}"
        f"{details_html(comparison, forecast.details())}</div>"
    )


# -- the dry run's op coverage ---------------------------------------------------------------


def coverage_html(report: Any) -> str:
    """Ops without an XLA lowering (and unknown ones) first, in a table; the ops that lower
    folded below them, as they need no action."""
    colours = {"not lowered": "#a33", "unknown": "#b36b00", "lowered": "#1b7f3b"}
    attention_statuses = ("not lowered", "unknown")

    def rows(entries: Sequence[Any]) -> str:
        out = []
        for entry in entries:
            code = f"<br><code>{_e(entry.code)}</code>" if entry.code else ""
            out.append(
                f'<tr class="g2t-op"><td class="g2t-left"><code>{_e(entry.op)}</code></td>'
                f'<td>{entry.count}</td><td class="g2t-left" style=\'color:'
                f"{colours.get(entry.status, '#777')}'>{_e(entry.status)}</td>"
                f'<td class="g2t-left g2t-wrap">{_e(entry.where)}{code}</td>'
                f'<td class="g2t-left g2t-wrap">{_e(entry.hint or entry.via)}</td></tr>'
            )
        return "".join(out)

    head = (
        '<thead><tr><th class="g2t-left">op</th><th>calls</th><th class="g2t-left">status'
        '</th><th class="g2t-left">where</th><th class="g2t-left">why / what instead</th>'
        "</tr></thead>"
    )
    attention = [e for e in report.ops if e.status in attention_statuses]
    rest = [e for e in report.ops if e.status not in attention_statuses]
    out = [
        '<div class="g2t-op-coverage">',
        f"<p><b>Op coverage</b> against {_e(report.table)}: {_e(report.summary())}</p>",
    ]
    if attention:
        out.append(
            '<div class="g2t-scroll"><table class="g2t-table g2t-ops-attention">'
            f"{head}<tbody>{rows(attention)}</tbody></table></div>"
        )
    if rest:
        out.append(
            f'<details class="g2t-ops-folded"><summary>{len(rest)} op'
            f"{'s' if len(rest) != 1 else ''} with an XLA lowering (or none needed)</summary>"
            f'<div class="g2t-scroll"><table class="g2t-table">{head}<tbody>{rows(rest)}'
            "</tbody></table></div></details>"
        )
    out.append("</div>")
    return "".join(out)


def coverage_page(report: Any) -> str:
    """The op coverage alone, with the shared style (`CoverageReport._repr_html_`)."""
    return f"{STYLE}<div class='g2t-view'>{coverage_html(report)}</div>"


def dry_run_html(report: Any) -> str:
    """A dry-run report: its hazards by line, then the op coverage (unlowered ops first)."""
    out = [
        f'{STYLE}<div class="g2t-view gpu2tpu-dry-run">',
        f"<p><b>Dry run of {_e(report.label)} on the CPU</b>: {report.total_ops:,} ATen ops "
        f"({report.distinct_ops} distinct) in {report.seconds * 1e3:,.1f} ms</p>",
    ]
    if report.error:
        out.append(f'<div class="g2t-warn">The run stopped: {_e(report.error)}</div>')
    if not report.hazards:
        out.append("<p>No TPU hazards found.</p>")
    else:
        out.append(
            '<div class="g2t-scroll"><table class="g2t-table g2t-hazards"><thead><tr>'
            '<th class="g2t-left">kind</th><th class="g2t-left">where</th><th>count</th>'
            '<th class="g2t-left">cause</th><th class="g2t-left">code</th></tr></thead><tbody>'
        )
        for h in report.hazards:
            where = h.where()  # "line 4", or "In[3] line 6 (from line 2)" in an earlier cell
            out.append(
                f'<tr><td class="g2t-left">{_e(h.kind)}</td><td class="g2t-left">{_e(where)}'
                f'</td><td>{h.count}</td><td class="g2t-left g2t-wrap">{_e(h.cause_text())}</td>'
                f'<td class="g2t-left"><code>{_e(h.code)}</code></td></tr>'
            )
        out.append("</tbody></table></div><ul>")
        for kind in report.kinds_found():
            out.append(f"<li><b>{_e(kind)}</b>: {_e(kind.why)}. Fix: {_e(kind.fix)}</li>")
        out.append("</ul>")
    out.append(coverage_html(report.coverage))
    out.append("</div>")
    return "".join(out)
