"""torchax 0.0.13 on torch 2.13 and newer: the one compatibility layer, and where it ends.

torchax 0.0.13, the newest release on PyPI, builds two tables when it is imported:
`torchax/amp.py`'s autocast policies and `torchax/decompositions.py`'s list for
`torch._decomp.get_decompositions`, each naming ATen ops as `torch.ops.aten.<op>.<overload>`.
Newer torch releases removed some of those names, and looking up a missing one raises
`AttributeError`, so `import torchax` fails (docs/architecture.md, "torch versions and
torchax"):

- torch 2.13 removed named tensors (pytorch/pytorch#173895) and with them the overloads
  that take a `Dimname`: 21 of those named by torchax (`aten.prod.dim_Dimname`, amp.py line
  118, is the first; 19 more are in decompositions.py, read when the default environment is
  first built);
- torch 2.14 removed the deprecated ops `aten.cholesky` and `aten.qr` whole (amp.py lines
  131 and 199, and the lowerings registered for them in `torchax/ops/jaten.py`, lines 206
  and 5100).

Past the import nothing else broke: with this layer the project's fast torchax tests pass on
torch 2.15.0, and a forward pass, `std`, `prod` and `linalg.qr` on 'jax' tensors run on
2.13.0, 2.14.1 and 2.15.0.

The layer: while torchax and the modules that name ATen ops are imported, each of those names
that the installed torch lacks is a placeholder attribute (a `RemovedOverload`, equal to no
real op; a removed op is a `RemovedOp` whose overloads are placeholders); afterwards the
placeholders are deleted, so torch's namespace is as torch made it. The tables keep a key
nothing dispatches to (no such op can run on that torch), and `get_decompositions` skips an
entry it has no decomposition for. No function of torch or torchax is replaced.

It is applied only to the torchax releases in `NEEDS_LAYER`. torchax's main branch fixed the
named overloads after 0.0.13 (google/torchax#102); when a release carries a fix,
`tests/test_torchax_compat.py` fails (the lock's torchax imports without the layer, or a newer
stable torchax is on PyPI) and this module goes, with the bound on torchax in pyproject.toml's
`forecast` extra.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

__all__ = [
    "NEEDS_LAYER",
    "NEWEST_TORCH",
    "REMOVED_NAMED_OVERLOADS",
    "REMOVED_OPS",
    "RemovedOp",
    "RemovedOverload",
    "import_torchax",
    "layer_applies",
    "missing_ops",
    "missing_overloads",
    "placeholders_present",
]

# The torchax releases that name overloads torch 2.13 removed (read from their sources).
NEEDS_LAYER: frozenset[str] = frozenset({"0.0.13"})
# The newest torch (major, minor) each torchax release is tested with here, the layer applied
# (the development lock's torch; `make test-all` runs the forecast's tests on it). A newer
# torch is refused with a sentence rather than left to fail at import with an odd error.
NEWEST_TORCH: dict[str, tuple[int, int]] = {"0.0.13": (2, 15)}

# (op, overload) named by torchax 0.0.13's amp.py and decompositions.py that torch 2.13 lacks:
# every `aten.<op>.<overload>` in its sources, looked up on torch 2.13.0, 2.14.1 and 2.15.0.
REMOVED_NAMED_OVERLOADS: tuple[tuple[str, str], ...] = (
    ("all", "dimname"),
    ("all", "dimname_out"),
    ("index_add", "dimname"),
    ("index_copy", "dimname"),
    ("index_copy_", "dimname"),
    ("index_fill", "Dimname_Scalar"),
    ("index_fill", "Dimname_Tensor"),
    ("index_fill_", "Dimname_Scalar"),
    ("index_fill_", "Dimname_Tensor"),
    ("norm", "names_ScalarOpt_dim"),
    ("norm", "names_ScalarOpt_dim_dtype"),
    ("norm", "names_dtype_out"),
    ("norm", "names_out"),
    ("prod", "dim_Dimname"),
    ("std", "correction_names"),
    ("std", "correction_names_out"),
    ("std", "names_dim"),
    ("std", "names_out"),
    ("std_mean", "correction_names"),
    ("std_mean", "names_dim"),
    ("unbind", "Dimname"),
)
# Whole ops named by torchax 0.0.13's amp.py (as `<op>.default`) that torch 2.14 removed.
REMOVED_OPS: tuple[str, ...] = ("cholesky", "qr")

# The modules whose import names ATen ops: torchax itself, and those its environment imports
# when it is first built (`Environment.load_ops`), imported here while the layer is on.
_MODULES = (
    "torchax",
    "torchax.ops.jaten",
    "torchax.ops.jc10d",
    "torchax.ops.jtorch",
    "torchax.ops.jtorchvision_nms",
    "torchax.decompositions",
)


class RemovedOverload:
    """Stands for an overload the installed torch no longer has; equal only to itself."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<removed overload aten.{self.name}>"


class RemovedOp:
    """Stands for an op the installed torch no longer has: each overload is a placeholder."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, overload: str) -> RemovedOverload:
        if overload.startswith("__"):
            raise AttributeError(overload)
        return RemovedOverload(f"{self.name}.{overload}")

    def __repr__(self) -> str:
        return f"<removed op aten.{self.name}>"


def _aten() -> Any:
    import torch

    return torch.ops.aten


def _has(owner: Any, name: str) -> bool:
    """Whether torch has it: torch's own lookup, which raises AttributeError when it does not."""
    try:
        getattr(owner, name)
    except AttributeError:
        return False
    return True


def missing_ops() -> list[str]:
    """The ops of `REMOVED_OPS` the installed torch does not have."""
    return [op for op in REMOVED_OPS if not _has(_aten(), op)]


def missing_overloads() -> list[tuple[str, str]]:
    """The pairs of `REMOVED_NAMED_OVERLOADS` the installed torch does not have."""
    aten = _aten()
    return [
        (op, overload)
        for op, overload in REMOVED_NAMED_OVERLOADS
        if not _has(aten, op) or not _has(getattr(aten, op), overload)
    ]


def placeholders_present() -> list[str]:
    """The placeholders in torch's namespace now (none outside the layer: it cleans up)."""
    aten = _aten()
    present = [op for op in REMOVED_OPS if isinstance(vars(aten).get(op), RemovedOp)]
    for op, overload in REMOVED_NAMED_OVERLOADS:
        packet = vars(aten).get(op)
        if packet is not None and isinstance(vars(packet).get(overload), RemovedOverload):
            present.append(f"{op}.{overload}")
    return present


def layer_applies(torchax_version: str | None = None) -> bool:
    """Whether importing this torchax on this torch needs the layer."""
    try:
        version = torchax_version or importlib.metadata.version("torchax")
    except importlib.metadata.PackageNotFoundError:
        return False  # not installed: the import fails as it would without gpu2tpu
    return version in NEEDS_LAYER and bool(missing_ops() or missing_overloads())


@contextlib.contextmanager
def _placeholders() -> Iterator[None]:
    """Each missing name a placeholder attribute for the block, then deleted."""
    aten = _aten()
    placed: list[tuple[Any, str]] = []
    try:
        for op in missing_ops():
            setattr(aten, op, RemovedOp(op))
            placed.append((aten, op))
        for op, overload in missing_overloads():
            packet = getattr(aten, op)
            if isinstance(packet, RemovedOp):
                continue  # its overloads are placeholders already
            setattr(packet, overload, RemovedOverload(f"{op}.{overload}"))
            placed.append((packet, overload))
        yield
    finally:
        for owner, name in reversed(placed):
            with contextlib.suppress(AttributeError):
                delattr(owner, name)


def import_torchax() -> ModuleType:
    """`import torchax`, through the layer where this torchax and torch need it.

    Every import of torchax in gpu2tpu comes here first; later `import torchax` statements
    find the module in `sys.modules`.
    """
    if all(name in sys.modules for name in _MODULES):
        return sys.modules["torchax"]
    if not layer_applies():
        return importlib.import_module("torchax")
    with _placeholders():
        for name in _MODULES:
            importlib.import_module(name)
    return sys.modules["torchax"]
