"""STAND-IN for TorchTPU (`torch_tpu` 0.2.0), used by gpu2tpu's tests; not the real package.

It mirrors the released package's shape (docs/backends.md, "TorchTPU 0.2.0 as released"):
importing it runs its loader, which registers `torch.tpu`, the public module, whether or not
a TPU is present, and registers the TPU as torch's accelerator only where "chips" are
present. Its TPU is torch's meta device, so tensors made on it have shapes but no data. It
exposes no name the real package lacks: tests/test_torchtpu_contract.py compares the two.
"""

from torch_tpu import _loader as _  # noqa: F401  (as the real package does)
