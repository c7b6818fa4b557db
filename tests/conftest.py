"""Shared test helpers."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_durations import (  # noqa: F401 (pytest finds hooks by name in a conftest)
    pytest_addoption,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_terminal_summary,
)

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _ctrl_c_raises() -> None:
    """A run started with SIGINT ignored (`nohup make test`, `make test &` from a script: the
    shell starts a background job so) would keep it ignored, and Python then installs no
    handler of its own: a SIGINT never becomes KeyboardInterrupt, here or in the processes
    the tests start (an ignored signal stays ignored across exec, a handled one does not).
    The tests of Ctrl-C (test_isolate, test_write_fidelity, test_forecast_isolation) need
    Python's own handler, so the run puts it back; pytest-xdist's workers run this too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_ctrl_c_raises()


def _fixed_examples_in_ci() -> None:
    """In CI the property tests draw the same examples on every run: a red CI blocks a
    submission, so a case found by chance should turn up in a developer's run (random, and
    kept in the local example database to replay), not in someone else's CI. The hunts for
    divergences run with more examples by hand."""
    try:
        from hypothesis import settings
    except ImportError:  # the XLA environment (tests/xla) has no property tests
        return
    settings.register_profile("ci", derandomize=True, database=None)
    if os.environ.get("CI"):
        settings.load_profile("ci")


_fixed_examples_in_ci()


def installed_torch_minor() -> str:
    """'2.6' for torch 2.6.0: the target-torch of a rewrite meant to run on this torch."""
    return ".".join(importlib.metadata.version("torch").split(".")[:2])


def run_cli(
    *args: str, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """Run the real `gpu2tpu` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "gpu2tpu", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def cli():
    return run_cli


def pytest_collection_modifyitems(config, items) -> None:  # type: ignore[no-untyped-def]
    """Tests that import torchax run last: once imported, torchax makes "jax" torch's
    accelerator for the rest of the process, which would change what other tests see."""
    # The forecast's own tests go very last: they leave torchax's environment mid-trace.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("torchax") is not None,
            item.module is not None and item.module.__name__.endswith("test_forecast"),
        )
    )
