"""G2T520: the project's torch pin, raised where it held fixes back (an unsafe fix).

Once a run has rewritten (or checked) the files of a project whose target-torch came from its
own pin (`Config.target_pin`, config.py), the fixes that pin held back say which torch the
project would need (`Finding.needs_torch`). The pin's file gets one finding; with
`--unsafe-fixes` in a rewrite, its lower bound is raised to that torch, written atomically
like any other fix (a guarded rename over the bytes that were read). The code is not
rewritten again in the same run: the next `gpu2tpu rewrite` reads the raised pin.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ..core.model import CellFinding, Finding, Options, Safety
from ..core.torch_target import Pin, raise_pin
from .atomic_write import Snapshot


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


@dataclass(frozen=True)
class PinChange:
    """What G2T520 says about one pin file: its finding, and the raised text where the fix
    applies (`new_text`, with the `snapshot` of the bytes it was made from); or why the file
    could not be read (`error`)."""

    path: str  # as shown: relative to the current folder where it lies below it
    real_path: str
    finding: Finding | None = None
    old_text: str = ""
    new_text: str | None = None
    snapshot: Snapshot | None = None
    error: str = ""


def pin_changes(
    processed: Iterable[tuple[Pin | None, Options, list[CellFinding | Finding]]],
) -> list[PinChange]:
    """One change per project pin that held fixes back: `processed` gives, per file, the pin
    that set its target-torch (None: none did), its options and its findings."""
    held: dict[Pin, list[str]] = defaultdict(list)
    options_of: dict[Pin, Options] = {}
    for pin, options, findings in processed:
        if pin is None or pin.path is None or not options.enabled("G2T520"):
            continue
        for item in findings:
            finding = item.finding if isinstance(item, CellFinding) else item
            if finding.needs_torch:
                held[pin].append(finding.needs_torch)
                options_of.setdefault(pin, options)
    return [_change(pin, needs, options_of[pin]) for pin, needs in held.items()]


def _change(pin: Pin, needs: list[str], options: Options) -> PinChange:
    from ..rules.project_checks import TorchPinFloor as Rule

    assert pin.path is not None
    need = max(needs, key=_version_key)
    shown = os.path.relpath(pin.path)
    if shown.startswith(".."):
        shown = str(pin.path)
    count = len(needs)
    message = Rule.message.format(
        pin=pin.text or pin.source, count=count, es="es" * (count != 1), need=need
    )
    try:
        data = pin.path.read_bytes()
        text = data.decode("utf-8")
        snapshot = Snapshot.of(pin.path.stat(), data)
    except (OSError, UnicodeDecodeError) as err:
        return PinChange(shown, str(pin.path), error=f"cannot read the torch pin: {err}")
    raised = raise_pin(text, pin, need)
    line, col = 1, 1
    if pin.text and pin.text in text:
        before = text[: text.index(pin.text)]
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
    if raised is None:
        hint = f"raise it to torch {need} by hand (its form or upper bound leaves no one edit)"
    else:
        hint = Rule.hint.format(raised=raised[0].splitlines()[raised[1] - 1].strip())
    apply = raised is not None and options.unsafe_fixes and options.fix
    finding = Finding(
        code=Rule.code,
        name=Rule.name,
        line=line,
        col=col,
        message=message,
        hint=hint,
        safety=Safety.UNSAFE,
        severity=Rule.severity,
        fixed=bool(apply),
        fixable=raised is not None,
        before=pin.text,
    )
    new_text = raised[0] if apply and raised is not None else None
    return PinChange(shown, str(pin.path), finding, text, new_text, snapshot)
