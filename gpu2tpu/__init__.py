"""gpu2tpu: move CUDA-first PyTorch code and notebooks to TPUs.

Importing the package is cheap: torch, jax and the notebook machinery load only when a
feature that needs them is used (`gpu2tpu --version` never imports torch).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """`%load_ext gpu2tpu`."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """`%unload_ext gpu2tpu`: removes every hook the extension added."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)
