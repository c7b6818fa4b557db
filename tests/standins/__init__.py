"""Stand-ins for TPU runtimes that cannot run on a machine without a TPU.

`torch_tpu/` and `torch_xla/` here are NOT the real packages. `torch_tpu/` mirrors the
released TorchTPU 0.2.0 (its `torch.tpu` names, the internal APIs that raise, the loader that
registers the TPU as torch's accelerator) and tests/test_torchtpu_contract.py checks it
against the real wheel; `torch_xla/` has the names and call shapes gpu2tpu/backends/xla.py
uses. Their "TPU" is torch's `meta` device, so tensors made on it have shapes but no data.
`use_standins` puts them on `sys.path` for one test and removes every trace afterwards.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

STANDINS = Path(__file__).resolve().parent
# Environment variable the stand-ins read: how many TPU chips they pretend to see.
CHIPS_ENV = "GPU2TPU_STANDIN_TPU_CHIPS"


def _forget(prefixes: tuple[str, ...]) -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in prefixes:
            del sys.modules[name]


def use_standins(monkeypatch: pytest.MonkeyPatch, *names: str, chips: int = 4) -> None:
    """Make `import torch_tpu` / `import torch_xla` find the stand-ins for this test."""
    import torch

    from gpu2tpu import backends

    monkeypatch.setenv(CHIPS_ENV, str(chips))
    monkeypatch.syspath_prepend(str(STANDINS))
    _forget(("torch_tpu", "torch_xla"))
    # Adapter instances are per process; a test must not see another test's stand-in.
    monkeypatch.setattr(backends, "_instances", {})
    if not hasattr(torch, "tpu"):
        monkeypatch.setattr(torch, "tpu", None, raising=False)
        monkeypatch.delattr(torch, "tpu")
    # The stand-in registers `torch.tpu` and, with chips, its TPU as torch's accelerator:
    # record what is there now so that all of it comes back after the test.
    monkeypatch.setitem(sys.modules, "torch.tpu", None)
    del sys.modules["torch.tpu"]
    for name in ("current_accelerator", "is_available", "device_count", "synchronize"):
        monkeypatch.setattr(torch.accelerator, name, getattr(torch.accelerator, name))
    hidden = {"torch_tpu", "torch_xla"} - set(names)
    for name in hidden:
        # A None entry makes find_spec and import see the package as absent.
        monkeypatch.setitem(sys.modules, name, None)
    if "torch_tpu" in names:
        from gpu2tpu.backends import torchtpu

        # What `import torch` does where TorchTPU is installed: its entry point loads it.
        importlib.import_module("torch_tpu")
        monkeypatch.setattr(torchtpu, "DEVICE_TYPE", sys.modules["torch_tpu._loader"].DEVICE_TYPE)


def forget_standins() -> None:
    """Drop the stand-in modules (monkeypatch restores sys.path and torch.tpu itself)."""
    _forget(("torch_tpu", "torch_xla"))
