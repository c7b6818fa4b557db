"""CUDA: the GPU baseline that a TPU run is compared against, on machines with an NVIDIA GPU.

Availability asks `torch.cuda.is_available()`, which is False on a CUDA build of torch
without a GPU (the usual development machine), so nothing here initialises CUDA there.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .base import Backend, ChipInfo, MemoryInfo, chip_kind

if TYPE_CHECKING:
    import torch


class CUDABackend(Backend):
    """PyTorch on an NVIDIA GPU, compiled with inductor."""

    name = "cuda"
    title = "CUDA (NVIDIA GPU)"
    install = "pip install torch"
    install_note = "on a machine with an NVIDIA GPU (Linux wheels of torch are CUDA builds)"
    distribution = "torch"
    compile_backend = "inductor"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import torch

        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                return f"this torch {torch.__version__} is built without CUDA"
            return "CUDA found no NVIDIA GPU on this machine"
        return None

    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", torch.cuda.current_device())

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def memory(self) -> MemoryInfo:
        import torch

        _free, total = torch.cuda.mem_get_info()
        return MemoryInfo(
            in_use_bytes=torch.cuda.memory_allocated(),
            peak_bytes=torch.cuda.max_memory_allocated(),
            total_bytes=total,
        )

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def chip(self) -> ChipInfo:
        import torch

        name = torch.cuda.get_device_name()
        return ChipInfo(name=name, kind=chip_kind(name), count=torch.cuda.device_count())

    def compilation_count(self) -> int | None:
        """Graphs torch.compile has produced in this process (dynamo's own counter)."""
        if "torch._dynamo" not in sys.modules:
            return 0
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
