"""Tests against the real PyTorch/XLA on the CPU (`PJRT_DEVICE=CPU`), marked `xla`.

They run in the XLA environment (.venv-xla, requirements/xla-cpu.lock) through
`make test-xla`. Everywhere else they are deselected by the `-m 'not xla'` in pyproject.toml;
where torch_xla is not installed they are not even collected, so a run that asks for them
with `-m xla` in the development environment finds none rather than failing to import.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

if importlib.util.find_spec("torch_xla") is None:
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("PJRT_DEVICE", "CPU")


def pytest_collection_modifyitems(config, items) -> None:  # type: ignore[no-untyped-def]
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.xla)
