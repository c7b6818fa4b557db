"""Run a function in a forked child process and bring its result (or its error) back.

The forecast needs torchax, and importing torchax changes the process for good: it renames
PyTorch's PrivateUse1 backend to "jax", so `torch.accelerator.current_accelerator()` answers
"jax" from then on and device-agnostic code would put the user's tensors on torchax. A forked
child does the compiling instead; the user's session never imports torchax. Fork (not spawn)
because the child must see the user's model as it is, including classes defined in a
notebook, without pickling it. The result must pickle.

While it works, the child can `emit` events (progress, finished targets) that the parent
receives as they happen. Ctrl-C is the parent's business: the child ignores SIGINT (a
terminal sends it to the whole process group, and a KeyboardInterrupt in the child would
print a traceback from inside JAX) and the parent ends it with SIGKILL, which no handler can
catch: libtpu's handler answers SIGTERM with a stack dump of the compiler (verified with
libtpu 0.0.52: "*** SIGTERM received ... Remote crash gathering disabled"). Whatever
the child writes to stdout or stderr (libtpu's log lines, warnings) is held in a file and
shown only when the child fails, so a notebook shows no stray stderr.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# The parent's end of the pipe, set in a forked child only (see `emit`).
_channel: Any = None
# What the child's output said, kept for an error message (the last characters).
_OUTPUT_TAIL = 3000


class ChildDied(RuntimeError):
    """The child died without a word (killed, out of memory)."""


def can_fork() -> bool:
    return hasattr(os, "fork") and "fork" in multiprocessing.get_all_start_methods()


def jax_started() -> bool:
    """Whether JAX has started its backends (and their threads) in this process: a fork
    after that deadlocks in the child, so callers then work in-process instead."""
    if "jax" not in sys.modules:
        return False
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    return True if backends is None else bool(backends)


def in_child() -> bool:
    """Whether this code runs inside `run_in_child` (events then reach the parent)."""
    return _channel is not None


def emit(event: Any) -> bool:
    """Send `event` (picklable) to the parent's `on_event`; False outside a child."""
    if _channel is None:
        return False
    _channel.send(("event", event, ""))
    return True


def _die_with_parent() -> None:
    """Ask Linux to kill this child when its parent dies (a killed notebook kernel)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


@contextlib.contextmanager
def _output_held() -> Any:
    """Send the child's stdout and stderr (Python's and native code's) to a temporary file.

    Yields a function that returns the tail of what was written.
    """
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved_streams = sys.stdout, sys.stderr
        text = io.TextIOWrapper(sink, encoding="utf-8", errors="replace", write_through=True)
        with contextlib.suppress(Exception):
            saved_streams[0].flush()
            saved_streams[1].flush()
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.dup2(sink.fileno(), fd)
        sys.stdout = sys.stderr = text

        def tail() -> str:
            with contextlib.suppress(Exception):
                text.flush()
                sink.seek(0, os.SEEK_END)
                size = sink.tell()
                sink.seek(max(0, size - _OUTPUT_TAIL))
                return sink.read().decode("utf-8", "replace")
            return ""

        try:
            yield tail
        finally:
            sys.stdout, sys.stderr = saved_streams


def _child(conn: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    global _channel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    _die_with_parent()
    _channel = conn
    with _output_held() as output:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the parent re-raises it
            trace = traceback.format_exc()
            said = output().strip()
            if said and not type(exc).__module__.startswith("gpu2tpu"):
                trace += "\nthe child process printed:\n" + said
            try:
                conn.send(("error", exc, trace))
            except Exception:  # an error that does not pickle: send its text
                conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), trace))
        else:
            conn.send(("ok", result, ""))
        finally:
            _channel = None
            conn.close()


def run_in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a forked child; its exception is re-raised here."""
    return run_streaming(fn, args, kwargs)


def run_streaming(
    fn: Callable[..., T],
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    on_event: Callable[[Any], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    idle_seconds: float = 0.5,
) -> T:
    """`fn(*args, **kwargs)` in a forked child, passing what it `emit`s to `on_event`.

    `on_idle` runs every `idle_seconds` while the child works (a clock to refresh). A
    KeyboardInterrupt here (Ctrl-C) kills the child at once and is re-raised; events
    received before it have been handled, so the caller keeps what was finished.
    """
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, fn, args, kwargs or {}), daemon=True)
    process.start()
    send.close()
    try:
        while True:
            if not receive.poll(idle_seconds):
                if on_idle is not None:
                    on_idle()
                continue
            status, value, text = receive.recv()
            if status != "event":
                break
            if on_event is not None:
                on_event(value)
    except EOFError:
        process.join()
        raise ChildDied(
            f"the forecast's child process ended without a result (exit code {process.exitcode}); "
            "it may have run out of memory"
        ) from None
    except BaseException:  # KeyboardInterrupt: stop the child now, without its crash handlers
        _kill(process)
        raise
    finally:
        receive.close()
    process.join()
    if status == "error":
        # gpu2tpu's own errors are sentences for the user; anything else keeps its traceback.
        ours = type(value).__module__.startswith("gpu2tpu")
        if text and not ours and not getattr(value, "__notes__", None):
            value.add_note("in the forecast's child process:\n" + text.rstrip())
        raise value
    return value


def run_streaming_many(
    calls: list[tuple[Callable[..., Any], tuple]],
    *,
    on_event: Callable[[Any], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    idle_seconds: float = 0.5,
) -> list[Any]:
    """Each `fn(*args)` in its own forked child, all at once; their results in order.

    Events from every child reach `on_event` as they come (in the order they arrive). All
    children are forked before any result is read, from this thread. The first error
    (or Ctrl-C) kills the other children and is raised here, after the events received.
    """
    results: dict[int, Any] = {}

    def relay(event: Any) -> None:
        if on_event is not None:
            on_event(event)

    run_pool(
        [PoolJob(fn, args, key=i) for i, (fn, args) in enumerate(calls)],
        workers=len(calls),
        on_event=relay,
        on_result=results.__setitem__,
        on_idle=on_idle,
        idle_seconds=idle_seconds,
    )
    return [results[i] for i in range(len(calls))]


@dataclass
class PoolJob:
    """One call for `run_pool`: `fn(*args)` in a child of its own.

    `holds`: a lock file the parent locks before forking the child, which inherits the lock
    and keeps it until it ends; `wait_for(holds)` in another child then blocks until this
    job is over (whatever way it ended). `key` names the job's result for `on_result`.
    An `optional` job that fails or dies is dropped (others do without its work) instead
    of stopping the pool.
    """

    fn: Callable[..., Any]
    args: tuple
    key: Any = None
    holds: str | None = None
    optional: bool = False


def run_pool(
    jobs: list[PoolJob],
    *,
    workers: int,
    on_event: Callable[[Any], list[PoolJob] | None] | None = None,
    on_result: Callable[[Any, Any], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    idle_seconds: float = 0.5,
) -> None:
    """Each job in its own forked child, at most `workers` at once, in the order given.

    Events reach `on_event` as they come; it may return more jobs, which start before the
    ones still waiting (work that the finished part of a forecast asked for). A job's
    return value goes to `on_result(job.key, value)`. The first error (or Ctrl-C) kills the
    other children and is raised here, after the events received. The parent forks every
    child from this thread, before reading any of its results.
    """
    import fcntl

    context = multiprocessing.get_context("fork")
    waiting = list(jobs)
    running: dict[Any, tuple[PoolJob, Any]] = {}  # receiving end -> (job, process)
    # Every child, listed before its fork: a Ctrl-C between the fork and `running` learning
    # of it must not leave it compiling after the pool has ended.
    spawned: list[Any] = []
    failure: tuple[Any, str] | None = None

    def start(job: PoolJob) -> None:
        held = None
        if job.holds is not None:
            held = os.open(job.holds, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(held, fcntl.LOCK_EX)  # the child inherits it and keeps it to its end
        try:
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(send, job.fn, job.args, {}), daemon=True)
            spawned.append(process)
            process.start()
            send.close()
        finally:
            if held is not None:
                os.close(held)
        running[receive] = (job, process)

    try:
        while (waiting or running) and failure is None:
            while waiting and len(running) < max(1, workers):
                start(waiting.pop(0))
            ready: list[Any] = multiprocessing.connection.wait(list(running), timeout=idle_seconds)
            if not ready:
                if on_idle is not None:
                    on_idle()
                continue
            for conn in ready:
                job, process = running[conn]
                try:
                    status, value, text = conn.recv()
                except EOFError:
                    status, value, text = "died", None, ""
                if status == "event":
                    more = on_event(value) if on_event is not None else None
                    waiting[:0] = more or []
                    continue
                del running[conn]
                conn.close()
                process.join()
                if status in ("died", "error") and job.optional:
                    continue
                if status == "died":
                    failure = (
                        ChildDied(
                            "a forecast child process ended without a result (exit code "
                            f"{process.exitcode}); it may have run out of memory"
                        ),
                        "",
                    )
                    break
                if status == "error":
                    failure = (value, text)
                    break
                if on_result is not None:
                    on_result(job.key, value)
    except BaseException:  # KeyboardInterrupt: stop every child now
        for process in spawned:
            _kill(process)
        raise
    finally:
        for conn, (_, process) in running.items():
            conn.close()
            _kill(process)
    if failure is not None:
        value, text = failure
        ours = type(value).__module__.startswith("gpu2tpu")
        if text and not ours and not getattr(value, "__notes__", None):
            value.add_note("in a forecast child process:\n" + text.rstrip())
        raise value


def wait_for(lock: str | None) -> None:
    """Block until the `run_pool` job holding `lock` has ended (at once if none holds it)."""
    import fcntl

    if lock is None:
        return
    try:
        handle = os.open(lock, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
    finally:
        os.close(handle)


def _kill(process: Any) -> None:
    """SIGKILL and reap: libtpu's signal handlers would print a stack dump for SIGTERM."""
    with contextlib.suppress(Exception):
        if process.is_alive():
            process.kill()
        process.join(10)
