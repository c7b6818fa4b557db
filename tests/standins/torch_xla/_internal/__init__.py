"""STAND-IN for `torch_xla._internal`."""
