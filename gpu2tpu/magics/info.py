"""`%tpu_info`: which backends run here, which do not and how to install them, the chips,
their memory and the versions that matter, as a widget in a notebook and text elsewhere.

The widget is core ipywidgets (a VBox of HTML), so it renders in Colab without a custom
widget manager; `TPUInfo` also has `_repr_html_`, text and `to_dict()` for other front ends.
"""

from __future__ import annotations

import html
import platform
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..backends import BackendReport, MemoryInfo

if TYPE_CHECKING:
    import ipywidgets


@dataclass
class TPUInfo:
    """What `%tpu_info` shows: each backend as `ask_backends` found it, `auto`'s choice and
    the versions of the packages that matter (`readiness.versions.REPORTED`)."""

    backends: list[BackendReport]
    auto: str
    versions: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "auto": self.auto,
            "backends": [b.to_dict() for b in self.backends],
            "versions": dict(self.versions),
        }

    def __str__(self) -> str:
        out = [self.auto, "", "Backends:"]
        for b in self.backends:
            s = b.status
            if s.available:
                version = f" ({s.version_label})" if s.version_label else ""
                out.append(f"  [found]   {s.name:<5} {s.title}{version}")
                if b.chip:
                    out.append(
                        f"            chip: {b.chip.name} (kind {b.chip.kind}) x{b.chip.count}"
                    )
                if b.memory:
                    out.append(f"            memory: {_memory_text(b.memory)}")
            else:
                out.append(f"  [missing] {s.name:<5} {s.title}: {s.reason}")
                out.append(f"            install: {s.install}")
        out += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items() if v)]
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _backend_rows(self) -> str:
        esc = html.escape
        rows = []
        for b in self.backends:
            s = b.status
            state = "found" if s.available else "missing"
            colour = "#1b7f3b" if s.available else "#a33"
            if s.available:
                detail = esc(s.version_label or s.version or "")
                if b.chip:
                    detail += f"<br>{esc(b.chip.name)} (kind <code>{esc(b.chip.kind)}</code>) ×{b.chip.count}"
                if b.memory:
                    detail += f"<br>{esc(_memory_text(b.memory))}"
            else:
                detail = f"{esc(s.reason)}<br>install: <code>{esc(s.install)}</code>"
            rows.append(
                f"<tr><td><b>{esc(s.name)}</b></td><td>{esc(s.title)}</td>"
                f"<td style='color:{colour}'>{state}</td><td>{detail}</td></tr>"
            )
        return "".join(rows)

    def _body_html(self) -> str:
        """The backends table and the versions, without the line on `auto`'s choice."""
        versions = ", ".join(
            f"{html.escape(k)} {html.escape(v)}" for k, v in self.versions.items() if v
        )
        return (
            "<div style='overflow-x:auto;max-width:100%'><table><thead><tr><th>backend</th>"
            "<th></th><th>state</th><th>details</th>"
            f"</tr></thead><tbody>{self._backend_rows()}</tbody></table></div>"
            f"<p><small>{versions}</small></p>"
        )

    def _repr_html_(self) -> str:
        return f"<div class='gpu2tpu-info'><p>{html.escape(self.auto)}</p>{self._body_html()}</div>"

    def widget(self) -> ipywidgets.VBox:
        """Core ipywidgets only: a heading with `auto`'s choice (said once), then the tables."""
        import ipywidgets as w

        return w.VBox(
            [
                w.HTML(f"<b>gpu2tpu</b>: {html.escape(self.auto)}"),
                w.HTML(f"<div class='gpu2tpu-info'>{self._body_html()}</div>"),
            ]
        )


def _memory_text(mem: MemoryInfo) -> str:
    def gib(n: int | None) -> str:
        return "?" if n is None else f"{n / 2**30:.2f} GiB"

    return (
        f"in use {gib(mem.in_use_bytes)}, peak {gib(mem.peak_bytes)}, total {gib(mem.total_bytes)}"
    )


def collect_info() -> TPUInfo:
    """Ask every backend whether it runs here; ask those that do for their chip and memory."""
    from ..backends import ask_backends, choose_backend
    from ..readiness.versions import REPORTED, read_installed, reported_versions

    def describe(name: str) -> bool:
        # Starting JAX just to describe it would leave its threads in this process (a forked
        # forecast child then deadlocks); it is described once something has started it.
        return name != "jax" or "jax" in sys.modules

    # A backend that raises while being asked comes back unavailable, with what it said.
    reports = ask_backends(describe)
    backend, reason = choose_backend("auto")
    if backend.name == "cpu":  # what auto's choice means for a cell, not a run here
        reason += " (a plain %%tpu cell runs there as a dry run)"
    versions = {"python": platform.python_version(), **reported_versions(read_installed(REPORTED))}
    return TPUInfo(backends=reports, auto=reason, versions=versions)


def show_info(shell: Any) -> TPUInfo:
    """Display the widget in a notebook kernel (with an HTML table and text beside it, for
    front ends without a widget manager and for saved notebooks), print text in a terminal."""
    from ..views.display import show

    info = collect_info()
    show(info, shell)
    return info


def show_doctor(shell: Any) -> Any:
    """`%tpu_doctor`: the environment report, displayed like `%tpu_info`."""
    from ..readiness.doctor import diagnose
    from ..views.display import show

    report = diagnose()
    show(report, shell)
    return report
