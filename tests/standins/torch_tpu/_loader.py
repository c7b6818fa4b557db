"""STAND-IN for `torch_tpu._loader`: registers `torch.tpu`, and the TPU as torch's accelerator.

Like the real loader it installs the public `torch.tpu` module at import. The real loader
then renames PrivateUse1 to "tpu" where the PCI bus shows TPU chips, which makes "tpu"
torch's accelerator. The stand-in cannot register a device type, so where
`GPU2TPU_STANDIN_TPU_CHIPS` is above 0 it makes `torch.accelerator` answer the meta device
with that many chips (tests/standins/__init__.py restores torch.accelerator afterwards).
"""

import os

import torch
from torch_tpu._internal import public_api

public_api.install()

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
