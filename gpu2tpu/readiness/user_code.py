"""Which source files are the user's own code, and what to call them in a message.

A notebook's code lives in its cells (IPython compiles each under a name of its own and keeps
the cell's number: `In[3]`) and in the local modules beside it (`helper_functions.py`). The
dry run follows calls into both, and the magics show only their frames in a traceback.
Installed packages (anything under `site-packages`, the interpreter's prefixes) and gpu2tpu
itself are never the user's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["UserCode", "cell_labels"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
_LIBRARY_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def cell_labels(shell: Any = None) -> dict[str, str]:
    """Compile-cache name -> "In[n]" for every cell the shell compiled (the running shell's
    when none is given; empty outside IPython)."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        get = getattr(ipython, "get_ipython", None)
        shell = get() if get is not None else None
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not isinstance(numbers, Mapping):
        return {}
    return {name: f"In[{number}]" for name, number in list(numbers.items())}


def _library_prefixes() -> tuple[str, ...]:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted(os.path.join(p, "") for p in prefixes if p))


class UserCode:
    """`label(filename)`: "In[3]" for a notebook cell, a path relative to `root` for a local
    module, None for anything else (libraries, the standard library, gpu2tpu, `<string>`).

    `cells` maps compile-cache names to labels (`cell_labels(shell)`); `root` is the folder
    whose Python files count as local modules (the working directory, where a notebook's
    `import helper_functions` finds them); None counts no file.
    """

    def __init__(
        self, cells: Mapping[str, str] | None = None, root: str | os.PathLike[str] | None = "."
    ) -> None:
        self.cells = dict(cell_labels() if cells is None else cells)
        self.root = None if root is None else os.path.join(os.path.abspath(root), "")
        self._prefixes = _library_prefixes()
        # file -> its label (None: not the user's), for each file asked about so far
        self.known: dict[str, str | None] = {}

    def label(self, filename: str) -> str | None:
        known = self.known
        if filename in known:
            return known[filename]
        label = known[filename] = self._label(filename)
        return label

    def __contains__(self, filename: object) -> bool:
        return isinstance(filename, str) and self.label(filename) is not None

    def _label(self, filename: str) -> str | None:
        cell = self.cells.get(filename)
        if cell is not None:
            return cell
        if self.root is None or filename.startswith("<") or not filename.endswith(".py"):
            return None
        path = os.path.abspath(filename)
        if not path.startswith(self.root) or path.startswith(_PACKAGE_DIR):
            return None
        if any(part in path for part in _LIBRARY_PARTS) or path.startswith(self._prefixes):
            return None
        return os.path.relpath(path, self.root)
