"""The whole output of `gpu2tpu check --format FMT`, and writing a report file safely.

`--output-file PATH` and `rewrite --report PATH` write the report with `write_report`: a
temporary file beside PATH, renamed over it, so a reader (a CI step, an editor) never sees
half a report and a failed run never leaves one behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..files.engine import Mode, RunReport
from .report import RunInfo, finding_lines, render_csv, render_json, summary_text


def render_report(report: RunReport, fmt: str, info: RunInfo, *, quiet: bool = False) -> str:
    """The whole output of `check --format FMT` as one text (what `--output-file` holds)."""
    if fmt == "json":
        return render_json(report, info=info)
    if fmt == "csv":
        return render_csv(report)
    if fmt in ("github", "sarif"):
        from .report_ci import notebook_locator, render_github, render_sarif

        locate = notebook_locator()
        if fmt == "github":
            return render_github(report, locate=locate)
        return render_sarif(report, locate=locate, info=info)
    if fmt == "markdown":
        from .report_markdown import render_markdown, source_lines

        lines = source_lines() if report.mode is not Mode.WRITE else None
        return render_markdown(report, info=info, lines=lines)
    body = [] if quiet else finding_lines(report, include_edits=report.mode is Mode.CHECK)
    return "".join(line + "\n" for line in [*body, *summary_text(report, info)])


def write_report(path: Path, text: str) -> None:
    """Write a report in one step: a reader never sees half of it (temporary file, rename)."""
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
