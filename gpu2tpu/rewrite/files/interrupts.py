"""Ctrl-C as a flag that the code reads where it is safe to stop, never an exception raised
wherever the program happens to be.

Python's own SIGINT handler raises KeyboardInterrupt at the next bytecode, anywhere: inside a
pipe read (the message being read is lost), or inside a weakref callback of the import system,
where Python drops it ("Exception ignored in ...") and the program goes on as if nothing had
happened. The `gpu2tpu` command (`cli.entry`) therefore watches for SIGINT with a handler that
only sets a flag and wakes a socket (`signal.set_wakeup_fd`, which `pool.run_isolated` waits
on); `checkpoint()` raises KeyboardInterrupt at the places that can stop cleanly (each folder
discovery walks, each phase of a run, each file done in this process). A second Ctrl-C
changes nothing. Commands other than check and rewrite go back to Python's handler
(`release`), so Ctrl-C stops them as usual.

Without `watch()` (gpu2tpu used as a library), nothing changes: `checkpoint()` does nothing and
a Ctrl-C is Python's own; `pool.run_isolated` watches for the time its workers run.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator

_active: Flag | None = None


class Flag:
    """SIGINT noted: `raised`, and a socket that becomes readable when it happens."""

    def __init__(self) -> None:
        self.raised = False
        self.waitables: list[socket.socket] = []
        self._previous: object = None
        self._wakeup = -1
        self._sockets: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> bool:
        """Take over SIGINT (main thread only); False where it cannot."""
        if threading.current_thread() is not threading.main_thread():
            return False
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._sockets = (reader, writer)
        self.waitables = [reader]
        self._previous = signal.signal(signal.SIGINT, self._note)
        self._wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        return True

    def _note(self, signum: int, frame: object) -> None:
        self.raised = True

    def uninstall(self) -> None:
        """Put back the handler and wake-up descriptor there were before."""
        if self._sockets is None:
            return
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._wakeup)
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]  # what signal.getsignal gave: a handler Python set
        for sock in self._sockets:
            sock.close()
        self._sockets = None
        self.waitables = []


def watch() -> Flag | None:
    """From now on, Ctrl-C only sets the flag (the command line's check and rewrite)."""
    global _active
    if _active is None:
        flag = Flag()
        if flag.install():
            _active = flag
    return _active


def release() -> None:
    """Back to Python's own Ctrl-C; one that came meanwhile is raised now."""
    global _active
    flag, _active = _active, None
    if flag is not None:
        flag.uninstall()
        if flag.raised:
            raise KeyboardInterrupt


def active_waitables() -> list[socket.socket]:
    """The socket that becomes readable on Ctrl-C, to wait on beside a descriptor (none
    without `watch()`: then Ctrl-C raises where the wait is)."""
    return list(_active.waitables) if _active is not None else []


def checkpoint() -> None:
    """Stop here (KeyboardInterrupt) if Ctrl-C was pressed since `watch()`."""
    if _active is not None and _active.raised:
        raise KeyboardInterrupt


@contextlib.contextmanager
def watching() -> Iterator[Flag | None]:
    """The active flag, or one set up for the time of the block (None: not the main thread,
    where no signal arrives)."""
    if _active is not None:
        yield _active
        return
    flag = Flag()
    if not flag.install():
        yield None
        return
    try:
        yield flag
    finally:
        flag.uninstall()
