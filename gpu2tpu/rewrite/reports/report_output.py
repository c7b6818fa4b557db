"""The whole output of `gpu2tpu check --format FMT`, and writing a report file safely.

`--output-file PATH` and `rewrite --report PATH` write the report with `write_report`: a
temporary file beside PATH, renamed over it, so a reader (a CI step, an editor) never sees
half a report and a failed run never leaves one behind. A PATH that is no regular file is
never renamed over: a FIFO or a character device (`/dev/null`, a terminal) is written into
as a stream, a socket or a block device refused (files/streams.py); a symbolic link is
written through, as a source file is.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..files.engine import Mode, RunReport
from ..files.streams import special_kind, write_stream
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
    """Write a report in one step: a reader never sees half of it (temporary file, rename).
    Into a FIFO or a device, as a stream (`write_stream`)."""
    kind = special_kind(str(path))
    if kind is not None:
        write_stream(str(path), text.encode("utf-8"), kind)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # the link stays; its target is the report
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
