"""Exclusive file lock deciding the master of a shared-store pair.

Theory of operation
-------------------
Both nodes of a shared-store pair open the same ``<data-dir>/ha.lock`` file and try
``flock(LOCK_EX | LOCK_NB)`` on it. The kernel grants it to one open file description
at a time and drops it when the holder's process dies (SIGKILL included) or closes the
file, so "holds the lock" is exactly "is the master". The waiting node polls every
``interval`` seconds (:func:`wait_for_lock`); a poll costs one syscall. ``flock`` is
per open file, not per process, so two nodes inside one test process exclude each
other too (POSIX ``lockf`` would not).

A lock belongs to a file (an inode), not to a name. If ``ha.lock`` is deleted or
replaced while the master holds it, the master still holds the lock on the old,
unnamed inode and the other node can create and lock a new file under the same name.
So :meth:`FileLock.try_acquire` checks after locking that the name still leads to the
file it locked; the master checks the same every poll (:meth:`FileLock.still_ours`)
and, when the name leads elsewhere, locks the file it leads to now
(:meth:`FileLock.relock`) or, failing that for a while, fences itself (node.py). A
node that has just taken a new ``ha.lock`` also makes sure the journal is free
(:func:`is_locked`) before it raises the epoch: if the old master still holds the
journal's own lock (``journal/LOCK``), the lock file was replaced under a live
master, and the node lets go and stays slave.

Shared filesystems. On Linux NFS clients ``flock`` is emulated with POSIX byte-range
locks held by the NFS server's lock manager: they work across hosts, but a lock is a
*lease* (NFSv4; NLM for v3): a client cut off from the server for longer than the
lease period loses its locks without being told, while its process goes on as if it
held them, and the other node can then take the lock. The inode check above does not
see that (the name still leads to the same file); neither does the journal lock,
which is a second ``flock`` on the same filesystem with the same lease. What the
journal lock still guarantees: two processes on hosts that both see the lock server
never open the journal for writing at the same time, and a replaced ``ha.lock`` alone
never lets a second writer in. Use a shared store only on a filesystem whose locks
survive the failures you plan for (local disks with a cluster filesystem that fences
a node it loses, or NFS with hard mounts and a lease longer than any pause); on other
shared filesystems check that ``flock`` works across hosts at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["FileLock", "is_locked", "wait_for_lock"]


class FileLock:
    """A non-blocking exclusive ``flock`` on one file; :meth:`try_acquire` never waits."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; ``True`` when we hold it afterwards."""
        if self._fd is not None:
            return True
        fd = self._lock_path()
        if fd is None:
            return False
        self._fd = fd
        return True

    def _lock_path(self) -> int | None:
        """An fd of the file the path names now, locked by us; None when it is locked by
        another, or the name moved to another file meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if not _same_file(self.path, fd):  # deleted or replaced between open and flock
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def still_ours(self) -> bool:
        """True while we hold the lock and the path still names the file we locked."""
        return self._fd is not None and _same_file(self.path, self._fd)

    def relock(self) -> bool:
        """The path names another file (or none): lock the file it names now (creating it)
        and let the old one go. False (the old lock still held) when that file is locked
        by someone else."""
        fd = self._lock_path()
        if fd is None:
            return False
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def is_locked_by_other(self) -> bool:
        """True when somebody else holds the lock right now (probes without keeping it)."""
        if self._fd is not None:
            return False
        if self.try_acquire():
            self.release()
            return False
        return True


def _same_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def is_locked(path: str | Path) -> bool:
    """True when another open file holds an exclusive ``flock`` on ``path`` right now
    (probes without keeping it; a missing file is not locked and is not created)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


async def wait_for_lock(
    lock: FileLock,
    interval: float,
    *,
    stop: asyncio.Event | None = None,
    may_take: Callable[[], bool] = lambda: True,
) -> bool:
    """Poll until the lock is ours (``True``) or ``stop`` is set (``False``).

    ``may_take`` is consulted before each attempt (failback: a node that just yielded
    waits until the returning node has taken over).
    """
    while True:
        if stop is not None and stop.is_set():
            return False
        if may_take() and lock.try_acquire():
            return True
        if stop is None:
            await asyncio.sleep(interval)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
