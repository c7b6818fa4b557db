"""Writing a user's file back: in one step, only if it is still what was read, never a
read-only one; and removing only the temporary files that a gpu2tpu write provably made.

A rewrite reads a file, works on it (a 5 MB file takes minutes), then replaces it. Whatever
happened to the file meanwhile wins: `write_atomic` compares the file's size, modification
time and a hash of its bytes at replace time with what was read (`Snapshot`) and leaves a
file that changed (`ChangedDuringRun`). The check and the rename are two system calls, so an
edit saved in the microseconds between them is not caught; an editor that saves by rename
gives the file a new inode, which the last check before the rename sees.

Temporary files are named `.NAME.PID.XXXXXXXX.DIGEST.gpu2tpu`, DIGEST a hash of the bytes the
temporary was given. A run killed between writing the temporary and the rename (SIGKILL; a
SIGTERM or Ctrl-C removes it) leaves one; the next rewrite removes it only when its bytes
still hash to its name, it is over a minute old and its process is gone. A file of the user's
that happens to match the pattern is never removed (the odds that its bytes hash to its own
name are 2**-64), nor is a temporary cut short mid-write.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TEMPORARY = re.compile(
    r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]{8}\.(?P<digest>[0-9a-f]{16})\.gpu2tpu$"
)
STALE_AFTER_S = 60.0  # a write takes milliseconds; a temporary this old was left behind


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """What a file was when it was read: replaced only while it still is."""

    size: int
    mtime_ns: int
    inode: int
    digest: str

    @classmethod
    def of(cls, st: os.stat_result, data: bytes) -> Snapshot:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, digest(data))

    def matches(self, path: Path) -> bool:
        """Whether `path` holds what was read: same size, time and inode, same bytes."""
        try:
            st = path.stat()
            if (st.st_size, st.st_mtime_ns, st.st_ino) != (self.size, self.mtime_ns, self.inode):
                return False
            return digest(path.read_bytes()) == self.digest
        except OSError:
            return False


class ChangedDuringRun(OSError):
    """The file is no longer what was read: someone saved it while the run worked on it."""


class ReadOnly(OSError):
    """The file may not be written (its mode, or this user's rights): it is left as it is."""


def is_read_only(path: Path, st: os.stat_result) -> bool:
    """No write bit at all (root ignores the bits: ruff and black leave such a file too), or
    not writable by this user: the effective one, which the write runs as (a process whose
    real user differs, such as a setuid one, asks for it)."""
    effective = os.access in os.supports_effective_ids
    return not st.st_mode & 0o222 or not os.access(path, os.W_OK, effective_ids=effective)


def write_atomic(path: str, text: str, encoding: str, snapshot: Snapshot | None = None) -> None:
    """Replace `path` with `text` in one step, keeping encoding, BOM, newlines, mode (setuid,
    setgid and sticky bits too), owner and group, and extended attributes (those this process
    may set: ACLs and `user.*`; as root, also `trusted.*` and `security.*`). Not kept: the
    file's other names, when it has hard links (they keep the old text: the new text is a new
    file).

    With `snapshot`, only while the file still is what was read (else `ChangedDuringRun`). A
    read-only file raises `ReadOnly`. A symbolic link is written through: its target is
    replaced, the link stays.
    """
    target = Path(os.path.realpath(path))
    data = text.encode(encoding)
    if encoding == "utf-8-sig" and not data.startswith(b"\xef\xbb\xbf"):
        data = b"\xef\xbb\xbf" + data
    st = target.stat()
    if is_read_only(target, st):
        raise ReadOnly(13, "read-only file", str(target))
    from .pool import hold_stop

    # From here the write is not cut short (it takes milliseconds): a worker told to stop
    # finishes it and says how it went (pool.py); in a single process, Ctrl-C waits for it.
    # Else a stop between creating the temporary and the `try` below would leave it behind.
    hold_stop()
    with _sigint_held():
        fd, tmp = tempfile.mkstemp(
            prefix=f".{target.name}.{os.getpid()}.",
            suffix=f".{digest(data)}.gpu2tpu",
            dir=target.parent,
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            # Owner first: a change of owner clears the setuid and setgid bits the mode sets.
            _keep_owner(tmp, st)
            _keep_attributes(str(target), tmp)
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if snapshot is not None and not snapshot.matches(target):
                raise ChangedDuringRun(16, "changed during the run", str(target))
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT held back (main thread only: signals go there) while a write is under way."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _keep_owner(tmp: str, st: os.stat_result) -> None:
    """Give the new file the old one's owner and group, as far as this process may (root may
    set both; others may set a group they belong to; else the file is theirs, as with an
    editor's save)."""
    if not hasattr(os, "chown"):
        return
    for uid, gid in ((st.st_uid, st.st_gid), (-1, st.st_gid)):
        try:
            os.chown(tmp, uid, gid)
            return
        except OSError:
            continue


def _keep_attributes(source: str, tmp: str) -> None:
    """Copy `source`'s extended attributes onto `tmp`, each one this process may set."""
    if not hasattr(os, "listxattr"):
        return
    try:
        names = os.listxattr(source)
    except OSError:  # a file system without them
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.setxattr(tmp, name, os.getxattr(source, name))


# -- what a killed run left --------------------------------------------------------------------


def temporaries_of(path: Path) -> list[str]:
    """The temporaries beside `path` named as a write of `path` names them."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [
        str(path.parent / n)
        for n in names
        if n.startswith(prefix) and (m := TEMPORARY.match(n)) and m["name"] == path.name
    ]


def remove_stale_temporaries(candidates: Iterable[str]) -> list[str]:
    """Delete the complete temporaries a killed write left: their bytes hash to their name,
    older than a minute, their process gone. Anything else is left, whatever its name."""
    removed = []
    now = time.time()
    for path in dict.fromkeys(candidates):
        match = TEMPORARY.match(os.path.basename(path))
        if match is None:
            continue
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < STALE_AFTER_S:
                continue
            if _alive(int(match["pid"])):
                continue
            with open(path, "rb") as handle:
                if digest(handle.read()) != match["digest"]:
                    continue
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
