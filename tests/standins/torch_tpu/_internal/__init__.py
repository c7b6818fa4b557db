"""STAND-IN for `torch_tpu._internal`."""
