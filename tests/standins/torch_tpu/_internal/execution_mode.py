"""STAND-IN for `torch_tpu._internal.execution_mode`: records the defer mode in force."""

import enum
from contextlib import contextmanager


class DeferMode(enum.Enum):
    DEFAULT = 0
    DEFER_AND_FUSE = 1
    STRICT_EAGER = 2
    DEBUG_EAGER = 3


current = DeferMode.DEFAULT


@contextmanager
def defer_mode(mode):
    global current
    old, current = current, mode
    try:
        yield
    finally:
        current = old
