"""Numbers as a person reads them: seconds, money, rates, ratios, percentages, bytes, FLOPs.

One place for every view (text, rich, HTML, widgets) and for the results' own summaries, so
the same figure reads the same everywhere.
"""

from __future__ import annotations

import math


def format_seconds(value: float | None) -> str:
    """ "812 µs", "12.3 ms", "1.52 s"; an em dash for no value."""
    if value is None:
        return "—"
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


# Below this a cost reads as "under $0.000000001" rather than as a long row of zeros.
_SMALLEST_MONEY = 1e-9


def format_money(value: float | None) -> str:
    """USD in plain dollars, about three significant digits: "$0.0000119", "$0.0123", "$4.56",
    "$1,234" (never scientific notation: views show costs per 1k steps and per 1M tokens)."""
    if value is None:
        return "—"
    if value == 0:
        return "$0"
    if abs(value) >= 1000:
        return f"${value:,.0f}"
    if abs(value) >= 1:
        return f"${value:.2f}"
    if abs(value) < _SMALLEST_MONEY:
        return "under $0.000000001"
    return f"${value:.{2 - math.floor(math.log10(abs(value)))}f}"


def format_rate(value: float | None) -> str:
    if value is None:
        return "—"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def format_ratio(value: float | None) -> str:
    """ "2.41×", "0.0029×": three significant digits, so small ratios do not read as zero."""
    return "—" if value is None else f"{value:.3g}×"


def format_percent(value: float | None) -> str:
    """ "41.3%", "0.047%": small fractions keep two significant digits."""
    if value is None:
        return "—"
    if 0 < abs(value) < 0.01:
        return f"{value * 100:.2g}%"
    return f"{value * 100:.1f}%"


def format_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:.0f} B"


def format_flops(value: float | None) -> str:
    """ "1.23 TFLOP" for a count (append "/s" yourself for a rate)."""
    if value is None:
        return "—"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.3g} FLOP"
