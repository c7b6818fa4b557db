"""The places PyTorch code can run: TorchTPU, PyTorch/XLA, torchax on JAX, CUDA and the CPU.

`get_backend(name)` gives one by name, and never falls back silently: an explicit name that
cannot run here raises `BackendUnavailable` with the install command. `choose_backend("auto")`
picks TorchTPU, then PyTorch/XLA on a TPU, then the CPU dry run, and says why in one line.
`ask_backends()` asks every backend whether it runs here (and, if asked to, for its chip and
memory); a backend that raises while being asked is listed as unavailable with what it said,
so one broken runtime never hides the others. Backend modules load only when their name is
asked for, so importing this package imports neither torch nor any TPU runtime.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import (
    Backend,
    BackendStatus,
    BackendUnavailable,
    ChipInfo,
    MemoryInfo,
    UnknownBackend,
    chip_kind,
    failure_reason,
)

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendReport",
    "BackendStatus",
    "BackendUnavailable",
    "ChipInfo",
    "MemoryInfo",
    "UnknownBackend",
    "ask_backends",
    "available_backends",
    "backend_class",
    "chip_kind",
    "choose_backend",
    "get_backend",
]

# name -> (module in this package, class); the order is the order of listings.
_REGISTRY: dict[str, tuple[str, str]] = {
    "tpu": ("torchtpu", "TorchTPUBackend"),
    "xla": ("xla", "XLABackend"),
    "jax": ("jax", "JAXBackend"),
    "cuda": ("cuda", "CUDABackend"),
    "cpu": ("cpu", "CPUBackend"),
}
_ALIASES = {
    "torchtpu": "tpu",
    "torch_tpu": "tpu",
    "torch-tpu": "tpu",
    "torch_xla": "xla",
    "pytorch/xla": "xla",
    "torchax": "jax",
    "gpu": "cuda",
}
BACKEND_NAMES: tuple[str, ...] = ("auto", *_REGISTRY)
# What `auto` tries before settling for the CPU dry run.
_AUTO_ORDER = ("tpu", "xla")

_instances: dict[str, Backend] = {}


def canonical_name(name: str) -> str:
    """The registry name for `name` (aliases and case folded); raise `UnknownBackend`."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key != "auto" and key not in _REGISTRY:
        known = ", ".join(BACKEND_NAMES)
        raise UnknownBackend(f"unknown backend {name!r}; known backends are: {known}")
    return key


def backend_class(name: str) -> type[Backend]:
    """The adapter class for a backend name (imports only that adapter's module)."""
    key = canonical_name(name)
    if key == "auto":
        raise UnknownBackend("'auto' is a choice among backends, not a backend; use choose_backend")
    module_name, class_name = _REGISTRY[key]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, class_name)


def _instance(key: str) -> Backend:
    # One instance per backend: adapters keep per-process runtime state (compile listeners).
    if key not in _instances:
        _instances[key] = backend_class(key)()
    return _instances[key]


def get_backend(name: str = "auto") -> Backend:
    """The backend called `name`, ready to use; `auto` as in `choose_backend`.

    Raises `UnknownBackend` for a name gpu2tpu does not know and `BackendUnavailable` (one
    sentence with the install command) for a known one that cannot run here.
    """
    key = canonical_name(name)
    if key == "auto":
        return choose_backend("auto")[0]
    backend_class(key).require()
    return _instance(key)


# How `choose_backend`'s reason ends when auto settles for the CPU. What runs there is the
# caller's to say: `%%tpu` dry-runs a plain cell, but profiles or forecasts as asked, and
# `%tpu_auto` runs cells as usual.
CPU_FALLBACK = "falling back to the CPU"


def choose_backend(name: str = "auto") -> tuple[Backend, str]:
    """The backend to use for `name` and a one-line reason a user can read."""
    key = canonical_name(name)
    if key != "auto":
        backend = get_backend(key)
        return backend, f"{key}: requested explicitly"
    skipped: list[str] = []
    for candidate in _AUTO_ORDER:
        try:
            cls = backend_class(candidate)
            why_not = cls.auto_skip_reason()
        except Exception as err:  # one broken runtime must not stop the choice
            skipped.append(f"{candidate} {failure_reason('failed when asked', err)}")
            continue
        if why_not is None:
            label = cls.version_label()
            found = f" ({label})" if label else ""
            return _instance(candidate), f"auto: using {cls.title}{found}, which sees a TPU"
        skipped.append(why_not)
    return _instance(
        "cpu"
    ), f"auto: no TPU backend found ({_join_reasons(skipped)}); {CPU_FALLBACK}"


def _join_reasons(reasons: list[str]) -> str:
    """'torch_tpu not installed', 'torch_xla not installed' -> 'torch_tpu, torch_xla not installed'."""
    suffix = " not installed"
    if reasons and all(r.endswith(suffix) for r in reasons):
        return ", ".join(r[: -len(suffix)] for r in reasons) + suffix
    return "; ".join(reasons)


@dataclass(frozen=True)
class BackendReport:
    """One backend as `ask_backends` found it: its status and, if asked for, chip and memory."""

    status: BackendStatus
    chip: ChipInfo | None = None
    memory: MemoryInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.status.to_dict(),
            "chip": self.chip.to_dict() if self.chip else None,
            "memory": self.memory.to_dict() if self.memory else None,
        }


def _status(key: str) -> BackendStatus:
    try:
        return backend_class(key).status()
    except Exception as err:  # the adapter module itself failed to import
        module_name, _class_name = _REGISTRY[key]
        return BackendStatus(
            name=key,
            title=key,
            available=False,
            reason=failure_reason(f"gpu2tpu's {module_name} adapter failed to load", err),
            install="",
        )


def _unavailable(status: BackendStatus, reason: str) -> BackendStatus:
    return BackendStatus(
        name=status.name,
        title=status.title,
        available=False,
        reason=reason,
        install=status.install,
        version=status.version,
    )


def ask_backends(describe: Callable[[str], bool] | None = None) -> list[BackendReport]:
    """Every backend, whether it runs here and why not; never raises for a backend's fault.

    `describe(name)` says which available backends to ask for their chip and memory too
    (None: none). An exception at any step (importing the adapter or its runtime, asking
    whether it runs, asking for the chip or memory) makes that backend's line "unavailable"
    with the exception's type and first line as the reason.
    """
    reports: list[BackendReport] = []
    for key in _REGISTRY:
        status = _status(key)
        if not status.available or describe is None or not describe(key):
            reports.append(BackendReport(status))
            continue
        try:
            backend = _instance(key)
            chip = backend.chip()
            memory = backend.memory()
        except Exception as err:
            why = failure_reason("is installed but failed when asked for its chip", err)
            reports.append(BackendReport(_unavailable(status, f"{status.title} {why}")))
            continue
        reports.append(BackendReport(status, chip, memory))
    return reports


def available_backends() -> list[BackendStatus]:
    """Every backend, found or missing, with its version or the command that installs it."""
    return [report.status for report in ask_backends()]
