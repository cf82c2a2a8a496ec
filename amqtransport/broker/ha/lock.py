"""Exclusive file lock deciding the master of a shared-store pair.

Theory of operation
-------------------
Both nodes of a shared-store pair open the same ``<data-dir>/ha.lock`` file and try
``flock(LOCK_EX | LOCK_NB)`` on it. The kernel grants it to one open file description
at a time and drops it when the holder's process dies (SIGKILL included) or closes the
file, so "holds the lock" is exactly "is the master". The waiting node polls every
``interval`` seconds (:func:`wait_for_lock`); a poll costs one syscall. ``flock`` is
per open file, not per process, so two nodes inside one test process exclude each
other too (POSIX ``lockf`` would not). On Linux NFS clients ``flock`` is emulated with
byte-range locks and works across hosts; on other shared filesystems check that it
does before trusting a pair to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["FileLock", "wait_for_lock"]


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
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
