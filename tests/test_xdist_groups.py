"""The parallel runs keep each `xdist_group` on one worker, as the test tiers rely on.

A module that starts something expensive in a module fixture (Jupyter kernels, a browser,
TorchTPU, a TPU compile shared by two tests) carries `pytest.mark.xdist_group`, and the
Makefile runs pytest with `--dist loadgroup`. When grouping silently stops, every test still
passes, but each worker that draws a test of the module starts the fixture again: with pytest
9.2, pytest-xdist 3.8's tag on the node id no longer took and CI set up the XLA notebooks'
eight kernels twice and compiled the one-chip step twice, unnoticed (the pins in
requirements/*.in). This runs a small suite the way the Makefile runs the real one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("expensive")


@pytest.fixture(scope="module")
def started():
    with open(os.environ["SETUPS"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("case", range(6))
def test_uses_it(started, case):
    pass
"""

OTHERS = """
import pytest


@pytest.mark.parametrize("case", range(6))
def test_other(case):
    pass
"""


def test_a_group_runs_on_one_worker_and_starts_its_fixture_once(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(SUITE, encoding="utf-8")
    (tmp_path / "test_others.py").write_text(OTHERS, encoding="utf-8")
    setups = tmp_path / "setups.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadgroup", "-o", "addopts=", "test_grouped.py", "test_others.py"],
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
            "SETUPS": str(setups),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 passed" in done.stdout
    assert len(setups.read_text(encoding="utf-8").split()) == 1, "the group ran on two workers"
