"""TorchTPU (`torch_tpu`): PyTorch on TPUs as a native device, `torch.device("tpu")`.

Written against the released package (torch_tpu 0.2.0 from PyPI), whose API is recorded in
docs/backends.md ("TorchTPU 0.2.0 as released"). What shapes this adapter:

- `import torch` loads TorchTPU through torch's device-backend entry point, and `torch.tpu`
  is its public module, present even without a TPU. Only where a TPU is found does it rename
  PrivateUse1 to "tpu" and make "tpu" torch's accelerator; without one the string "tpu" is
  not even a valid device type.
- Availability, the chip count and synchronize come from `torch.accelerator`: TorchTPU's own
  `torch.tpu.is_available()`, `device_count()`, `synchronize()`, `current_device()` and
  `set_device()` raise "... is internal to TorchTPU" when called from outside torch (with
  torch >= 2.11, which every release of it needs).
- The eager mode is the context manager `torch.tpu.set_eager_mode(torch.tpu.EagerMode.X)`.
- There is no public memory API; the chip's HBM comes from `get_device_properties()`.

Every call is feature-detected, so another revision degrades to "unknown" instead of
breaking `%tpu_info`. The tests check each name used here against the installed package
(tests/test_torchtpu_contract.py) and drive the TPU-present paths through a stand-in.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from .base import (
    Backend,
    ChipInfo,
    MemoryInfo,
    accelerator_answers,
    chip_kind,
    has_module,
)

if TYPE_CHECKING:
    import torch

# The device type TorchTPU registers where a TPU is present (the stand-in's is "meta").
DEVICE_TYPE = "tpu"

# What the supported release declares (docs/backends.md, "The package"): its Requires-Python
# and its Requires-Dist lines on the TPU stack. The one statement of TorchTPU's requirements:
# `%tpu_info`'s install line and `gpu2tpu doctor`'s advice (readiness/versions.py) read it.
RELEASE = "0.2.0"
REQUIRES_PYTHON = ">=3.11"
REQUIRES = ("torch>=2.11,<=2.15", "libtpu>=0.0.50")

# `eager_mode` choices -> the member of `torch.tpu.EagerMode` they select.
EAGER_MODES: dict[str, str] = {
    "defer_and_fuse": "DEFER_AND_FUSE",
    "defer_never": "DEFER_NEVER",
    "defer_never_and_launch_blocking": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
}

# TorchTPU warns once per process for each "experimental" API a program calls (all of
# `torch.tpu` we use); the adapter's own calls are not the user's, so their warnings are not
# shown. The prefix is the one TorchTPU puts on those warnings.
_EXPERIMENTAL_WARNING = r"<TorchTpu/ApiStage/"
# Printed at import where tcmalloc is not preloaded; `gpu2tpu doctor` reports it instead.
_TCMALLOC_WARNING = r"<TorchTpu/Performance/TcMalloc/"
# Quiets the INFO lines (`GetPjrtApi was found ...`) TorchTPU's C++ runtime prints at import;
# warnings and errors still print.
_LOG_LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"


def _import_torch() -> Any:
    """`import torch` (which loads TorchTPU), without TorchTPU's start-up noise.

    Only where gpu2tpu is the first to import torch: a user's own `import torch` prints what it
    prints. The log-level variable is set for the import only, and only if the user did not
    set it, so later runtimes in the process log as they would have.
    """
    if "torch" in sys.modules:
        import torch

        return torch
    added = _LOG_LEVEL_VAR not in os.environ
    if added:
        os.environ[_LOG_LEVEL_VAR] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TCMALLOC_WARNING)
            import torch
    finally:
        if added:
            os.environ.pop(_LOG_LEVEL_VAR, None)
    return torch


def _tpu_module() -> Any:
    """`torch.tpu`, TorchTPU's public module; None where this torch_tpu registers none."""
    torch = _import_torch()
    if "torch_tpu" not in sys.modules:
        # torch loads it itself unless TORCH_DEVICE_BACKEND_AUTOLOAD=0; importing it then
        # registers `torch.tpu` (the TPU device is registered only by the autoload).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TCMALLOC_WARNING)
            import torch_tpu  # noqa: F401
    return getattr(torch, "tpu", None)


def _registered_device() -> torch.device | None:
    """The TPU device if TorchTPU registered one as torch's available accelerator, else None."""
    torch = _import_torch()
    current = torch.accelerator.current_accelerator(check_available=True)
    if current is None or current.type != DEVICE_TYPE:
        return None
    return torch.device(DEVICE_TYPE)


@contextmanager
def _quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_EXPERIMENTAL_WARNING)
        yield


class TorchTPUBackend(Backend):
    """TorchTPU: device "tpu", `torch.compile(backend="tpu")`, and its three eager modes.

    `eager_mode` selects how TorchTPU runs eager ops for the block, by the name of a
    `torch.tpu.EagerMode` member in lower case: None keeps the runtime's current mode
    (`DEFER_NEVER` unless changed), "defer_and_fuse" defers eager ops and fuses them, and
    "defer_never" / "defer_never_and_launch_blocking" run each op as it is issued, the latter
    also blocking on each launch (as the names say; TorchTPU 0.2.0 documents no more).
    """

    name = "tpu"
    title = "TorchTPU"
    install = "pip install torch-tpu~=0.2.0"
    install_note = f"on a TPU VM (it needs {', '.join(REQUIRES)} and Python{REQUIRES_PYTHON})"
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
            _tpu_module()
        except Exception as err:  # an installed but broken runtime: say what it said
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return f"torch_tpu is installed but failed to import ({type(err).__name__}: {first})"
        if _registered_device() is None:
            if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
                return (
                    "torch_tpu is installed but not loaded (TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
                    "stops torch from registering the TPU)"
                )
            return "torch_tpu is installed but found no TPU chip on this machine"
        return None

    # -- using ---------------------------------------------------------------------------------

    def device(self) -> torch.device:
        dev = _registered_device()
        if dev is None:
            raise RuntimeError(f"TorchTPU cannot run here: {self.unavailable_reason()}")
        return dev

    def synchronize(self) -> None:
        _import_torch().accelerator.synchronize()

    def memory(self) -> MemoryInfo | None:
        """The HBM of one chip, from `get_device_properties()`; None where that is unknown.

        In use and peak stay unknown: TorchTPU has no memory statistics API, and torch's
        `torch.accelerator.memory_allocated()` answers 0 for a device whose runtime does not
        feed it (it does so for CUDA without a GPU), which would read as a measurement.
        """
        tpu = _tpu_module()
        with _quiet_experimental():
            properties = getattr(tpu, "get_device_properties", None)
            if properties is None:
                return None
            try:
                total = int(properties().total_memory)
            except (RuntimeError, AttributeError, TypeError, ValueError):
                return None  # a generation TorchTPU does not know ("unrecognized TPU")
        return MemoryInfo(total_bytes=total)

    def chip(self) -> ChipInfo:
        torch = _import_torch()
        tpu = _tpu_module()
        name = "TPU"
        get_name = getattr(tpu, "get_device_name", None)
        if get_name is not None:
            with _quiet_experimental():
                name = str(get_name())
        return ChipInfo(name=name, kind=chip_kind(name), count=torch.accelerator.device_count())

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        return torch.compile(fn_or_module, backend="tpu", dynamic=False)

    def compilation_count(self) -> int | None:
        """Compile-cache misses, i.e. graphs compiled: a private counter, None where absent."""
        misses = getattr(_tpu_module(), "_get_cache_misses", None)
        if misses is None:
            return None
        try:
            return int(misses())
        except (RuntimeError, TypeError, ValueError):
            return None

    @contextmanager
    def activate(self) -> Iterator[torch.device]:
        dev = self.device()
        with accelerator_answers(dev, **self.answers()), self._eager_mode():
            yield dev

    @contextmanager
    def _eager_mode(self) -> Iterator[None]:
        if self.eager_mode is None:
            yield
            return
        tpu = _tpu_module()
        member = EAGER_MODES[self.eager_mode]
        with _quiet_experimental():
            set_mode = getattr(tpu, "set_eager_mode", None)
            modes = getattr(tpu, "EagerMode", None)
            if set_mode is None or modes is None:
                raise RuntimeError(
                    f"this torch_tpu has no torch.tpu.set_eager_mode, so eager mode "
                    f"{self.eager_mode!r} cannot be set"
                )
            known = [m for m in modes.__members__ if not m.startswith("_")]
            if member not in known:
                raise RuntimeError(
                    f"this torch_tpu has no EagerMode.{member} (its modes are {', '.join(known)})"
                )
            context = set_mode(modes[member])
        with context:
            yield
