"""A comparison as a table: its columns, and the text and rich renderings of the same cells.

`Comparison.__repr__` and `__rich__` come here, as do the HTML table and the widgets
(`html.py`), so every view shows the same columns with the same formatting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .format import (
    format_bytes,
    format_money,
    format_percent,
    format_rate,
    format_ratio,
    format_seconds,
)

if TYPE_CHECKING:
    from gpu2tpu.pricing.compare import Comparison, ComparisonRow


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    always: bool = False
    spare: bool = False  # left out of compact views

    def value(self, row: ComparisonRow) -> Any:
        if self.key == "device":
            return row.label
        if self.key == "fits":
            return row.fits
        return getattr(row, self.key)

    def text(self, row: ComparisonRow) -> str:
        value = self.value(row)
        if self.key == "device":
            return value
        if self.key == "source":
            return row.source
        if self.key == "step_seconds":
            text = (
                "≥ " if row.time_kind == "bound" and value is not None else ""
            ) + format_seconds(value)
            low, high = step_range(row)
            if low is not None and high is not None and value is not None:
                text += f" ({format_seconds(low)}–{format_seconds(high)})"
            return text
        if self.key == "bound_seconds":
            return format_seconds(value)
        if self.key == "time_kind":
            return "—" if value is None else row.kind_label
        if self.key in ("samples_per_s", "tokens_per_s"):
            return format_rate(value)
        if self.key.startswith("cost_per") or self.key == "price_per_hour":
            return format_money(value)
        if self.key in ("speedup_vs_baseline", "cost_ratio_vs_baseline"):
            return format_ratio(value)
        if self.key == "mfu":
            return format_percent(value)
        if self.key == "memory_bytes":
            return format_bytes(value)
        if self.key == "fits":
            return "—" if value is None else ("yes" if value else "no")
        return "—" if value is None else str(value)


def step_range(row: ComparisonRow) -> tuple[float | None, float | None]:
    """A row's step range: p10-p90 of timed steps, or the expected time's range."""
    if row.time_kind == "expected":
        return row.step_low, row.step_high
    return row.step_p10, row.step_p90


COLUMNS: Sequence[Column] = (
    Column("device", "Device", always=True),
    Column("source", "Source", always=True),
    Column("time_kind", "Step is", always=True),
    Column("step_seconds", "Step (p10–p90 or range)", always=True),
    Column("bound_seconds", "Roofline bound"),
    Column("samples_per_s", "Samples/s"),
    Column("tokens_per_s", "Tokens/s"),
    Column("price_per_hour", "$/hour"),
    Column("cost_per_step", "$/step", spare=True),
    Column("cost_per_1k_steps", "$/1k steps"),
    Column("cost_per_epoch", "$/epoch"),
    Column("cost_per_1m_tokens", "$/1M tokens"),
    Column("speedup_vs_baseline", "Speed-up"),
    Column("cost_ratio_vs_baseline", "Cost ratio"),
    Column("mfu", "MFU"),
    Column("memory_bytes", "Memory"),
    Column("fits", "Fits"),
)


def columns(comparison: Comparison, *, compact: bool = False) -> list[Column]:
    """The display columns that have at least one value (an all-empty column is noise).

    `compact` drops the columns a narrow view can spare ($/step, which $/1k steps says
    more readably); the data exports always keep every field.
    """
    return [
        c
        for c in COLUMNS
        if (c.always or any(c.value(r) is not None for r in comparison.rows))
        and not (compact and c.spare)
    ]


def table_cells(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The cells every view shows: costs per 1k steps and per 1M tokens, not per step (a
    fraction of a cent); the exports keep `cost_per_step`."""
    cols = columns(comparison, compact=True)
    return [c.header for c in cols], [[c.text(r) for c in cols] for r in comparison.rows]


def padded_lines(headers: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """A plain-text table: a header, a rule, one line per row, columns padded to fit."""
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for cells in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
    return lines


def ratio_line(comparison: Comparison) -> str | None:
    """ "Ratios are against h100." when the table shows a ratio column; None when no row has
    a ratio (the baseline has no figure, or only bounds), so no line names absent columns."""
    if not comparison.baseline_key:
        return None
    ratios = ("speedup_vs_baseline", "cost_ratio_vs_baseline")
    if not any(c.key in ratios for c in columns(comparison, compact=True)):
        return None
    return f"Ratios are against {comparison.baseline_key}."


def comparison_text(comparison: Comparison) -> str:
    """The comparison for a terminal without rich: title, table, ratio base, prices, notes."""
    headers, body = table_cells(comparison)
    lines = [comparison.title, *padded_lines(headers, body)]
    if ratio := ratio_line(comparison):
        lines.append(ratio)
    lines.append(comparison.prices_summary())
    if comparison.expected_source:
        lines.append(comparison.expected_source)
    notes = [f"  {r.label} ({r.source}): {r.note}" for r in comparison.rows if r.note]
    if notes:
        lines.append("Notes:")
        lines.extend(notes)
    return "\n".join(lines)


def comparison_rich(comparison: Comparison) -> Any:
    """The same cells as `comparison_text`, as a rich Table styled by each row's source."""
    from rich.table import Table

    headers, body = table_cells(comparison)
    caption = comparison.prices_summary()
    if comparison.expected_source:
        caption += " " + comparison.expected_source
    if ratio := ratio_line(comparison):
        caption = f"{ratio} " + caption
    table = Table(title=comparison.title, caption=caption, caption_justify="left")
    for col in columns(comparison, compact=True):
        table.add_column(col.header, justify="left" if col.key in ("device", "source") else "right")
    styles = {"measured": "bold", "baseline": "green", "estimated": "dim", "compiled": "cyan"}
    for row, cells in zip(comparison.rows, body, strict=True):
        table.add_row(*cells, style=styles.get(row.source))
    return table
