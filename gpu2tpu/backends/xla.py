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
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .base import (
    Backend,
    ChipInfo,
    MemoryInfo,
    asked_by_torch,
    chip_kind,
    has_module,
    tpu_chips_on_pci,
)

if TYPE_CHECKING:
    import torch

# The counter torch_xla bumps when Python reads a device value (`.item()`, `bool(t)`).
_HOST_READ = "aten::_local_scalar_dense"


# Said once per process, the first time a cell asks for inference mode on XLA.
INFERENCE_MODE_NOTE = (
    "gpu2tpu: torch.inference_mode() runs as torch.no_grad() on PyTorch/XLA, whose tensors "
    'cannot be inference tensors ("Cannot set version_counter for inference tensor")\n'
)
_noted: list[bool] = []


def _inference_as_no_grad(real: Any) -> Callable[..., Any]:
    """`torch.inference_mode` for code on XLA: `torch.no_grad()` where it asks for inference
    mode, as a context manager or a decorator (bare or called), and torch's own class for
    torch's modules and for `inference_mode(False)`, which creates no inference tensor.

    With torch_xla 2.9, an op in inference mode on a tensor made outside it (a model's
    weights) raises `RuntimeError: Cannot set version_counter for inference tensor`; no_grad
    computes the same values (docs/backends.md, "The default device, and XLA's step boundary").
    """
    import torch

    def inference_mode(mode: Any = True) -> Any:
        if asked_by_torch():
            return real(mode)
        if not isinstance(mode, bool):  # `@torch.inference_mode` on a function
            return inference_mode()(mode)
        if not mode:
            return real(False)
        if not _noted:
            _noted.append(True)
            sys.stderr.write(INFERENCE_MODE_NOTE)
        return torch.no_grad()

    return inference_mode


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

    @contextmanager
    def activate(self) -> Iterator[torch.device]:
        """`Backend.activate`, with every optimizer step a step boundary (`torch_xla.sync()`).

        XLA records ops into one lazy graph until something cuts it. A CUDA training loop has
        no cut: each `loss.item()` runs the graph so far, but the weights' update stays
        pending and joins the next step's graph, so every step is a new, larger graph and a
        new compile (a small CNN's eighth step compiled for 40 s here). PyTorch/XLA's own
        loops cut after the optimizer step (`xm.optimizer_step(opt, barrier=True)`, or the
        `MpDeviceLoader`); the migrated code cannot say that without importing torch_xla, so
        the adapter does it for the cell, through torch's hook common to all optimizers.
        """
        import torch
        import torch_xla
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def step_boundary(optimizer: object, args: object, kwargs: object) -> None:
            torch_xla.sync()

        real_inference_mode = torch.inference_mode
        with super().activate() as dev:
            handle = register_optimizer_step_post_hook(step_boundary)
            torch.inference_mode = _inference_as_no_grad(real_inference_mode)
            try:
                yield dev
            finally:
                torch.inference_mode = real_inference_mode
                handle.remove()

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
