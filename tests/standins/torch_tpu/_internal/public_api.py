"""STAND-IN for `torch_tpu._internal.public_api`: builds `torch.tpu`, the public module.

Only names the released `torch.tpu` has, with the same parameters; what is internal there
raises the same "internal to TorchTPU" error here, and what is experimental warns with
TorchTPU's prefix, so an adapter that calls the wrong API fails against the stand-in too.
"""

import contextlib
import enum
import sys
import types
import warnings
from dataclasses import dataclass

import torch

# What the stand-in's chip reports (a v5e, as TorchTPU names it from the PCI device id).
DEVICE_NAME = "TPU v5e"
HBM_BYTES = 16 * 2**30
CACHE_MISSES = 7


class EagerMode(enum.Enum):
    DEFER_AND_FUSE = 0
    DEFER_NEVER = 1
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 2


@dataclass(frozen=True)
class _TpuDeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int = 1


def _experimental(name: str) -> None:
    warnings.warn(
        f"<TorchTpu/ApiStage/ExperimentalApi/> {name} is experimental and subject to change",
        UserWarning,
        stacklevel=3,
    )


def _internal(name: str, prefer: str) -> RuntimeError:
    return RuntimeError(
        f"{name} is internal to TorchTPU and can only be called by the PyTorch framework "
        f"(torch and torch_tpu). Use {prefer} instead."
    )


def is_available() -> bool:
    raise _internal("is_available", "torch.accelerator.is_available")


def device_count() -> int:
    raise _internal("device_count", "torch.accelerator.device_count")


def synchronize(device=None) -> None:
    raise _internal("synchronize", "torch.accelerator.synchronize")


def get_device_name(device=None) -> str:
    _experimental("get_device_name")
    return DEVICE_NAME


def get_device_properties(device=None) -> _TpuDeviceProperties:
    _experimental("get_device_properties")
    return _TpuDeviceProperties(name=DEVICE_NAME, total_memory=HBM_BYTES)


def set_eager_mode(mode):
    # The real one warns when called, like any experimental API, then returns the context.
    _experimental("set_eager_mode")
    return _eager_mode_context(mode)


@contextlib.contextmanager
def _eager_mode_context(mode):
    module = sys.modules["torch.tpu"]
    previous = module.eager_mode
    module.eager_mode = mode
    try:
        yield
    finally:
        module.eager_mode = previous


def _get_cache_misses() -> int:
    return CACHE_MISSES


def install() -> None:
    """Register `torch.tpu` as TorchTPU's public API table does at import."""
    module = types.ModuleType("torch.tpu", "STAND-IN for TorchTPU's `torch.tpu`.")
    for name, value in {
        "EagerMode": EagerMode,
        "eager_mode": EagerMode.DEFER_NEVER,
        "is_available": is_available,
        "device_count": device_count,
        "synchronize": synchronize,
        "get_device_name": get_device_name,
        "get_device_properties": get_device_properties,
        "set_eager_mode": set_eager_mode,
        "_get_cache_misses": _get_cache_misses,
    }.items():
        setattr(module, name, value)
    sys.modules["torch.tpu"] = module
    torch.tpu = module
