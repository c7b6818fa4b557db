"""What every backend gives: its device, a synchronize, memory figures, the chip, a compile hook.

A backend is one small adapter class. Its class methods answer "can I be used here?" cheaply
(`importlib.util.find_spec` first, so an absent package is never imported); everything that
touches the runtime happens only after that answer was yes, inside the adapter's own methods,
so the surface that cannot be exercised without the hardware stays small and in one place.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

if TYPE_CHECKING:
    import torch

# PCI vendor id of Google's TPU chips (docs/backends.md, "TorchTPU 0.2.0 as released").
GOOGLE_TPU_PCI_VENDOR = "0x1ae0"


class UnknownBackend(ValueError):
    """A backend name that gpu2tpu does not know."""


class BackendUnavailable(RuntimeError):
    """A known backend that cannot run here; the message says what to install or where to run."""


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes; a field is None when the backend cannot tell."""

    in_use_bytes: int | None = None
    peak_bytes: int | None = None
    total_bytes: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


@dataclass(frozen=True)
class ChipInfo:
    """The accelerator as the runtime names it, its catalogue key, and how many there are.

    `kind` is the hardware catalogue's key ("v5e", "v6e", "v5p", "tpu7x", "h100",
    "a100-80gb", "cpu", ...), so the profiler can look up peak FLOP/s and prices.
    """

    name: str
    kind: str
    count: int = 1

    def to_dict(self) -> dict[str, str | int]:
        return asdict(self)


@dataclass(frozen=True)
class BackendStatus:
    """One line of `available_backends()`: whether a backend runs here, and if not, why."""

    name: str
    title: str
    available: bool
    reason: str
    install: str
    version: str | None = None
    version_label: str | None = None  # the version with its package's name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Runtime device names -> catalogue keys. TPU names follow jax's device_kind strings
# and TorchTPU's names (docs/backends.md, "Chip names"); GPU names follow
# torch.cuda.get_device_name().
_KIND_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        (r"\bTPU ?v5 ?(lite|e)\b|\bv5litepod\b|\bv5e\b", "v5e"),
        (r"\bTPU ?v6 ?(lite|e)\b|\bv6e\b|trillium", "v6e"),
        (r"\bTPU ?v5p?\b|\bv5p\b", "v5p"),
        (r"\bTPU ?v4 ?lite\b|\bv4i\b", "v4i"),
        (r"\bTPU ?v4\b|\bv4\b", "v4"),
        (r"\bTPU ?v3\b", "v3"),
        (r"\bTPU ?v2\b", "v2"),
        (r"\bTPU ?v?7x?\b|ironwood", "tpu7x"),
        (r"\bH200\b", "h200"),
        (r"\bH100\b", "h100"),
        (r"\bB200\b", "b200"),
        (r"\bA100\b.*\b80\s?GB\b", "a100-80gb"),
        (r"\bA100\b", "a100-40gb"),
        (r"\bL4\b", "l4"),
        (r"\bT4\b", "t4"),
    )
)


def chip_kind(name: str) -> str:
    """The catalogue key for a runtime's chip name, e.g. "TPU v5 lite" -> "v5e".

    Names the table does not know become a lowercase slug, so they still group together.
    """
    for pattern, kind in _KIND_PATTERNS:
        if pattern.search(name):
            return kind
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def tpu_chips_on_pci(root: str = "/sys/bus/pci/devices") -> int:
    """How many Google TPU chips the PCI bus lists, without loading any TPU runtime."""
    try:
        entries = os.listdir(root)
    except OSError:
        return 0
    count = 0
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "vendor"), encoding="ascii") as fh:
                if fh.read().strip().lower() == GOOGLE_TPU_PCI_VENDOR:
                    count += 1
        except OSError:
            continue
    return count


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (never imports it)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def failure_reason(what: str, err: BaseException) -> str:
    """'failed when asked for its chip (RuntimeError: first line)': one line for a report."""
    lines = str(err).strip().splitlines()
    said = lines[0] if lines else ""
    if len(said) > 200:
        said = said[:197] + "..."
    return f"{what} ({type(err).__name__}: {said})" if said else f"{what} ({type(err).__name__})"


def has_module(name: str) -> bool:
    """Whether `import name` could succeed, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Backend:
    """One way of running PyTorch code; subclasses adapt a runtime's real calls.

    Class attributes describe the backend for listings and error messages; `is_available`
    and `unavailable_reason` decide without importing absent packages. Instances are cheap
    and hold no device state beyond what their runtime keeps.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    install: ClassVar[str]  # the exact command that installs the backend
    install_note: ClassVar[str] = ""  # where the command must run, or what else it needs
    distribution: ClassVar[str | None] = None  # the PyPI distribution whose version we report
    runs_on_tpu: ClassVar[bool] = False  # eligible for `auto`
    compile_backend: ClassVar[str | None] = None  # torch.compile backend name, if one
    # Lazy runtimes (XLA) run a cell's queued graph when the cell ends, as a step boundary.
    sync_after_cell: ClassVar[bool] = False

    # -- deciding, cheaply -------------------------------------------------------------------

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can run here, else one sentence saying why not."""
        raise NotImplementedError

    @classmethod
    def is_available(cls) -> bool:
        return cls.unavailable_reason() is None

    @classmethod
    def auto_skip_reason(cls) -> str | None:
        """None when `auto` should pick this backend, else a short phrase saying why not.

        Only backends that run on a TPU are candidates; a TPU backend that can also run on
        the CPU (PyTorch/XLA) overrides this to ask for TPU chips as well.
        """
        if not cls.runs_on_tpu:
            return f"{cls.name} does not run on a TPU"
        return cls.unavailable_reason()

    @classmethod
    def version(cls) -> str | None:
        return package_version(cls.distribution) if cls.distribution else None

    @classmethod
    def version_label(cls) -> str | None:
        """The versions that run this backend, each with its package's name ("torch 2.12.1",
        "torchax 0.0.13, jax 0.10.2"): a bare number beside a title misnames its package."""
        version = cls.version()
        return f"{cls.distribution} {version}" if version else None

    @classmethod
    def safe_unavailable_reason(cls) -> str | None:
        """`unavailable_reason()`, with an exception it raises turned into the reason.

        A runtime that raises when asked (a broken install, an API that changed) makes its
        own backend unavailable, never the question about every backend.
        """
        try:
            return cls.unavailable_reason()
        except Exception as err:
            return failure_reason("failed when asked whether it runs here", err)

    @classmethod
    def status(cls) -> BackendStatus:
        reason = cls.safe_unavailable_reason()
        try:
            version, label = cls.version(), cls.version_label()
        except Exception:  # unreadable metadata: the version is unknown, nothing more
            version = label = None
        return BackendStatus(
            name=cls.name,
            title=cls.title,
            available=reason is None,
            reason=reason or "available",
            install=f"{cls.install} {cls.install_note}".strip(),
            version=version,
            version_label=label,
        )

    @classmethod
    def require(cls) -> None:
        """Raise `BackendUnavailable` with the reason, if unusable, and the install command
        unless the backend is installed already (then the reason says what is missing)."""
        reason = cls.safe_unavailable_reason()
        if reason is None:
            return
        message = f"the {cls.name!r} backend ({cls.title}) cannot run here: {reason}"
        try:
            installed = cls.distribution is not None and cls.version() is not None
        except Exception:  # unreadable metadata: give the install command
            installed = False
        if not installed:
            note = f" {cls.install_note}" if cls.install_note else ""
            message += f"; install it with `{cls.install}`{note}"
        raise BackendUnavailable(message)

    # -- using ---------------------------------------------------------------------------------

    def device(self) -> torch.device:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued device work has finished (timing needs this)."""

    def memory(self) -> MemoryInfo | None:
        return None

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window; a no-op where the runtime keeps no peak."""

    def chip(self) -> ChipInfo:
        raise NotImplementedError

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        """Compile a function or module for this backend (`torch.compile` with its backend)."""
        import torch

        return torch.compile(fn_or_module, backend=self.compile_backend or "inductor")

    def compilation_count(self) -> int | None:
        """How many graphs the runtime has compiled so far in this process; None if unknown."""
        return None

    def compilation_seconds(self) -> float | None:
        """Seconds the runtime has spent compiling so far in this process; None if unknown."""
        return None

    def explain_failure(self, error: BaseException, source: str | None = None) -> str | None:
        """A sentence to add to an error raised by user code on this backend, if one helps."""
        return None

    @contextmanager
    def activate(self) -> Iterator[torch.device]:
        """Run the block with this backend's device as the accelerator rewritten code asks for.

        Code the codemod rewrote asks `torch.accelerator.current_accelerator(...)` for its
        device; inside the block that call answers this backend's device, so a rewritten cell
        lands here even where torch's own accelerator is another one (CUDA on a GPU machine
        asked to dry-run on the CPU, or XLA and torchax, which are not torch accelerators).
        `torch.accelerator.synchronize()` calls this backend's synchronize. All of it is
        restored afterwards, also when the block raises.

        torch's default device is left alone: in the CUDA code being migrated, a tensor made
        without a device is a host tensor (a dataset, a DataLoader's pinned batch, a NumPy
        view) that the code itself moves with `.cuda()`, which the codemod rewrote into
        `.to(device)`. A device default would put that data on the TPU before the code moves
        it, and break what only host tensors do (docs/backends.md, "The default device").
        """
        dev = self.device()
        with accelerator_answers(dev, **self.answers()):
            yield dev

    def answers(self) -> dict[str, Any]:
        """What `torch.accelerator` answers from inside `activate()` (`accelerator_answers`)."""
        return {
            "synchronize": self.synchronize,
            "memory": self.memory,
            "reset_peak": self.reset_peak_memory,
            "count": lambda: self.chip().count,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def asked_by_torch() -> bool:
    """Whether the function that called our caller is in one of torch's own modules (the
    caller answers torch differently from the user's code)."""
    module = sys._getframe(2).f_globals.get("__name__", "")
    return module == "torch" or module.startswith("torch.")


@contextmanager
def accelerator_answers(
    dev: torch.device,
    synchronize: Callable[[], None] | None = None,
    force: bool = False,
    memory: Callable[[], MemoryInfo | None] | None = None,
    reset_peak: Callable[[], None] | None = None,
    count: Callable[[], int] | None = None,
) -> Iterator[None]:
    """Make `torch.accelerator` answer for `dev` inside the block.

    `current_accelerator()` returns `dev` (None for the CPU, so the codemod's
    `... or torch.device("cpu")` picks the CPU), `is_available()` says whether `dev` is an
    accelerator, `synchronize()` calls the backend's own synchronize, and the rest of what
    rewritten code calls answers for the backend too: `device_count()` from `count`, the
    device index functions for its one device, and the memory functions
    (`torch.accelerator.memory.*`: allocated, peak, stats, free and total) from `memory`,
    with 0 where the backend cannot tell (as torch answers for an accelerator whose
    allocator it does not know); resetting the peak calls `reset_peak`, emptying the cache
    does nothing. Without that, a rewritten `torch.cuda.reset_peak_memory_stats()` behind
    `is_available()` reached torch's own accelerator, CUDA without a GPU, on XLA. Nothing is
    patched when torch's accelerator already is `dev`, unless `force` (torchax registers
    "jax" as the accelerator but leaves its synchronize broken).

    The answers are for the user's code and gpu2tpu's, not for torch itself: torch asks the
    same questions to choose what only its own accelerators support (a DataLoader with
    `pin_memory=True` pins its batches for the current accelerator, which fails for XLA), so
    torch's modules keep torch's own answers, as on a TPU VM where XLA is no accelerator.
    """
    import torch

    accel = torch.accelerator
    current = _current_accelerator(accel)
    native = (current.type if current is not None else "cpu") == dev.type
    if native and not force:
        yield
        return
    target = torch.device(dev.type)
    is_accel = target.type != "cpu"

    def known() -> MemoryInfo:
        try:
            info = memory() if memory is not None else None
        except Exception:  # a runtime that cannot tell: unknown, as where it has no API
            info = None
        return info or MemoryInfo()

    def stats(*_: object, **__: object) -> dict[str, int]:
        info = known()
        in_use = info.in_use_bytes or 0
        peak = info.peak_bytes or in_use
        return {
            "allocated_bytes.all.current": in_use,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": in_use,
            "reserved_bytes.all.peak": peak,
        }

    def memory_info(*_: object, **__: object) -> tuple[int, int]:
        info = known()
        total = info.total_bytes or 0
        return (max(total - (info.in_use_bytes or 0), 0), total)

    def devices() -> int:
        if not is_accel:
            return 0
        try:
            return count() if count is not None else 1
        except Exception:  # a runtime that cannot count: its one device
            return 1

    def reset(*_: object, **__: object) -> None:
        if reset_peak is not None:
            reset_peak()

    def nothing(*_: object, **__: object) -> None:
        return None

    def accel_synchronize(device: object = None) -> None:
        if synchronize is not None:
            synchronize()

    index = dev.index or 0
    answers: dict[str, Callable[..., Any]] = {
        "current_accelerator": lambda check_available=False: target if is_accel else None,
        "is_available": lambda: is_accel,
        "device_count": devices,
        "current_device_index": lambda: index,
        "current_device_idx": lambda: index,
        "set_device_index": nothing,
        "set_device_idx": nothing,
        "device_index": lambda *_, **__: nullcontext(),
        "memory_allocated": lambda *_, **__: stats()["allocated_bytes.all.current"],
        "max_memory_allocated": lambda *_, **__: stats()["allocated_bytes.all.peak"],
        "memory_reserved": lambda *_, **__: stats()["reserved_bytes.all.current"],
        "max_memory_reserved": lambda *_, **__: stats()["reserved_bytes.all.peak"],
        "memory_stats": stats,
        "get_memory_info": memory_info,
        "reset_peak_memory_stats": reset,
        "reset_accumulated_memory_stats": nothing,
        "empty_cache": nothing,
    }
    patched: list[tuple[Any, str, Any]] = []
    for module in (accel, getattr(accel, "memory", None)):
        if module is None:
            continue
        for name, ours in answers.items():
            real = getattr(module, name, None)
            if real is not None:
                patched.append((module, name, real))
                setattr(module, name, _routed(real, ours))
    patched.append((accel, "synchronize", accel.synchronize))
    accel.synchronize = accel_synchronize
    try:
        yield
    finally:
        for module, name, real in reversed(patched):
            setattr(module, name, real)


def _current_accelerator(accel: Any) -> torch.device | None:
    """torch's accelerator, or None where there is none, on every torch from 2.6.

    `check_available` is torch 2.7's; torch 2.6's `current_accelerator()` takes no argument
    and raises where there is no accelerator (docs/torch-versions.md), so it is asked only
    where `is_available()` says there is one (found by the torch matrix, `make test-torch`).
    """
    try:
        return cast("torch.device | None", accel.current_accelerator(check_available=True))
    except TypeError:  # torch 2.6
        return cast("torch.device", accel.current_accelerator()) if accel.is_available() else None
    except RuntimeError:
        return None


def _routed(real: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    """`ours` for the user's code and gpu2tpu's, `real` for torch's own modules."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        if asked_by_torch():
            return real(*args, **kwargs)
        return ours(*args, **kwargs)

    answer.__name__ = getattr(real, "__name__", "answer")
    answer.__doc__ = getattr(real, "__doc__", None)
    return answer
