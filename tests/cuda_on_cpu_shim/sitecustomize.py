"""TEST SHIM, never shipped: run CUDA-first code with every CUDA request sent to the CPU.

tests/test_examples.py puts this folder first on PYTHONPATH, so Python imports this file at
start-up (as `sitecustomize`) in the example script's process or in the notebook's kernel.
It gives the baseline the migrated examples are compared with: the original code, unmodified,
computing on the CPU. Nothing here is used by gpu2tpu itself.

What it maps, as a runtime patcher such as Ascend's transfer_to_npu does for NPUs:
- `.cuda()` on tensors and modules, `"cuda"`/`"cuda:N"` devices in `.to(...)` -> the CPU;
- `.pin_memory()` -> the tensor itself (pinning needs an accelerator);
- CUDA autocast and GradScaler -> their CPU versions, with the CPU's defaults where the code
  gives none (autocast computes in bfloat16 on the CPU: the same default the device-agnostic
  `torch.amp.autocast(device_type=device.type)` of the migrated code takes there);
- `torch.cuda.Event` -> the wall clock; synchronize, set_device, memory statistics -> no-ops
  and zeros; NCCL -> gloo, and DDP without `device_ids`.
`torch.cuda.is_available()` is left False on purpose: torch's own internals ask it too, and
claiming CUDA there would send them down CUDA-only paths.
"""

from __future__ import annotations

import os
import time

if os.environ.get("GPU2TPU_TEST_CUDA_ON_CPU") == "1":
    import torch
    import torch.distributed as dist
    import torch.nn.parallel

    def _on_cpu(device):  # type: ignore[no-untyped-def]
        if isinstance(device, torch.device | str) and str(device).startswith("cuda"):
            return "cpu"
        return device

    def _patch_to(cls):  # type: ignore[no-untyped-def]
        original = cls.to

        def to(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            args = tuple(_on_cpu(a) for a in args)
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            return original(self, *args, **kwargs)

        cls.to = to

    _patch_to(torch.Tensor)
    _patch_to(torch.nn.Module)
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **kw: self.to("cpu")
    torch.nn.Module.cuda = lambda self, device=None: self.to("cpu")
    torch.Tensor.pin_memory = lambda self, device=None: self

    class CpuAutocast(torch.amp.autocast):
        def __init__(self, device_type, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(_on_cpu(device_type), *args, **kwargs)

    def cuda_autocast(enabled=True, dtype=None, cache_enabled=True):  # type: ignore[no-untyped-def]
        return CpuAutocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.autocast = torch.amp.autocast = CpuAutocast
    torch.cuda.amp.autocast = cuda_autocast

    def cuda_grad_scaler(*args, **kwargs):  # type: ignore[no-untyped-def]
        return torch.amp.GradScaler("cpu", *args, **kwargs)

    torch.cuda.amp.GradScaler = cuda_grad_scaler

    class WallClockEvent:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):  # type: ignore[no-untyped-def]
            self.at = None

        def record(self, stream=None):  # type: ignore[no-untyped-def]
            self.at = time.perf_counter()

        def synchronize(self):  # type: ignore[no-untyped-def]
            pass

        def elapsed_time(self, end):  # type: ignore[no-untyped-def]
            return (end.at - self.at) * 1000.0

    torch.cuda.Event = WallClockEvent
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.set_device = lambda device: None
    torch.cuda.reset_peak_memory_stats = lambda device=None: None
    torch.cuda.max_memory_allocated = lambda device=None: 0
    torch.cuda.memory_allocated = lambda device=None: 0
    torch.cuda.empty_cache = lambda: None

    _init_process_group = dist.init_process_group

    def gloo_process_group(backend=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        return _init_process_group("gloo" if backend == "nccl" else backend, *args, **kwargs)

    dist.init_process_group = gloo_process_group
    torch.distributed.distributed_c10d.init_process_group = gloo_process_group

    class CpuDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module, device_ids=None, output_device=None, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(module, **kwargs)

    torch.nn.parallel.DistributedDataParallel = CpuDDP
