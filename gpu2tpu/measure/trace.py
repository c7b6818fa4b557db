"""One step op by op, for when a step is slow: a per-op time table and a Chrome trace file.

`trace_step` runs the step once more under `torch.profiler` (the host's view of every op,
and the GPU's kernels where CUDA runs), writes torch.profiler's Chrome trace, which
https://ui.perfetto.dev and chrome://tracing open, and keeps the ops that took the most
time. The step is timed apart from the profiler's measured steps (the profiler's own
overhead lands here, not there). On PyTorch/XLA the host's view is the ops being traced into
the graph, not the TPU's work: XProf (`torch_xla.debug.profiler`) shows that.
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OpTime", "OpTrace", "default_trace_path", "trace_step"]

# Rows the table keeps (the trace file has every op).
TOP_OPS = 15


@dataclass(frozen=True)
class OpTime:
    """One op's share of the traced step: calls, time in the op itself, and on the device."""

    name: str
    calls: int
    self_seconds: float  # host time inside the op itself, its children apart
    total_seconds: float  # host time with the ops it called
    device_seconds: float | None = None  # kernel time on the GPU, where one ran

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "self_seconds": self.self_seconds,
            "total_seconds": self.total_seconds,
            "device_seconds": self.device_seconds,
        }


@dataclass
class OpTrace:
    """The traced step: its ops by self time (`ops`, the top `TOP_OPS`), the step's wall time
    under the profiler and the Chrome trace file written (`path`)."""

    path: Path | None
    step_seconds: float
    ops: list[OpTime] = field(default_factory=list)
    backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": None if self.path is None else str(self.path),
            "step_seconds": self.step_seconds,
            "backend": self.backend,
            "ops": [op.to_dict() for op in self.ops],
        }

    def summary_line(self) -> str:
        """Where the trace is, and the op that took the most time."""
        from ..views.format import format_seconds

        top = ""
        if self.ops:
            op = self.ops[0]
            share = op.self_seconds / self.step_seconds if self.step_seconds else 0.0
            top = f"; most time in {op.name} ({format_seconds(op.self_seconds)}, {share:.0%})"
        where = f"trace: {self.path} (open it in https://ui.perfetto.dev)" if self.path else ""
        return f"gpu2tpu: {where}{top}".rstrip()

    def rows(self) -> tuple[list[str], list[list[str]]]:
        """The table as text cells: op, calls, self time, its share of the step, total, device."""
        from ..views.format import format_seconds

        device = any(op.device_seconds for op in self.ops)
        headers = ["Op", "Calls", "Self", "Share", "With children"] + (["GPU"] if device else [])
        body = []
        for op in self.ops:
            share = op.self_seconds / self.step_seconds if self.step_seconds else 0.0
            row = [
                op.name,
                str(op.calls),
                format_seconds(op.self_seconds),
                f"{share:.1%}",
                format_seconds(op.total_seconds),
            ]
            if device:
                row.append(format_seconds(op.device_seconds))
            body.append(row)
        return headers, body

    def __str__(self) -> str:
        from ..views.format import format_seconds
        from ..views.table import padded_lines

        title = (
            f"One step op by op on {self.backend} (torch.profiler, "
            f"{format_seconds(self.step_seconds)} under the profiler)"
        )
        lines = [title, *padded_lines(*self.rows())]
        if self.path is not None:
            lines.append(f"Chrome trace: {self.path} (https://ui.perfetto.dev, chrome://tracing)")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        headers, body = self.rows()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body
        )
        path = (
            f"<p>Chrome trace: <code>{html.escape(str(self.path))}</code></p>" if self.path else ""
        )
        return f"<div class='gpu2tpu-trace'><table><tr>{head}</tr>{rows}</table>{path}</div>"


def default_trace_path() -> Path:
    """A new file in the working directory, named for the time it was made."""
    return Path.cwd() / f"gpu2tpu-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"


def trace_step(
    step: Callable[[], Any],
    *,
    synchronize: Callable[[], None],
    backend: str,
    path: str | Path | None = None,
    cuda: bool = False,
) -> OpTrace:
    """Run `step()` once under torch.profiler; the per-op table, and the Chrome trace at `path`
    (None: no file). `cuda` also records the GPU's kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize()
    with warnings.catch_warnings():
        # torch.profiler's note on schedules with several cycles: this one has one step
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each")
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            step()
            synchronize()
            seconds = time.perf_counter() - start
        out = None
        if path is not None:
            out = Path(path)
            out.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(out))
        ops = []
        for event in prof.key_averages():
            device_us = getattr(event, "self_device_time_total", None)
            if device_us is None:
                device_us = getattr(event, "self_cuda_time_total", 0)
            ops.append(
                OpTime(
                    name=event.key,
                    calls=int(event.count),
                    self_seconds=event.self_cpu_time_total / 1e6,
                    total_seconds=event.cpu_time_total / 1e6,
                    device_seconds=device_us / 1e6 if cuda and device_us else None,
                )
            )
    ops.sort(key=lambda op: -(op.device_seconds or op.self_seconds))
    return OpTrace(path=out, step_seconds=seconds, ops=ops[:TOP_OPS], backend=backend)
