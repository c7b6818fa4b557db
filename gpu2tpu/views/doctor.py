"""The doctor's report as text, rich text, HTML and a notebook widget.

`DoctorReport.__str__`, `__rich__`, `_repr_html_` and `widget()` come here; the report
itself only holds what was found.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from .html import STYLE

if TYPE_CHECKING:
    import ipywidgets
    from rich.console import RenderableType

    from gpu2tpu.readiness.doctor import DoctorReport

# Sentences and commands wrap inside their cells (the shared table style keeps cells on one
# line); a wrapped command still copies as one line.
WRAP_STYLE = (
    "<style>.g2t-table td.g2t-wrap{white-space:normal;max-width:38em;vertical-align:top}"
    ".g2t-table td.g2t-wrap code{white-space:pre-wrap;word-break:break-word}</style>"
)


def versions_line(report: DoctorReport) -> str:
    """One line of the reported packages' versions, for every rendering."""
    shown = [f"{name} {v}" for name, v in report.versions.items() if v]
    return "Versions: " + (", ".join(shown) or "none of the packages gpu2tpu reports")


def doctor_text(report: DoctorReport) -> str:
    """The report for a terminal without rich, or a log."""
    out = [f"gpu2tpu doctor: {report.environment.label}, Python {report.python}", report.headline]
    for i, problem in enumerate(report.problems, 1):
        out.append(f"  {i}. {problem.message}")
        out.append(f"     fix: {problem.fix}")
    if report.usable:
        out.append("Usable here:")
        out += [f"  - {line}" for line in report.usable]
    if report.missing:
        out.append("Not installed:")
        out += [f"  - {m.line}" for m in report.missing]
    if report.missing_optional:
        out.append(f"Not installed (optional): {', '.join(report.missing_optional)}")
    if report.probe_note:
        out.append(report.probe_note)
    if report.notes:
        out.append("Notes:")
        for note in report.notes:
            out.append(f"  - {note.message}")
            if note.fix:
                out.append(f"    where it matters: {note.fix}")
    out.append(versions_line(report))
    return "\n".join(out)


def doctor_rich(report: DoctorReport) -> RenderableType:
    """The same report as rich text: the fixes bold, each on one unbroken line."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [
        Text.assemble(
            ("gpu2tpu doctor: ", "bold"), f"{report.environment.label}, Python {report.python}"
        )
    ]
    parts.append(Text(report.headline, style="bold green" if report.ok else "bold red"))
    for i, problem in enumerate(report.problems, 1):
        parts.append(Text(f"{i:>3}. {problem.message}"))
        # One unbroken line, so the command can be copied as it is.
        fix = Text.assemble("     fix: ", (problem.fix, "bold cyan"))
        fix.no_wrap, fix.overflow = True, "ignore"
        parts.append(fix)
    if report.usable:
        parts.append(Text("Usable here:", style="bold"))
        parts += [Text(f"  • {line}") for line in report.usable]
    if report.missing:
        parts.append(Text("Not installed:", style="bold"))
        for m in report.missing:
            parts.append(
                Text.assemble(
                    f"  • {', '.join(m.packages)}, needed by {m.needed_for}: ",
                    (m.install, "bold cyan"),
                )
            )
    if report.missing_optional:
        parts.append(Text(f"Not installed (optional): {', '.join(report.missing_optional)}"))
    if report.probe_note:
        parts.append(Text(report.probe_note, style="yellow"))
    for note in report.notes:
        where = f" (where it matters: {note.fix})" if note.fix else ""
        parts.append(Text(f"note: {note.message}{where}", style="dim"))
    parts.append(Text(versions_line(report), style="dim"))
    return Group(*parts)


def _html_body(report: DoctorReport) -> str:
    e = html.escape
    colour = "#1b7f3b" if report.ok else "#a33"
    out = [
        f"<h3>gpu2tpu doctor: {e(report.environment.label)}, Python {e(report.python)}</h3>",
        f"<p style='color:{colour};font-weight:600'>{e(report.headline)}</p>",
    ]
    if report.problems:
        rows = "".join(
            f"<tr><td>{i}</td><td class='g2t-left g2t-wrap'>{e(p.message)}</td>"
            f"<td class='g2t-left g2t-wrap'><code>{e(p.fix)}</code></td></tr>"
            for i, p in enumerate(report.problems, 1)
        )
        out.append(
            "<table class='g2t-table g2t-doctor-problems'><thead><tr><th>#</th>"
            "<th class='g2t-left'>problem</th><th class='g2t-left'>fix</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    if report.usable:
        items = "".join(f"<li>{e(line)}</li>" for line in report.usable)
        out.append(f"<p><b>Usable here</b></p><ul class='g2t-doctor-usable'>{items}</ul>")
    if report.missing:
        items = "".join(
            f"<li>{e(', '.join(m.packages))}, needed by {e(m.needed_for)}: "
            f"<code>{e(m.install)}</code></li>"
            for m in report.missing
        )
        out.append(f"<p><b>Not installed</b></p><ul class='g2t-doctor-missing'>{items}</ul>")
    if report.missing_optional:
        out.append(
            f"<p class='g2t-note'>Not installed (optional): "
            f"{e(', '.join(report.missing_optional))}</p>"
        )
    if report.probe_note:
        out.append(f"<div class='g2t-warn'>{e(report.probe_note)}</div>")
    for note in report.notes:
        fix = f" Where it matters: <code>{e(note.fix)}</code>" if note.fix else ""
        out.append(f"<p class='g2t-note'>Note: {e(note.message)}{fix}</p>")
    out.append(f"<p class='g2t-small'>{e(versions_line(report))}</p>")
    return "".join(out)


def doctor_html(report: DoctorReport) -> str:
    """The report as HTML with the shared style, for notebooks and saved pages."""
    return f"{STYLE}{WRAP_STYLE}<div class='g2t-view g2t-doctor'>{_html_body(report)}</div>"


def doctor_widget(report: DoctorReport) -> ipywidgets.VBox:
    """Core ipywidgets only (a VBox of HTML), so it renders in Colab without set-up."""
    import ipywidgets as w

    view = w.VBox([w.HTML(doctor_html(report))])
    view.add_class("g2t-view")
    return view
