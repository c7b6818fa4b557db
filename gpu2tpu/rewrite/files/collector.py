"""Python's cyclic garbage collector, run less often while the codemod works through files.

Parsing a file builds hundreds of thousands of small objects (libcst's nodes, Python's tree,
the rules' facts), and CPython's default thresholds (700, 10, 10) start a collection every
700 allocations; the older generations' collections then walk every live object, the tree
being parsed included. On diffusers' files that held `cuda` it was a third of `check`'s CPU
time, and a third of libcst's own parse (docs/architecture.md, "Garbage collection"). mypy
raises the thresholds for the same reason, to the values used here. The thresholds are the
process's: they are put back when the run ends, so that a notebook or program calling the
engine keeps its own; workers forked during the run inherit them.
"""

from __future__ import annotations

import contextlib
import gc
import platform
from collections.abc import Iterator

# Young collections every 200,000 allocations, the older ones after 30 of the one below.
THRESHOLDS = (200_000, 30, 30)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Within this block, CPython collects cycles at `THRESHOLDS` (others: unchanged)."""
    if platform.python_implementation() != "CPython":
        yield
        return
    before = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
