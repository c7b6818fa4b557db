"""STAND-IN for TorchTPU (`torch_tpu`), used by gpu2tpu's tests; not the real package.

Like the real one, importing it registers `torch.tpu`; its "TPU" is torch's meta device.
"""

import torch

from . import api  # noqa: F401
from ._device_module import StandInTpuModule

torch.tpu = StandInTpuModule
__version__ = "0.0.0+standin"
