"""The IPython extension: `%load_ext gpu2tpu` registers `%%tpu`, `%tpu_auto` and `%tpu_info`.

`%unload_ext gpu2tpu` removes every hook the extension added: the three magics, and auto
mode's input transformer and run events. Loading imports neither torch nor any TPU runtime;
they load on the first cell that needs them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

_LOADED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_MAGIC_NAMES = {"cell": ("tpu",), "line": ("tpu_auto", "tpu_info")}


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register the magics on `ipython` (called by `%load_ext gpu2tpu`)."""
    from .execution import TPUMagics

    if ipython in _LOADED:
        unload_ipython_extension(ipython)
    magics = TPUMagics(ipython)
    ipython.register_magics(magics)
    _LOADED[ipython] = magics


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Remove the magics and every hook they added (called by `%unload_ext gpu2tpu`)."""
    magics = _LOADED.pop(ipython, None)
    if magics is None:
        return
    magics.close()
    manager = ipython.magics_manager
    for kind, names in _MAGIC_NAMES.items():
        table = manager.magics[kind]
        for name in names:
            bound = table.get(name)
            if getattr(bound, "__self__", None) is magics:
                del table[name]
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
