"""Renderings of a run: `path:line:col: CODE message` lines, JSON, CSV, and the summary.

The JSON record is documented in docs/json-schema.md and is stable: code, name, severity,
safety, fixed, fixable, path, cell, cell_id, line, col, message, hint, url.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterator

from .engine import FileOutcome, Mode, RunReport, Status
from .model import CellFinding, Finding

DOCS_URL = "https://github.com/gpu2tpu/gpu2tpu/blob/main/docs/rules.md#{code}"
SCHEMA_VERSION = 1


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
    marker = " [*]" if show_fix and _would_fix(finding) else ""
    return f"{location(path, finding, cell)}: {finding.code}{marker} {finding.message}"


def iter_records(report: RunReport, *, include_edits: bool) -> Iterator[dict]:
    for outcome in report.files:
        items = [*(outcome.edits if include_edits else ()), *outcome.findings]
        for item in sorted(items, key=_sort_key):
            finding, cell, cell_id = _unpack(item)
            yield {
                "code": finding.code,
                "name": finding.name,
                "severity": str(finding.severity),
                "safety": str(finding.safety),
                "fixed": finding.fixed and report.mode is Mode.WRITE,
                "fixable": finding.fixed or finding.fixable,
                "path": outcome.path,
                "cell": cell,
                "cell_id": cell_id,
                "line": finding.line,
                "col": finding.col,
                "message": finding.message,
                "hint": finding.hint,
                "url": DOCS_URL.format(code=finding.code),
            }


def _sort_key(item: CellFinding | Finding) -> tuple[int, int, int, str]:
    finding, cell, _ = _unpack(item)
    return (cell if cell is not None else -2, finding.line, finding.col, finding.code)


def render_json(report: RunReport, *, include_edits: bool = True) -> str:
    errors = [{"path": e.split(": ", 1)[0], "reason": e.split(": ", 1)[-1]} for e in report.errors]
    for o in report.files:
        errors.extend({"path": o.path, "reason": e} for e in o.cell_errors)
    doc = {
        "version": SCHEMA_VERSION,
        "findings": list(iter_records(report, include_edits=include_edits)),
        "errors": errors,
        "summary": summary_counts(report),
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(report: RunReport, *, include_edits: bool = True) -> str:
    out = io.StringIO()
    fields = ["path", "cell", "line", "col", "code", "name", "severity", "safety", "fixable",
              "message", "hint"]  # fmt: skip
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for rec in iter_records(report, include_edits=include_edits):
        writer.writerow(rec)
    return out.getvalue()


def finding_lines(report: RunReport, *, include_edits: bool) -> list[str]:
    lines: list[str] = []
    for outcome in report.files:
        items = [*(outcome.edits if include_edits else ()), *outcome.findings]
        for item in sorted(items, key=_sort_key):
            lines.append(finding_line(outcome.path, item, show_fix=include_edits))
    return lines


def error_lines(report: RunReport) -> list[str]:
    lines = [f"error: {e}" for e in report.errors]
    for o in report.files:
        lines.extend(f"error: {o.path}: {e}" for e in o.cell_errors)
    return lines


def _would_fix(finding: Finding) -> bool:
    return finding.fixed or (finding.fixable and finding.safety == "safe")


def summary_counts(report: RunReport) -> dict:
    """Counts for the summary; in `check` mode "edits" are the fixes a rewrite would make."""
    edits: Counter[str] = Counter()
    left: Counter[str] = Counter()
    for o in report.files:
        for item in (*o.edits, *o.findings):
            finding = _unpack(item)[0]
            if finding.fixed or (report.mode is Mode.CHECK and _would_fix(finding)):
                edits[finding.code] += 1
            else:
                left[finding.code] += 1
    return {
        "files_scanned": len(report.files),
        "skipped_by_prefilter": report.count(Status.PREFILTERED) + report.count(Status.EMPTY),
        "rewritten": report.count(Status.REWRITTEN),
        "would_rewrite": report.count(Status.WOULD_REWRITE),
        "errors": len(report.errors),
        "edits_by_rule": dict(sorted(edits.items())),
        "findings_left": dict(sorted(left.items())),
    }


def summary_text(report: RunReport) -> list[str]:
    """The closing lines, ruff/black style, as plain text."""
    c = summary_counts(report)
    edits = sum(c["edits_by_rule"].values())
    left = sum(c["findings_left"].values())
    files = c["files_scanned"]
    lines = []
    if report.mode is Mode.CHECK:
        total = edits + left
        fixable = edits
        with_findings = sum(1 for o in report.files if o.edits or o.findings)
        if total:
            lines.append(
                f"Found {total} finding{'s' * (total != 1)} in {with_findings} "
                f"file{'s' * (with_findings != 1)} ({fixable} fixable with `gpu2tpu rewrite`, "
                f"{left} need{'s' * (left == 1)} a person)."
            )
        else:
            lines.append(f"All clear: no CUDA-specific code in {files} file{'s' * (files != 1)}.")
    else:
        verb = "rewritten" if report.mode is Mode.WRITE else "would be rewritten"
        n = c["rewritten"] if report.mode is Mode.WRITE else c["would_rewrite"]
        lines.append(
            f"{n} file{'s' * (n != 1)} {verb}, {files - n - c['errors']} left unchanged "
            f"({c['skipped_by_prefilter']} skipped without parsing); "
            f"{edits} edit{'s' * (edits != 1)}, {left} finding{'s' * (left != 1)} left for a person."
        )
    if c["edits_by_rule"]:
        by_rule = ", ".join(f"{k} x{v}" for k, v in c["edits_by_rule"].items())
        label = "Fixable by rule" if report.mode is Mode.CHECK else "Edits by rule"
        lines.append(f"{label}: {by_rule}")
    if c["errors"]:
        lines.append(
            f"{c['errors']} file{'s' * (c['errors'] != 1)} could not be processed (see errors above)."
        )
    return lines


def print_summary(report: RunReport, stream) -> None:  # type: ignore[no-untyped-def]
    """Print the summary with rich on a terminal, plain text elsewhere."""
    lines = summary_text(report)
    if stream.isatty():
        from rich.console import Console

        console = Console(file=stream, highlight=False)
        for i, line in enumerate(lines):
            console.print(line, style="bold" if i == 0 else None, markup=False)
    else:
        for line in lines:
            print(line, file=stream)


def exit_code(report: RunReport) -> int:
    """0 clean, 1 changes or findings, 2 files that could not be processed."""
    if report.errors or any(o.cell_errors for o in report.files):
        return 2
    if report.mode is Mode.CHECK:
        return int(any(o.edits or o.findings for o in report.files))
    if report.mode in (Mode.DRY, Mode.DIFF):
        return int(report.count(Status.WOULD_REWRITE) > 0)
    return int(any(o.findings for o in report.files))


def outcome_has_output(outcome: FileOutcome) -> bool:
    return bool(outcome.edits or outcome.findings or outcome.error)
