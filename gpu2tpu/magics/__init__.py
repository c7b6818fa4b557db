"""The IPython extension: `%load_ext gpu2tpu` registers `%%tpu`, `%tpu_auto`, `%tpu_info` and
`%tpu_doctor`.

`%unload_ext gpu2tpu` removes every hook the extension added: each magic it registered, auto
mode's input and AST transformers, run events and traceback wrapper, and its syntax-error
handler. Loading imports neither torch nor any TPU runtime; they load on the first cell that
needs them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

_LOADED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


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
    for kind, registered in magics.magics.items():  # every magic this instance registered
        table = manager.magics[kind]
        for name in registered:
            bound = table.get(name)
            if getattr(bound, "__self__", None) is magics:
                del table[name]
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
