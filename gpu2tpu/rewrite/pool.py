"""Worker processes that one bad file cannot take down, and that die with their parent.

`concurrent.futures.ProcessPoolExecutor` loses the whole run when one worker dies (a native
parser overflowing its stack on a pathological file is a SIGSEGV): every pending future fails
with `BrokenProcessPool`, and which file did it is unknown. Here each worker answers file by
file over its own pipe, so when one dies the parent knows the file it was on: that file gets
an error line, the files it had not reached go to the other workers, and a new worker starts.

A worker also stops when its parent dies (killed mid-run): on Linux the kernel sends it SIGTERM
(`prctl(PR_SET_PDEATHSIG)`), elsewhere a thread watches the parent's pid. SIGTERM raises
`SystemExit` in the worker, so a write in progress removes its temporary file.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1


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
) -> list[R]:
    """`[work(item) for item in items]`, in `jobs` worker processes.

    `work` must not raise (it turns its own errors into results). When a worker dies, the item
    it was working on gets `crashed(item, reason)` and the others are done by other workers.

    `quick(item)` answers the items that need no real work (a file without any token) or
    None; a worker tries it on a whole batch first and sends those answers in one message
    (most files of a tree are such: one message each cost more than the answer). It must be
    pure Python that cannot take the process down, so that a worker's death still names the
    one item `work` was on.
    """
    context = _context()
    results: list[R | None] = [None] * len(items)
    todo: deque[int] = deque(range(len(items)))
    batch = max(1, min(16, len(items) // max(1, jobs * 8)))
    workers: dict[object, _Worker[T]] = {}  # by connection and by process sentinel

    def start() -> None:
        mine, theirs = context.Pipe()
        process = context.Process(
            target=_serve, args=(theirs, work, os.getpid(), quick), daemon=True
        )
        process.start()
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

    try:
        for _ in range(max(1, min(jobs, len(items)))):
            start()
        while workers:
            for ready in wait(list(workers)):
                worker = workers.get(ready)
                if worker is None:
                    continue  # its connection and sentinel were both ready
                if receive(worker):
                    feed(worker)
                    continue
                receive(worker)
                retire(worker)
                if todo and len({id(w) for w in workers.values()}) < jobs:
                    start()
    except BaseException:
        for worker in {id(w): w for w in workers.values()}.values():
            worker.process.terminate()
        for worker in {id(w): w for w in workers.values()}.values():
            worker.process.join()
        raise
    return results  # type: ignore[return-value]


def _context() -> multiprocessing.context.BaseContext:
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
                conn.send([(index, work(item))])
    except KeyboardInterrupt:
        sys.exit(130)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent(parent: int) -> None:
    signal.signal(signal.SIGTERM, _stop)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before prctl took effect
                    raise SystemExit(143)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch, args=(parent,), daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.25)
    os.kill(os.getpid(), signal.SIGTERM)
