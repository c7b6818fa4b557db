"""STAND-IN for PyTorch/XLA (`torch_xla`), used by gpu2tpu's tests; not the real package.

Its XLA device is torch's meta device; `sync()` only counts calls.
"""

import torch

syncs = 0


def device() -> torch.device:
    return torch.device("meta")


def sync(wait: bool = False) -> None:
    global syncs
    syncs += 1
