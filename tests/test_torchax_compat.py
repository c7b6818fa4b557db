"""The layer that lets torchax 0.0.13 import on torch 2.13 and newer, and its end.

gpu2tpu/backends/torchax_compat.py says what breaks and why. These tests check that the layer
covers exactly the names torchax uses and torch lacks, that torch's namespace is as torch made
it once torchax is imported, and they fail when the layer is no longer needed (the lock's
torchax imports without it, or a newer stable torchax is on PyPI): then the layer goes.

torchax is imported only in subprocesses here: once imported it makes "jax" torch's
accelerator for the rest of the process (conftest.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from gpu2tpu.backends import torchax_compat
from gpu2tpu.backends.torchax_compat import (
    NEEDS_LAYER,
    NEWEST_TORCH,
    REMOVED_NAMED_OVERLOADS,
    REMOVED_OPS,
    RemovedOp,
    RemovedOverload,
    missing_ops,
    missing_overloads,
    placeholders_present,
)

TORCHAX_VERSION = importlib.metadata.version("torchax")
TORCH_MINOR = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
# `aten.<op>` or `aten.<op>.<overload>` as torchax's sources spell them.
_ATEN_NAME = re.compile(r"(?:torch\.ops\.|\b)aten\.(\w+)(?:\.(\w+))?")


def _names_in_torchax() -> set[tuple[str, str | None]]:
    """Every ATen op and overload named in the installed torchax's code (comments left out)."""
    spec = importlib.util.find_spec("torchax")
    assert spec is not None and spec.origin is not None
    names: set[tuple[str, str | None]] = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#", 1)[0]
            names.update(_ATEN_NAME.findall(code))
    return {(op, overload or None) for op, overload in names}


def _missing_in_torch(names: set[tuple[str, str | None]]) -> tuple[set[str], set[tuple[str, str]]]:
    """Of `names`, the ops torch lacks whole, and the overloads of ops it has that it lacks."""
    aten = torch.ops.aten
    ops, overloads = set(), set()
    for op, overload in names:
        try:
            packet = getattr(aten, op)
        except AttributeError:
            ops.add(op)
            continue
        if overload is not None and overload != "default":
            try:
                getattr(packet, overload)
            except AttributeError:
                overloads.add((op, overload))
    return ops, overloads


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_layer_names_exactly_what_torchax_uses_and_this_torch_lacks() -> None:
    """A name torchax uses that this torch lacks and the layer misses would fail the import;
    a name the layer lists that torch has is never touched (the layer adds only what is
    missing)."""
    ops, overloads = _missing_in_torch(_names_in_torchax())
    assert ops == set(missing_ops())
    assert overloads == set(missing_overloads())
    assert set(missing_ops()) <= set(REMOVED_OPS)
    assert set(missing_overloads()) <= set(REMOVED_NAMED_OVERLOADS)


def test_placeholders_last_only_for_the_block_even_when_it_fails() -> None:
    with pytest.raises(RuntimeError, match="inside"), torchax_compat._placeholders():
        aten = torch.ops.aten
        for op in missing_ops():
            assert isinstance(getattr(aten, op), RemovedOp)
            assert isinstance(getattr(aten, op).default, RemovedOverload)
        for op, overload in missing_overloads():
            assert isinstance(getattr(getattr(aten, op), overload), RemovedOverload)
        assert placeholders_present()  # this torch lacks some (the lock's torch is 2.13+)
        raise RuntimeError("inside")
    assert placeholders_present() == []
    for op in missing_ops():
        with pytest.raises(AttributeError):
            getattr(torch.ops.aten, op)
    for op, overload in missing_overloads():
        if op not in REMOVED_OPS:
            with pytest.raises(AttributeError):
                getattr(getattr(torch.ops.aten, op), overload)


def test_torchax_imports_and_runs_through_the_layer_and_torch_is_left_alone() -> None:
    done = _run(
        """
        import torch
        from gpu2tpu.backends.torchax_compat import import_torchax, placeholders_present

        torchax = import_torchax()
        assert placeholders_present() == [], placeholders_present()
        try:
            torch.ops.aten.prod.dim_Dimname
        except AttributeError:
            print("TORCH-UNCHANGED")
        env = torchax.default_env()
        with env:
            x = torch.arange(12.0, device="jax").reshape(3, 4)
            print("STD", torch.std(x, dim=0).tolist())
            print("PROD", torch.prod(x + 1, 1).tolist())
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TORCH-UNCHANGED" in done.stdout
    assert "STD [4.0, 4.0, 4.0, 4.0]" in done.stdout
    assert "PROD [24.0, 1680.0, 11880.0]" in done.stdout


def test_the_lock_still_needs_the_layer() -> None:
    """Fails once torchax releases the fix and the lock takes it: then remove
    gpu2tpu/backends/torchax_compat.py and its calls, and the torchax bound of the
    `forecast` extra."""
    assert TORCHAX_VERSION in NEEDS_LAYER, (
        f"the lock's torchax {TORCHAX_VERSION} is not one the layer is for "
        f"({sorted(NEEDS_LAYER)}): if it imports on torch {torch.__version__}, remove the layer"
    )
    done = _run(
        """
        import torchax

        torchax.default_env()
        """
    )
    assert done.returncode != 0, (
        f"torchax {TORCHAX_VERSION} imports on torch {torch.__version__} without the layer: "
        "remove gpu2tpu/backends/torchax_compat.py"
    )
    assert "AttributeError" in done.stderr
    named = [f"'{o}'" for _, o in REMOVED_NAMED_OVERLOADS] + [f"'{op}'" for op in REMOVED_OPS]
    assert any(name in done.stderr.splitlines()[-1] for name in named), done.stderr[-2000:]


def test_the_lock_torch_is_the_newest_the_layer_is_tested_with() -> None:
    assert NEWEST_TORCH[TORCHAX_VERSION] == TORCH_MINOR


@pytest.mark.slow
def test_no_stable_torchax_newer_than_the_layer_knows_is_released() -> None:
    """From the registry, as a user's pip sees it: a new stable torchax may carry the fix
    (google/torchax#102 is on its main branch), and then the layer should go."""
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps",
            "--ignore-installed", "--report", "-", "torchax",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    [item] = json.loads(done.stdout)["install"]
    newest = item["metadata"]["version"]
    assert Version(newest) <= max(Version(v) for v in NEEDS_LAYER), (
        f"torchax {newest} is on PyPI: check whether it imports on torch 2.13 and newer "
        "without gpu2tpu's layer; if so, move the lock to it and remove the layer"
    )
