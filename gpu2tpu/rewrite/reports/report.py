"""Renderings of a run: `path:line:col: CODE message` lines, JSON, CSV, and the summary.

The JSON record is documented in docs/json-schema.md and is stable: code, name, severity,
safety, category, fixed, fixable, needs_torch, path, cell, cell_id, line, col, message, hint,
url. The CI formats (GitHub annotations, SARIF) are in `report_ci`, the Markdown migration
report in `report_markdown`; all of them sort findings into the same categories.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TextIO

from ..core.model import CellFinding, Finding, Severity
from ..core.torch_target import rewrite_floor
from ..files.engine import FileOutcome, Mode, RunReport, Status

DOCS_URL = "https://github.com/gpu2tpu/gpu2tpu/blob/main/docs/rules.md#{anchor}"
SCHEMA_VERSION = 1


class Category(StrEnum):
    """What a finding means for the move to a TPU; every format sorts findings by it."""

    BLOCKS_TPU = "blocks-tpu"  # fails on a TPU (or on any machine without CUDA)
    DIFFERS_ON_TPU = "differs-on-tpu"  # runs, but may behave differently
    TPU_PERFORMANCE = "tpu-performance"  # runs correctly, slowly (G2T6xx)
    FIX_WITHHELD = "fix-withheld"  # a fix exists but would have broken the file
    NEEDS_NEWER_TORCH = "needs-newer-torch"  # a fix exists but needs a newer torch
    RUNTIME_SETTINGS = "runtime-settings"  # where a notebook asks to run, not its code (G2T513)


CATEGORY_TITLES: dict[Category, str] = {
    Category.BLOCKS_TPU: "Stops the code running on a TPU",
    Category.DIFFERS_ON_TPU: "Runs on a TPU, but may behave differently",
    Category.TPU_PERFORMANCE: "TPU performance hints",
    Category.FIX_WITHHELD: "Fixes withheld (the result would not have been valid code)",
    Category.NEEDS_NEWER_TORCH: "Fixes that need a newer torch than target-torch",
    Category.RUNTIME_SETTINGS: (
        "Notebook runtime settings, not code (no effect on the exit status; "
        "`--unsafe-fixes` writes them)"
    ),
}

# Short labels, for a list or a table column.
CATEGORY_LABELS: dict[Category, str] = {
    Category.BLOCKS_TPU: "blocks a TPU",
    Category.DIFFERS_ON_TPU: "may differ on a TPU",
    Category.TPU_PERFORMANCE: "TPU performance",
    Category.FIX_WITHHELD: "fix withheld",
    Category.NEEDS_NEWER_TORCH: "needs a newer torch",
    Category.RUNTIME_SETTINGS: "runtime settings",
}
# Rules about where a notebook asks to run (its Colab or Kaggle metadata), not about its code:
# every Colab notebook written for a GPU has one, so they never fail a CI gate.
RUNTIME_SETTING_CODES = frozenset({"G2T513"})


def category(finding: Finding, *, withheld: bool = False) -> Category:
    """The finding's category; `withheld`: the safety net withheld its fix (`item_category`)."""
    if withheld:
        return Category.FIX_WITHHELD
    if finding.code in RUNTIME_SETTING_CODES:
        return Category.RUNTIME_SETTINGS
    if finding.needs_torch:
        return Category.NEEDS_NEWER_TORCH
    if finding.code.startswith("G2T6"):
        return Category.TPU_PERFORMANCE
    if finding.severity == Severity.ERROR:
        return Category.BLOCKS_TPU
    return Category.DIFFERS_ON_TPU


def is_withheld(outcome: FileOutcome, item: CellFinding | Finding) -> bool:
    """Whether the rewrite's safety net withheld this finding's fix (`FileOutcome.withheld`:
    the file's findings whose fix would have left invalid code)."""
    return item in getattr(outcome, "withheld", ())


def item_category(outcome: FileOutcome, item: CellFinding | Finding) -> Category:
    return category(_unpack(item)[0], withheld=is_withheld(outcome, item))


def rule_url(code: str) -> str:
    """The rule's section in docs/rules.md (GitHub's heading anchors are lower case)."""
    return DOCS_URL.format(anchor=code.lower())


@dataclass(frozen=True)
class RunInfo:
    """What the renderings say about the run besides its findings."""

    target_torch: str | None = None  # the lowest target of the run's projects
    target_source: str = ""  # where target-torch came from, e.g. "requirements.txt: torch>=2.4"
    # Every distinct (target, where it came from) of the run's files, where projects differ.
    targets: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, targets: Iterable[tuple[str | None, str]]) -> RunInfo:
        """From the targets of a run's files (`RunReport.targets`)."""
        real = tuple(dict.fromkeys((t, s) for t, s in targets if t))
        if not real:
            return cls()
        lowest = min(real, key=lambda pair: _version_key(pair[0]))
        return cls(lowest[0], lowest[1], real)

    def target_text(self) -> str:
        """`2.6 (requirements.txt: torch>=2.6)`, or each project's where they differ."""
        pairs = self.targets or (
            ((self.target_torch, self.target_source),) if self.target_torch else ()
        )
        return ", ".join(f"{t} ({s})" if s else t for t, s in pairs)


def _unpack(item: CellFinding | Finding) -> tuple[Finding, int | None, str | None]:
    if isinstance(item, CellFinding):
        return item.finding, item.cell_index, item.cell_id
    return item, None, None


def location(path: str, finding: Finding, cell: int | None) -> str:
    if cell is None:
        return f"{path}:{finding.line}:{finding.col}"
    if cell < 0:
        return f"{path}:metadata"
    return f"{path}:cell {cell}:line {finding.line}:col {finding.col}"


def finding_line(path: str, item: CellFinding | Finding, *, show_fix: bool = True) -> str:
    finding, cell, _ = _unpack(item)
    marker = " [*]" if show_fix and would_fix(finding) else ""
    return f"{location(path, finding, cell)}: {finding.code}{marker} {finding.message}"


def unpack(item: CellFinding | Finding) -> tuple[Finding, int | None, str | None]:
    """The finding, its cell index and cell id (None, None outside notebooks)."""
    return _unpack(item)


def iter_items(
    report: RunReport, *, include_edits: bool
) -> Iterator[tuple[FileOutcome, CellFinding | Finding]]:
    """Every file's edits (if asked) and findings, in file order, then place order."""
    for outcome in report.files:
        items = [*(outcome.edits if include_edits else ()), *outcome.findings]
        for item in sorted(items, key=_sort_key):
            yield outcome, item


def iter_records(report: RunReport, *, include_edits: bool) -> Iterator[dict[str, Any]]:
    for outcome, item in iter_items(report, include_edits=include_edits):
        finding, cell, cell_id = _unpack(item)
        yield {
            "code": finding.code,
            "name": finding.name,
            "severity": str(finding.severity),
            "safety": str(finding.safety),
            "category": str(item_category(outcome, item)),
            "fixed": finding.fixed and report.mode is Mode.WRITE,
            "fixable": finding.fixed or finding.fixable,
            "needs_torch": finding.needs_torch or None,
            "path": outcome.path,
            "cell": cell,
            "cell_id": cell_id,
            "line": finding.line,
            "col": finding.col,
            "message": finding.message,
            "hint": finding.hint,
            "url": rule_url(finding.code),
        }


def _sort_key(item: CellFinding | Finding) -> tuple[int, int, int, str]:
    finding, cell, _ = _unpack(item)
    return (cell if cell is not None else -2, finding.line, finding.col, finding.code)


def error_records(report: RunReport) -> list[dict[str, Any]]:
    """`{"path", "reason"}` for each file (or notebook cell) that could not be processed."""
    errors = [{"path": e.split(": ", 1)[0], "reason": e.split(": ", 1)[-1]} for e in report.errors]
    for o in report.files:
        errors.extend({"path": o.path, "reason": e} for e in o.cell_errors)
    return errors


def render_json(
    report: RunReport, *, include_edits: bool = True, info: RunInfo | None = None
) -> str:
    doc = {
        "version": SCHEMA_VERSION,
        "findings": list(iter_records(report, include_edits=include_edits)),
        "errors": error_records(report),
        "summary": summary_counts(report, info),
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(report: RunReport, *, include_edits: bool = True) -> str:
    out = io.StringIO()
    fields = ["path", "cell", "line", "col", "code", "name", "severity", "safety", "category",
              "fixable", "needs_torch", "message", "hint"]  # fmt: skip
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for rec in iter_records(report, include_edits=include_edits):
        writer.writerow(rec)
    return out.getvalue()


def finding_lines(report: RunReport, *, include_edits: bool) -> list[str]:
    """One line per finding, ruff style; after a file's lines, its note on torch, if any."""
    lines: list[str] = []
    notes = torch_notes(report)
    for outcome in report.files:
        items = [*(outcome.edits if include_edits else ()), *outcome.findings]
        for item in sorted(items, key=_sort_key):
            lines.append(finding_line(outcome.path, item, show_fix=include_edits))
        if outcome.path in notes:
            lines.append(f"{outcome.path}: note: {notes[outcome.path]}")
    return lines


def error_lines(report: RunReport) -> list[str]:
    lines = [f"error: {e}" for e in report.errors]
    for o in report.files:
        lines.extend(f"error: {o.path}: {e}" for e in o.cell_errors)
    return lines


def would_fix(finding: Finding) -> bool:
    """Fixed, or fixed by `gpu2tpu rewrite` with the same options (safe fixes)."""
    return finding.fixed or (finding.fixable and finding.safety == "safe")


def is_fix_item(report: RunReport, outcome: FileOutcome, item: CellFinding | Finding) -> bool:
    """`is_fix` for one of `outcome`'s items; a fix the safety net withheld is not one."""
    return is_fix(report, _unpack(item)[0]) and not is_withheld(outcome, item)


def is_fix(report: RunReport, finding: Finding) -> bool:
    """An edit of this run: made (rewrite) or one `gpu2tpu rewrite` would make (check)."""
    return finding.fixed or (report.mode is Mode.CHECK and would_fix(finding))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def torch_notes(report: RunReport) -> dict[str, str]:
    """Once per file whose fixes were held back by target-torch: what applying them needs."""
    notes: dict[str, str] = {}
    for o in report.files:
        held = [_unpack(i)[0] for i in o.findings if _unpack(i)[0].needs_torch]
        if held:
            highest = max((f.needs_torch for f in held), key=_version_key)
            n = len(held)
            notes[o.path] = (
                f"{n} fix{'es' * (n != 1)} not applied: the rewrite would raise the minimum "
                f"torch to {highest}"
            )
    return notes


def summary_counts(report: RunReport, info: RunInfo | None = None) -> dict[str, Any]:
    """Counts for the summary; in `check` mode "edits" are the fixes a rewrite would make."""
    edits: Counter[str] = Counter()
    left: Counter[str] = Counter()
    by_category: dict[str, Counter[str]] = {str(c): Counter() for c in Category}
    for o in report.files:
        for item in (*o.edits, *o.findings):
            finding = _unpack(item)[0]
            if is_fix_item(report, o, item):
                edits[finding.code] += 1
            else:
                left[finding.code] += 1
                by_category[str(item_category(o, item))][finding.code] += 1
    notes = torch_notes(report)
    return {
        "files_scanned": len(report.files),
        "skipped_by_prefilter": report.count(Status.PREFILTERED) + report.count(Status.EMPTY),
        "rewritten": report.count(Status.REWRITTEN),
        "would_rewrite": report.count(Status.WOULD_REWRITE),
        "errors": len(report.errors),
        "edits_by_rule": dict(sorted(edits.items())),
        "findings_left": dict(sorted(left.items())),
        "findings_by_category": {k: sum(v.values()) for k, v in by_category.items()},
        "target_torch": info.target_torch if info else None,
        "raises_min_torch": {path: note.rsplit(" ", 1)[-1] for path, note in sorted(notes.items())},
    }


def category_counts(report: RunReport) -> dict[Category, Counter[str]]:
    """Findings left for a person, by category and then by rule code."""
    out: dict[Category, Counter[str]] = {c: Counter() for c in Category}
    for o in report.files:
        for item in (*o.edits, *o.findings):
            finding = _unpack(item)[0]
            if not is_fix_item(report, o, item):
                out[item_category(o, item)][finding.code] += 1
    return out


def _by_rule(counts: Counter[str]) -> str:
    return ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))


def summary_text(report: RunReport, info: RunInfo | None = None) -> list[str]:
    """The closing lines, ruff/black style, as plain text: one fact per line."""
    c = summary_counts(report, info)
    edits = sum(c["edits_by_rule"].values())
    left = sum(c["findings_left"].values())
    files = c["files_scanned"]
    errors = c["errors"] + sum(len(o.cell_errors) for o in report.files)
    lines: list[str] = []
    if report.mode is Mode.CHECK:
        total = edits + left
        with_findings = sum(1 for o in report.files if o.edits or o.findings)
        if total:
            lines.append(
                f"Found {total} finding{'s' * (total != 1)} in {with_findings} "
                f"file{'s' * (with_findings != 1)} ({edits} fixable with `gpu2tpu rewrite`, "
                f"{left} need{'s' * (left == 1)} a person)."
            )
        elif not errors:
            lines.append(f"All clear: no CUDA-specific code in {files} file{'s' * (files != 1)}.")
        else:
            lines.append(f"No findings in {files} file{'s' * (files != 1)}.")
    else:
        verb = "rewritten" if report.mode is Mode.WRITE else "would be rewritten"
        n = c["rewritten"] if report.mode is Mode.WRITE else c["would_rewrite"]
        unchanged = files - n - report.count(Status.ERROR)
        lines.append(
            f"{n} file{'s' * (n != 1)} {verb}, {unchanged} left unchanged "
            f"({c['skipped_by_prefilter']} skipped without parsing); "
            f"{edits} edit{'s' * (edits != 1)}, {left} finding{'s' * (left != 1)} left for a person."
        )
    if c["edits_by_rule"]:
        label = "Fixable by rule" if report.mode is Mode.CHECK else "Edits by rule"
        lines.append(f"{label}: {_by_rule(Counter(c['edits_by_rule']))}")
    for cat, counts in category_counts(report).items():
        if not counts:
            continue
        title = CATEGORY_TITLES[cat]
        if cat is Category.NEEDS_NEWER_TORCH and info and info.target_torch:
            title = f"{title} {info.target_torch}"
        lines.append(f"{title}: {sum(counts.values())} ({_by_rule(counts)})")
    if c["raises_min_torch"]:
        highest = max(c["raises_min_torch"].values(), key=_version_key)
        k = len(c["raises_min_torch"])
        target = info.target_text() if info else ""
        lines.append(
            f"Applying them would raise the minimum torch to {highest} in {k} "
            f"file{'s' * (k != 1)}; target-torch is {target or c['target_torch']}."
        )
        lines.append(
            f'To raise the floor: `--target-torch {highest}`, or `target-torch = "{highest}"` '
            "in [tool.gpu2tpu] of pyproject.toml; `--unsafe-fixes` raises the project's own "
            "torch pin (G2T520)."
        )
        floor = rewrite_floor()
        if info and info.target_torch and _version_key(info.target_torch) < _version_key(floor):
            lines.append(
                f"target-torch {info.target_torch} is older than {floor}, the oldest torch "
                "any fix writes for: every fix is reported, none applied."
            )
    cells = sum(len(o.cell_errors) for o in report.files)
    parts = [
        f"{n} {what}{'s' * (n != 1)}"
        for n, what in ((c["errors"], "file"), (cells, "notebook cell"))
        if n
    ]
    if parts:
        lines.append(f"{' and '.join(parts)} could not be processed (see the error lines).")
    return lines


def print_summary(report: RunReport, stream: TextIO, info: RunInfo | None = None) -> None:
    """Print the summary with rich on a terminal, plain text elsewhere; one line per fact."""
    lines = summary_text(report, info)
    if stream.isatty():
        from rich.console import Console

        console = Console(file=stream, highlight=False, soft_wrap=True)
        for i, line in enumerate(lines):
            console.print(line, style="bold" if i == 0 else None, markup=False)
    else:
        for line in lines:
            print(line, file=stream)
    stream.flush()


def exit_code(report: RunReport) -> int:
    """0 clean, 1 changes or findings, 2 files that could not be processed. Findings about a
    notebook's runtime settings (`Category.RUNTIME_SETTINGS`) do not count."""
    if report.errors or any(o.cell_errors for o in report.files):
        return 2
    if report.mode is Mode.CHECK:
        return int(any(o.edits or _counted(o) for o in report.files))
    if report.mode in (Mode.DRY, Mode.DIFF):
        return int(report.count(Status.WOULD_REWRITE) > 0)
    return int(any(_counted(o) for o in report.files))


def _counted(outcome: FileOutcome) -> bool:
    """Whether the file has findings that count for the exit status."""
    return any(
        item_category(outcome, item) is not Category.RUNTIME_SETTINGS for item in outcome.findings
    )
