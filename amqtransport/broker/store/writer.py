"""The journal's writer thread: group commit, failure, completions (see :mod:`.journal`).

Theory of operation
-------------------
:class:`JournalWriter` is the half of :class:`~.journal.Journal` that runs on its writer
thread (:meth:`JournalWriter._run`): it sleeps on the journal's condition until something
is queued (or, idle, every :data:`~.guard.CHECK_INTERVAL` seconds, to check the disk under
it), takes *everything* queued since its last round, writes it with one ``write`` per
segment and one ``fdatasync`` (:meth:`~JournalWriter._write_batch`), checks the head
segment still has a name, runs the batch hooks (replication), and hands the round's
completions to ``notify`` in one call. A failure fails the batch and everything queued
meanwhile and stops the writer. The rules are the journal's; they are stated once, in
:mod:`.journal`'s docstring.

:func:`run_completions` runs a batch's completions where ``notify`` delivers them (the
broker's loop), then what they deferred with :func:`after_completions` (a connection's
write of its RECEIPTs, a slave's ACK): for a lone completion, in the same loop turn,
not one later.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..ops.stats import RECEIPT_PATH, Histogram
from .files import fsync_dir as _fsync_dir
from .files import preallocate
from .files import pwrite_all as _pwrite_all
from .files import write_all as _write_all
from .guard import CHECK_INTERVAL, StorageGuard
from .segments import MAGIC, JournalError

__all__ = ["BatchHook", "Callback", "JournalWriter", "after_completions", "leave_turn_to_writer", "run_completions",
           "take_turn_to_writer"]

log = logging.getLogger("amqtransport.broker.store.journal")  # the journal's logger, as before the move

#: completion callback: receives None when durable, or the error that prevented it
Callback = Callable[[BaseException | None], None]
#: replication gate: called with a batch's payloads after the local fsync
BatchHook = Callable[[Sequence[bytes]], "concurrent.futures.Future[object] | None"]


class JournalWriter:
    """The writer thread's methods of :class:`~.journal.Journal` (state set by its ``__init__``)."""

    directory: Path
    fsync: bool
    segment_size: int
    preallocate: bool
    _preallocated: bool
    _cond: threading.Condition
    _queue: list[bytes | tuple[str, object]]
    _callbacks: list[Callback]
    _payloads: list[bytes]
    _hooks: list[BatchHook]
    _notify: Callable[[list[tuple[Callback, BaseException | None]]], None]
    _on_failure: Callable[[JournalError], None] | None
    _appended: int
    appended_bytes: int
    _durable: int
    _durable_bytes: int
    _closing: bool
    _busy: bool
    _waiting: bool
    wake_on_append: bool
    _woken_at: float
    _queued_at: float
    _failed: BaseException | None
    _guard: StorageGuard | None
    _check_due: bool
    _full_checked: float
    _fd: int | None
    _fd_seg: int
    _fd_off: int
    _written: tuple[int, int]
    _read_waiting: bool
    _waiters: int
    bytes_written: int
    batches: int
    records_written: int
    fsync_seconds: Histogram
    _thread: threading.Thread | None
    sync_writer: float | None
    sync_here: float | None
    wake_writer: float | None
    handback_writer: float | None
    on_queued: Callable[[], None] | None
    batch_records: Histogram

    def path_of(self, seg_id: int) -> Path:
        raise NotImplementedError  # SegmentReads.path_of

    def record_created(self, seg_id: int) -> None:
        raise NotImplementedError  # Journal.record_created

    def _open_head_sync(self, seg_id: int) -> None:
        """Create the head segment ``seg_id``, preallocated to ``segment_size`` (see
        :mod:`.segments`; where that fails, a full disk or a file system without
        ``fallocate``, it grows as it is written), durable with its directory entry."""
        if self._fd is not None:
            os.close(self._fd)
        path = self.path_of(seg_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # written at offsets: no O_APPEND
        _write_all(fd, MAGIC)
        self._preallocated = self.preallocate and preallocate(fd, self.segment_size)
        if self.preallocate and not self._preallocated:
            os.ftruncate(fd, len(MAGIC))  # (a failed fallocate may have allocated part): grow as before
        if self.fsync:
            os.fdatasync(fd)
            _fsync_dir(self.directory)
        self._fd = fd
        self._fd_seg = seg_id
        self._fd_off = len(MAGIC)
        self.record_created(seg_id)  # durable before the segment's first record (chain.py)
        self._mark_written()

    def _mark_written(self) -> None:
        with self._cond:
            self._written = (self._fd_seg, self._fd_off)
            if self._read_waiting:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                idle_check = False
                # a batch committed by commit_here (_busy) is waited for: one batch at a time
                while self._failed is None and (self._busy or (not self._queue and not self._closing)):
                    if not self._busy and (self._check_due or time.monotonic() - self._full_checked >= CHECK_INTERVAL):
                        idle_check = True
                        break
                    self._waiting = True
                    self._cond.wait(CHECK_INTERVAL)
                    self._waiting = False
                    if self._woken_at:
                        woke = time.perf_counter() - self._woken_at
                        RECEIPT_PATH.journal_wakeup.observe(woke)
                        self.wake_writer = woke if self.wake_writer is None else self.wake_writer + (woke - self.wake_writer) / 16
                        self._woken_at = 0.0
                if self._failed is not None:  # a batch commit_here wrote failed: it did what a failure does
                    return
                if not self._queue and self._closing:
                    return
                if idle_check:
                    self._check_due = False
                    self._busy = True
                else:
                    items, callbacks, payloads, target, target_bytes = self._take()
            if idle_check:  # nothing to write: is the disk under us still there?
                problem = self._storage_problem(full=True)
                if problem is None:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                    continue
                with self._cond:
                    target, target_bytes = self._durable, self._durable_bytes
                error: JournalError | None = _storage_error(problem)
                log.error("journal %s: %s; the broker can no longer persist", self.directory, error)
                done = self._settle([], target, error, batch=False)
            else:
                error = self._commit(items, payloads)
                done = self._settle(callbacks, target, error, batch=True)
                if done and self.on_queued is not None:  # a loop that commits turns itself: time the way back
                    done[0] = self._timed_handback(*done[0])
            self._deliver(done)
            self._done(target, target_bytes)
            if error is not None:
                self._report_failure(error)
                return

    def commit_here(self, max_records: int) -> list[tuple[Callback, BaseException | None]] | None:
        """Group commit on the calling thread, when nothing is to be grouped: if the writer
        thread holds no batch and at most ``max_records`` records are queued, write and
        fdatasync them here, with every check and hook of the writer's round, and return the
        completions for the caller to run (:func:`run_completions`); this saves the two
        thread hand-offs of an idle writer (waking it; handing the completions back). None:
        the writer thread takes them (it is busy, or more is queued). A failure is handled
        as the writer handles one (the completions get the error through ``notify``;
        ``on_failure``; the writer stops) and returns ``[]``. The caller blocks for the
        fsync: a slave's replication loop (:mod:`..ha.slave_link`), and the broker's loop at the
        end of a turn that appended few records (:meth:`~.journal.Journal.commit_turn`;
        a turn that appended more leaves them to the writer, whose fsync then overlaps the
        loop's parsing: pipelined producers keep their group commit)."""
        with self._cond:
            if (self._busy or not self._queue or self._closing or self._failed is not None or self._check_due
                    or len(self._payloads) > max_records):
                self._wake_writer_locked()  # the writer's, then (the appends may not have woken it)
                return None
            self._woken_at = 0.0  # the writer, if woken, finds nothing to do
            items, callbacks, payloads, target, target_bytes = self._take()
        error = self._commit(items, payloads)
        done = self._settle(callbacks, target, error, batch=True)
        if error is None:
            self._done(target, target_bytes, here=True)
            return done
        self._deliver(done)
        self._done(target, target_bytes)
        self._report_failure(error)
        return []

    def _wake_writer_locked(self) -> None:
        """Under ``_cond``: wake the writer thread if it sleeps while records are queued
        (an append on the loop's ``inline_thread`` leaves it asleep for ``commit_turn``):
        ``commit_here`` handing a batch over, and a read of a position not written yet
        (:meth:`~.segments.SegmentReads._wait_written`), which would otherwise wait for the
        writer's idle round."""
        if self._queue and self._waiting:
            if not self._woken_at:
                self._woken_at = time.perf_counter()  # RECEIPT_PATH.journal_wakeup, wake_writer
            self._cond.notify_all()

    def _timed_handback(self, cb: Callback, err: BaseException | None) -> tuple[Callback, BaseException | None]:
        """``cb``, noting when it runs how long the hand-back took (:attr:`handback_writer`)."""
        handed = time.perf_counter()

        def first(e: BaseException | None) -> None:
            took = time.perf_counter() - handed
            self.handback_writer = took if self.handback_writer is None else self.handback_writer + (
                took - self.handback_writer) / 16
            cb(e)

        return first, err

    def _take(self) -> tuple[list[bytes | tuple[str, object]], list[Callback], list[bytes], int, int]:
        """Take everything queued as one batch (under ``_cond``); the taker holds ``_busy``."""
        items, self._queue = self._queue, []
        callbacks, self._callbacks = self._callbacks, []
        payloads, self._payloads = self._payloads, []
        self._busy = True
        RECEIPT_PATH.journal_queue.observe(time.perf_counter() - self._queued_at)
        return items, callbacks, payloads, self._appended, self.appended_bytes

    def _commit(self, items: list[bytes | tuple[str, object]], payloads: list[bytes]) -> JournalError | None:
        """Write and fdatasync a batch, check its file still has a name, run the batch hooks;
        the error that failed it, or None."""
        try:
            started = time.perf_counter()
            self._write_batch(items)
            problem = self._storage_problem(full=False)
            if problem is not None:  # before any completion: no receipt into a deleted file
                raise _storage_error(problem)
            synced = time.perf_counter() - started
            thread = self._thread
            if thread is not None and thread.ident == threading.get_ident():  # (Journal.commit_turn's choice)
                self.sync_writer = synced if self.sync_writer is None else self.sync_writer + (synced - self.sync_writer) / 16
            else:
                self.sync_here = synced if self.sync_here is None else self.sync_here + (synced - self.sync_here) / 16
            self.fsync_seconds.observe(synced)
            RECEIPT_PATH.journal_sync.observe(synced)
            if payloads:
                self.batch_records.observe(len(payloads))
            for hook in list(self._hooks):
                fut = hook(payloads)
                if fut is not None:
                    fut.result()
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter
            log.error(
                "journal %s: write failed: %s; the broker can no longer persist", self.directory, exc
            )
            error = exc if isinstance(exc, JournalError) else JournalError(f"journal write failed: {exc}")
            if error is not exc:
                error.__cause__ = exc
            return error
        return None

    def _settle(self, callbacks: list[Callback], target: int, error: JournalError | None, *,
                batch: bool) -> list[tuple[Callback, BaseException | None]]:
        """A round is over: on ``error`` the journal is failed (appends from now on raise, and
        what was queued meanwhile fails too); the completions to deliver."""
        if error is not None:
            with self._cond:
                self._failed = error
                callbacks += self._callbacks
                self._callbacks, self._queue, self._payloads = [], [], []
        if batch:
            self.batches += 1
        self.records_written = target  # every record appended before this batch, plus it
        return [(cb, error) for cb in callbacks]

    def _deliver(self, done: list[tuple[Callback, BaseException | None]]) -> None:
        if done:
            try:
                self._notify(done)
            except Exception:  # noqa: BLE001 - e.g. the loop is closed
                log.exception("journal: delivering completions failed")

    def _done(self, target: int, target_bytes: int, *, here: bool = False) -> None:
        """The batch is over. ``here`` (:meth:`commit_here`): wake the sleeping writer only
        when it has something to do, so that it does not take the GIL from the thread
        that is about to run the completions."""
        with self._cond:
            self._durable = target
            self._durable_bytes = target_bytes
            self._busy = False
            if not here or self._queue or self._closing or self._check_due or self._waiters:
                self._cond.notify_all()

    def _report_failure(self, error: JournalError) -> None:
        if self._on_failure is not None:
            try:
                self._on_failure(error)
            except Exception:  # noqa: BLE001 - e.g. the loop is closed
                log.exception("journal: reporting the failure failed")

    def _storage_problem(self, *, full: bool) -> str | None:
        """The guard's finding (writer thread): the quick check after each batch, the whole
        one when ``full`` or every :data:`CHECK_INTERVAL` seconds."""
        guard = self._guard
        if guard is None:
            return None
        name = f"segment {self.path_of(self._fd_seg).name}"
        now = time.monotonic()
        if full or now - self._full_checked >= CHECK_INTERVAL:
            self._full_checked = now
            return guard.problem(self._fd, name)
        return guard.quick(self._fd, name)

    def _write_batch(self, items: list[bytes | tuple[str, object]]) -> None:
        chunk: list[bytes] = []
        deletes: list[int] = []
        for item in items:
            if isinstance(item, bytes):
                chunk.append(item)
                continue
            action, arg = item
            if action == "roll":
                self._flush_chunk(chunk)
                chunk = []
                if self._fd is not None and self._preallocated:  # done: cut to its written size (segments.py)
                    os.ftruncate(self._fd, self._fd_off)
                if self.fsync and self._fd is not None:
                    os.fdatasync(self._fd)
                assert isinstance(arg, int)
                self._open_head_sync(arg)
            elif action == "delete":
                assert isinstance(arg, tuple)
                deletes.extend(arg)
        self._flush_chunk(chunk)
        if self.fsync and self._fd is not None:
            os.fdatasync(self._fd)
        for seg in deletes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path_of(seg))
                log.debug("journal %s: deleted segment %d", self.directory, seg)
        if deletes and self.fsync:
            _fsync_dir(self.directory)

    def _flush_chunk(self, chunk: list[bytes]) -> None:
        if not chunk or self._fd is None:
            return
        data = b"".join(chunk)
        _pwrite_all(self._fd, data, self._fd_off)
        self.bytes_written += len(data)
        self._fd_off += len(data)
        self._mark_written()


def _storage_error(problem: str) -> JournalError:
    return JournalError(f"journal storage lost: {problem}")


def run_completions(items: list[tuple[Callback, BaseException | None]], handed_at: float | None = None) -> None:
    """Call each ``cb(err)``; one failing completion is logged and must not skip the rest.
    Then what the completions deferred with :func:`after_completions` (a connection's
    write of its RECEIPTs) runs, in order. ``handed_at``: the ``perf_counter()`` at
    which the writer thread handed the batch over (``RECEIPT_PATH.handoff``).

    The journal's default ``notify``; the broker and the HA node run it on their loop.
    """
    started = time.perf_counter()
    if handed_at is not None:
        RECEIPT_PATH.handoff.observe(started - handed_at)
    outer = getattr(_completing, "after", None)
    # a lone completion (one receipted send at a time) is answered in this loop turn; a
    # batch of several (pipelined producers) as before, in the next turn, where the writes
    # of other batches ready by then join it (the pipelined path stays as it was measured)
    after: list[Callable[[], None]] | None = [] if len(items) <= WRITE_NOW_AT_MOST else None
    _completing.after = after
    try:
        for cb, err in items:
            try:
                cb(err)
            except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                log.exception("completion callback failed")
    finally:
        _completing.after = outer
    for fn in after or ():
        try:
            fn()
        except Exception:  # noqa: BLE001 - as above
            log.exception("deferred completion work failed")
    RECEIPT_PATH.receipt_write.observe(time.perf_counter() - started)


_completing = threading.local()  # .after: what the completions running on this thread deferred
#: a batch of at most this many completions has what they write go out once they ran (after_completions)
WRITE_NOW_AT_MOST = 1


_turn = threading.local()  # .to_writer: this loop turn's records are for the writer thread (commit_turn)


def leave_turn_to_writer() -> None:
    """This loop turn appends for a producer that does not wait for each record's receipt
    (a pipelined one, a send without a receipt, a consumer's ack): the journal's
    ``commit_turn`` then leaves the turn's records to the writer thread, whose fsync
    overlaps the loop's work on the next frames, instead of blocking the loop for it."""
    _turn.to_writer = True


def take_turn_to_writer() -> bool:
    """Whether :func:`leave_turn_to_writer` was called on this thread since the last call."""
    found = bool(getattr(_turn, "to_writer", False))
    _turn.to_writer = False
    return found


def after_completions(fn: Callable[[], None]) -> bool:
    """While :func:`run_completions` runs a batch of at most :data:`WRITE_NOW_AT_MOST`
    completions on this thread, have ``fn`` run once every completion of it has, and
    return True; otherwise return False (the caller schedules ``fn`` itself). A
    connection writes a batch's RECEIPTs this way: in one
    write, in the same loop turn as the completions, not one turn later."""
    after: list[Callable[[], None]] | None = getattr(_completing, "after", None)
    if after is None:
        return False
    after.append(fn)
    return True
