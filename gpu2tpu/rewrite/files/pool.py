"""Worker processes that one bad file cannot take down, and that die with their parent.

`concurrent.futures.ProcessPoolExecutor` loses the whole run when one worker dies (a native
parser overflowing its stack on a pathological file is a SIGSEGV): every pending future fails
with `BrokenProcessPool`, and which file did it is unknown. Here each worker answers file by
file over its own pipe, so when one dies the parent knows the file it was on: that file gets
an error line, the files it had not reached go to the other workers, and a new worker starts.

A worker also stops when its parent dies (killed mid-run): on Linux the kernel sends it SIGTERM
(`prctl(PR_SET_PDEATHSIG)`), elsewhere a thread watches the parent's pid. SIGTERM ends a
worker at once, except during a write (`hold_stop`, from before its temporary file exists):
then the write finishes and the worker says how it went to the parent before it ends, so no
temporary file is left and the parent knows every file written.

Ctrl-C: workers ignore SIGINT (the terminal sends it to the whole process group); the parent
notes it (interrupts.py: a handler that only sets a flag and wakes the wait through a
socket), tells every worker to stop, takes the answers they still send, and raises
`Interrupted` with what was done. Waiting on a worker is always bounded: one that has not stopped a few seconds after
SIGTERM is killed, so an interrupted run never hangs.

When no worker can start (a process limit, `ulimit -u`; too few file descriptors for its
pipes, `ulimit -n`), the items left are done one by one in this process, and `notice` is told
why once: the run goes on without the isolation, rather than ending in a traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from .interrupts import watching

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0  # how long a worker told to stop may take before it is killed


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during `run_isolated`: `results` holds what the workers answered (None for the
    items they did not finish)."""

    def __init__(self, results: list[Any]) -> None:
        super().__init__("interrupted")
        self.results = results


@dataclass
class _Worker(Generic[T]):
    process: multiprocessing.process.BaseProcess
    conn: Connection
    inflight: deque[int] = field(default_factory=deque)
    stopping: bool = False


def run_isolated(
    items: Sequence[T],
    work: Callable[[T], R],
    jobs: int,
    crashed: Callable[[T, str], R],
    quick: Callable[[T], R | None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> list[R]:
    """`[work(item) for item in items]`, in `jobs` worker processes.

    `work` must not raise (it turns its own errors into results). When a worker dies, the item
    it was working on gets `crashed(item, reason)` and the others are done by other workers.

    `quick(item)` answers the items that need no real work (a file without any token) or
    None; a worker tries it on a whole batch first and sends those answers in one message
    (most files of a tree are such: one message each cost more than the answer). It must be
    pure Python that cannot take the process down, so that a worker's death still names the
    one item `work` was on. `notice` hears once that no worker could start, when the items
    left are done in this process.
    """
    context = _context()
    results: list[R | None] = [None] * len(items)
    todo: deque[int] = deque(range(len(items)))
    batch = max(1, min(16, len(items) // max(1, jobs * 8)))
    workers: dict[Any, _Worker[T]] = {}  # by connection and by process sentinel, as wait() gives

    failures: list[OSError] = []

    def start() -> None:
        try:
            mine, theirs = context.Pipe()
        except OSError as err:  # no descriptor left for the pipe
            failures.append(err)
            return
        process = context.Process(
            target=_serve, args=(theirs, work, os.getpid(), quick), daemon=True
        )
        try:
            with _sigint_blocked():  # the worker ignores SIGINT before it could raise one
                process.start()
        except OSError as err:  # fork refused (a process limit), or its pipes (descriptors)
            mine.close()
            theirs.close()
            failures.append(err)
            return
        theirs.close()
        worker: _Worker[T] = _Worker(process, mine)
        workers[mine] = workers[process.sentinel] = worker
        feed(worker)

    def feed(worker: _Worker[T]) -> None:
        if worker.stopping or len(worker.inflight) > batch:
            return
        try:
            if todo:
                chunk = [todo.popleft() for _ in range(min(batch, len(todo)))]
                worker.inflight.extend(chunk)
                worker.conn.send([(i, items[i]) for i in chunk])
            elif not worker.inflight:
                worker.stopping = True
                worker.conn.send(None)
        except OSError:
            pass  # it died: its sentinel is ready, and `retire` hands its files on

    def receive(worker: _Worker[T]) -> bool:
        """Take every answer waiting; False once the worker is gone."""
        try:
            while worker.conn.poll():
                for index, result in worker.conn.recv():
                    results[index] = result
                    worker.inflight.remove(index)
        except (EOFError, OSError):
            return False
        return worker.process.is_alive() or bool(worker.conn.poll())

    def retire(worker: _Worker[T]) -> None:
        workers.pop(worker.conn, None)
        workers.pop(worker.process.sentinel, None)
        worker.process.join()
        worker.conn.close()
        if worker.inflight:
            culprit = worker.inflight.popleft()
            results[culprit] = crashed(items[culprit], _death(worker.process.exitcode))
            todo.extendleft(reversed(worker.inflight))
            worker.inflight.clear()

    def in_this_process() -> None:
        """No worker could start: the items left, one by one, here (Ctrl-C between two)."""
        if notice is not None and failures:
            reason = failures[-1].strerror or str(failures[-1])
            notice(f"cannot start worker processes ({reason}); the files are processed one by "
                   "one in this process")  # fmt: skip
        while todo and not interrupted():
            index = todo.popleft()
            results[index] = work(items[index])

    with watching() as flag:

        def interrupted() -> bool:
            return flag is not None and flag.raised

        try:
            for _ in range(max(1, min(jobs, len(items)))):
                start()
            if not workers:
                in_this_process()
            while workers and not interrupted():
                waitables = flag.waitables if flag is not None else []
                for ready in wait([*workers, *waitables]):
                    worker = workers.get(ready)
                    if worker is None or interrupted():
                        continue  # the wake-up socket, or a worker already retired
                    if receive(worker):
                        feed(worker)
                        continue
                    receive(worker)
                    retire(worker)
                    if todo and len({id(w) for w in workers.values()}) < jobs:
                        start()
                    if todo and not workers:
                        in_this_process()
        except BaseException:
            _stop_all(list({id(w): w for w in workers.values()}.values()), None)
            raise
        if interrupted():
            _stop_all(list({id(w): w for w in workers.values()}.values()), results)
            raise Interrupted(results)
    return results  # type: ignore[return-value]  # every slot answered when no interrupt came


def _stop_all(workers: list[_Worker[Any]], results: list[Any] | None) -> None:
    """Tell `workers` to stop (SIGTERM) and wait for them, at most `STOP_GRACE_S`, then kill
    the rest. With `results`, the answers they still send are kept: a worker that has begun
    a rename finishes it and says so before it stops (`hold_stop`)."""
    for worker in workers:
        with contextlib.suppress(OSError):
            worker.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    live = list(workers)
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready = set(wait([w.process.sentinel for w in live] + [w.conn for w in live], left))
        for worker in list(live):
            if results is not None and worker.conn in ready:
                _drain(worker, results)
            if worker.process.sentinel in ready:
                if results is not None:
                    _drain(worker, results)
                live.remove(worker)
    for worker in live:
        with contextlib.suppress(OSError):
            worker.process.kill()
    for worker in workers:
        worker.process.join()
        with contextlib.suppress(OSError):
            worker.conn.close()


def _drain(worker: _Worker[Any], results: list[Any]) -> None:
    try:
        while worker.conn.poll():
            for index, result in worker.conn.recv():
                results[index] = result
    except (EOFError, OSError):
        pass


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back while a worker is forked: it inherits the mask and ignores SIGINT
    before it lets one in (`_serve`); the parent gets a held one as soon as it unblocks."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _context() -> multiprocessing.context.ForkContext | multiprocessing.context.DefaultContext:
    """fork where it exists (workers start at once, with the parent's modules loaded)."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the worker processing this file crashed ({name})"
    return f"the worker processing this file exited (status {exitcode})"


def _serve(
    conn: Connection,
    work: Callable[[object], object],
    parent: int,
    quick: Callable[[object], object | None] | None,
) -> None:
    """A worker: take batches of (index, item); answer the quick ones of a batch together,
    then each other item as soon as it is done, in the batch's order (so that the parent,
    should this process die, knows the item it was on: the first one not answered)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)  # the parent's wake-up socket is not this process's
    _die_with_parent(parent)
    try:
        while True:
            try:
                batch = conn.recv()
            except EOFError:
                return
            if batch is None:
                return
            rest, done = batch, []
            if quick is not None:
                rest = []
                for index, item in batch:
                    answer = quick(item)
                    if answer is None:
                        rest.append((index, item))
                    else:
                        done.append((index, answer))
            if done:
                conn.send(done)
            for index, item in rest:
                answer = work(item)
                conn.send([(index, answer)])
                _release_stop()
    except KeyboardInterrupt:
        sys.exit(130)


# A worker told to stop (SIGTERM) stops at once, unless a write has begun its rename: then it
# stops once the answer that says so is sent, so that the parent knows the file was written.
_holding = False
_stop_pending = False


def hold_stop() -> None:
    """Called just before a write's rename: a stop waits until this item's answer is sent."""
    global _holding
    _holding = True


def _release_stop() -> None:
    global _holding
    _holding = False
    if _stop_pending:
        os._exit(128 + signal.SIGTERM)


def _stop(signum: int, frame: object) -> None:
    """SIGTERM in a worker. Outside a write there is nothing of the user's to finish (no
    temporary file exists, no file is half replaced), so the worker ends at once, without an
    exception: one raised where Python drops exceptions (a weakref callback, a `__del__`)
    would print "Exception ignored in ..." and let the worker go on."""
    global _stop_pending
    if _holding:
        _stop_pending = True
        return
    os._exit(128 + signum)


def _die_with_parent(parent: int) -> None:
    signal.signal(signal.SIGTERM, _stop)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before prctl took effect
                    os._exit(143)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch, args=(parent,), daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.25)
    os.kill(os.getpid(), signal.SIGTERM)
