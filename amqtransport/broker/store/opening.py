"""Opening a journal: its directory lock, the record of its segments, and recovery.

Theory of operation
-------------------
:class:`JournalOpening` is the half of :class:`~.journal.Journal` that runs before its
writer starts (state set by the journal's ``__init__``; see the journal's module
docstring, *Recovery*). :meth:`~JournalOpening.lock` takes the data directory's
``LOCK`` (one broker per directory). :meth:`~JournalOpening.check_chain` reads the
record of the segments created and deleted (:mod:`.chain`) and refuses a journal that
lost one. :meth:`~JournalOpening.recover_from` fsyncs every segment (what a killed
predecessor left in the page cache), then reads them in id order through
:func:`~.salvage.recover_segment` (a torn tail cut, damage skipped and reported, a
preallocated zero tail cut: every segment's file size is then its written size) and
sets the sizes and the new head's id: after every id ever used, so a new segment never
takes the name of one compaction deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .chain import Chain, check_chain, write_chain
from .records import Record
from .salvage import Damage, recover_segment
from .segments import MAGIC, StoreLockedError
from .segments import segment_id as _segment_id

__all__ = ["JournalOpening"]

log = logging.getLogger("amqtransport.broker.store.journal")  # the journal's log, as before the split


class JournalOpening:
    """Opening and recovering a :class:`~.journal.Journal` (see the module docstring)."""

    # the journal's state (set by Journal.__init__)
    directory: Path
    fsync: bool
    max_record: int
    damage: list[Damage]
    chain: Chain | None
    _chain_lock: threading.Lock
    _lock_fd: int | None
    segments: list[int]
    _sizes: dict[int, int]
    size: int
    _head: int
    _written: tuple[int, int]

    if TYPE_CHECKING:
        def path_of(self, seg_id: int) -> Path: ...  # SegmentReads.path_of

    def lock(self) -> None:
        """Take the exclusive lock on the journal directory (one broker per data dir)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StoreLockedError(
                f"journal {self.directory} is in use by another broker process"
            ) from exc
        self._lock_fd = fd

    def _damaged(self, damage: Damage) -> None:
        self.damage.append(damage)
        log.error("journal %s: %s (recovery skips it and reads on: `amq broker verify` reports, `amq broker "
                  "repair` salvages)", self.directory, damage)

    def existing_segments(self) -> list[int]:
        ids = [i for p in self.directory.glob("seg-*.log") if (i := _segment_id(p)) is not None]
        return sorted(ids)

    def check_chain(self) -> Chain:
        """Read the record of deleted segments (:mod:`.chain`; a journal without one gets
        one now) and raise :class:`~.chain.SegmentsLost` when a segment is missing that
        compaction did not delete. Runs before recovery."""
        self.chain = check_chain(self.directory, self.existing_segments(), fsync=self.fsync)
        return self.chain

    def _update_chain(self, change: Callable[[Chain], Chain]) -> Chain:
        """Write ``change(record)`` durably, then keep it (any thread)."""
        with self._chain_lock:
            chain = change(self.chain or Chain.of(self.segments))
            write_chain(self.directory, chain, fsync=self.fsync)
            self.chain = chain
            return chain

    def _next_id(self, ids: Sequence[int]) -> int:
        """The new head's id: after every id on disk, created or deleted (never one used before)."""
        chain = self.chain or Chain()
        return max([*ids, chain.top, chain.floor - 1, *chain.ids]) + 1

    def record_created(self, seg_id: int) -> None:
        """Record that segment ``seg_id`` exists (:mod:`.chain`), durably: the writer calls
        this once the file and its directory entry are synced, before the segment's first
        record. An :class:`OSError` fails the write that needed the segment."""
        self._update_chain(lambda chain: chain.created(seg_id))

    def _sync_existing(self, ids: list[int]) -> None:
        """fsync every segment before reading it: what a crashed predecessor (a killed
        process, not a lost machine) wrote and never fsynced is still only in the page
        cache, readable as if on disk. Recovery builds on it and the next checkpoint
        records those sizes as durable; a power loss then took the bytes and the
        checkpoint proved records lost (found by the nemesis: a shared store's master
        killed, the next one recovered its unsynced tail of segment 221, power lost).

        Only the last segment can be unsynced if every run had ``fsync`` on (the writer
        fdatasyncs a segment before it rolls to the next; repair and the torn-tail cut
        fsync what they rewrite), but nothing on disk says so (``BrokerConfig.fsync``):
        a run with it off leaves every segment it wrote in the page cache. So all are
        synced (cheap when clean: 200 synced 1 MiB files took 9 ms here)."""
        for seg_id in ids:
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(self.path_of(seg_id), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def recover(self) -> Iterator[tuple[int, Record]]:
        """Yield ``(segment_id, record)`` for every intact record; truncate torn tails.

        Must be called (and exhausted) before :meth:`start`.
        """
        for seg, _offset, _payload, rec in self.recover_from():
            yield seg, rec

    def recover_from(
        self, start: tuple[int, int] | None = None
    ) -> Iterator[tuple[int, int, memoryview, Record]]:
        """Yield ``(segment_id, offset, payload, record)`` for every intact record from
        position ``start`` (``(segment, offset)``; None: the beginning), truncating torn
        tails (a segment is cut only after ``start``). Segments before ``start`` are not
        read. ``payload`` is valid until the next item. Must run (to the end) before
        :meth:`start`."""
        if self._lock_fd is None:
            self.lock()
        if self.chain is None:
            self.check_chain()
        ids = self.existing_segments()
        if self.fsync:
            self._sync_existing(ids)
        for n, seg_id in enumerate(ids):
            path = self.path_of(seg_id)
            if start is not None and seg_id < start[0]:
                self._sizes[seg_id] = path.stat().st_size
                continue
            first = len(MAGIC)
            if start is not None and seg_id == start[0]:
                first = max(first, start[1])
            yield from recover_segment(path, seg_id, first, last=n == len(ids) - 1, max_record=self.max_record,
                                       on_damage=self._damaged)
            self._sizes[seg_id] = path.stat().st_size
        self.segments = ids
        self.size = sum(self._sizes.values())
        self._head = self._next_id(ids)
        self._written = (self._head, 0)  # everything before the new head is on disk
