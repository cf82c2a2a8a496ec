"""Append-only, checksummed, group-committed journal of segment files.

Theory of operation
-------------------
The journal is a directory of segment files ``seg-<id>.log`` (ids increase; the
highest is the *head*, the only one written). A segment starts with the 8-byte magic
``AMQJSEG1`` followed by framed records::

    u32 length | u32 crc32(payload) | payload (length bytes; see records.py)

A new head segment is preallocated to ``segment_size`` and written at its offsets (an
append's ``fdatasync`` then does not change the file's size); its data ends at a zero
frame head with only zeros after it. The format, that rule, scanning a segment and
reading records back at their positions are :mod:`.segments` (:class:`~.segments.SegmentReads`, which :class:`Journal` inherits);
this module writes.

Writing (group commit). :meth:`Journal.append` runs on the caller's thread (the
broker's event loop): it frames the payloads, assigns them to the head segment
(rolling to a new segment once the head passes ``segment_size``), queues the bytes
and the caller's completion callback, and returns at once. One writer thread takes
*everything* queued since its last round, writes it with one ``write`` per segment,
calls ``fdatasync`` once, runs the batch hooks (replication gates), and then hands
all the round's callbacks back in one call to ``notify`` (the broker passes a
function that schedules them on its loop with a single ``call_soon_threadsafe``).
While one fsync is in flight the next batch accumulates, so N concurrent producers
cost one fsync, not N. A caller that may block for an fsync (a slave's replication
loop) can instead commit a small batch on its own thread when the writer is idle
(:meth:`~.writer.JournalWriter.commit_here`: the same write, fsync, checks and hooks,
one batch at a time, without the two thread hand-offs). The broker's loop does so at
the end of each turn that appended with the writer asleep (:attr:`Journal.inline_thread`,
``on_queued``, :meth:`Journal.commit_turn`): a lone receipted send (window 1) is read,
written, fsynced and receipted in two loop turns and no thread hop; a turn that
appended more than a few records hands them to the writer as before. A receipt for a persistent SEND is sent from such a callback,
i.e. only once its record is on disk. The writer thread's code is :mod:`.writer`.

Recovery. :meth:`Journal.recover` reads the segments in id order and yields every
record whose frame is complete and whose CRC matches. A bad frame (short header,
impossible length, CRC mismatch, undecodable payload) with nothing intact after it at
the end of the last segment is a torn tail from a crash mid-write: it is cut off. Any
other bad frame is damage, and recovery never destroys what it could read: it skips
just the damaged bytes, reads on from the next intact frame and reports what was lost
(:mod:`.salvage`, :attr:`Journal.damage`). Recovery always starts a fresh head segment.
Taking the directory's lock, checking the chain and the recovery scan are :mod:`.opening`.

Compaction. The store decides which segments hold nothing needed any more and calls
:meth:`Journal.delete_segments`; the writer deletes them only after the batch that was
queued before the request (which carries anything the store moved forward) is durable.
The ids are first recorded as deleted (:mod:`.chain`), so that recovery can tell a
segment compaction deleted from one that is lost: a lost one refuses the start
(:meth:`Journal.check_chain`, :class:`~.chain.SegmentsLost`). Likewise every new
segment is recorded as created (:meth:`Journal.record_created`, by the writer once the
file and its directory entry are synced, before its first record), so losing the newest
segments is a loss recovery sees too.

Failure. When a write or an fsync fails (a full disk: ENOSPC; an I/O error: EIO) the
writer fails that batch's completions *and everything queued meanwhile* with a
:class:`JournalError` naming the cause, refuses every later append, calls
``on_failure`` once and stops. Nothing it failed was acknowledged as durable; the
broker fences itself (see ``server.py``). A record that was partly written is a torn
tail for the next recovery; one that was wholly written but not fsynced may survive.

The disk under it. A data directory deleted, replaced or made read-only under a running
broker leaves every write and fsync on the open files succeeding, into files no path
names any more (:mod:`.guard`). So after each fsync, before the batch's completions run,
the writer checks that the head segment still has a name and the directory is the one
it opened (and every :data:`~.guard.CHECK_INTERVAL` seconds, idle or not, the whole
check: the lock file too, and that the directory is writable); a problem fails the
journal exactly as a failed write does: no receipt for a record in a deleted file.

Size. :attr:`Journal.size` is the bytes of all segments (head included) as appended
(their written sizes, not the head's preallocated file size), minus the segments handed
to :meth:`delete_segments`: what ``store_limit`` measures.

Replication hooks. :meth:`Journal.add_batch_hook` registers ``fn(payloads)`` that
the writer calls after each local fsync with the batch's record payloads; when it
returns a ``concurrent.futures.Future`` the batch's callbacks wait for it (a
replicating master uses this to receipt only once the slave has the records).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from ..ops.stats import LATENCY_BUCKETS, RECEIPT_PATH, SIZE_BUCKETS, Histogram
from .chain import Chain
from .guard import StorageGuard
from .opening import JournalOpening
from .records import RecordTooLarge
from .salvage import Damage
from .segments import FRAME as _FRAME
from .segments import (
    MAGIC,
    MAX_RECORD,
    JournalError,
    NotReceipted,
    SegmentReads,
    StoreLockedError,
    scan_segment,
)
from .writer import (
    BatchHook,
    Callback,
    JournalWriter,
    after_completions,
    leave_turn_to_writer,
    run_completions,
    take_turn_to_writer,
)

#: :meth:`Journal.commit_turn` commits on the loop while its commits there take at most
#: the two hand-offs (:attr:`Journal.handoffs`, as measured) longer than the writer
#: thread's; this much (seconds) until they have been measured...
INLINE_MARGIN = 0.00005
#: ...and every this many turns tries the other way
INLINE_PROBE_EVERY = 16
#: a commit on the loop (:meth:`Journal.commit_turn`) slower than this (seconds)...
INLINE_SLOW = 0.05
#: ...leaves every turn's records to the writer thread for this long (seconds)
INLINE_PAUSE = 1.0

__all__ = [
    "RECEIPT_PATH",
    "after_completions",
    "leave_turn_to_writer",
    "Journal",
    "JournalError",
    "NotReceipted",
    "StoreLockedError",
    "Callback",
    "BatchHook",
    "MAGIC",
    "MAX_RECORD",
    "run_completions",
    "scan_segment",
]

log = logging.getLogger(__name__)

class Journal(JournalOpening, SegmentReads, JournalWriter):
    """Segment files + a group-commit writer thread. See the module docstring."""

    def __init__(
        self,
        directory: str | Path,
        *,
        segment_size: int = 32 << 20,
        fsync: bool = True,
        notify: Callable[[list[tuple[Callback, BaseException | None]]], None] | None = None,
        max_record: int = MAX_RECORD,
        on_failure: Callable[[JournalError], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.segment_size = segment_size
        #: create each head segment at ``segment_size`` (segments.py: an fdatasync that does
        #: not change the file's size); False: grow it as it is written (the format before)
        self.preallocate = True
        self._preallocated = False  # the head segment is (writer thread)
        self.max_record = max_record  # recovery's limit, so append's too (tests use a small one)
        self.fsync = fsync
        self._notify = notify or run_completions
        self._on_failure = on_failure  # writer thread, once, after the failed batch's completions
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: list[bytes | tuple[str, object]] = []
        self._callbacks: list[Callback] = []
        self._payloads: list[bytes] = []
        self._hooks: list[BatchHook] = []
        self._appended = 0  # records queued so far
        self.appended_bytes = 0  # bytes queued so far (framing included)
        self._durable_bytes = 0  # of those, the bytes written and synced
        self.last_frame: tuple[int, int, int] | None = None  # (segment, offset, crc) of the newest frame
        self._durable = 0  # records durable so far
        self._closing = False
        self._busy = False
        self._waiting = False  # the writer sleeps on the condition
        #: False: an append leaves a sleeping writer asleep; the appender then calls
        #: commit_here, which commits on its own thread or wakes the writer (a slave's link
        #: does: its fsync then needs no thread hand-off). The writer still takes whatever
        #: is queued when its CHECK_INTERVAL wait ends, so nothing waits longer than that.
        self.wake_on_append = True
        #: the thread of the loop that may commit here (the broker's event loop; None: none):
        #: an append on it that finds the writer asleep leaves the writer asleep and calls
        #: ``on_queued()`` once, which schedules :meth:`commit_turn` at the end of the loop
        #: turn (every record the turn appended in one batch, fsynced there when few, or
        #: handed to the writer): a lone receipted send then needs no thread hand-off
        self.inline_thread: int | None = None
        self.on_queued: Callable[[], None] | None = None
        #: runs the completions :meth:`commit_turn` committed, on the loop (a replicating
        #: master puts its receipt gate here); default: run them at once
        self.deliver_here: Callable[[list[tuple[Callback, BaseException | None]]], None] = run_completions
        self._turn_due = False  # on_queued was called and commit_turn has not run since
        self._inline_paused_until = 0.0  # time.monotonic() until which commit_turn leaves all to the writer
        #: moving averages (seconds) of one commit's write + fdatasync + checks, as measured on
        #: the writer thread and on a caller's (commit_here): a thread that gets its CPU back
        #: late after the fdatasync (a loop thread on a crowded machine) shows it here
        self.sync_writer: float | None = None  # (None: no commit measured yet)
        self.sync_here: float | None = None
        #: moving averages (seconds) of what a turn left to the writer costs besides its
        #: commit, measured on such turns: waking the sleeping writer (the append, or
        #: commit_turn, until the writer runs) and handing the completions back (the
        #: writer's ``notify`` until the first of them runs on the loop)
        self.wake_writer: float | None = None
        self.handback_writer: float | None = None
        self._turns = 0  # commit_turn calls that could commit here
        self._woken_at = 0.0  # perf_counter() when an append woke the sleeping writer (0: none since)
        self._queued_at = 0.0  # perf_counter() when the first record of the next batch was queued
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._head = 0
        self._head_size = 0
        self._head_records = 0
        self._roll_next = False  # the head holds a batch appended alone: the next append rolls
        self.segments: list[int] = []  # existing segment ids, ascending (head last)
        self._sizes: dict[int, int] = {}  # segment id -> bytes (as appended; loop thread)
        self.size = 0  # bytes of every segment on disk, head included (store_limit)
        self._lock_fd: int | None = None
        self._guard: StorageGuard | None = None  # taken at start(); the writer checks it
        self._check_due = False  # check_soon() asked for a whole check (under _cond)
        self._full_checked = 0.0  # time.monotonic() of the writer's last whole check
        self._fd: int | None = None  # the thread holding the batch (_busy): the writer, or commit_here's caller
        self._fd_seg = -1
        self._fd_off = 0  # bytes in the file self._fd writes (writer thread)
        self._written = (0, 0)  # (segment, offset) up to which the writer has written (under _cond)
        self._read_waiting = False
        self._waiters = 0  # threads in flush() / wait_durable() (under _cond)
        self._read_fds: OrderedDict[int, int] = OrderedDict()  # segment -> fd for reading (loop thread)
        self.bytes_written = 0
        self.batches = 0
        self.records_written = 0
        # metrics (observed by the writer thread): write + fdatasync time of each group
        # commit, and how many records it carried
        self.damage: list[Damage] = []  # damaged regions recovery skipped (salvage.py)
        self.chain: Chain | None = None  # the segments created and deleted (chain.py; check_chain)
        self._chain_lock = threading.Lock()  # one writer of the record at a time (loop: deletes; writer: rolls)
        self.fsync_seconds = Histogram(LATENCY_BUCKETS)
        self.batch_records = Histogram(SIZE_BUCKETS)

    # ------------------------------------------------------------------ writer (opening: opening.py)
    def start(self) -> None:
        """Create the head segment and start the writer thread."""
        if self._lock_fd is None:
            self.lock()
        if not self.segments and self.existing_segments():
            raise JournalError("Journal.recover() must run before start() on a non-empty journal")
        if self.chain is None:
            self.check_chain()
        if self._head == 0:
            self._head = self._next_id(self.existing_segments())
        self._open_head_sync(self._head)
        self._guard = StorageGuard(self.directory, self._lock_fd)
        self._full_checked = time.monotonic()
        self.segments.append(self._head)
        self._head_size = len(MAGIC)
        self._sizes[self._head] = len(MAGIC)
        self.size += len(MAGIC)
        self._thread = threading.Thread(
            target=self._run, name=f"journal-writer:{self.directory}", daemon=True
        )
        self._thread.start()

    @property
    def head(self) -> int:
        return self._head

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def segment_sizes(self) -> dict[int, int]:
        """Segment id -> bytes (as appended), for the segments not handed to :meth:`delete_segments`."""
        return dict(self._sizes)

    def disk_problem(self) -> str | None:
        """The guard's whole check now, from any thread (:mod:`.guard`); None: all well."""
        guard = self._guard
        return guard.problem(None) if guard is not None else None

    def check_soon(self) -> None:
        """Have the writer check the disk under the journal now (:mod:`.guard`), e.g.
        after a background storage task failed; a problem fails the journal."""
        with self._cond:
            self._check_due = True
            self._cond.notify_all()

    def add_batch_hook(self, hook: BatchHook) -> None:
        self._hooks.append(hook)

    def remove_batch_hook(self, hook: BatchHook) -> None:
        with contextlib.suppress(ValueError):
            self._hooks.remove(hook)

    def append(self, payloads: Sequence[bytes], callback: Callback | None = None) -> int:
        """Queue record payloads; returns the segment they will live in.

        ``callback(None)`` runs (through ``notify``) once they are durable, or
        ``callback(error)`` if writing failed. A payload larger than ``max_record``
        (recovery would cut it off as corruption, with the rest of its segment) raises
        :class:`RecordTooLarge` and nothing is queued.
        """
        return self.append_at(payloads, callback)[0]

    def segment_for(self, size: int) -> int:
        """The segment a batch of ``size`` bytes (frames included) appended now goes into."""
        with self._lock:
            return self._head + 1 if self._rolls(size) else self._head

    def _rolls(self, size: int, alone: bool = False) -> bool:
        """Whether a batch of ``size`` bytes appended now starts a new segment (under _lock)."""
        return bool(self._head_records) and (alone or self._roll_next or self._head_size + size > self.segment_size)

    def append_at(self, payloads: Sequence[bytes], callback: Callback | None = None, *,
                  alone: bool = False) -> tuple[int, int]:
        """:meth:`append`, returning ``(segment, offset of the first frame)``: the payloads
        are framed one after the other from there, all in that segment. ``alone``: in a
        segment of their own (the head rolls before them, unless empty, and after them):
        compaction's carried keys (compaction.py, "Carried keys")."""
        for p in payloads:
            if len(p) > self.max_record:
                raise RecordTooLarge(
                    f"a record of {len(p)} bytes is over the journal's limit of {self.max_record} bytes"
                )
        if self._closing:
            raise JournalError("journal is closed")
        if len(payloads) == 1:
            size = len(payloads[0]) + _FRAME.size
        else:
            size = sum(len(p) for p in payloads) + _FRAME.size * len(payloads)
        with self._lock:
            if self._failed is not None:  # checked under the lock the writer fails under
                raise JournalError(f"journal failed earlier: {self._failed}")
            if not self._queue:
                self._queued_at = time.perf_counter()  # a new batch starts (RECEIPT_PATH.journal_queue)
            if self._rolls(size, alone):
                self._head += 1
                self._head_size = len(MAGIC)
                self._head_records = 0
                self.segments.append(self._head)
                self._sizes[self._head] = len(MAGIC)
                self.size += len(MAGIC)
                self._queue.append(("roll", self._head))
            offset = self._head_size
            queue = self._queue
            crc = 0
            for p in payloads:
                crc = zlib.crc32(p)
                queue.append(_FRAME.pack(len(p), crc))
                queue.append(p)
            if payloads:
                self.last_frame = (self._head, offset + size - _FRAME.size - len(payloads[-1]), crc)
            self.appended_bytes += size
            self._payloads.extend(payloads)
            self._head_size += size
            self._sizes[self._head] += size
            self.size += size
            self._head_records += len(payloads)
            self._roll_next = alone
            self._appended += len(payloads)
            if callback is not None:
                self._callbacks.append(callback)
            else:  # nobody waits for this record: no reason to block the loop for its fsync
                leave_turn_to_writer()
            at = self._head, offset
            kick = False
            if self._waiting and self.wake_on_append:
                if self.on_queued is not None and threading.get_ident() == self.inline_thread:
                    kick, self._turn_due = not self._turn_due, True  # commit_turn wakes it if need be
                else:
                    if not self._woken_at:
                        self._woken_at = time.perf_counter()  # RECEIPT_PATH.journal_wakeup
                    self._cond.notify_all()  # flush() waiters share the condition
        if kick:
            self.on_queued()  # type: ignore[misc]  # (checked above, under the lock)
        return at

    def commit_turn(self, max_records: int) -> None:
        """End of a loop turn that appended (``on_queued``): commit what it queued here when
        the writer is idle and it is at most ``max_records`` records
        (:meth:`~.writer.JournalWriter.commit_here`; the completions go to ``deliver_here``),
        else leave it to the writer thread (woken if asleep). After a commit here that took
        longer than :data:`INLINE_SLOW` (a disk in trouble), the writer takes every turn for
        :data:`INLINE_PAUSE` seconds: the loop (its clients, an HA node's pings and stall
        detector) is blocked by one slow fsync at most, not by each."""
        with self._cond:
            self._turn_due = False
        started = time.monotonic()
        if take_turn_to_writer() or started < self._inline_paused_until:
            max_records = 0  # (commit_here then wakes the writer)
        else:
            # here, unless the writer's commits have been faster by more than the two
            # hand-offs saved (measured on the writer's turns); every INLINE_PROBE_EVERY-th
            # turn tries the other way, so that the averages follow the machine's load
            self._turns += 1
            here = self.sync_here is None or self.sync_writer is None or self.sync_here <= self.sync_writer + self.handoffs
            if here == (self._turns % INLINE_PROBE_EVERY == 0):
                max_records = 0
        done = self.commit_here(max_records)
        if done is not None and time.monotonic() - started > INLINE_SLOW:
            self._inline_paused_until = time.monotonic() + INLINE_PAUSE
        if done:
            RECEIPT_PATH.handoff.observe(0.0)  # no hand-off: committed where it is delivered
            self.deliver_here(done)

    @property
    def handoffs(self) -> float:
        """What the two thread hand-offs of a turn left to the writer cost (seconds): as
        measured (:attr:`wake_writer` + :attr:`handback_writer`), else :data:`INLINE_MARGIN`.
        On a crowded machine they cost several times the margin (issue 27: 120-130 us at
        load 6), and a fixed margin left turns to the writer that the loop did faster."""
        if self.wake_writer is None or self.handback_writer is None:
            return INLINE_MARGIN
        return self.wake_writer + self.handback_writer

    @property
    def backlog_bytes(self) -> int:
        """Bytes appended and not yet durable: what waits in memory for the disk. A
        caller that appends faster than the disk takes (a slave applying a full sync)
        waits for :meth:`on_durable` once this passes its bound."""
        return self.appended_bytes - self._durable_bytes

    def on_durable(self, callback: Callback) -> None:
        """Run ``callback`` once everything appended so far is durable."""
        with self._cond:
            if self._queue or self._busy:
                self._callbacks.append(callback)
                if not self._queue:
                    self._queued_at = time.perf_counter()
                self._queue.append(("noop", None))
                self._cond.notify_all()
                return
        self._notify([(callback, self._failed)])

    def delete_segments(self, seg_ids: Sequence[int]) -> None:
        """Delete these (non-head) segments once everything queued before is durable."""
        ids = [s for s in seg_ids if s != self._head]
        if not ids:
            return
        try:  # recorded before the writer unlinks them: a gap is then never taken for a loss
            self._update_chain(lambda chain: chain.plus(ids))
        except OSError as exc:
            log.error("journal %s: cannot record the deletion of segments %s (%s): keeping them",
                      self.directory, ids, exc)
            self.check_soon()  # the directory gone? that fails the journal (guard.py)
            return
        with self._cond:
            for s in ids:
                with contextlib.suppress(ValueError):
                    self.segments.remove(s)
                self.size -= self._sizes.pop(s, 0)
            if not self._queue:
                self._queued_at = time.perf_counter()
            self._queue.append(("delete", tuple(ids)))
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything appended so far is durable (never call from a notify callback)."""
        with self._cond:
            self._cond.notify_all()  # the writer too (an append may have left it asleep: wake_on_append)
            self._waiters += 1
            try:
                ok = self._cond.wait_for(
                    lambda: (
                        (not self._queue and not self._busy)
                        or self._failed is not None
                        or self._thread is None
                    ),
                    timeout,
                )
            finally:
                self._waiters -= 1
        return bool(ok) and self._failed is None

    def close(self) -> None:
        """Flush, stop the writer, close files and release the directory lock."""
        if self._thread is not None:
            self.flush(timeout=30)
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join(timeout=30)
            if not self._thread.is_alive() and self._preallocated and self._failed is None:
                self._cut_head()
            self._thread = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _cut_head(self) -> None:
        """A closed journal's head is cut to its written size (segments.py: a store at rest
        has no preallocated tail, as before; a crash can leave one, which recovery cuts)."""
        fd = self._fd
        if fd is None:
            return
        try:
            os.ftruncate(fd, self._fd_off)
            if self.fsync:
                os.fdatasync(fd)
        except OSError as exc:  # the data is durable already: a zero tail left is still a valid segment
            log.warning("journal %s: cannot cut the head segment to its written size: %s", self.directory, exc)

    # ------------------------------------------------------------------ positions and reads
    @property
    def position(self) -> tuple[int, int, int]:
        """``(segment, offset, records)``: where the next record will go, and how many
        were appended before it (what a checkpoint taken now covers)."""
        with self._lock:
            return self._head, self._head_size, self._appended

    @property
    def durable_records(self) -> int:
        """Records appended and durable (fsynced) so far."""
        with self._lock:
            return self._durable

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` where completions run (the broker's loop), from any thread."""
        self._notify([(lambda _err: fn(), None)])

    def wait_durable(self, records: int, timeout: float | None = None) -> bool:
        """Block until the first ``records`` appended records are durable; False on
        timeout or a failed journal. For threads other than the writer."""
        with self._cond:
            self._waiters += 1
            try:
                ok = self._cond.wait_for(
                    lambda: self._durable >= records or self._failed is not None or self._thread is None, timeout
                )
            finally:
                self._waiters -= 1
            return bool(ok) and self._failed is None and self._durable >= records
