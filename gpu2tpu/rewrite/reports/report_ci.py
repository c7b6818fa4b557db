"""The CI renderings of a run: GitHub workflow annotations and SARIF 2.1.0.

`--format github` prints one workflow command per finding, as ruff's `--output-format github`
does: `::error title=gpu2tpu (G2T101),file=train.py,line=3,col=9::train.py:3:9: G2T101 ...`.
A finding that stops the code on a TPU is an `error`, one that may behave differently a
`warning`, a TPU performance hint a `notice`.

`--format sarif` writes one SARIF 2.1.0 log (the format GitHub code scanning uploads): one
rule entry per code found, with its explanation and the URL of its section in docs/rules.md;
one result per finding, with the fix's safety, whether it is fixable and the category as
properties.

Notebook findings are placed on the line of the `.ipynb` file that holds the cell's source
line (a JSON string), so that an annotation lands beside the code in a diff; the message and
the properties name the cell and the line within it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ... import __version__
from ..core.model import Finding
from ..files.engine import RunReport
from .report import (
    Category,
    RunInfo,
    category,
    error_records,
    finding_line,
    is_fix_item,
    item_category,
    iter_items,
    rule_url,
    summary_counts,
    unpack,
)

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/gpu2tpu/gpu2tpu"

# (path, cell index, line in the cell) -> line in the file, or None when unknown
CellLocator = Callable[[str, int, int], int | None]

_LEVELS = {
    Category.BLOCKS_TPU: ("error", "error"),
    Category.FIX_WITHHELD: ("error", "error"),
    Category.NEEDS_NEWER_TORCH: ("warning", "warning"),
    Category.DIFFERS_ON_TPU: ("warning", "warning"),
    Category.TPU_PERFORMANCE: ("notice", "note"),
    Category.RUNTIME_SETTINGS: ("notice", "note"),
}


def github_level(kind: Category) -> str:
    return _LEVELS[kind][0]


def sarif_level(kind: Category) -> str:
    return _LEVELS[kind][1]


# -- notebook cells in the file's JSON ---------------------------------------------------------


def notebook_locator(read: Callable[[str], str] | None = None) -> CellLocator:
    """A `CellLocator` that reads each notebook once and finds its cells' source lines.

    `read` returns a file's text (default: read it from disk as UTF-8); a notebook that
    cannot be read or parsed gives None for every line.
    """
    from ..notebooks.notebook_json import value_spans

    cache: dict[str, dict[tuple[object, ...], tuple[int, int]] | None] = {}
    texts: dict[str, str] = {}

    def reader(path: str) -> str:
        return Path(path).read_text(encoding="utf-8")

    read = read or reader

    def locate(path: str, cell: int, line: int) -> int | None:
        if path not in cache:
            try:
                texts[path] = read(path)
                cache[path] = value_spans(
                    texts[path], [("cells", "*", "source", "*"), ("cells", "*", "source")]
                )
            except (OSError, ValueError, IndexError, KeyError):
                cache[path] = None
        spans = cache[path]
        if spans is None or cell < 0:
            return None
        text = texts[path]
        span = spans.get(("cells", cell, "source", line - 1))
        if span is None:  # the source is one string, or the line is past its end
            span = spans.get(("cells", cell, "source"))
        if span is None:
            return None
        return text.count("\n", 0, span[0]) + 1

    return locate


def _file_position(
    path: str, item_cell: int | None, finding: Finding, locate: CellLocator | None
) -> tuple[int, int | None]:
    """Line and column in the file itself (a notebook cell's line becomes a JSON line)."""
    if item_cell is None or item_cell < 0:  # a .py file, or notebook metadata (JSON lines)
        return finding.line, finding.col
    line = locate(path, item_cell, finding.line) if locate else None
    return (line or 1), None


# -- GitHub workflow commands ------------------------------------------------------------------


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(
    report: RunReport, *, include_edits: bool = True, locate: CellLocator | None = None
) -> str:
    """One `::error`/`::warning`/`::notice` workflow command per finding (and per error)."""
    out: list[str] = []
    for outcome, item in iter_items(report, include_edits=include_edits):
        finding, cell, _ = unpack(item)
        line, col = _file_position(outcome.path, cell, finding, locate)
        props = [
            f"title={_escape_property(f'gpu2tpu ({finding.code})')}",
            f"file={_escape_property(outcome.path)}",
            f"line={line}",
        ]
        if col is not None:
            props.append(f"col={col}")
        text = finding_line(outcome.path, item)
        if finding.hint:
            text += f"\n  hint: {finding.hint}"
        level = github_level(item_category(outcome, item))
        out.append(f"::{level} {','.join(props)}::{_escape_data(text)}")
    for err in error_records(report):
        where = f"title={_escape_property('gpu2tpu')},file={_escape_property(err['path'])}"
        out.append(f"::error {where}::{_escape_data(err['path'] + ': ' + err['reason'])}")
    return "".join(line + "\n" for line in out)


# -- SARIF 2.1.0 -------------------------------------------------------------------------------


def _artifact(path: str) -> dict[str, Any]:
    """A relative path is relative to the working folder (`%SRCROOT%`); an absolute one is a
    `file:` URI."""
    p = Path(path)
    if p.is_absolute():
        return {"uri": _file_uri(p)}
    return {"uri": _quoted(p), "uriBaseId": "%SRCROOT%"}


def _quoted(path: Path) -> str:
    """A path in a URI: its own bytes percent-encoded (RFC 3986), so that a file name that is
    not UTF-8 (a lone surrogate in Python) still names the file, instead of failing."""
    return quote(os.fsencode(path.as_posix()))


def _file_uri(path: Path) -> str:
    return "file://" + _quoted(path)


def _rule_entry(code: str, docs: dict[str, object], example: Finding) -> dict[str, Any]:
    doc = docs.get(code)
    explanation = ""
    short = example.message
    min_torch = "2.6"
    if doc is not None:
        import inspect

        explanation = inspect.cleandoc(getattr(doc, "__doc__", None) or "")
        short = explanation.splitlines()[0] if explanation else short
        min_torch = getattr(doc, "min_torch", min_torch)
    help_text = explanation or example.message
    if example.hint:
        help_text += f"\n\nWhat to do: {example.hint}"
    return {
        "id": code,
        "name": example.name,
        "shortDescription": {"text": short},
        "fullDescription": {"text": explanation or example.message},
        "help": {
            "text": help_text,
            "markdown": f"{help_text}\n\n[{code} in docs/rules.md]({rule_url(code)})",
        },
        "helpUri": rule_url(code),
        "defaultConfiguration": {"level": sarif_level(category(example))},
        "properties": {
            "safety": str(example.safety),
            "severity": str(example.severity),
            "category": str(category(example)),
            "min_torch": str(min_torch),
            "tags": ["gpu2tpu", "tpu-migration", str(category(example))],
        },
    }


def render_sarif(
    report: RunReport,
    *,
    include_edits: bool = True,
    locate: CellLocator | None = None,
    root: Path | None = None,
    info: RunInfo | None = None,
) -> str:
    """One SARIF 2.1.0 log with one run; `root` is the folder relative paths start from."""
    from ..rules.base import all_rules

    docs: dict[str, object] = {d.code: d for d in all_rules()}
    rules: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    for outcome, item in iter_items(report, include_edits=include_edits):
        finding, cell, cell_id = unpack(item)
        if finding.code not in index:
            index[finding.code] = len(rules)
            rules.append(_rule_entry(finding.code, docs, finding))
        line, col = _file_position(outcome.path, cell, finding, locate)
        region: dict[str, int] = {"startLine": max(1, line)}
        if col is not None:
            region["startColumn"] = max(1, col)
        message = finding.message
        kind = item_category(outcome, item)
        properties: dict[str, object] = {
            "category": str(kind),
            "safety": str(finding.safety),
            "fixable": finding.fixed or finding.fixable,
            "fixed": finding.fixed and kind is not Category.FIX_WITHHELD,
            "wouldFix": is_fix_item(report, outcome, item),
        }
        if finding.needs_torch:
            properties["needsTorch"] = finding.needs_torch
        if cell is not None and cell >= 0:
            message = f"cell {cell}, line {finding.line}, col {finding.col}: {message}"
            properties.update(cell=cell, cellLine=finding.line, cellColumn=finding.col)
            if cell_id:
                properties["cellId"] = cell_id
        elif cell is not None:
            message = f"notebook metadata: {message}"
        if finding.hint:
            message += f" (hint: {finding.hint})"
        results.append(
            {
                "ruleId": finding.code,
                "ruleIndex": index[finding.code],
                "level": sarif_level(kind),
                "message": {"text": message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": _artifact(outcome.path),
                            "region": region,
                        }
                    }
                ],
                "properties": properties,
            }
        )
    notifications = [
        {
            "level": "error",
            "message": {"text": f"{err['path']}: {err['reason']}"},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(err["path"])}}],
        }
        for err in error_records(report)
    ]
    base = (root or Path.cwd()).resolve()
    run = {
        "tool": {
            "driver": {
                "name": "gpu2tpu",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFORMATION_URI,
                "rules": rules,
            }
        },
        "originalUriBaseIds": {"%SRCROOT%": {"uri": _file_uri(base) + "/"}},
        "invocations": [
            {
                "executionSuccessful": not notifications,
                "toolExecutionNotifications": notifications,
            }
        ],
        "columnKind": "unicodeCodePoints",
        "results": results,
        "properties": {"summary": summary_counts(report, info)},
    }
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
