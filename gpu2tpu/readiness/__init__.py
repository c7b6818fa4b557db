"""Readiness checks to run before paying for TPU time: the environment doctor and op coverage.

- `diagnose()` (doctor.py) says where the code runs (Colab, Kaggle, a Cloud TPU VM, a GPU
  machine, the CPU), whether the installed torch, torch_tpu, torch_xla, torchax, jax, jaxlib
  and libtpu fit together, and for each problem the one command that fixes it.
- `coverage()` and `coverage_of_run()` (op_coverage.py) list the ATen operators code ran and
  mark those with no XLA lowering, which fall back to the CPU or fail on a TPU.
- `dry_run()` (dryrun.py, `gpu2tpu.dry_run`) runs a step on the CPU and reports what would be
  slow on a TPU (host syncs, float64, dynamic shapes), with the op coverage of what it ran.

Nothing here imports torch, jax or a TPU runtime until a function that needs it is called.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CoverageReport",
    "DoctorReport",
    "Environment",
    "LoweringTable",
    "coverage",
    "coverage_of_run",
    "detect_environment",
    "diagnose",
    "lowering_table",
]

# public name -> the module of this package that defines it (loaded on first use)
_HOME = {
    "CoverageReport": "op_coverage",
    "LoweringTable": "op_coverage",
    "coverage": "op_coverage",
    "coverage_of_run": "op_coverage",
    "lowering_table": "op_coverage",
    "DoctorReport": "doctor",
    "diagnose": "doctor",
    "Environment": "environment",
    "detect_environment": "environment",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
