"""gpu2tpu: move CUDA-first PyTorch code and notebooks to TPUs.

Importing the package is cheap: torch, jax and the notebook machinery load only when a
feature that needs them is used (`gpu2tpu --version` never imports torch). `pip install
gpu2tpu` is the codemod alone; the profiler, the dry run and the magics need
`pip install 'gpu2tpu[notebook]'`, the forecast `gpu2tpu[forecast]`, and say so in one line
when they are missing.

    import gpu2tpu
    gpu2tpu.rewrite_source(text)              # the codemod, pure
    gpu2tpu.profile(step, batch, steps=20)    # measure and cost a training step
    gpu2tpu.forecast(model, (x, y), ...)      # compile for TPU generations, no TPU needed
    gpu2tpu.dry_run(step, batch)              # what would be slow on a TPU
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute), imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "rewrite_source": ("gpu2tpu.rewrite.core.source", "rewrite_source"),
    "Options": ("gpu2tpu.rewrite.core.model", "Options"),
    "rewrite_notebook": ("gpu2tpu.rewrite.notebooks.notebook", "rewrite_notebook"),
    "profile": ("gpu2tpu.measure", "profile"),
    "Profiler": ("gpu2tpu.measure", "Profiler"),
    "forecast": ("gpu2tpu.forecasting.forecast", "forecast"),
    "dry_run": ("gpu2tpu.readiness.dryrun", "dry_run"),
}

# These measure or compile torch code: without torch, asking for them names the extra.
_NEEDS_TORCH = frozenset({"profile", "Profiler", "forecast", "dry_run"})

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'gpu2tpu' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    from ._extras import extra_needed, require

    if name in _NEEDS_TORCH:
        require(f"gpu2tpu.{name}", "torch")
    with extra_needed(f"gpu2tpu.{name}"):
        module = importlib.import_module(module_name)
    value = getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, for tab completion: the lazy ones are not in the module's namespace
    until first used, so the default `dir()` would hide them."""
    return sorted(__all__)


def load_ipython_extension(ipython):
    """`%load_ext gpu2tpu`; without torch or ipywidgets, one line says what to install."""
    from ._extras import MissingExtraError, require

    try:
        require("%load_ext gpu2tpu", "torch", "ipywidgets")
    except MissingExtraError as err:
        from IPython.core.error import UsageError  # shown by IPython as one line

        raise UsageError(str(err).replace("pip install", "%pip install", 1)) from None
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext gpu2tpu`: removes every hook the extension added."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)
