"""A live status line per forecast target, where the user is looking.

A forecast compiles for minutes; silence for that long reads as a hang. The heading says
about how long is left once a target has finished (the mean time of the finished ones for
each target still to go); each target shows what it is doing and for how long ("… v5e  compiling at batch 8 [0:42]", "… v5e  batch
search 2/8: compiling at batch 24 [1:10]"), then its verdict. Three renderings, picked by where the forecast runs:

- a notebook kernel: one display (text/plain and text/html) updated in place through an
  IPython display handle, on stdout, so it is saved with the notebook and never pink;
- a terminal: rich's live display on stdout;
- anything else (a log file, a pipe): one plain line per finished target on stdout.

The state (`TargetLine`) is plain data; the forecast feeds it events (from its child process
or from this one) and the renderer draws it. `tick()` refreshes the clocks while a compile
gives no events.
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Notebook updates go through the kernel's message bus: at most this often for a clock.
_NOTEBOOK_TICK_S = 1.0


@dataclass
class TargetLine:
    """One target's line: what it is doing, since when, and how it ended."""

    label: str
    text: str = "waiting"
    state: str = "waiting"  # waiting, running, done, failed, interrupted
    started: float | None = None
    ended: float | None = None

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or now) - self.started

    def render(self, now: float, width: int = 0) -> str:
        mark = {"done": "✓", "failed": "✗", "interrupted": "■", "running": "…"}.get(self.state, "·")
        clock = "" if self.started is None else f" [{format_clock(self.elapsed(now))}]"
        return f"{mark} {self.label.ljust(width)}  {self.text}{clock}"


def format_clock(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ForecastProgress:
    """Per-target status for one forecast; `mode` "notebook", "terminal", "lines" or "off"."""

    def __init__(self, labels: Sequence[str], mode: str | None = None, title: str = "") -> None:
        self.lines = {label: TargetLine(label) for label in labels}
        self.mode = mode or detect_mode()
        self.title = title
        self._handle: Any = None
        self._live: Any = None
        self._last_draw = 0.0

    # events ------------------------------------------------------------------------------

    def status(self, label: str, text: str) -> None:
        line = self._line(label)
        if line.started is None:
            line.started = time.monotonic()
        line.state, line.text = "running", text
        self._draw()

    def finished(self, label: str, text: str, ok: bool = True) -> None:
        line = self._line(label)
        now = time.monotonic()
        line.started = line.started or now
        line.ended = now
        line.state, line.text = ("done" if ok else "failed"), text
        if self.mode == "lines":
            print(f"forecast {label}: {text} [{format_clock(line.elapsed(now))}]", flush=True)
        self._draw(force=True)

    def interrupted(self, message: str) -> None:
        """Mark unfinished targets as stopped and print `message` (one line)."""
        now = time.monotonic()
        for line in self.lines.values():
            if line.state in ("waiting", "running"):
                line.text = "stopped" if line.state == "running" else "not started"
                line.state = "interrupted"
                line.ended = now if line.started is not None else None
        self._draw(force=True)
        self._stop()
        print(message, flush=True)

    def tick(self) -> None:
        """Refresh the clocks (the notebook at most once a second; rich redraws itself)."""
        if self.mode == "notebook":
            self._draw()

    # rendering ---------------------------------------------------------------------------

    def eta(self, now: float) -> float | None:
        """Seconds left, from the mean time of the targets done so far (None before one is)."""
        done = [
            line.elapsed(now) for line in self.lines.values() if line.state in ("done", "failed")
        ]
        left = [line for line in self.lines.values() if line.state in ("waiting", "running")]
        if not done or not left:
            return None
        mean = sum(done) / len(done)
        return sum(max(0.0, mean - line.elapsed(now)) for line in left)

    def heading(self, now: float) -> str:
        """The title, with the time left once a target has finished ("about 2:10 left")."""
        eta = self.eta(now)
        if eta is None:
            return self.title
        left = f"about {format_clock(eta)} left"
        return f"{self.title} ({left})" if self.title else left

    def text(self) -> str:
        now = time.monotonic()
        width = max((len(label) for label in self.lines), default=0)
        rows = [line.render(now, width) for line in self.lines.values()]
        heading = self.heading(now)
        return "\n".join(([heading] if heading else []) + rows)

    def html(self) -> str:
        now = time.monotonic()
        colours = {"done": "#1a7f37", "failed": "#cf222e", "interrupted": "#9a6700"}
        rows = []
        for line in self.lines.values():
            colour = colours.get(line.state, "inherit")
            clock = "" if line.started is None else format_clock(line.elapsed(now))
            rows.append(
                f"<tr><td style='color:{colour};padding-right:1em'><b>{html.escape(line.label)}</b></td>"
                f"<td style='padding-right:1em'>{html.escape(line.text)}</td>"
                f"<td style='font-variant-numeric:tabular-nums'>{clock}</td></tr>"
            )
        heading = self.heading(now)
        title = f"<div><b>{html.escape(heading)}</b></div>" if heading else ""
        return (
            f"<div class='gpu2tpu-forecast-progress'>{title}"
            f"<table style='font-family:monospace'>{''.join(rows)}</table></div>"
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __rich__(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        table = Table.grid(padding=(0, 2))
        styles = {"done": "green", "failed": "red", "interrupted": "yellow", "running": "cyan"}
        for line in self.lines.values():
            clock = "" if line.started is None else format_clock(line.elapsed(now))
            style = styles.get(line.state, "dim")
            table.add_row(Text(line.label, style=f"bold {style}"), Text(line.text), Text(clock))
        heading = self.heading(now)
        if heading:
            from rich.console import Group

            return Group(Text(heading, style="bold"), table)
        return table

    @contextmanager
    def shown(self) -> Iterator[ForecastProgress]:
        """Show the display for the duration; it stays, in its final state, afterwards."""
        try:
            self._start()
            yield self
        finally:
            self._stop()

    def _start(self) -> None:
        if self.mode == "notebook":
            from IPython.display import display

            self._handle = display(self, display_id=True)
        elif self.mode == "terminal":
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self, console=Console(), refresh_per_second=4, transient=False)
            self._live.start()

    def _stop(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.refresh()
            live.stop()
        elif self._handle is not None:
            self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        if self._handle is None:
            return  # rich redraws on its own clock; lines print when a target ends
        now = time.monotonic()
        if force or now - self._last_draw >= _NOTEBOOK_TICK_S:
            self._last_draw = now
            self._handle.update(self)

    def _line(self, label: str) -> TargetLine:
        if label not in self.lines:
            self.lines[label] = TargetLine(label)
        return self.lines[label]


def detect_mode() -> str:
    """ "notebook" in a Jupyter kernel, "terminal" when stdout is a terminal, else "lines"."""
    from ..views.display import in_kernel

    if in_kernel():
        return "notebook"
    try:
        if sys.stdout.isatty():
            return "terminal"
    except (AttributeError, ValueError):
        pass
    return "lines"
