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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "replace_file", "write_all"]


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
