"""STAND-IN for `torch_tpu._loader`: registers the stand-in TPU as torch's accelerator.

The real loader renames PrivateUse1 to "tpu" where the PCI bus shows TPU chips, which makes
"tpu" torch's accelerator. The stand-in cannot register a device type, so where
`GPU2TPU_STANDIN_TPU_CHIPS` is above 0 it makes `torch.accelerator` answer the meta device
with that many chips (tests/standins/__init__.py restores torch.accelerator afterwards).
"""

import os

import torch

# The stand-in TPU's device type, and what the tests read back.
DEVICE_TYPE = "meta"
synchronized: list[str] = []


def _chips() -> int:
    return int(os.environ.get("GPU2TPU_STANDIN_TPU_CHIPS", "4"))


def load() -> None:
    chips = _chips()
    if chips <= 0:
        return
    accel = torch.accelerator
    device = torch.device(DEVICE_TYPE)

    def current_accelerator(check_available: bool = False) -> torch.device:
        return device

    def synchronize(device_index: object = None) -> None:
        synchronized.append("synchronize")

    accel.current_accelerator = current_accelerator
    accel.is_available = lambda: True
    accel.device_count = lambda: chips
    accel.synchronize = synchronize


load()
