"""Full-disk faults (tests, the chaos nemesis): a size-limited tmpfs, grown or filled on demand.

``with tmpfs(path, 8 << 20):`` mounts ``mount -t tmpfs -o size=8388608 tmpfs PATH``
(root only, Linux) and unmounts it on exit, even when the test fails; a process still
using it (a broker that was not stopped) gets a lazy unmount instead. Where mounting is
not allowed :class:`TmpfsUnavailable` says why, so a test can skip with that reason.
:func:`fill` writes a filler file until the filesystem is full (ENOSPC); deleting the
file gives the space back. :func:`resize` grows (or shrinks) a mounted tmpfs in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from amqtransport.errors import AmqTransportError

__all__ = ["TmpfsUnavailable", "tmpfs", "resize", "fill"]


class TmpfsUnavailable(AmqTransportError, RuntimeError):
    """A tmpfs cannot be mounted here (not root, no mount(8), a container without the right)."""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30)


@contextlib.contextmanager
def tmpfs(path: str | Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` (created if missing) for the ``with`` body."""
    where = Path(path)
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        raise TmpfsUnavailable("no mount(8) on this machine")
    if os.geteuid() != 0:
        raise TmpfsUnavailable("mounting a tmpfs needs root")
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
    if done.returncode != 0:
        raise TmpfsUnavailable(f"mount -t tmpfs at {where} failed: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        if _run("umount", str(where)).returncode != 0:
            _run("umount", "-l", str(where))  # still busy: detach now, freed when unused


def resize(path: str | Path, size: int) -> None:
    """Give the tmpfs mounted at ``path`` a new size (e.g. room again after a full disk)."""
    done = _run("mount", "-o", f"remount,size={size}", str(path))
    if done.returncode != 0:
        raise OSError(f"remount of {path} with size={size} failed: {done.stderr.strip()}")


def fill(directory: str | Path, name: str = "filler") -> Path:
    """Write ``directory/name`` until the filesystem is full; returns the file."""
    target = Path(directory) / name
    chunk = b"\0" * (64 << 10)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return target
