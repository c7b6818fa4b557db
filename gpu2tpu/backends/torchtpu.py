"""TorchTPU (`torch_tpu`): PyTorch on TPUs as a native device, `torch.device("tpu")`.

TorchTPU registers "tpu" as torch's accelerator, so code the codemod rewrote runs on it as is.
Everything that calls into `torch_tpu` is in this one class; it cannot run without a TPU (the
wheel registers no "tpu" device there, backends.md §5), so the tests drive it through a
stand-in module and the calls below are the whole untested surface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from .base import (
    Backend,
    ChipInfo,
    MemoryInfo,
    accelerator_answers,
    chip_kind,
    default_device,
    has_module,
)

if TYPE_CHECKING:
    import torch

# `eager_mode` names -> the word in torch_tpu's execution-mode enum member (DEFER_AND_FUSE ...).
EAGER_MODES: dict[str, str] = {"fused": "FUSE", "strict": "STRICT", "debug": "DEBUG"}


def _device_module() -> Any:
    """`torch.tpu`, which `import torch_tpu` registers; None when no TPU registered it."""
    import torch
    import torch_tpu  # noqa: F401  (registers torch.tpu and the "tpu" device type)

    return getattr(torch, "tpu", None)


class TorchTPUBackend(Backend):
    """TorchTPU: device "tpu", `torch.compile(backend="tpu")`, eager or fused-eager execution.

    `eager_mode` selects TorchTPU's eager execution: None keeps the runtime's default,
    "fused" defers and fuses eager ops (fused eager), "strict" and "debug" are its other
    eager modes.
    """

    name = "tpu"
    title = "TorchTPU"
    install = "pip install torch-tpu"
    install_note = "on a TPU VM (it needs torch>=2.11 and Python>=3.11)"
    distribution = "torch-tpu"
    runs_on_tpu = True
    compile_backend = "tpu"
    eager_modes: ClassVar[tuple[str, ...]] = tuple(EAGER_MODES)

    def __init__(self, eager_mode: str | None = None) -> None:
        if eager_mode is not None and eager_mode not in EAGER_MODES:
            known = ", ".join(EAGER_MODES)
            raise ValueError(f"unknown TorchTPU eager mode {eager_mode!r}; known modes: {known}")
        self.eager_mode = eager_mode

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not has_module("torch_tpu"):
            return "torch_tpu not installed"
        try:
            module = _device_module()
        except Exception as err:  # an installed but broken runtime: say what it said
            return f"torch_tpu is installed but failed to import ({type(err).__name__}: {err})"
        if module is None or not module.is_available():
            return "torch_tpu is installed but found no TPU chip on this machine"
        return None

    def device(self) -> torch.device:
        from torch_tpu import api

        return api.tpu_device()

    def synchronize(self) -> None:
        _device_module().synchronize()

    def memory(self) -> MemoryInfo | None:
        tpu = _device_module()
        # Revisions differ (backends.md §3): feature-detect each call.
        stats = tpu.memory_stats() if hasattr(tpu, "memory_stats") else None
        total = None
        if hasattr(tpu, "mem_get_info"):
            _free, total = tpu.mem_get_info()
        elif hasattr(tpu, "get_device_properties"):
            total = tpu.get_device_properties().total_memory
        if stats is None and total is None:
            return None
        stats = stats or {}
        return MemoryInfo(
            in_use_bytes=stats.get("allocated_bytes.all.current", stats.get("bytes_in_use")),
            peak_bytes=stats.get("allocated_bytes.all.peak", stats.get("peak_bytes_in_use")),
            total_bytes=total,
        )

    def reset_peak_memory(self) -> None:
        tpu = _device_module()
        if hasattr(tpu, "reset_peak_memory_stats"):
            tpu.reset_peak_memory_stats()

    def chip(self) -> ChipInfo:
        tpu = _device_module()
        name = tpu.get_device_name()
        return ChipInfo(name=name, kind=chip_kind(name), count=tpu.device_count())

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        return torch.compile(fn_or_module, backend="tpu", dynamic=False)

    def compilation_count(self) -> int | None:
        """Compile-cache misses, i.e. graphs compiled (a private counter: None if absent)."""
        tpu = _device_module()
        misses = getattr(tpu, "_get_cache_misses", None)
        return int(misses()) if misses is not None else None

    @contextmanager
    def activate(self) -> Iterator[torch.device]:
        dev = self.device()
        with (
            default_device(dev),
            accelerator_answers(dev, synchronize=self.synchronize),
            self._eager_mode(),
        ):
            yield dev

    @contextlib.contextmanager
    def _eager_mode(self) -> Iterator[None]:
        if self.eager_mode is None:
            yield
            return
        from torch_tpu._internal import execution_mode

        enum = getattr(execution_mode, "DeferMode", None) or execution_mode.EagerMode
        word = EAGER_MODES[self.eager_mode]
        members = [m for m in enum.__members__ if word in m]
        if not members:
            raise RuntimeError(
                f"this torch_tpu has no {self.eager_mode!r} eager mode "
                f"(its modes are {', '.join(enum.__members__)})"
            )
        with execution_mode.defer_mode(enum.__members__[members[0]]):
            yield
