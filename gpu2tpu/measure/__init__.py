"""The profiler: step time, throughput, FLOPs, MFU and memory, costed beside TPUs and GPUs.

```
from gpu2tpu.profile import profile
result = profile(train_step, batch, steps=20, warmup=3, tokens_per_step=8 * 512)
result            # a widget in a notebook, a table in a terminal
result.to_json()  # or to_csv(), to_dataframe(), save_baseline(path)
```
The loop form, for training loops that exist already: `with Profiler(...) as prof: ...
prof.step()`; the `%%tpu --profile` magic calls `cell_profile`. Only the timer is imported
with this package; the catalogue, cost model and views load when first used, and torch only
when a step is measured.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from .timer import (
    DEFAULT_TARGETS,
    ProfileError,
    Profiler,
    StepStats,
    StepTimer,
    cell_profile,
    profile,
    summarize,
)

# name -> submodule, imported on first access (PEP 562).
_LAZY = {
    "ProfileResult": "result",
    "BaselineRecord": "result",
    "load_baseline": "result",
    "Comparison": "compare",
    "ComparisonRow": "compare",
    "HardwareCatalogue": "catalogue",
    "Chip": "catalogue",
    "UnknownChip": "catalogue",
    "PriceOverrideError": "catalogue",
    "CatalogueError": "catalogue",
    "roofline_seconds": "cost",
    "cost_per_step": "cost",
    "cost_per_million_tokens": "cost",
    "StepCount": "flops",
    "count_step": "flops",
    "measure_host_peak": "flops",
    # `gpu2tpu.forecast` is the forecast function; here only its notebook hook and result,
    # since the submodule `gpu2tpu.profile.forecast` has the function's name.
    "forecast_cell": "forecast",
    "Forecast": "forecast",
    "TargetForecast": "forecast",
    "ForecastUnavailable": "aot",
    "ForecastError": "aot",
    "UnsupportedOptimizer": "optimizers",
}

__all__ = [
    "DEFAULT_TARGETS",
    "ProfileError",
    "Profiler",
    "StepStats",
    "StepTimer",
    "cell_profile",
    "profile",
    "summarize",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _CallableModule(types.ModuleType):
    """Lets `gpu2tpu.profile(step_fn, ...)` be the function while `gpu2tpu.profile.Profiler`
    and friends stay reachable: the subpackage and the function share the name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return profile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
