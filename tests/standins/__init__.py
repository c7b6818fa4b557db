"""Stand-ins for TPU runtimes that cannot run on a machine without a TPU.

`torch_tpu/` and `torch_xla/` here are NOT the real packages: they are small fakes with the
names and call shapes gpu2tpu's adapters use (gpu2tpu/backends/torchtpu.py and xla.py), so the
tests can check detection, selection and the adapters' bookkeeping. Their "TPU" is torch's
`meta` device, so tensors made on it have shapes but no data. `use_standins` puts them on
`sys.path` for one test and removes every trace afterwards.
"""

from __future__ import annotations

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
    hidden = {"torch_tpu", "torch_xla"} - set(names)
    for name in hidden:
        # A None entry makes find_spec and import see the package as absent.
        monkeypatch.setitem(sys.modules, name, None)


def forget_standins() -> None:
    """Drop the stand-in modules (monkeypatch restores sys.path and torch.tpu itself)."""
    _forget(("torch_tpu", "torch_xla"))
