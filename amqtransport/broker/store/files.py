"""Durable file writes of the store: one implementation of the atomic replace and of the
directory fsync.

Theory of operation
-------------------
A small file the store must never find half written (the checkpoint, the segment
chain's record; a pair node's HA state and the witness's leases, :mod:`..ha.epoch` and
:mod:`..ha.witness`) is replaced whole: written into ``<name>.tmp``, fsynced, renamed over
``<name>``, and the directory fsynced so that the rename itself survives a power loss
(:func:`replace_file`). A crash leaves the old file or the new one, never a mix. A
directory entry made or removed (a new segment, a deleted one) is durable only once the
directory is fsynced (:func:`fsync_dir`). With ``fsync=False`` (tests, a store that
promises nothing) the same steps run without the syncs.

A journal segment is preallocated (:func:`preallocate`, see :mod:`.segments`) with the
``fallocate`` system call itself, not ``posix_fallocate``: where the file system does
not support it (a FUSE file system: the power-loss nemesis's), the C library's
``posix_fallocate`` would write a zero byte into every block, and the caller would
rather grow the file as it is written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "preallocate", "pwrite_all", "replace_file", "write_all"]

log = logging.getLogger(__name__)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (files made, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


_fallocate: Callable[[int, int, int, int], int] | None = None
_fallocate_looked = False


def _fallocate_call() -> Callable[[int, int, int, int], int] | None:
    global _fallocate, _fallocate_looked
    if not _fallocate_looked:
        _fallocate_looked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
            _fallocate = fn
        except (OSError, AttributeError):  # no libc fallocate (not Linux): never preallocate
            _fallocate = None
    return _fallocate


def preallocate(fd: int, size: int) -> bool:
    """Allocate the file's blocks up to ``size`` bytes (its size becomes ``size``; the new
    bytes read as zeros): ``fallocate(fd, 0, 0, size)``. False, changing nothing the
    caller relies on, when it cannot (ENOSPC: a full disk; EOPNOTSUPP: a file system
    without it; no such call): the caller then grows the file as it writes, and should
    set the file's size back (a failed ``fallocate`` may have allocated part of it)."""
    fn = _fallocate_call()
    if fn is None:
        return False
    if fn(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    level = logging.DEBUG if err in (errno.EOPNOTSUPP, errno.ENOSYS) else logging.WARNING
    log.log(level, "cannot preallocate %d bytes (%s): the file grows as it is written", size, os.strerror(err))
    return False


def replace_file(directory: Path, name: str, write: Callable[[int], object], *,
                 fsync: bool = True, ready: Callable[[], None] | None = None,
                 mode: int = 0o644, tmp_name: str | None = None) -> None:
    """Replace ``directory/name`` atomically: ``write(fd)`` writes ``name.tmp`` (or
    ``tmp_name``; created with ``mode``), ``ready()`` (which may raise to give up, leaving
    ``name`` as it was), fsync, rename over ``name``, fsync the directory."""
    tmp = directory / (tmp_name or name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write(fd)
        if ready is not None:
            ready()
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)
    if fsync:
        fsync_dir(directory)
