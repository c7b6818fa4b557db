"""The checks on a project's own files (G2T520): declared here, in the one registry, run by
rewrite/files/pins.py once the run knows which fixes the project's torch pin held back."""

from __future__ import annotations

from ..core.model import Safety, Severity
from .base import ProjectRule


class TorchPinFloor(ProjectRule):
    """The project's own torch pin is older than the fixes need (`torch==1.9.1`).

    Why: without `--target-torch`, the pin (requirements*.txt, environment.yml, pyproject.toml,
    setup.cfg or setup.py) is the oldest torch the rewritten code must run on, so every fix
    that writes a newer API is held back (docs/torch-versions.md). TorchTPU needs a recent
    torch anyway. The fix raises the lower bound of the requirement that set the floor to the
    torch the held-back fixes need, keeping its upper bounds, extras and markers, and is
    unsafe: the project then needs that torch. The held-back fixes are applied by the next
    `gpu2tpu rewrite`, which reads the new pin. A requirement whose upper bound the new floor
    passes (`torch>=1.8,<2`, `~=1.9`), or one in Poetry's table, is reported, not changed.

    Example:
        torch==1.9.1  ->  torch>=2.9        (requirements.txt)
        - pytorch=1.9.1  ->  - pytorch>=2.9 (environment.yml)
    """

    code = "G2T520"
    name = "torch-pin-floor"
    safety = Safety.UNSAFE
    severity = Severity.WARNING
    message = "the project's torch pin `{pin}` holds back {count} fix{es} (they need torch {need})"
    hint = "raise it to `{raised}` (`gpu2tpu rewrite --unsafe-fixes`), then rewrite again"
