"""The CPU: always there; the `%%tpu --dry-run` target and the last step of `auto`.

Memory is the process's resident set: in use from /proc/self/status (VmRSS), peak from the
kernel's high-water mark (VmHWM, resettable through /proc/self/clear_refs), falling back to
`resource.getrusage` where /proc is missing.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import Backend, ChipInfo, MemoryInfo

if TYPE_CHECKING:
    import torch


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux and bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _total_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


class CPUBackend(Backend):
    """Plain PyTorch on the host CPU."""

    name = "cpu"
    title = "CPU"
    install = "pip install torch"
    distribution = "torch"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def memory(self) -> MemoryInfo:
        rss = _status_kib("VmRSS")
        hwm = _status_kib("VmHWM")
        return MemoryInfo(
            in_use_bytes=rss * 1024 if rss is not None else None,
            peak_bytes=hwm * 1024 if hwm is not None else _maxrss_bytes(),
            total_bytes=_total_ram_bytes(),
        )

    def reset_peak_memory(self) -> None:
        # "5" resets the peak resident set size (Linux >= 4.0, proc(5) clear_refs).
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
        except OSError:
            pass

    def chip(self) -> ChipInfo:
        return ChipInfo(name=_cpu_model(), kind="cpu", count=1)

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        """The identity: the CPU dry run measures eager PyTorch, and needs no C compiler."""
        return fn_or_module
