"""A live bar for `gpu2tpu.profile`: steps done of all, the phase, and the time left.

A profile of a real step runs for many seconds (warm-up with its compiles, one counted step,
the timed steps); silence that long reads as a hang. The bar appears once a run has lasted
`DELAY_S` (a quick profile shows nothing), as tqdm's notebook bar in a kernel (core
ipywidgets: a progress bar and a line of text) and as rich's progress bar on a terminal's
standard error; elsewhere (a log, a pipe, a test) nothing is drawn.

The timed loop only counts (`done += 1`, an attribute on this object); a daemon thread reads
the count and draws, so the bar costs the measured steps nothing (benchmarks/profiler_overhead.py).
"""

from __future__ import annotations

import html
import statistics
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["StepProgress", "WorkStatus", "detect_mode", "format_eta"]

# Seconds a run lasts before the bar appears, and between redraws.
DELAY_S = 0.5
REDRAW_S = 0.25


def detect_mode() -> str:
    """ "notebook" in a Jupyter kernel, "terminal" when standard error is a terminal, else "off"."""
    from ..views.display import in_kernel

    if in_kernel():
        return "notebook"
    try:
        if sys.stderr.isatty():
            return "terminal"
    except (AttributeError, ValueError):
        pass
    return "off"


def _bundle(widget: Any, text: str) -> dict[str, Any]:
    """The widget's display data with `text` as its plain-text copy (ipywidgets' own is the
    widget's repr, frozen at the first frame in a saved notebook)."""
    data = dict(widget._repr_mimebundle_() or {})
    data["text/plain"] = text
    return data


def format_eta(seconds: float | None) -> str:
    """ "ETA 0:12", "ETA 1:02:03"; "ETA ?" before there is a step to go by."""
    if seconds is None:
        return "ETA ?"
    seconds = int(max(0.0, seconds) + 0.5)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"ETA {hours}:{minutes:02d}:{secs:02d}" if hours else f"ETA {minutes}:{secs:02d}"


class _LiveView(ABC):
    """A view redrawn by a daemon thread while a piece of work runs: it appears once the work
    has lasted `delay` (quick work shows nothing) and gets its last word when the work ends.
    Subclasses draw: `_show` (first frame), `_draw` (each redraw), `_finish(failed)`."""

    mode: str
    delay: float
    _view: Any

    def _start_thread(self) -> None:
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.mode in ("notebook", "terminal"):
            self._thread = threading.Thread(target=self._run, name="gpu2tpu-progress", daemon=True)
            self._thread.start()

    def _stop_thread(self, failed: bool) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._view is not None:
            self._finish(failed=failed)

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        try:
            self._show()
            while not self._stop.wait(REDRAW_S):
                self._draw()
        except Exception:  # a front end that cannot draw must not stop the work
            self._view = None

    @abstractmethod
    def _show(self) -> None: ...

    @abstractmethod
    def _draw(self) -> None: ...

    @abstractmethod
    def _finish(self, failed: bool) -> None: ...


class StepProgress(_LiveView):
    """Steps done of `total`, by phase ("warm-up", "counting FLOPs", "timed", "tracing").

    The loop calls `step()` after each warm-up, counted or traced step and hands the timed
    loop's list of step times to `watch()`; `eta()` reads the median timed step (before there
    is one, the mean step of the current phase). Use as a context manager: the thread runs inside.
    `mode` is "notebook", "terminal" or "off" (None: `detect_mode()`); `delay` is how long a
    run lasts before the bar appears.
    """

    def __init__(
        self,
        total: int,
        *,
        mode: str | None = None,
        title: str = "gpu2tpu.profile",
        delay: float = DELAY_S,
        console: Any = None,
    ) -> None:
        self.total = total
        self.phase = "warm-up"
        self.title = title
        self.mode = detect_mode() if mode is None else mode
        self.delay = delay
        self._console = console
        self._count = 0
        self._watched: list[float] | None = None  # the timed loop's list of step times
        self._step_times: list[float] = []  # the timed steps, for the ETA
        self._phase_start = (0, 0.0)  # (done, clock) when the current phase began
        self._started = 0.0
        self._view: Any = None  # the widgets and display handle, or rich's (Progress, task id)

    # -- what the loop tells it ----------------------------------------------------------------

    @property
    def done(self) -> int:
        watched = self._watched
        return self._count + (len(watched) if watched is not None else 0)

    def step(self) -> None:
        """One step done (warm-up, counted, traced); the timed loop uses `watch` instead."""
        self._count += 1

    def start_phase(self, phase: str) -> None:
        self.phase = phase
        self._phase_start = (self.done, time.perf_counter())

    def watch(self, times: list[float]) -> None:
        """Each time the timed loop appends to `times` is a step done: the loop itself does
        nothing more (the drawing thread reads the list's length)."""
        self._watched = times
        self._step_times = times

    def unwatch(self) -> None:
        if self._watched is not None:
            self._count += len(self._watched)
            self._step_times = list(self._watched)
            self._watched = None

    # -- what it shows ---------------------------------------------------------------------------

    def eta(self) -> float | None:
        left = self.total - self.done
        if left <= 0:
            return 0.0
        times = self._step_times
        if times:
            return left * statistics.median(times[-50:])
        done, since = self._phase_start
        steps = self.done - done
        if steps <= 0:
            return None
        return left * (time.perf_counter() - since) / steps

    def text(self) -> str:
        elapsed = time.perf_counter() - self._started
        return (
            f"{self.title}: {self.done}/{self.total} steps ({self.phase}), "
            f"{elapsed:.1f} s, {format_eta(self.eta())}"
        )

    def __enter__(self) -> StepProgress:
        self._start_thread()
        self._phase_start = (0, self._started)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_thread(failed=exc[0] is not None)

    def _show(self) -> None:
        if self.mode == "notebook":
            import ipywidgets as w
            from IPython.display import display

            bar = w.IntProgress(value=self.done, min=0, max=self.total, description="")
            label = w.HTML(html.escape(self.text()))
            box = w.HBox([bar, label])
            # The output's plain-text copy (what a saved notebook shows without the widget
            # state) is our line, and `_finish` replaces it with the run's last word.
            handle = display(_bundle(box, self.text()), raw=True, display_id=True)
            self._view = (bar, label, box, handle)
        else:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps ({task.fields[phase]}), {task.fields[eta]}"),
                console=self._console or Console(stderr=True),
                transient=True,
                auto_refresh=False,
            )
            progress.start()
            task = progress.add_task(self.title, total=self.total, phase=self.phase, eta="ETA ?")
            self._view = (progress, task)
        self._draw()

    def _draw(self) -> None:
        view = self._view
        if view is None:
            return
        if self.mode == "notebook":
            bar, label = view[:2]
            bar.value = min(self.done, self.total)
            label.value = html.escape(self.text())
        else:
            progress, task = view
            progress.update(
                task,
                completed=min(self.done, self.total),
                phase=self.phase,
                eta=format_eta(self.eta()),
            )
            progress.refresh()

    def _finish(self, failed: bool) -> None:
        """The notebook bar stays, full, with the run's time; the terminal's goes away."""
        view, self._view = self._view, None
        elapsed = time.perf_counter() - self._started
        if self.mode == "notebook":
            bar, label, box, handle = view
            bar.value = self.done if failed else self.total
            bar.bar_style = "danger" if failed else "success"
            state = "stopped" if failed else "done"
            last = f"{self.title}: {self.done}/{self.total} steps, {state} in {elapsed:.1f} s"
            label.value = html.escape(last)
            if handle is not None:
                handle.update(_bundle(box, last), raw=True)
        else:
            progress, _task = view
            progress.stop()


class WorkStatus(_LiveView):
    """One line that says a long piece of work of unknown length is still going: its title,
    the time so far and what `progress()` says ("1,234,567 ATen ops"). The dry run of a cell
    uses it: a run of many seconds says what it has done instead of looking hung. The same
    modes, delay and drawing thread as `StepProgress`; the notebook line stays with its last
    word, the terminal's goes away.
    """

    def __init__(
        self,
        title: str,
        progress: Callable[[], str],
        *,
        mode: str | None = None,
        delay: float = DELAY_S,
        console: Any = None,
    ) -> None:
        self.title = title
        self.progress = progress
        self.mode = detect_mode() if mode is None else mode
        self.delay = delay
        self._console = console
        self._started = 0.0
        self._view: Any = None

    def text(self, state: str = "") -> str:
        elapsed = time.perf_counter() - self._started
        return f"{self.title}: {self.progress()}, {state}{elapsed:.1f} s"

    def __enter__(self) -> WorkStatus:
        self._start_thread()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_thread(failed=exc[0] is not None)

    def _show(self) -> None:
        if self.mode == "notebook":
            import ipywidgets as w
            from IPython.display import display

            label = w.HTML(html.escape(self.text()))
            handle = display(_bundle(label, self.text()), raw=True, display_id=True)
            self._view = (label, handle)
        else:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            live = Live(
                Text(self.text()),  # plain text: no markup read in "In[3]", no highlighting
                console=self._console or Console(stderr=True),
                transient=True,
                auto_refresh=False,
            )
            live.start()
            self._view = live
        self._draw()

    def _draw(self) -> None:
        view = self._view
        if view is None:
            return
        if self.mode == "notebook":
            view[0].value = html.escape(self.text())
        else:
            from rich.text import Text

            view.update(Text(self.text()), refresh=True)

    def _finish(self, failed: bool) -> None:
        view, self._view = self._view, None
        if self.mode == "notebook":
            label, handle = view
            last = self.text("stopped after " if failed else "done in ")
            label.value = html.escape(last)
            if handle is not None:
                handle.update(_bundle(label, last), raw=True)
        else:
            view.stop()
