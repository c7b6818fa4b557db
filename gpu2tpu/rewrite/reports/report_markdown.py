"""The migration report: Markdown a person pastes into a pull request or an issue.

`gpu2tpu check --format markdown` and `gpu2tpu rewrite --report report.md` write it. It
opens with a summary table (files, fixes, and the findings left for a person by category),
then one table per category with links to each rule's documentation, then the notebooks
cell by cell. Long tables fold into `<details>` so the summary stays on the first screen;
GitHub renders all of it (tables, `<details>`, links).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ... import __version__
from ..core.model import CellFinding, Finding
from ..files.engine import FileOutcome, Mode, RunReport
from .report import (
    CATEGORY_LABELS,
    CATEGORY_TITLES,
    Category,
    RunInfo,
    error_records,
    is_fix_item,
    item_category,
    iter_items,
    rule_url,
    summary_counts,
    torch_notes,
    unpack,
)

# (path, cell index or None, 1-based line) -> that line of the file as it was checked
SourceLines = Callable[[str, int | None, int], str | None]

FOLD_AFTER = 25  # rows; longer tables start folded

_COMMAND = {
    Mode.CHECK: "gpu2tpu check",
    Mode.WRITE: "gpu2tpu rewrite",
    Mode.DIFF: "gpu2tpu rewrite --diff",
    Mode.DRY: "gpu2tpu rewrite --check",
}


def source_lines() -> SourceLines:
    """Read each file once; lines of a notebook come from its code cell's source."""
    cache: dict[str, list[str] | list[list[str]] | None] = {}

    def load(path: str) -> list[str] | list[list[str]] | None:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            if not path.endswith(".ipynb"):
                return text.splitlines()
            cells = json.loads(text).get("cells", [])
            return [_cell_source(c).splitlines() for c in cells]
        except (OSError, ValueError, AttributeError):
            return None

    def get(path: str, cell: int | None, line: int) -> str | None:
        if path not in cache:
            cache[path] = load(path)
        lines = cache[path]
        if lines is None or (cell is not None and cell < 0):
            return None
        try:
            if cell is None:
                return lines[line - 1]  # type: ignore[return-value]  # a .py file's lines are strings
            return lines[cell][line - 1]
        except (IndexError, TypeError):
            return None

    return get


def _cell_source(cell: object) -> str:
    source = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(source) if isinstance(source, list) else str(source)


# -- Markdown pieces ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, HTML brackets neutral."""
    return (
        text.replace("\r", " ")
        .replace("\n", " ")
        .replace("|", "\\|")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
    )


def _code(text: str) -> str:
    """An inline code span that survives backticks and pipes inside a table."""
    text = text.strip().replace("|", "\\|")
    if len(text) > 100:
        text = text[:97] + "..."
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}" if text else ""


def _rule_link(finding: Finding) -> str:
    return f"[{finding.code}]({rule_url(finding.code)})"


def _where(path: str, cell: int | None, finding: Finding) -> str:
    if cell is None:
        return _code(f"{path}:{finding.line}:{finding.col}")
    if cell < 0:
        return f"{_code(path)} metadata"
    return f"{_code(path)} cell {cell}, line {finding.line}"


def _table(
    header: list[str], rows: list[list[str]], summary: str, *, fold: bool = False
) -> list[str]:
    """A table; with `fold`, or over `FOLD_AFTER` rows, it folds into `<details>` titled
    `summary`."""
    if not rows:
        return []
    align = [
        "---:" if h in ("fixes", "findings", "line", "cell", "count") else "---" for h in header
    ]
    body = [
        f"| {' | '.join(header)} |",
        f"|{'|'.join(align)}|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]
    if len(rows) <= FOLD_AFTER and not fold:
        return [*body, ""]
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""]


# -- the report --------------------------------------------------------------------------------


def render_markdown(
    report: RunReport,
    *,
    info: RunInfo | None = None,
    lines: SourceLines | None = None,
    title: str = "gpu2tpu migration report",
) -> str:
    """The whole report as Markdown text (GitHub-flavoured: tables, `<details>`)."""
    info = info or RunInfo()
    counts = summary_counts(report, info)
    items = list(iter_items(report, include_edits=True))
    fixes = [(o, i) for o, i in items if is_fix_item(report, o, i)]
    left = [(o, i) for o, i in items if not is_fix_item(report, o, i)]
    by_cat: dict[Category, list[tuple[FileOutcome, CellFinding | Finding]]] = {
        c: [] for c in Category
    }
    for o, i in left:
        by_cat[item_category(o, i)].append((o, i))
    changed = (
        counts["rewritten"]
        if report.mode is Mode.WRITE
        else counts["would_rewrite"]
        if report.mode in (Mode.DIFF, Mode.DRY)
        else len({o.path for o, _ in fixes})
    )
    verb = "rewritten" if report.mode is Mode.WRITE else "the rewrite would change"
    fix_label = "Fixes made" if report.mode is Mode.WRITE else "Fixes `gpu2tpu rewrite` makes"
    with_code = sum(1 for o in report.files if o.edits or o.findings)
    target = info.target_torch or "any (not set)"
    if info.target_torch and info.target_source:
        target += f", from {info.target_source}"

    out = [f"# {title}", ""]
    out.append(
        f"`{_COMMAND[report.mode]}` with gpu2tpu {__version__} on {counts['files_scanned']} "
        f"file{'s' * (counts['files_scanned'] != 1)} ({counts['skipped_by_prefilter']} skipped "
        f"without parsing: no CUDA-specific token). Target torch: {target}."
    )
    out.append("")
    rows = [
        ["Files with CUDA-specific code or TPU hazards", str(with_code)],
        [f"Files {verb}", str(changed)],
        [fix_label, str(len(fixes))],
    ]
    rows += [[CATEGORY_TITLES[c], str(len(by_cat[c]))] for c in Category if by_cat[c]]
    errors = error_records(report)
    if errors:
        rows.append(["Files or cells that could not be processed", str(len(errors))])
    out += ["| Summary | count |", "|---|---:|", *(f"| {a} | {b} |" for a, b in rows), ""]
    if not items and not errors:
        out += ["Nothing to do: no CUDA-specific code was found.", ""]

    if fixes:
        heading = (
            "Fixed by `gpu2tpu rewrite`"
            if report.mode is Mode.WRITE
            else "Fixable with `gpu2tpu rewrite`"
        )
        out += [f"## {heading} ({len(fixes)})", ""]
        per_rule: Counter[str] = Counter()
        example: dict[str, Finding] = {}
        for _, item in fixes:
            f = unpack(item)[0]
            per_rule[f.code] += 1
            example.setdefault(f.code, f)
        out += _table(
            ["rule", "fixes", "what"],
            [
                [
                    f"{_rule_link(example[c])} {_code(example[c].name)}",
                    str(n),
                    _cell(example[c].message),
                ]
                for c, n in sorted(per_rule.items())
            ],
            f"{len(per_rule)} rules",
        )
        out += _table(
            ["where", "rule", "code"],
            [_fix_row(o.path, i, lines) for o, i in fixes],
            f"Each fix, by place ({len(fixes)})",
            fold=True,
        )

    for cat in Category:
        group = by_cat[cat]
        if not group:
            continue
        out += [f"## {CATEGORY_TITLES[cat]} ({len(group)})", ""]
        if cat is Category.NEEDS_NEWER_TORCH:
            out += _torch_paragraph(report, info)
        header = ["where", "rule", "what, and what to do"]
        if lines is not None:
            header.insert(2, "code")
        out += _table(
            header,
            [_finding_row(o.path, i, lines) for o, i in group],
            f"{len(group)} findings",
        )

    notebooks = [o for o in report.files if o.is_notebook and (o.edits or o.findings)]
    if notebooks:
        out += ["## Notebooks, cell by cell", ""]
        for o in notebooks:
            out += _notebook_section(report, o, lines)

    if errors:
        out += ["## Could not be processed", ""]
        out += [f"- {_code(e['path'])}: {_cell(e['reason'])}" for e in errors]
        out.append("")
    out += [
        "---",
        "",
        "Categories: *stops the code running on a TPU* fails on a TPU (or on any machine "
        "without CUDA); *may behave differently* runs but can give other results or do "
        "nothing there; *TPU performance hints* run correctly but slowly. Each rule code links "
        "to its explanation in docs/rules.md.",
        "",
    ]
    return "\n".join(out)


def _fix_row(path: str, item: CellFinding | Finding, lines: SourceLines | None) -> list[str]:
    finding, cell, _ = unpack(item)
    code = (lines(path, cell, finding.line) if lines else None) or finding.before
    return [_where(path, cell, finding), _rule_link(finding), _code(code or "")]


def _finding_row(path: str, item: CellFinding | Finding, lines: SourceLines | None) -> list[str]:
    finding, cell, _ = unpack(item)
    what = _cell(finding.message)
    if finding.hint:
        what += f"<br>*To do:* {_cell(finding.hint)}"
    row = [_where(path, cell, finding), _rule_link(finding), what]
    if lines is not None:
        row.insert(2, _code(lines(path, cell, finding.line) or ""))
    return row


def _torch_paragraph(report: RunReport, info: RunInfo) -> list[str]:
    notes = torch_notes(report)
    source = f" ({info.target_source})" if info.target_source else ""
    text = [
        f"target-torch is {info.target_torch}{source}: these fixes use APIs of a newer torch, so "
        "they were not applied. Raise target-torch (`--target-torch` or `[tool.gpu2tpu] "
        "target-torch`) once the project requires that torch.",
        "",
    ]
    text += [f"- {_code(path)}: {note}" for path, note in sorted(notes.items())]
    return [*text, ""]


def _notebook_section(
    report: RunReport, outcome: FileOutcome, lines: SourceLines | None
) -> list[str]:
    """One notebook, cell by cell: each cell's flagged lines (when the file as checked can be
    read) and what was found on them."""
    path = outcome.path
    out = [f"### {_code(path)}", ""]
    cells: dict[int, list[CellFinding | Finding]] = {}
    for item in [*outcome.edits, *outcome.findings]:
        _, cell, _ = unpack(item)
        cells.setdefault(cell if cell is not None else -1, []).append(item)
    for cell in sorted(cells):
        group = sorted(cells[cell], key=lambda i: (unpack(i)[0].line, unpack(i)[0].col))
        cell_id = unpack(group[0])[2]
        if cell < 0:
            out.append("**Notebook metadata**")
        else:
            ident = f" (id {_code(cell_id)})" if cell_id else ""
            out.append(f"**Cell {cell}**{ident}")
        out.append("")
        if cell >= 0 and lines is not None:
            out += _excerpt(path, cell, sorted({unpack(i)[0].line for i in group}), lines)
        for item in group:
            finding = unpack(item)[0]
            kind = (
                _fix_label(report)
                if is_fix_item(report, outcome, item)
                else CATEGORY_LABELS[item_category(outcome, item)]
            )
            where = f"line {finding.line}: " if cell >= 0 else ""
            out.append(f"- {where}{_rule_link(finding)} *{kind}*: {_cell(finding.message)}")
        out.append("")
    return out


def _fix_label(report: RunReport) -> str:
    return "fixed" if report.mode is Mode.WRITE else "fixable"


def _excerpt(path: str, cell: int, flagged: list[int], lines: SourceLines) -> list[str]:
    """The flagged lines of a cell with one line of context each, `...` between the parts."""
    wanted = sorted({n for line in flagged for n in (line - 1, line, line + 1) if n >= 1})
    body: list[str] = []
    last = 0
    for n in wanted:
        text = lines(path, cell, n)
        if text is None:
            continue
        if last and n > last + 1:
            body.append("...")
        body.append(f"{n:>3}  {text}")
        last = n
    if not body:
        return []
    fence = "````" if any("```" in b for b in body) else "```"
    return [f"{fence}text", *body, fence, ""]
