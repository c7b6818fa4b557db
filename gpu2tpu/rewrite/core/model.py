"""The records the codemod produces: options in, edits and findings out.

They are plain frozen dataclasses so that they cross process boundaries (the engine runs
files in a pool) and serialise to JSON without help.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Safety(StrEnum):
    """How far a rule's fix can be trusted, in ruff's terms."""

    SAFE = "safe"  # applied by default: behaviour is kept
    UNSAFE = "unsafe"  # applied only with --unsafe-fixes: behaviour may change
    REPORT = "report-only"  # no fix: a person decides


class Severity(StrEnum):
    ERROR = "error"  # fails on a TPU (or on any machine without CUDA)
    WARNING = "warning"  # runs, but slowly or differently on a TPU


@dataclass(frozen=True)
class Options:
    """What `rewrite_source` should do.

    `select` and `ignore` hold rule codes or code prefixes (`G2T1`, `G2T101`), as in ruff.
    `device_name` names a device variable that already exists outside this text (a notebook's
    earlier cell); with `define_device=False` the rewrite never defines one itself.
    `target_torch` ("2.6") is the oldest torch the rewritten code must run on: a fix whose
    rule needs a newer torch is not applied but reported (see `torch_target`); None: any.
    `withhold` lists fixes not to apply, as (rule code, first line, last line): the safety net
    (net.py) reruns the rules with the fixes that broke a text withheld.

    For callers that run texts one after another in one namespace (notebook cells, the
    `%%tpu` magic):
    `prior_imports` holds the source of import statements that ran before this text (earlier
    cells): their names resolve like this text's own imports. `prior_names` are names already
    bound there: a new variable never takes one. `reserved_names` are never used for new names
    either. With `insert_statements=False` the rewrite adds no statement at all (no import, no
    device line): a fix that needs a device variable uses `device_name` or is reported, and
    the imports the new text needs come back in `Result.required_imports` for the caller to run.
    `library` says whether the text is a library module (imported by others, never run), whose
    device is asked for lazily, in a function, not by a line that runs at import; None: tell
    from the text (`analysis.placement.runs_as_script`). Notebooks and cells are never one.
    """

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    fix: bool = True
    device_name: str | None = None
    define_device: bool = True
    target_torch: str | None = None
    withhold: tuple[tuple[str, int, int], ...] = ()
    prior_imports: tuple[str, ...] = ()
    prior_names: frozenset[str] = frozenset()
    reserved_names: frozenset[str] = frozenset()
    insert_statements: bool = True
    library: bool | None = None

    def withholds(self, code: str, line: int) -> bool:
        """Whether the fix of rule `code` at `line` is withheld (`withhold`)."""
        return any(c == code and a <= line <= b for c, a, b in self.withhold)

    def enabled(self, code: str) -> bool:
        """Whether a rule code is switched on: the longest matching prefix wins."""
        sel = max((len(p) for p in self.select if code.startswith(p)), default=-1)
        ign = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        if self.select and sel < 0:
            return False
        return ign < 0 or sel > ign


@dataclass(frozen=True)
class Finding:
    """One place in the text that is tied to CUDA or slow on a TPU.

    `fixed` is True when the returned text already contains the fix (an edit); otherwise the
    finding is left for a person, and `fixable` says whether `--unsafe-fixes` would fix it.
    Lines are 1-based, columns 1-based (as ruff prints them). `needs_torch` is set on a fix
    that was not applied because its rule needs a newer torch than `Options.target_torch`.
    """

    code: str
    name: str
    line: int
    col: int
    message: str
    hint: str
    safety: Safety
    severity: Severity
    fixed: bool = False
    fixable: bool = False
    before: str = ""
    after: str = ""
    needs_torch: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Result:
    """What `rewrite_source` returns: the new text, the edits in it, and what is left.

    `withheld` are the findings (also in `findings`) whose fix the safety net held back because
    the text with it did not verify (net.py); each message says why.
    """

    new_text: str
    edits: tuple[Finding, ...] = ()
    findings: tuple[Finding, ...] = ()
    device_name: str | None = None
    device_defined: bool = False
    skipped: tuple[str, ...] = field(default=())
    withheld: tuple[Finding, ...] = ()
    # Import statements the new text needs but did not add (`Options.insert_statements=False`).
    required_imports: tuple[str, ...] = ()
    # A fix that writes the device was not applied because `Options.device_name` means
    # something else where it would go (a parameter or local of that name): the caller may
    # offer another name (the magics do).
    device_shadowed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.edits)

    @property
    def all(self) -> tuple[Finding, ...]:
        """Edits and findings together, in text order."""
        return tuple(sorted(self.edits + self.findings, key=lambda f: (f.line, f.col, f.code)))


@dataclass(frozen=True)
class CellFinding:
    """A finding or edit inside a notebook: the code cell's index (0-based among all cells),
    its id when the notebook has ids, and the finding with lines counted within the cell."""

    cell_index: int
    cell_id: str | None
    finding: Finding
