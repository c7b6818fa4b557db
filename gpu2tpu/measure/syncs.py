"""Which ops make the host wait for the device: one classification for the profiler and the dry run.

A host sync is a read of device data by Python: `.item()`, `float(t)`, `if t:` (the ATen op
`_local_scalar_dense`), `.cpu()`, `.tolist()`, `.numpy()`, printing a tensor, and any copy
from an accelerator to the host. On PyTorch/XLA each one is a device-to-host transfer
(torch_xla's `TransferFromDeviceTime` grows by one per read: tests/xla/test_host_syncs_xla.py
checks the profiler and the dry run against that counter).

Two settings of the same rules:

- on a real accelerator (`emulated=False`) the tensor's device decides: a read of a CPU
  tensor waits for nothing;
- on the CPU standing in for a TPU (`emulated=True`: the dry run, a profile on the CPU) every
  tensor may be a device tensor, except those that stay on the host on a TPU too: an
  optimizer's step counter (a CPU tensor unless `capturable` or `fused`) and the DataLoader
  sampler's indices, recognised by the library code that reads them.

Ops whose output shape depends on the data (`nonzero`, `x[mask]`, `unique`) are classified
apart (`DYNAMIC_SHAPE`, `MASK_INDEX`): PyTorch/XLA runs them on the CPU, a fallback rather
than a read the host asked for.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = [
    "COPY_OPS",
    "DYNAMIC_SHAPE",
    "HOST_READ",
    "MASK_INDEX",
    "METHOD_READS",
    "OP_INFO",
    "OTHER",
    "READ_CAUSES",
    "HostReads",
    "host_side_origin",
    "op_info",
]

# What an op is, decided once per op overload for the whole process.
OTHER, HOST_READ, DYNAMIC_SHAPE, MASK_INDEX = 0, 1, 2, 3

# Ops that read tensor data on the host, named as a user wrote them.
READ_CAUSES = {"aten._local_scalar_dense": ".item() / Python scalar from a tensor"}
# Tensor methods that read data on the host; on the CPU they run no ATen op.
METHOD_READS = {
    "cpu": ".cpu()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "__repr__": "printing a tensor",
    "__format__": "formatting a tensor (f-string)",
}
COPY_OPS = frozenset({"aten._to_copy", "aten.copy_"})
COPY_CAUSE = "a copy to the host"

# Library code whose host reads stay on the host on a TPU too: optimizers keep their step
# counter on the CPU (unless capturable/fused), and the DataLoader's sampler draws indices there.
_HOST_SIDE_PATHS = (f"{os.sep}torch{os.sep}optim{os.sep}",)
# The DataLoader, and everything it calls: the sampler, and the user's own Dataset and
# collate_fn, which load samples on the host, on a TPU too (`int(self.y[i])` in `__getitem__`
# reads host memory, not the device).
_DATA_LOADER_PATH = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
_GRAD_SCALER_FILE = f"{os.sep}torch{os.sep}amp{os.sep}grad_scaler.py"
# How far up from a read to look for the line that `.cpu()`-copied the tensor (torch's own
# frames between a user's `float(t)` and the dispatch of its `_local_scalar_dense`).
_COPY_FRAMES = 12

# op overload -> what `op_info` decided (read directly by the dry run's dispatch hook)
OP_INFO: dict[Any, tuple[str, str, int]] = {}


def op_info(func: Any) -> tuple[str, str, int]:
    """(packet name "aten.mul", full name "aten.mul.Tensor", kind) of an op overload."""
    info = OP_INFO.get(func)
    if info is not None:
        return info
    import torch

    name = f"{func.namespace}.{func._opname}"
    tags = func.tags
    if name in READ_CAUSES or torch.Tag.data_dependent_output in tags:
        kind = HOST_READ
    elif torch.Tag.dynamic_output_shape in tags:
        # Indexing is dynamic only with a boolean mask; integer indices keep their shape.
        kind = MASK_INDEX if name == "aten.index" else DYNAMIC_SHAPE
    else:
        kind = OTHER
    info = OP_INFO[func] = (name, str(func), kind)
    return info


def host_side_origin(frame: FrameType | None, user_files: Container[str] = ()) -> str | None:
    """Where a host read comes from when not from a device tensor on a TPU: "host" for library
    code whose tensors live on the CPU there too and for anything the DataLoader runs (the
    user's Dataset included), "scaler" for GradScaler's found_inf; None for a read of device
    data. Above the first of `user_files` only the DataLoader counts (a user's optimizer
    reading its state is the user's read)."""
    in_user = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if _DATA_LOADER_PATH in filename:
            return "host"
        if not in_user:
            if filename in user_files:
                in_user = True
            elif any(part in filename for part in _HOST_SIDE_PATHS):
                return "host"
            elif filename.endswith(_GRAD_SCALER_FILE):
                return "scaler"
        frame = frame.f_back
    return None


def _first_tensor(args: tuple[Any, ...]) -> Any:
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
    return None


class HostReads:
    """The host reads of the code run while `watching()`, by `on_read(cause, frame)`.

    The owner's dispatch mode asks `op_read` for each ATen op; the tensor methods that run
    no ATen op on the CPU are wrapped while watching. A read inside another (the op that
    `.tolist()` runs on an accelerator) counts once. `user_files` stop the walk that looks
    for the library code whose reads stay on the host (`host_side_origin`).
    """

    def __init__(
        self,
        on_read: Callable[[str, FrameType | None, str | None], None],
        *,
        emulated: bool,
        user_files: Container[str] = (),
    ) -> None:
        self.on_read = on_read
        self.emulated = emulated
        self.user_files = user_files
        self.quiet = 0
        # Emulated: tensors `.cpu()` copied to the host, by id: (their version then, the id
        # and line of the frame that copied them). On the CPU `.cpu()` returns the tensor
        # itself, which stands for the host copy on the line that made it.
        self._copied: dict[int, tuple[int, int, int]] = {}

    def _device(self, tensor: Any, frame: FrameType | None) -> bool:
        """Whether reading `tensor` (from code at `frame`) waits for a device."""
        if not self.emulated:
            return tensor is not None and tensor.device.type != "cpu"
        copied = self._copied.get(id(tensor)) if tensor is not None else None
        if copied is None or copied[0] != tensor._version:
            return True
        _, where, line = copied
        for _ in range(_COPY_FRAMES):  # the read is on the line that copied it: the host copy
            if frame is None:
                break
            if id(frame) == where and frame.f_lineno == line:
                return False
            frame = frame.f_back
        return True

    def _copied_to_host(self, tensor: Any, frame: FrameType | None) -> None:
        """Remember an emulated `.cpu()`: reading the copy on the same line
        (`float(loss.cpu())`, `x.detach().cpu().numpy()`) reads the host, as on PyTorch/XLA
        (one transfer); a read of the tensor on another line reads the device again."""
        if frame is None:
            return
        key = id(tensor)
        if key not in self._copied:
            weakref.finalize(tensor, self._copied.pop, key, None)
        self._copied[key] = (tensor._version, id(frame), frame.f_lineno)

    def _read(self, cause: str, frame: FrameType | None) -> None:
        origin = host_side_origin(frame, self.user_files) if self.emulated else None
        if origin == "host":
            return
        self.on_read(cause, frame, origin)

    def op_read(self, info: tuple[str, str, int], args: tuple[Any, ...], kwargs: dict) -> None:
        """Record the op as a read if it is one (call after the op ran, from the dispatch mode)."""
        if self.quiet:
            return
        name, _, kind = info
        if kind == HOST_READ:
            frame = sys._getframe(2)
            if self._device(_first_tensor(args), frame):
                self._read(READ_CAUSES.get(name, name), frame)
        elif name in COPY_OPS and not self.emulated and _copies_to_host(name, args, kwargs):
            self._read(COPY_CAUSE, sys._getframe(2))

    @contextmanager
    def watching(self) -> Iterator[HostReads]:
        """Wrap the tensor methods that read data (`METHOD_READS`) for the duration."""
        import torch

        cls = torch.Tensor
        originals = {name: getattr(cls, name) for name in METHOD_READS}
        reads = self

        def wrap(method_name: str) -> Callable[..., Any]:
            original = originals[method_name]
            label = METHOD_READS[method_name]
            copies = method_name == "cpu"

            def hooked(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if reads.quiet:
                    return original(self, *args, **kwargs)
                caller = sys._getframe(1)
                if reads._device(self, caller):
                    reads._read(label, caller)
                reads.quiet += 1
                try:
                    out = original(self, *args, **kwargs)
                finally:
                    reads.quiet -= 1
                if copies and reads.emulated and isinstance(out, torch.Tensor):
                    reads._copied_to_host(out, caller)
                return out

            hooked.__name__ = getattr(original, "__name__", method_name)
            hooked.__doc__ = getattr(original, "__doc__", None)
            return hooked

        for method_name in originals:
            setattr(cls, method_name, wrap(method_name))
        try:
            yield self
        finally:
            for method_name, original in originals.items():
                setattr(cls, method_name, original)


def _copies_to_host(name: str, args: tuple[Any, ...], kwargs: dict) -> bool:
    """Whether a copy op moves data from an accelerator to the CPU."""
    import torch

    if name == "aten.copy_":
        if len(args) < 2 or not isinstance(args[1], torch.Tensor):
            return False
        src, dst = args[1], getattr(args[0], "device", None)
    else:
        src, dst = _first_tensor(args), kwargs.get("device")
    if not isinstance(src, torch.Tensor) or dst is None:
        return False
    return src.device.type != "cpu" and torch.device(dst).type == "cpu"
