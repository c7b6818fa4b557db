"""The forked child that keeps torchax out of the user's process."""

from __future__ import annotations

import os
import sys

import pytest

from gpu2tpu.profile.isolate import ChildDied, run_in_child


class Local:
    """A class a notebook might define: not importable by a fresh interpreter."""

    def __init__(self, value: int) -> None:
        self.value = value


def _work(obj: Local, extra: int) -> tuple[int, int, bool]:
    sys.modules["gpu2tpu_isolate_marker"] = sys  # a change to the child's process only
    return obj.value + extra, os.getpid(), "gpu2tpu_isolate_marker" in sys.modules


def test_result_comes_back_and_the_parent_is_untouched() -> None:
    total, pid, marked = run_in_child(_work, Local(40), extra=2)
    assert total == 42 and marked
    assert pid != os.getpid()
    assert "gpu2tpu_isolate_marker" not in sys.modules


def _fail() -> None:
    raise ValueError("bad shape 3")


def test_the_childs_error_is_raised_here_with_its_traceback() -> None:
    with pytest.raises(ValueError, match="bad shape 3") as info:
        run_in_child(_fail)
    assert any("_fail" in note for note in getattr(info.value, "__notes__", []))


def _die() -> None:
    os._exit(3)


def test_a_child_that_dies_is_reported() -> None:
    with pytest.raises(ChildDied, match="exit code 3"):
        run_in_child(_die)
