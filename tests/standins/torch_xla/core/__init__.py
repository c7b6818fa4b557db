"""STAND-IN for `torch_xla.core`."""
