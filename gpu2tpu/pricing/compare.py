"""A comparison of devices in time and money per step: rows, ratios, and their renderings.

`ComparisonRow` is one device at one step time, labelled by where that time came from:
"measured" (timed here), "baseline" (timed earlier on another machine and loaded from a
file), "estimated" (roofline from the measured run, docs/profiler.md) or "compiled" (the
forecast's compiler figures). `Comparison` holds the rows, the chip the ratios are against,
and the prices used, and renders as a rich table, plain text, JSON, CSV, a DataFrame, static
HTML or a notebook widget. Rows are generic, so the forecast builds them the same way.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import date
from typing import Any

from .catalogue import Chip, HardwareCatalogue, describe_age, parse_date
from .cost import cost_per_million_tokens, cost_per_step, price_per_hour, steps_per_epoch
from .utilisation import default_fit

SOURCES = ("measured", "baseline", "compiled", "estimated")
# What a row's step time is: timed, expected from the utilisation model (with a range), or
# the roofline bound at 100% of peak (only where nothing better exists).
TIME_KINDS = ("measured", "expected", "bound")
# How views name the framework an expected time is for.
FRAMEWORK_LABELS = {
    "jax": "tuned JAX",
    "pytorch_xla": "PyTorch/XLA",
    "torchtpu": "TorchTPU",
    "torchax": "torchax",
    "pytorch": "PyTorch",
    "megatron": "Megatron",
}
# When two rows share a chip, the baseline is the most trustworthy one.
_SOURCE_RANK = {s: i for i, s in enumerate(SOURCES)}


@dataclass
class ComparisonRow:
    """One device at one step time, with what that step costs there.

    Money is USD; `cost_per_epoch` needs a dataset size and samples per step;
    `speedup_vs_baseline` > 1 means faster than the baseline, `cost_ratio_vs_baseline` < 1
    means cheaper. `fits` says whether the step's memory fits the chips' HBM (None: unknown).
    """

    device_key: str
    device_name: str
    source: str
    step_seconds: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    cost_per_step: float | None = None
    cost_per_1k_steps: float | None = None
    cost_per_epoch: float | None = None
    cost_per_1m_tokens: float | None = None
    speedup_vs_baseline: float | None = None
    cost_ratio_vs_baseline: float | None = None
    mfu: float | None = None
    memory_bytes: int | None = None
    fits: bool | None = None
    note: str = ""
    chips: int = 1
    price_per_hour: float | None = None
    step_p10: float | None = None
    step_p90: float | None = None
    time_kind: str | None = None
    step_low: float | None = None
    step_high: float | None = None
    bound_seconds: float | None = None
    cost_per_step_low: float | None = None
    cost_per_step_high: float | None = None
    cost_per_1m_tokens_low: float | None = None
    cost_per_1m_tokens_high: float | None = None
    token_budget: float | None = None
    time_to_budget_seconds: float | None = None
    cost_to_budget: float | None = None
    framework: str = ""
    ceiling_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"row source must be one of {', '.join(SOURCES)}, not {self.source!r}."
            )
        if self.time_kind is None:  # a roofline unless someone timed it
            self.time_kind = "measured" if self.source in ("measured", "baseline") else "bound"
        if self.time_kind not in TIME_KINDS:
            raise ValueError(
                f"row time_kind must be one of {', '.join(TIME_KINDS)}, not {self.time_kind!r}."
            )

    @classmethod
    def build(
        cls,
        chip: Chip,
        step_seconds: float | None,
        source: str,
        *,
        chips: int = 1,
        price: str = "on_demand",
        samples_per_step: float | None = None,
        tokens_per_step: float | None = None,
        dataset_size: int | None = None,
        flops_per_step: float | None = None,
        memory_bytes: int | None = None,
        fits: bool | None = None,
        note: str = "",
        step_p10: float | None = None,
        step_p90: float | None = None,
        mfu: float | None = None,
        device_name: str | None = None,
        time_kind: str | None = None,
        step_low: float | None = None,
        step_high: float | None = None,
        bound_seconds: float | None = None,
        token_budget: float | None = None,
        framework: str = "",
        ceiling_seconds: float | None = None,
    ) -> ComparisonRow:
        """A row with throughput and costs computed from a step time and the chip's price.

        `time_kind` says what `step_seconds` is ("measured", "expected" with its range
        `step_low`-`step_high`, or a roofline "bound"; by default "measured" for measured and
        baseline rows, "bound" for the others); costs come from it, and their ranges
        from the step's range. `bound_seconds` is the roofline shown beside an expected time.
        `mfu` is computed from `flops_per_step` and the chip's peak unless given; `fits` from
        `memory_bytes` (per step, all chips together) against the chips' HBM unless given.
        `token_budget` (tokens) adds the time and money to train on that many tokens.
        `framework` names what an expected time is for (`FRAMEWORK_LABELS`), and
        `ceiling_seconds` what the tuned framework reaches on the chip where it differs.
        """
        hourly = price_per_hour(chip, chips, price)
        row = cls(
            device_key=chip.key,
            device_name=device_name or chip.name,
            source=source,
            step_seconds=step_seconds,
            chips=chips,
            price_per_hour=hourly,
            memory_bytes=memory_bytes,
            note=note,
            step_p10=step_p10,
            step_p90=step_p90,
            time_kind=time_kind,
            step_low=step_low,
            step_high=step_high,
            bound_seconds=bound_seconds,
            token_budget=token_budget,
            framework=framework,
            ceiling_seconds=ceiling_seconds,
        )
        if fits is None and memory_bytes is not None and chip.hbm_bytes > 0:
            fits = memory_bytes <= chip.hbm_bytes * chips
        row.fits = fits
        if step_seconds is None or step_seconds <= 0:
            return row
        if samples_per_step:
            row.samples_per_s = samples_per_step / step_seconds
        if tokens_per_step:
            row.tokens_per_s = tokens_per_step / step_seconds
        row.cost_per_step = cost_per_step(step_seconds, chip, chips, price)
        if row.cost_per_step is not None:
            row.cost_per_1k_steps = row.cost_per_step * 1000
            if dataset_size and samples_per_step:
                row.cost_per_epoch = row.cost_per_step * steps_per_epoch(
                    dataset_size, samples_per_step
                )
            if tokens_per_step:
                row.cost_per_1m_tokens = cost_per_million_tokens(
                    step_seconds, tokens_per_step, chip, chips, price
                )
            if step_low is not None and step_high is not None:
                row.cost_per_step_low = cost_per_step(step_low, chip, chips, price)
                row.cost_per_step_high = cost_per_step(step_high, chip, chips, price)
                if tokens_per_step:
                    row.cost_per_1m_tokens_low = cost_per_million_tokens(
                        step_low, tokens_per_step, chip, chips, price
                    )
                    row.cost_per_1m_tokens_high = cost_per_million_tokens(
                        step_high, tokens_per_step, chip, chips, price
                    )
        if token_budget and tokens_per_step:
            row.time_to_budget_seconds = token_budget / tokens_per_step * step_seconds
            if row.cost_per_1m_tokens is not None:
                row.cost_to_budget = row.cost_per_1m_tokens * token_budget / 1e6
        if mfu is None and flops_per_step and chip.has_peak:
            mfu = flops_per_step / (step_seconds * chip.peak_bf16_flops * chips)
        row.mfu = mfu
        return row

    @property
    def label(self) -> str:
        """The device as the views show it: "TPU v5e", or "TPU v5e x8" for several chips."""
        return self.device_name if self.chips == 1 else f"{self.device_name} x{self.chips}"

    @property
    def expected(self) -> bool:
        return self.time_kind == "expected"

    @property
    def kind_label(self) -> str:
        """What the step time is, for a view: "measured", "bound (>=)", or "expected for
        PyTorch/XLA" (with the tuned framework's figure where it differs)."""
        if self.time_kind == "bound":
            return "bound (>=)"
        if self.time_kind != "expected" or not self.framework:
            return str(self.time_kind)
        label = f"expected for {FRAMEWORK_LABELS.get(self.framework, self.framework)}"
        if self.ceiling_seconds:
            from ..views.format import format_seconds

            label += f"; tuned: {format_seconds(self.ceiling_seconds)}"
        return label

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    """Rows of devices, the chip the ratios are against, and which prices were used.

    `prices_used` holds the price column, each chip's price date and source, and any user
    overrides (see `HardwareCatalogue.prices_used`); `workload` keeps what repricing needs
    (tokens and samples per step, dataset size).
    """

    rows: list[ComparisonRow]
    baseline_key: str | None = None
    prices_used: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    title: str = "gpu2tpu profile"
    catalogue: HardwareCatalogue | None = field(default=None, repr=False, compare=False)
    expected_source: str = ""

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[ComparisonRow],
        *,
        baseline_key: str | None = None,
        catalogue: HardwareCatalogue | None = None,
        price: str = "on_demand",
        workload: Mapping[str, Any] | None = None,
        title: str = "gpu2tpu profile",
        expected_source: str | None = None,
    ) -> Comparison:
        """A comparison with ratios filled in against `baseline_key` and prices recorded.

        `expected_source` is the one line every view prints about expected rows (where the
        figure comes from, how sure it is); by default the shipped utilisation fit's line
        when any row is expected.
        """
        rows = list(rows)
        catalogue = catalogue or HardwareCatalogue.load()
        known = [r.device_key for r in rows if catalogue.find(r.device_key) is not None]
        if expected_source is None:
            expected_source = default_fit().source_line() if any(r.expected for r in rows) else ""
        comparison = cls(
            rows=rows,
            baseline_key=baseline_key,
            prices_used=catalogue.prices_used(list(dict.fromkeys(known)), price),
            workload=dict(workload or {}),
            title=title,
            catalogue=catalogue,
            expected_source=expected_source,
        )
        comparison.apply_ratios()
        return comparison

    # -- ratios and repricing --------------------------------------------------------------

    def baseline_row(self) -> ComparisonRow | None:
        """The row ratios are against: the baseline chip's most trustworthy row."""
        if self.baseline_key is None:
            return None
        matches = [r for r in self.rows if r.device_key == self.baseline_key]
        if not matches:
            return None
        return min(matches, key=lambda r: _SOURCE_RANK.get(r.source, len(SOURCES)))

    def apply_ratios(self) -> None:
        """Fill speed-up and cost ratios of every row against the baseline row; a bound is
        never set against an expected or measured time (the ratio would be a bound too,
        in a direction the column cannot show)."""
        base = self.baseline_row()
        for row in self.rows:
            row.speedup_vs_baseline = None
            row.cost_ratio_vs_baseline = None
            if base is None or not row.step_seconds or not base.step_seconds:
                continue
            if (row.time_kind == "bound") != (base.time_kind == "bound"):
                continue  # a lower bound against a figure is no ratio
            row.speedup_vs_baseline = base.step_seconds / row.step_seconds
            if row.cost_per_step is not None and base.cost_per_step:
                row.cost_ratio_vs_baseline = row.cost_per_step / base.cost_per_step

    def repriced(self, price: str, catalogue: HardwareCatalogue | None = None) -> Comparison:
        """The same step times costed with another price column ("on_demand" or "spot")."""
        catalogue = catalogue or self.catalogue or HardwareCatalogue.load()
        rows = []
        for row in self.rows:
            chip = catalogue.find(row.device_key)
            if chip is None:
                rows.append(replace(row))
                continue
            rebuilt = ComparisonRow.build(
                chip,
                row.step_seconds,
                row.source,
                chips=row.chips,
                price=price,
                samples_per_step=self.workload.get("samples_per_step"),
                tokens_per_step=self.workload.get("tokens_per_step"),
                dataset_size=self.workload.get("dataset_size"),
                memory_bytes=row.memory_bytes,
                fits=row.fits,
                note=row.note,
                step_p10=row.step_p10,
                step_p90=row.step_p90,
                mfu=row.mfu,
                device_name=row.device_name,
                time_kind=row.time_kind,
                step_low=row.step_low,
                step_high=row.step_high,
                bound_seconds=row.bound_seconds,
                token_budget=row.token_budget,
                framework=row.framework,
                ceiling_seconds=row.ceiling_seconds,
            )
            rows.append(rebuilt)
        return Comparison.from_rows(
            rows,
            baseline_key=self.baseline_key,
            catalogue=catalogue,
            price=price,
            workload=self.workload,
            title=self.title,
            expected_source=self.expected_source,
        )

    # -- prices ------------------------------------------------------------------------------

    def prices_summary(self, today: date | None = None) -> str:
        """One sentence: which price column, how old the prices are, and any overrides."""
        used = self.prices_used or {}
        column = used.get("column", "on_demand").replace("_", "-")
        dates = {k: v for k, v in (used.get("as_of") or {}).items() if v}
        text = (
            f"Prices: {column}, {used.get('currency', 'USD')} {used.get('unit', 'per chip-hour')}"
        )
        if dates:
            parsed = [(parse_date(v), v) for v in dates.values()]
            valid = [p for p in parsed if p[0] is not None]
            if valid:
                oldest = min(valid)[1]
                newest = max(valid)[1]
                text += f"; oldest {describe_age(oldest, today)}"
                if newest != oldest:
                    text += f"; newest {describe_age(newest, today)}"
        overrides = used.get("overrides") or {}
        if overrides:
            parts = [
                f"{k} {', '.join(f'{f}={v}' for f, v in o.items() if f != 'note')}"
                for k, o in overrides.items()
            ]
            text += f"; your overrides: {'; '.join(parts)}"
            if used.get("override_source"):
                text += f" (from {used['override_source']})"
        missing = [k for k, v in (used.get("prices") or {}).items() if v is None]
        if missing:
            text += f"; no public price for {', '.join(missing)}"
        return text + "."

    # -- data --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "baseline_key": self.baseline_key,
            "prices_used": self.prices_used,
            "workload": self.workload,
            "expected_source": self.expected_source,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(_json_safe(self.to_dict()), indent=indent)

    def to_csv(self) -> str:
        """One line per row, every ComparisonRow field as a column (raw numbers, USD)."""
        out = io.StringIO()
        names = [f.name for f in fields(ComparisonRow)]
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.to_dict().items()})
        return out.getvalue()

    def to_dataframe(self) -> Any:
        """A pandas DataFrame of the rows (pandas is optional: a clear error without it)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "to_dataframe() needs pandas: `pip install pandas` (to_csv() and to_json() do not)."
            ) from None
        frame = pd.DataFrame([r.to_dict() for r in self.rows])
        frame.attrs["baseline_key"] = self.baseline_key
        frame.attrs["prices_used"] = self.prices_used
        return frame

    # -- views (gpu2tpu.views draws them) ------------------------------------------------------

    def __repr__(self) -> str:
        from gpu2tpu.views.table import comparison_text

        return comparison_text(self)

    __str__ = __repr__

    def __rich__(self) -> Any:
        from gpu2tpu.views.table import comparison_rich

        return comparison_rich(self)

    # -- notebook ------------------------------------------------------------------------------

    def to_html(self, *, series: Any = None, details: Mapping[str, Any] | None = None) -> str:
        """Static HTML (table, SVG bars, series, details): for nbconvert, GitHub, e-mail."""
        from gpu2tpu.views.html import static_html

        return static_html(self, series=series, details=details)

    def widget(self, *, series: Any = None, details: Mapping[str, Any] | None = None) -> Any:
        from gpu2tpu.views.widgets import comparison_view

        return comparison_view(self, series=series, details=details)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from gpu2tpu.views.display import mimebundle

        return mimebundle(repr(self), self.to_html, self.widget)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class ComparisonExports:
    """Data exports shared by results that carry a `comparison` (the profiler's and the
    forecast's): JSON of the whole result, and the comparison table as CSV or a DataFrame."""

    comparison: Comparison

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every user defines its own
        raise NotImplementedError

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(_json_safe(self.to_dict()), indent=indent)

    def to_csv(self) -> str:
        """The comparison table as CSV (one line per device)."""
        return self.comparison.to_csv()

    def to_dataframe(self) -> Any:
        """The comparison table as a pandas DataFrame."""
        return self.comparison.to_dataframe()
