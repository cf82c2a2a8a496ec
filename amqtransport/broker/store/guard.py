"""Is the journal still on a disk that exists? The checks behind "never receipt into deleted files".

Theory of operation
-------------------
A running broker holds its segment files and its ``LOCK`` file open. When the data
directory is deleted (``rm -rf``), replaced (a volume re-attached, a bind mount that went
away and left the empty directory underneath), or made read-only, every ``write`` and
``fdatasync`` on those open files still succeeds: the bytes go to inodes that no path
names any more, and vanish with the process. Only creating the next segment fails
(``ENOENT``), which at 32 MiB a segment can be a long time later -- with every record
receipted meanwhile lost on restart.

:class:`StorageGuard` takes the identity of the journal directory (device and inode)
and of its lock file when the journal opens, and :meth:`StorageGuard.problem` says what
changed since, or None:

* the open head segment or the lock file has no name left (``st_nlink == 0``: deleted);
* the directory's path is gone, or names another directory (device/inode changed);
* the lock file's path names another file (replaced: another broker could lock it);
* the directory is no longer writable (a read-only remount, a permission change).

The journal's writer thread (:mod:`.journal`) runs the cheap part (:meth:`quick`: whether
the head segment's name is gone, and one ``stat`` of the directory) after every group
commit's fsync and *before* the batch's completions run, so no receipt goes out for a
record appended into a file that no longer exists; and the whole check whenever it has
been idle for :data:`CHECK_INTERVAL` seconds, so an idle broker notices within about a
second too. A problem is a journal failure like ``ENOSPC``: the batch's senders get
their ERROR, appends are refused, and the broker fences (``server.py``; an HA master
hands over to its in-sync slave). A background storage task that fails (a checkpoint
that cannot be written) asks for a check at once (:meth:`.journal.Journal.check_soon`).

The head segment's name is read from ``/proc/self/fd`` (:func:`unlinked`: the kernel
marks an open file whose name was removed ``(deleted)``), not with ``fstat``: since Linux
6.13 a ``stat`` that reads a file's change time makes its next write take a fine-grained
timestamp, which dirties the inode, and the next ``fdatasync`` then writes it (measured
here, issue 27: 125-136 us instead of 86-90 us for a 308-byte record in a preallocated
segment). Where there is no ``/proc``, ``fstat``'s ``st_nlink`` says it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CHECK_INTERVAL", "StorageGuard", "unlinked"]

#: seconds an idle journal writer waits between two whole checks
CHECK_INTERVAL = 0.5


def unlinked(fd: int) -> bool:
    """Whether the open file ``fd`` has lost the name it was opened by (deleted, or
    replaced by a rename), without reading its attributes (see the module docstring)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        if os.path.isdir("/proc/self/fd"):
            raise OSError(f"descriptor {fd} is not open") from None
        return os.fstat(fd).st_nlink == 0  # no /proc
    except OSError:
        return os.fstat(fd).st_nlink == 0
    return target.endswith(" (deleted)")


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class StorageGuard:
    """The journal directory and lock file as they were when the journal opened."""

    def __init__(self, directory: Path, lock_fd: int | None) -> None:
        self.directory = directory
        self.lock_fd = lock_fd
        self.dir_id = _identity(os.stat(directory))
        self.lock_id = _identity(os.fstat(lock_fd)) if lock_fd is not None else None

    def quick(self, head_fd: int | None, head_name: str = "the open segment") -> str | None:
        """What the writer checks after each fsync: the head segment still has a name, the
        directory is still the one we opened."""
        if head_fd is not None:
            try:
                if unlinked(head_fd):
                    return f"{head_name} was deleted (it has no name left in {self.directory})"
            except OSError as exc:
                return f"cannot check {head_name}: {exc}"
        return self._directory()

    def problem(self, head_fd: int | None, head_name: str = "the open segment") -> str | None:
        """Every check (see the module docstring); None when the journal is where it was."""
        found = self.quick(head_fd, head_name)
        if found is not None:
            return found
        if self.lock_fd is not None and self.lock_id is not None:
            lock_path = self.directory / "LOCK"
            try:
                if os.fstat(self.lock_fd).st_nlink == 0:
                    return f"its lock file {lock_path} was deleted"
                if _identity(os.stat(lock_path)) != self.lock_id:
                    return f"its lock file {lock_path} was replaced by another file"
            except FileNotFoundError:
                return f"its lock file {lock_path} was deleted"
            except OSError as exc:
                return f"cannot stat its lock file {lock_path}: {exc}"
        if not os.access(self.directory, os.W_OK):
            return f"the journal directory {self.directory} is no longer writable"
        return None

    def _directory(self) -> str | None:
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            return f"the journal directory {self.directory} is gone"
        except OSError as exc:
            return f"cannot stat the journal directory {self.directory}: {exc}"
        if _identity(st) != self.dir_id:
            return (f"the journal directory {self.directory} was replaced (device/inode changed: "
                    "another directory or volume has its name now)")
        return None
