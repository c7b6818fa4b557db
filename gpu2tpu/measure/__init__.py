"""Measurement: time a training step, count what it does, and cost it beside TPUs and GPUs.

```
import gpu2tpu
result = gpu2tpu.profile(train_step, batch, steps=20, warmup=3, tokens_per_step=8 * 512)
result            # a widget in a notebook, a table in a terminal
result.to_json()  # or to_csv(), to_dataframe(), save_baseline(path)
```
The loop form, for training loops that exist already: `with gpu2tpu.Profiler(...) as prof:
... prof.step()`; the `%%tpu --profile` magic calls `cell_profile`. `timer.py` measures,
`records.py` holds what a measurement produced and how to cost it, `result.py` turns a record
into a `ProfileResult` with the pricing package's catalogue and comparison. Only the timer
is imported with this package; torch loads only when a step is measured.
"""

from __future__ import annotations

import importlib
from typing import Any

from .records import DEFAULT_TARGETS, ProfileError, StepStats, summarize
from .timer import Profiler, StepTimer, cell_profile, profile

# name -> submodule, imported on first access (PEP 562).
_LAZY = {
    "ProfileResult": "result",
    "BaselineRecord": "result",
    "load_baseline": "result",
    "StepCount": "flops",
    "count_step": "flops",
    "measure_host_peak": "flops",
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
