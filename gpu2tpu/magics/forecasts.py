"""The forecasts a session made, so that a later `%%tpu --profile` of the same model shows the
compiled TPU figures instead of rooflines from a CPU run.

A profile on a machine without a TPU estimates TPU rows from the CPU run: FLOPs and bytes
counted by PyTorch on the CPU, unfused, scaled by the CPU's efficiency. A forecast of the
same model compiled the step with libtpu for those TPUs. Shown side by side without a word,
the two disagree by one or two orders of magnitude; here the profile's TPU rows take the
forecast's compiled step times and say where they come from.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass
class _Remembered:
    forecast: Any
    number: int
    name: str


class ForecastMemory:
    """Forecasts by the model object they forecast (held weakly: a deleted model is forgotten)."""

    def __init__(self) -> None:
        self._by_model: weakref.WeakKeyDictionary[Any, _Remembered] = weakref.WeakKeyDictionary()

    def remember(self, model: Any, forecast: Any, number: int, name: str = "model") -> None:
        if model is None or not hasattr(forecast, "comparison"):
            return
        try:
            self._by_model[model] = _Remembered(forecast, number, name)
        except TypeError:  # not weak-referenceable: nothing to remember it by
            return

    def apply(self, result: Any, model: Any) -> str | None:
        """Give `result`'s estimated TPU rows the compiled figures of the forecast of `model`.

        Only when the forecast was made at the batch the profile ran (when the profile knows
        its batch). Returns the line to say, or None when nothing changed.
        """
        if model is None or not hasattr(result, "comparison"):
            return None
        try:
            remembered = self._by_model.get(model)
        except TypeError:
            return None
        if remembered is None:
            return None
        forecast = remembered.forecast
        batch = getattr(result, "samples_per_step", None)
        if batch is not None and batch != getattr(forecast, "batch", batch):
            return None
        from ..pricing.compare import Comparison, ComparisonRow

        comparison = result.comparison
        catalogue = comparison.catalogue
        compiled = {
            (r.device_key, r.chips): r for r in forecast.comparison.rows if r.source == "compiled"
        }
        rows = []
        replaced = []
        column = (comparison.prices_used or {}).get("column", "on_demand")
        for row in comparison.rows:
            twin = compiled.get((row.device_key, row.chips))
            chip = catalogue.find(row.device_key) if catalogue is not None else None
            if row.source != "estimated" or twin is None or chip is None:
                rows.append(row)
                continue
            rows.append(
                ComparisonRow.build(
                    chip,
                    twin.step_seconds,
                    "compiled",
                    chips=row.chips,
                    price=column,
                    samples_per_step=comparison.workload.get("samples_per_step"),
                    tokens_per_step=comparison.workload.get("tokens_per_step"),
                    dataset_size=comparison.workload.get("dataset_size"),
                    memory_bytes=twin.memory_bytes,
                    fits=twin.fits,
                    time_kind=twin.time_kind,
                    step_low=twin.step_low,
                    step_high=twin.step_high,
                    bound_seconds=twin.bound_seconds,
                    note=(
                        f"compiled figures of the forecast of `{remembered.name}` in "
                        f"In[{remembered.number}] (libtpu), not this run's figures"
                    ),
                )
            )
            replaced.append(row.label)
        if not replaced:
            return None
        result.comparison = Comparison.from_rows(
            rows,
            baseline_key=comparison.baseline_key,
            catalogue=catalogue,
            price=column,
            workload=comparison.workload,
            title=comparison.title,
        )
        return (
            f"gpu2tpu: {', '.join(replaced)}: the compiled figures of the forecast of "
            f"`{remembered.name}` in In[{remembered.number}], not this run's figures"
        )
