"""The standard streams at the edges: closed, full, cut short, unable to hold a character, or
waiting forever; and report files that are no files (a FIFO, a terminal, a device).

A stream that fails says which one failed (`OutputError`), so that the command prints one line
and exits 2 instead of a traceback. A descriptor 0, 1 or 2 that was closed when the command
started is given /dev/null (`reopen_closed`): the next file opened would otherwise take its
number, and a write meant for the stream would land in it.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import select
import socket
import stat
import time
from typing import IO, Any, TextIO

from .interrupts import active_waitables, checkpoint

ESCAPE = "gpu2tpu.escape"  # the error handler of standard output and standard error
_closed: frozenset[int] = frozenset()


class OutputError(OSError):
    """Writing to a standard stream failed: `stream` says which ("standard output")."""

    def __init__(self, stream: str, err: OSError) -> None:
        super().__init__(err.errno, err.strerror or str(err))
        self.stream = stream

    @property
    def line(self) -> str:
        return f"gpu2tpu: error: cannot write to {self.stream}: {self.strerror}"


def reopen_closed() -> frozenset[int]:
    """Give /dev/null to each of descriptors 0, 1 and 2 that is closed; remember which
    (`closed`). Called once, first thing, by the command."""
    global _closed
    found = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            found.append(fd)
    for fd in found:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:  # the lowest free number: `fd` itself when the ones below are taken
            os.dup2(null, fd)
            os.close(null)
    _closed = frozenset(found)
    return _closed


def closed() -> frozenset[int]:
    """The standard descriptors that were closed when the command started."""
    return _closed


def silence(fd: int) -> None:
    """Point `fd` at /dev/null: Python's own flush at exit must not fail on it again."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


class Guarded:
    """A text stream (or its binary buffer) whose failed writes raise `OutputError`. A broken
    pipe stays a BrokenPipeError: the reader went away, which the command ends quietly. A
    short write (an unbuffered stream under `ulimit -f`, or a signal) is continued until it
    is whole or fails: the rest is never dropped silently."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, data: Any) -> int:
        try:
            done = self._stream.write(data)
            if isinstance(data, bytes | bytearray | memoryview):
                view = memoryview(data)
                while done is not None and done < len(view):
                    more = self._stream.write(view[done:])
                    if not more:
                        raise OSError(errno.EIO, "the stream took no more bytes")
                    done += more
            return int(done or 0)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError(self._name, err) from err

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError(self._name, err) from err

    @property
    def buffer(self) -> Guarded:
        return Guarded(self._stream.buffer, self._name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def buffered(stream: Any) -> Any:
    """`stream`, or, when its binary layer is unbuffered (`PYTHONUNBUFFERED`, `python -u`), the
    same stream over a BufferedWriter, line by line: an unbuffered TextIOWrapper drops the
    rest of a short write without a word (the raw write's count is not looked at)."""
    import io

    raw = getattr(stream, "buffer", None)
    if not isinstance(raw, io.FileIO):
        return stream
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=True,
    )


def guarded(stream: TextIO, name: str) -> TextIO:
    return Guarded(stream, name)  # type: ignore[return-value]  # writes as the stream does


# -- characters the stream's encoding cannot hold -------------------------------------------------


def _escape(err: UnicodeError) -> tuple[str | bytes, int]:
    """A file name's undecodable byte (a lone surrogate from `surrogateescape`) goes out as
    that byte, as `ls` prints it; any other character the encoding cannot hold as `\\xe9`,
    `\\u65e5` (Python's `backslashreplace`)."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    char = err.object[err.start]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return bytes([code - 0xDC00]), err.start + 1
    if code <= 0xFF:
        return f"\\x{code:02x}", err.start + 1
    if code <= 0xFFFF:
        return f"\\u{code:04x}", err.start + 1
    return f"\\U{code:08x}", err.start + 1


codecs.register_error(ESCAPE, _escape)


def escape_unencodable(stream: TextIO) -> None:
    """Make a strict text stream write what its encoding cannot hold with escapes
    (`_escape`) instead of raising UnicodeEncodeError (`PYTHONIOENCODING=ascii`)."""
    if getattr(stream, "errors", None) != "strict":
        return
    with contextlib.suppress(AttributeError, ValueError, OSError):
        stream.reconfigure(errors=ESCAPE)  # type: ignore[attr-defined]  # a standard stream: TextIOWrapper has it


# -- standard input ------------------------------------------------------------------------------

_CHUNK = 1 << 16


def read_input(stream: TextIO, limit: int) -> tuple[bytes, bool]:
    """Standard input's bytes, up to `limit` + 1; and whether there were more than `limit`.

    A wait for input is a wait on the descriptor and on Ctrl-C's wake-up socket at once
    (interrupts.py), so Ctrl-C ends it (KeyboardInterrupt) even while the writer keeps the
    pipe open and sends nothing. A stream with no descriptor is read as it is.
    """
    binary: IO[bytes] | None = getattr(stream, "buffer", None)
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd < 0 or binary is None or os.name == "nt":  # select() takes no pipe on Windows
        data = binary.read(limit + 1) if binary is not None else stream.read().encode()
        return data[: limit + 1], len(data) > limit
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = _read_some(fd, min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), size > limit


def copy_rest(stream: TextIO, out: TextIO | None) -> int:
    """The rest of standard input, as it comes, onto `out` (None: dropped); how many bytes.
    An input over the size limit goes back unchanged without being held in memory."""
    try:
        fd = stream.fileno() if os.name != "nt" else -1
    except (AttributeError, OSError, ValueError):
        fd = -1
    size = 0
    while True:
        if fd >= 0:
            chunk = _read_some(fd, _CHUNK)
        else:
            chunk = stream.buffer.read(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if out is not None:
            out.buffer.write(chunk)
    if out is not None:
        out.flush()
    return size


def _read_some(fd: int, size: int) -> bytes:
    while True:
        checkpoint()
        waitables: list[int | socket.socket] = [fd, *active_waitables()]
        ready, _, _ = select.select(waitables, [], [])
        checkpoint()
        if fd in ready:
            return os.read(fd, size)


# -- a report file that is no file ---------------------------------------------------------------

_POLL_S = 0.05  # how often an open of a FIFO nobody reads yet is tried again


def special_kind(path: str) -> str | None:
    """What `path` is when it is no regular file and a report may be written into it as a
    stream ("fifo", "character device"), or raise OSError for one it may not (a socket, a
    block device); None for a regular file or none at all."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISSOCK(mode):
        raise OSError(errno.ENXIO, "a socket, not a file; name a file, a FIFO or a device")
    raise OSError(errno.EINVAL, "a block device, not a file; name a file, a FIFO or a device")


def write_stream(path: str, data: bytes, kind: str) -> None:
    """Write `data` into a FIFO or a character device as a stream: opened without creating or
    truncating anything, never replaced. A FIFO nobody reads yet is waited for, as a shell's
    `>` waits, and Ctrl-C ends the wait."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if kind == "fifo":
        import fcntl

        while True:
            try:
                fd = os.open(path, flags | os.O_NONBLOCK)
                break
            except OSError as err:
                if err.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
            checkpoint()
            time.sleep(_POLL_S)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    else:
        fd = os.open(path, flags)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
