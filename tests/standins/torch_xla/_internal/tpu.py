"""STAND-IN for `torch_xla._internal.tpu`."""


def get_tpu_type() -> str:
    return "v5litepod-4"


def version() -> int:
    return 5
