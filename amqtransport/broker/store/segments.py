"""Segment files: their format, scanning them, and reading records back at positions.

Theory of operation
-------------------
A segment file ``seg-<id>.log`` starts with the 8-byte magic ``AMQJSEG1`` followed by
framed records (``u32 length | u32 crc32(payload) | payload``); a record inside a
transaction's record has a u32 length and no frame or CRC of its own (its position
carries the ``INNER`` flag, see :mod:`.pages`). :func:`scan_segment` and :class:`Scan`
walk a segment's frames and stop at the first bad one (what recovery truncates).

Preallocated segments (issue 27). The writer creates a head segment at its full
``segment_size`` (``fallocate``, :func:`~.files.preallocate`) and writes each batch at
its offset (``pwrite``, no ``O_APPEND``): an append then never changes the file's
size, and its ``fdatasync`` need not commit the inode through the filesystem's
journal (on ext4 here: 112-131 us rather than 132-202 us per 300-byte record). So a
segment's written data ends at the first *zero frame head* (``u32 length 0 | u32 crc
0``) that only zeros follow (:func:`zeros_from`): the clean end, with the file's size
past it. The rules:

* :class:`Scan` stops there without a problem, :attr:`Scan.end` at the zero head: the
  segment's *written size* (its data size everywhere: recovery's sizes, the
  checkpoint's, ``amq broker verify``). A short remainder of zeros (fewer than a frame
  head's 8 bytes) is the same clean end.
* A zero frame head with any non-zero byte after it is a bad frame like any other (no
  record has length 0; note ``crc32(b"") == 0``, so the CRC alone would pass it): the
  damage / torn-tail rules of :mod:`.salvage` decide, unchanged.
* A segment written by earlier versions (or when preallocation failed: a full disk,
  a file system without ``fallocate``, where the writer grows the file as before) ends
  at its file's end: the same scan reads it unchanged.
* A segment that stops being the head is cut to its written size: by the writer when
  it rolls to the next (before the roll's ``fdatasync``), and by recovery (which always
  starts a fresh head, so the old one is never written again: its preallocation is
  of no more use, and the new head gets its own). A crash can still leave a finished
  segment with a zero tail; every reader accepts it.

Reading back (:class:`SegmentReads`, the part of :class:`~.journal.Journal` that reads
while its writer thread appends): paged messages (:meth:`SegmentReads.read`) and a
replica's full sync (:meth:`SegmentReads.read_span`) read records at their positions
with ``pread`` on a few cached descriptors, CRC-checked (a zero frame head is no record:
never an empty payload); a run of positions read with one ``pread`` waits until its *last*
position is written (waiting for its first only, it read the preallocated zeros past what
was written, and a replica's full sync failed on the empty payload); a position the writer has not
written yet waits for it (briefly) under the journal's condition, waking the writer if it
sleeps (the broker's loop reads back, in a selective scan, what its own turn appended
and left for the turn's end: without the wake-up it waited for the writer's idle round).
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from amqtransport.errors import ServerError

from .pages import INNER, pack, unpack
from .records import Record, RecordError, decode

__all__ = [
    "FRAME", "FRAME_HEAD", "MAGIC", "MAX_RECORD", "JournalError", "StoreLockedError", "Scan", "SegmentReads",
    "first_nonzero", "scan_segment", "segment_id", "segment_name", "zeros_from",
]

MAGIC = b"AMQJSEG1"
FRAME = struct.Struct("<II")
FRAME_HEAD = FRAME.size  # the journal's u32 length + u32 crc before each payload
#: the largest record recovery reads back; :meth:`Journal.append` refuses larger ones
MAX_RECORD = 1 << 30


class JournalError(ServerError, OSError):
    """The journal could not write or sync; the broker must not claim durability."""


class NotReceipted(JournalError):
    """A replicated master's completion refused for now: the record is on this node's disk,
    but the synced slave was lost before it acknowledged it (it may be taking over without
    it). Waiting again (``Journal.on_durable``) succeeds once a slave has it or the node
    knows its peer did not take over."""


class StoreLockedError(JournalError):
    """Another process holds the data directory."""


def segment_name(seg_id: int) -> str:
    return f"seg-{seg_id:010d}.log"


def segment_id(path: Path) -> int | None:
    name = path.name
    if not (name.startswith("seg-") and name.endswith(".log")):
        return None
    try:
        return int(name[4:-4])
    except ValueError:
        return None


_ZEROS = bytes(1 << 20)


def first_nonzero(view: bytes | memoryview, pos: int) -> int:
    """The offset of the first non-zero byte of ``view`` at or after ``pos`` (its length
    when there is none), at C speed: a preallocated tail is megabytes of zeros."""
    view = memoryview(view)
    end, step = len(view), 4096
    while pos < end:
        chunk = view[pos : pos + step].tobytes()
        if chunk != _ZEROS[: len(chunk)]:
            return pos + len(chunk) - len(chunk.lstrip(b"\0"))
        pos += step
        step = min(step * 2, len(_ZEROS))
    return end


def zeros_from(view: bytes | memoryview, pos: int) -> bool:
    """Whether every byte of ``view`` from ``pos`` on is zero (an unwritten, preallocated
    tail; true when ``pos`` is at or past the end)."""
    return first_nonzero(view, pos) >= len(view)


def scan_segment(
    data: bytes | memoryview, max_record: int = MAX_RECORD
) -> tuple[list[tuple[Record, int]], int, str | None]:
    """Parse one segment's bytes (a frame longer than ``max_record`` counts as corruption).

    Returns ``(records_with_sizes, good_end, problem)``: every intact record with its
    framed size, the offset just after the last intact one, and a description of what
    stopped the scan (``None`` when the data ended cleanly at a frame boundary: the
    file's end or a zero tail, see the module docstring).
    """
    view = memoryview(data)
    if len(view) < len(MAGIC):
        return [], 0, ("short segment header" if len(view) else None)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        return [], 0, "bad segment magic"
    out: list[tuple[Record, int]] = []
    scan = Scan(view, len(MAGIC), max_record)
    for _offset, payload, rec in scan:
        out.append((rec, FRAME.size + len(payload)))
    return out, scan.end, scan.problem


class Scan:
    """Iterate ``(offset, payload, record)`` over the frames of ``view`` from ``pos``;
    afterwards ``end`` is the offset after the last intact frame and ``problem`` what
    stopped the scan (None: the data ended at a frame boundary: the end of ``view``, or
    a zero tail from ``end`` on, which ``zero_tail`` then says)."""

    def __init__(self, view: memoryview, pos: int, max_record: int) -> None:
        self.view = view
        self.end = pos
        self.max_record = max_record
        self.problem: str | None = None
        self.zero_tail = False

    def __iter__(self) -> Iterator[tuple[int, memoryview, Record]]:
        view, pos, end, unpack, crc32 = self.view, self.end, len(self.view), FRAME.unpack_from, zlib.crc32
        while pos < end:
            if end - pos < FRAME.size:
                if zeros_from(view, pos):  # the preallocated tail (module docstring)
                    self.zero_tail = True
                    return
                self.problem = f"torn frame header at offset {pos}"
                return
            length, crc = unpack(view, pos)
            if length == 0:  # no record is empty; crc32(b"") == 0 would pass it
                if crc == 0 and zeros_from(view, pos):
                    self.zero_tail = True  # the clean end of a preallocated segment
                    return
                self.problem = f"empty frame at offset {pos} with data after it"
                return
            if length > self.max_record:
                self.problem = f"impossible record length {length} at offset {pos}"
                return
            start = pos + FRAME.size
            stop = start + length
            if stop > end:
                self.problem = f"torn record at offset {pos} ({end - start} of {length} bytes)"
                return
            payload = view[start:stop]
            if crc32(payload) != crc:
                self.problem = f"checksum mismatch at offset {pos}"
                return
            try:
                rec = decode(payload)
            except RecordError as exc:
                self.problem = f"undecodable record at offset {pos}: {exc}"
                return
            yield pos, payload, rec
            pos = self.end = stop


class SegmentReads:
    """Reading records back from the segment files (see the module docstring)."""

    # the journal's state (set by Journal.__init__)
    directory: Path
    max_record: int
    _cond: threading.Condition
    _written: tuple[int, int]
    _read_waiting: bool
    _read_fds: OrderedDict[int, int]
    _sizes: dict[int, int]
    _thread: threading.Thread | None
    _failed: BaseException | None
    _wake_writer_locked: Callable[[], None]  # JournalWriter's

    def path_of(self, seg_id: int) -> Path:
        return self.directory / segment_name(seg_id)

    def read(self, positions: Sequence[int]) -> list[bytes]:
        """The record payloads at ``positions`` (:func:`.pages.pack`), read back from the
        segment files, CRC-checked (a record inside a transaction's record has no CRC of its
        own: it was checked with its transaction's). Waits (briefly) for the writer when a
        position is not written yet. :class:`JournalError` when a record cannot be read."""
        out: list[bytes] = []
        i, n = 0, len(positions)
        while i < n:
            seg, off, _flags = unpack(positions[i])
            j = i + 1  # a run of positions close together in one segment: one pread
            while j < n and j - i < 1024:
                s2, o2, _f = unpack(positions[j])
                if s2 != seg or o2 < off or o2 - off > (1 << 20):
                    break
                j += 1
            last = unpack(positions[j - 1])[1]
            self._wait_written(seg, last + 8)  # the whole run, not only its first record
            window = self._pread(seg, off, last - off + 65536)
            for p in positions[i:j]:
                out.append(self._payload_at(window, off, p))
            i = j
        return out

    def candidates(self, positions: Sequence[int], needles: Sequence[bytes]) -> list[int]:
        """Indexes (into ``positions``, increasing) of the records that may hold one of
        ``needles``: every record at ``positions`` whose bytes hold one is among them, and
        the others are not read one by one -- the segment's bytes around them are searched
        at C speed (``bytes.find``), so a miss costs no slice and no CRC (a candidate is
        read, and checked, by :meth:`read`). A run that cannot be read: all candidates."""
        out: list[int] = []
        i, n = 0, len(positions)
        while i < n:
            seg, off, _flags = unpack(positions[i])
            offsets = [off]
            j = i + 1  # a run close together in one segment, as read() reads them: one pread
            while j < n and j - i < 4096:
                s2, o2, _f = unpack(positions[j])
                if s2 != seg or o2 < offsets[-1] or o2 - off > (1 << 20):
                    break
                offsets.append(o2)
                j += 1
            try:
                self._wait_written(seg, offsets[-1] + 8)  # every record before the last is whole on disk
                window = self._pread(seg, off, offsets[-1] - off + 65536)
            except (JournalError, OSError):
                window = b""
            if len(window) <= offsets[-1] - off:
                out.extend(range(i, j))
                i = j
                continue
            found: set[int] = set()
            for needle in needles:
                at = window.find(needle)
                while at >= 0:  # the record holding it: the last one starting at or before it
                    found.add(bisect_right(offsets, off + at) - 1)
                    at = window.find(needle, at + 1)
            found.add(j - 1 - i)  # the last one may run past the window
            found.discard(-1)  # (before the first record: another record's bytes)
            out.extend(i + k for k in sorted(found))
            i = j
        return out

    def _payload_at(self, window: bytes, base: int, pos: int) -> bytes:
        seg, off, flags = unpack(pos)
        rel = off - base
        if flags & INNER:
            if rel + 4 > len(window):
                window, rel = self._pread(seg, off, 65536), 0
            (length,) = struct.unpack_from("<I", window, rel)
            start = rel + 4
        else:
            if rel + FRAME.size > len(window):
                window, rel = self._pread(seg, off, 65536), 0
            length, crc = FRAME.unpack_from(window, rel)
            start = rel + FRAME.size
            if length == 0:  # zeros (never written, or lost): crc32(b"") == 0 would pass them
                raise JournalError(f"journal {self.directory}: no record at segment {seg} offset {off}")
        if length > self.max_record:
            raise JournalError(f"journal {self.directory}: no record at segment {seg} offset {off}")
        if start + length > len(window):
            head = FRAME.size if not flags & INNER else 4
            window, start = self._pread(seg, off, head + length), head
            if len(window) < head + length:
                raise JournalError(f"journal {self.directory}: record at segment {seg} offset {off} is cut short")
        payload = window[start : start + length]
        if not flags & INNER and zlib.crc32(payload) != crc:
            raise JournalError(f"journal {self.directory}: checksum mismatch at segment {seg} offset {off}")
        return payload

    def _pread(self, seg: int, off: int, size: int) -> bytes:
        self._wait_written(seg, off + 8)
        fd = self._read_fds.get(seg)
        if fd is None:
            try:
                fd = os.open(self.path_of(seg), os.O_RDONLY)
            except OSError as exc:
                raise JournalError(f"journal {self.directory}: cannot read segment {seg}: {exc}") from exc
            self._read_fds[seg] = fd
            if len(self._read_fds) > 16:
                os.close(self._read_fds.popitem(last=False)[1])
        else:
            self._read_fds.move_to_end(seg)
        return os.pread(fd, size, off)

    def read_span(self, seg: int, offset: int, max_bytes: int) -> tuple[list[bytes], int, int, bool]:
        """The payloads of whole frames from ``(seg, offset)`` on, as far as the writer has
        written, about ``max_bytes`` of them (at least one when one is written), crossing
        into the next segment when this one is complete. Returns ``(payloads, segment,
        offset, caught_up)``: where to read next, and whether the read stopped at what is
        written (rather than at ``max_bytes``)."""
        out: list[bytes] = []
        used = 0
        while used < max_bytes:
            with self._cond:
                wseg, woff = self._written
            if seg > wseg:
                return out, seg, offset, True
            end = woff if seg == wseg else self._sizes.get(seg, 0)
            if offset >= end:
                if seg < wseg:
                    seg, offset = seg + 1, len(MAGIC)
                    continue
                return out, seg, offset, True
            data = self._pread(seg, offset, min(end - offset, max(max_bytes - used, 0) + 65536))
            at = 0
            while at + FRAME.size <= len(data):
                length, crc = FRAME.unpack_from(data, at)
                if at + FRAME.size + length > len(data):
                    break
                payload = data[at + FRAME.size : at + FRAME.size + length]
                if zlib.crc32(payload) != crc:
                    raise JournalError(f"journal {self.directory}: checksum mismatch at segment {seg} offset {offset + at}")
                out.append(payload)
                used += length
                at += FRAME.size + length
                if used >= max_bytes:
                    break
            if at == 0:  # one frame bigger than the read
                (length,) = struct.unpack_from("<I", data, 0)
                out.append(self._payload_at(self._pread(seg, offset, FRAME.size + length), offset,
                                            pack(seg, offset)))
                used += length
                at = FRAME.size + length
            offset += at
        return out, seg, offset, False

    def forget_reader(self, seg: int) -> None:
        fd = self._read_fds.pop(seg, None)
        if fd is not None:
            os.close(fd)

    def _wait_written(self, seg: int, end: int) -> None:
        if self._thread is None:
            return
        with self._cond:
            if (seg, end) <= self._written:
                return
            self._read_waiting = True
            # the position may be in what this very thread queued and left for the end of
            # its turn (the broker loop's inline commit, journal.py): the writer must take it
            self._wake_writer_locked()
            try:
                ok = self._cond.wait_for(
                    lambda: (seg, end) <= self._written or seg < self._written[0] or self._failed is not None, 30.0
                )
            finally:
                self._read_waiting = False
            if not ok or self._failed is not None and not (seg < self._written[0] or (seg, end) <= self._written):
                raise JournalError(f"journal {self.directory}: segment {seg} offset {end} was never written")
