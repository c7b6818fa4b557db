"""STAND-IN for `torch_xla.debug`."""
