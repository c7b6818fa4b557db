"""torchax on JAX: PyTorch ops run as JAX arrays on device "jax", on any JAX platform.

On a machine without a TPU, JAX runs on its CPU platform; JAX_PLATFORMS=cpu is set before
the first JAX import so that libtpu, when installed, does not print its start-up errors
(docs/backends.md, "torchax on JAX"). Forward and inference cells work; eager `.backward()`
on 'jax' tensors fails under torch 2.12 ("element 0 of tensors does not require grad"), so
that error comes back with a sentence that says what to do instead.

torchax makes "jax" torch's accelerator for the whole process once imported, but
`torch.accelerator.synchronize()` then fails ("PyTorch is not linked with support for jax
devices"); `activate()` routes both to this backend for the duration of a cell.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .base import (
    Backend,
    ChipInfo,
    MemoryInfo,
    accelerator_answers,
    chip_kind,
    has_module,
    package_version,
    tpu_chips_on_pci,
)
from .torchax_compat import NEWEST_TORCH, import_torchax

if TYPE_CHECKING:
    import torch

BACKWARD_LIMITATION = (
    "torchax cannot run an eager `.backward()` on 'jax' tensors with this torch "
    "(the autograd graph is not recorded, so backward finds nothing to differentiate); "
    "run forward and inference cells with `--backend jax`, and for a training step use "
    "`gpu2tpu.forecast` or the functional route (torch.func.functional_call + "
    "jax.value_and_grad + optax)"
)
# The event JAX records around every backend compile (docs/backends.md, "torchax on JAX").
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_BACKWARD_CALL = re.compile(r"\.backward\s*\(|autograd\.(backward|grad)\s*\(")


def _version_tuple(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def configure_jax_platform() -> None:
    """Point JAX at its CPU platform where no TPU exists, before JAX starts its backends."""
    if os.environ.get("JAX_PLATFORMS") or tpu_chips_on_pci() > 0:
        return
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax

    # Once its backends have started JAX keeps what it chose; that is fine too.
    with contextlib.suppress(Exception):
        jax.config.update("jax_platforms", "cpu")


class JAXBackend(Backend):
    """torchax's environment: `torch.device("jax")`, `torchax.compile`, jax compile events."""

    name = "jax"
    title = "torchax on JAX"
    install = "pip install torchax 'jax[cpu]'"
    install_note = "(on a TPU VM: `pip install torchax 'jax[tpu]'`)"
    distribution = "torchax"

    _lock = threading.Lock()
    _compiles = 0
    _listening = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        missing = [m for m in ("torchax", "jax") if not has_module(m)]
        if missing:
            return f"{' and '.join(missing)} not installed"
        torch_v = _version_tuple(package_version("torch"))
        newest = NEWEST_TORCH.get(package_version("torchax") or "")
        if newest is not None and torch_v[:2] > newest:
            return (
                f"torchax {package_version('torchax')} is tested with torch up to "
                f"{newest[0]}.{newest[1]}, not with torch {package_version('torch')}"
            )
        return None

    @classmethod
    def version(cls) -> str | None:
        torchax_v, jax_v = package_version("torchax"), package_version("jax")
        if torchax_v is None:
            return None
        return f"{torchax_v} (jax {jax_v})" if jax_v else torchax_v

    @classmethod
    def version_label(cls) -> str | None:
        torchax_v, jax_v = package_version("torchax"), package_version("jax")
        if torchax_v is None:
            return None
        return f"torchax {torchax_v}, jax {jax_v}" if jax_v else f"torchax {torchax_v}"

    def _jax(self) -> Any:
        """JAX alone, on the right platform; torchax is not imported (see `_env`)."""
        configure_jax_platform()
        import jax

        self._listen_for_compiles()
        return jax

    def _env(self) -> Any:
        """torchax's environment. Importing torchax makes "jax" torch's accelerator for the
        rest of the process, so only running code on this backend does it, never a query."""
        self._jax()
        return import_torchax().default_env()

    @classmethod
    def _listen_for_compiles(cls) -> None:
        with cls._lock:
            if cls._listening:
                return
            import jax.monitoring

            def on_event(event: str, duration_secs: float, **_: Any) -> None:
                if event == _COMPILE_EVENT:
                    cls._compiles += 1

            jax.monitoring.register_event_duration_secs_listener(on_event)
            cls._listening = True

    def device(self) -> torch.device:
        import torch

        self._env()
        return torch.device("jax")

    def synchronize(self) -> None:
        self._jax()
        import jax.numpy as jnp

        # A device runs its queue in order: waiting for a fresh result waits for all before it.
        jnp.zeros(()).block_until_ready()

    def memory(self) -> MemoryInfo | None:
        stats = self._jax().devices()[0].memory_stats()
        if not stats:
            return None  # the CPU platform keeps no statistics
        return MemoryInfo(
            in_use_bytes=stats.get("bytes_in_use"),
            peak_bytes=stats.get("peak_bytes_in_use"),
            total_bytes=stats.get("bytes_limit"),
        )

    def chip(self) -> ChipInfo:
        devices = self._jax().devices()
        kind = devices[0].device_kind
        name = "CPU (JAX)" if devices[0].platform == "cpu" else kind
        return ChipInfo(
            name=name,
            kind="cpu" if devices[0].platform == "cpu" else chip_kind(kind),
            count=len(devices),
        )

    def compile(self, fn_or_module: Callable[..., Any]) -> Callable[..., Any]:
        """`torchax.compile`: a jitted JittableModule for modules, `jax_jit` for functions."""
        self._env()
        return import_torchax().compile(fn_or_module)

    def compilation_count(self) -> int | None:
        """JAX backend compiles seen since this backend was first used in the process."""
        self._jax()
        return type(self)._compiles

    def explain_failure(self, error: BaseException, source: str | None = None) -> str | None:
        if "does not require grad" in str(error) or (
            source is not None and _BACKWARD_CALL.search(source) and isinstance(error, RuntimeError)
        ):
            return BACKWARD_LIMITATION
        return None

    @contextmanager
    def activate(self) -> Iterator[torch.device]:
        """Inside torchax's environment, with "jax" as the accelerator rewritten code asks for.

        torch's global default device is left alone: set to "jax" it breaks
        `torch.get_default_device()`, which torchax itself calls; tensors made without a
        device stay on the CPU, as they would in the CUDA notebook.
        """
        env = self._env()
        dev = self.device()
        with env, accelerator_answers(dev, force=True, **self.answers()):
            yield dev
