"""PyTorch/XLA (`torch_xla`): lazy tensors on `torch_xla.device()`, flushed by `torch_xla.sync()`.

XLA is not one of torch's accelerators, so `activate()` also makes the codemod's
`torch.accelerator.current_accelerator(...)` answer the XLA device (see `Backend.activate`).
`auto` picks it only where a TPU is present: torch_xla also runs on the CPU (PJRT_DEVICE=CPU),
which an explicit `--backend xla` still allows. All calls into torch_xla are in this class;
tests/xla drives it against the real torch_xla on the CPU, the other tests through a stand-in
module (tests/standins/torch_xla, whose API tests/xla checks against the real one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import Backend, ChipInfo, MemoryInfo, chip_kind, has_module, tpu_chips_on_pci

if TYPE_CHECKING:
    import torch

# The counter torch_xla bumps when Python reads a device value (`.item()`, `bool(t)`).
_HOST_READ = "aten::_local_scalar_dense"


class XLABackend(Backend):
    """PyTorch/XLA 2.x with the PJRT runtime."""

    name = "xla"
    title = "PyTorch/XLA"
    install = "pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'"
    distribution = "torch-xla"
    runs_on_tpu = True
    compile_backend = "openxla"
    sync_after_cell = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not has_module("torch_xla"):
            return "torch_xla not installed"
        return None

    @classmethod
    def auto_skip_reason(cls) -> str | None:
        reason = cls.unavailable_reason()
        if reason is not None:
            return reason
        wanted = os.environ.get("PJRT_DEVICE", "").upper()
        if wanted == "TPU" or (not wanted and tpu_chips_on_pci() > 0):
            return None
        where = f"PJRT_DEVICE={wanted}" if wanted else "no TPU chip on this machine"
        return f"torch_xla is installed but would run on the CPU ({where})"

    def device(self) -> torch.device:
        import torch_xla

        return torch_xla.device()

    def synchronize(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    def memory(self) -> MemoryInfo | None:
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(self.device())
        except RuntimeError:  # "UNIMPLEMENTED: GetAllocatorStats" on PJRT's CPU client
            return None
        if "bytes_used" in info:
            return MemoryInfo(
                in_use_bytes=info.get("bytes_used"),
                peak_bytes=info.get("peak_bytes_used"),
                total_bytes=info.get("bytes_limit"),
            )
        if "kb_total" in info:  # torch_xla < 2.3 reported kilobytes free and total
            total = info["kb_total"] * 1024
            return MemoryInfo(in_use_bytes=total - info["kb_free"] * 1024, total_bytes=total)
        return None

    def chip(self) -> ChipInfo:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        hardware = xm.xla_device_hw(self.device())
        count = xr.global_runtime_device_count()
        if hardware != "TPU":
            return ChipInfo(name=f"XLA {hardware}", kind=hardware.lower(), count=count)
        name = os.environ.get("TPU_ACCELERATOR_TYPE") or self._tpu_type()
        return ChipInfo(name=name, kind=chip_kind(name), count=count)

    @staticmethod
    def _tpu_type() -> str:
        """The TPU's accelerator type ("v5litepod-8"), from torch_xla's TPU helpers."""
        from torch_xla._internal import tpu

        try:
            return str(tpu.get_tpu_type())
        except Exception:  # metadata server absent: the generation number is still known
            return f"TPU v{tpu.version()}"

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        return torch.compile(fn_or_module, backend="openxla")

    def explain_failure(self, error: BaseException, source: str | None = None) -> str | None:
        """Say what to do about the autograd engine assert torch raises when a backward pass
        ran in this process before torch_xla was imported (seen with torch_xla 2.9: the
        engine sized its device queues without XLA's)."""
        if "device_ready_queues_" in str(error):
            return (
                "gpu2tpu: autograd ran a backward pass before torch_xla was imported in this "
                "process, so it has no queue for XLA devices; restart the kernel and run "
                "`import torch_xla` (or the first %%tpu --backend xla cell) before training"
            )
        return None

    def compilation_count(self) -> int | None:
        """Graphs XLA compiled: the sample count of its CompileTime metric.

        Each sample is one real compilation (torch_xla's `UncachedCompile`); a graph found in
        the compile cache adds none.
        """
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def compilation_seconds(self) -> float | None:
        """Seconds XLA spent compiling: the CompileTime metric's accumulator (nanoseconds)."""
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return float(data[1]) / 1e9 if data else 0.0

    def fallback_ops(self) -> dict[str, int]:
        """Ops that ran on the CPU for want of an XLA lowering, with how often, so far.

        torch_xla counts each in a counter named after the op (`aten::nonzero`);
        `aten::_local_scalar_dense` is not a fallback but a host read (`.item()`), so it is
        left out here and reported by `host_reads()`.
        """
        import torch_xla.debug.metrics as met

        return {
            name: int(met.counter_value(name) or 0)
            for name in met.counter_names()
            if name.startswith("aten::") and name != _HOST_READ
        }

    def host_reads(self) -> int:
        """How many times Python read a scalar from the device so far (`.item()`, `if t:`)."""
        import torch_xla.debug.metrics as met

        return int(met.counter_value(_HOST_READ) or 0)
